//! HTTP/1 request framing, checked before hyper sees a byte of it.
//!
//! Why not leave this to hyper: hyper answers the heads it cannot take (two
//! `content-length`s, too many or too large headers, a long target) with its
//! own canned response and an empty body, before any service runs, so those
//! errors could never carry the gateway's error shape; it closes silently on a
//! header timeout; and its chunked decoder accepts a chunk size followed by
//! spaces (`5 \r\n`), which RFC 9112 §7.1 does not allow and a proxy in front
//! may frame differently. So [`Framing`] follows the byte stream the way a
//! strict HTTP/1.1 server does: every request head is parsed here (httparse,
//! the parser hyper itself uses, with limits below hyper's), every body is
//! followed to its end (content-length bytes, or chunk lines checked strictly),
//! and the connection guard only hands hyper bytes this checker passed. What
//! it refuses is answered by the gateway in its own error shape.
//!
//! Pure: bytes in, a verdict out, no I/O and no clock, so it is unit-tested
//! and fuzzed on its own.

use crate::error::{ApiError, ErrorKind};

/// Longest request head (request line and headers) accepted: 431 beyond.
pub const MAX_HEAD_BYTES: usize = 64 * 1024;
/// Longest request target accepted: 414 beyond.
pub const MAX_TARGET_BYTES: usize = 8 * 1024;
/// Most header fields in one head (hyper's own default): 431 beyond.
pub const MAX_HEADERS: usize = 100;
/// Longest chunk-size line (with extensions) or trailer line.
const MAX_LINE_BYTES: usize = 4 * 1024;
/// Most trailer bytes after the last chunk.
const MAX_TRAILER_BYTES: usize = 16 * 1024;

/// What the checker makes of the bytes seen so far.
#[derive(Debug, Default)]
pub struct Scan {
    /// Bytes from the front that are checked and may go to hyper.
    pub pass: usize,
    /// The request is refused just after the passed bytes.
    pub refuse: Option<Refusal>,
}

/// A refused request.
#[derive(Debug, Clone)]
pub struct Refusal {
    pub error: ApiError,
    /// The request's method and path, when its head got that far (the
    /// error's shape may depend on the path).
    pub method: Option<String>,
    pub path: Option<String>,
    /// Refused inside a body hyper is already reading: the service sees a
    /// body error and answers; otherwise the gateway answers for hyper.
    pub in_body: bool,
}

impl Refusal {
    fn head(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self {
            error: ApiError::new(kind, message),
            method: None,
            path: None,
            in_body: false,
        }
    }

    fn body(message: &str) -> Self {
        Self {
            error: ApiError::new(
                ErrorKind::InvalidRequest,
                format!("malformed chunked body: {message}"),
            )
            .with_param("transfer-encoding"),
            method: None,
            path: None,
            in_body: true,
        }
    }

    /// The 408 for a head that did not arrive in time, naming what of it did.
    pub fn head_timeout(partial: &[u8], within: std::time::Duration) -> Self {
        let mut r = Self::head(
            ErrorKind::RequestTimeout,
            format!("the request head did not arrive within {within:?}"),
        );
        let line = partial.split(|&b| b == b'\n').next().unwrap_or_default();
        let mut words = line.split(|&b| b == b' ');
        if let (Some(m), Some(p)) = (words.next(), words.next()) {
            r.method = std::str::from_utf8(m).ok().map(str::to_owned);
            r.path = std::str::from_utf8(p).ok().map(str::to_owned);
        }
        r
    }
}

#[derive(Debug, Clone, Copy)]
enum State {
    /// Between messages, or inside a head not yet complete.
    Head,
    /// This many body bytes left (content-length).
    Length(u64),
    Chunked(Chunk),
}

#[derive(Debug, Clone, Copy)]
enum Chunk {
    /// In a chunk-size line.
    Size {
        digits: u8,
        value: u64,
        line: usize,
        /// Past the `;` of an extension: anything visible goes.
        ext: bool,
        /// Whitespace after the digits: only `;` may follow (RFC 9112's BWS).
        space: bool,
        cr: bool,
    },
    Data(u64),
    DataCr,
    DataLf,
    /// After the last chunk: trailer lines up to an empty one.
    Trailer {
        line: usize,
        cr: bool,
        total: usize,
    },
}

const SIZE_LINE: Chunk = Chunk::Size {
    digits: 0,
    value: 0,
    line: 0,
    ext: false,
    space: false,
    cr: false,
};

/// One connection's HTTP/1 request stream.
#[derive(Debug)]
pub struct Framing {
    state: State,
}

impl Default for Framing {
    fn default() -> Self {
        Self { state: State::Head }
    }
}

impl Framing {
    /// Between requests: nothing of a head or body is outstanding.
    pub fn at_boundary(&self) -> bool {
        matches!(self.state, State::Head)
    }

    /// Check `buf`, the bytes not yet passed. `buf[..seen]` were offered
    /// before and are the start of an incomplete head (only heads are held
    /// back), so a head is parsed again only once a new line end arrives, and
    /// only up to its last line end: the verdict is then the same however the
    /// bytes were split (the fuzz target checks it), and a head trickled a
    /// byte at a time costs one parse a line, not one a byte.
    pub fn scan(&mut self, buf: &[u8], seen: usize) -> Scan {
        let mut at = 0;
        while at < buf.len() {
            match self.state {
                State::Head => {
                    let fresh = &buf[at.max(seen)..];
                    // A body that came in the head's read is searched too:
                    // memrchr, not a byte loop, or a 16 KiB prompt costs
                    // ~130k instructions here.
                    let Some(end) = memchr::memrchr(b'\n', fresh) else {
                        return Scan {
                            pass: at,
                            refuse: too_long(&buf[at..]),
                        };
                    };
                    let lines = &buf[at..at.max(seen) + end + 1];
                    match head(lines) {
                        Ok(None) => {
                            return Scan {
                                pass: at,
                                refuse: too_long(&buf[at..]),
                            };
                        }
                        Ok(Some((len, next))) => {
                            at += len;
                            self.state = next;
                        }
                        Err(r) => {
                            return Scan {
                                pass: at,
                                refuse: Some(*r),
                            };
                        }
                    }
                }
                State::Length(left) => {
                    let take = left.min((buf.len() - at) as u64);
                    at += take as usize;
                    self.state = match left - take {
                        0 => State::Head,
                        n => State::Length(n),
                    };
                }
                State::Chunked(Chunk::Data(left)) => {
                    let take = left.min((buf.len() - at) as u64);
                    at += take as usize;
                    self.state = State::Chunked(match left - take {
                        0 => Chunk::DataCr,
                        n => Chunk::Data(n),
                    });
                }
                State::Chunked(c) => match chunk_byte(c, buf[at]) {
                    Ok(next) => {
                        at += 1;
                        self.state = next;
                    }
                    Err(r) => {
                        return Scan {
                            pass: at,
                            refuse: Some(*r),
                        };
                    }
                },
            }
        }
        Scan {
            pass: at,
            refuse: None,
        }
    }
}

/// An incomplete head already over a limit.
fn too_long(partial: &[u8]) -> Option<Refusal> {
    if partial.len() > MAX_HEAD_BYTES {
        return Some(Refusal::head(
            ErrorKind::HeadersTooLarge,
            format!("the request head is over {MAX_HEAD_BYTES} bytes"),
        ));
    }
    // The request line alone: method, target, version and a few spaces.
    if !partial.contains(&b'\n') && partial.len() > MAX_TARGET_BYTES + 64 {
        return Some(Refusal::head(
            ErrorKind::UriTooLong,
            format!("the request target is over {MAX_TARGET_BYTES} bytes"),
        ));
    }
    None
}

/// Parse one head: its length and the body framing it declares, `None` if
/// incomplete, or why it is refused.
fn head(buf: &[u8]) -> Result<Option<(usize, State)>, Box<Refusal>> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    let len = match req.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(httparse::Error::TooManyHeaders) => {
            return Err(Box::new(Refusal::head(
                ErrorKind::HeadersTooLarge,
                format!("the request has more than {MAX_HEADERS} header fields"),
            )));
        }
        Err(e) => {
            return Err(Box::new(Refusal::head(
                ErrorKind::InvalidRequest,
                format!("malformed request head: {e}"),
            )));
        }
    };
    let refuse = |kind, message: &str, param: Option<&str>| {
        let mut error = ApiError::new(kind, message);
        if let Some(p) = param {
            error = error.with_param(p);
        }
        Box::new(Refusal {
            error,
            method: req.method.map(str::to_owned),
            path: req.path.map(str::to_owned),
            in_body: false,
        })
    };
    if len > MAX_HEAD_BYTES {
        return Err(refuse(
            ErrorKind::HeadersTooLarge,
            &format!("the request head is over {MAX_HEAD_BYTES} bytes"),
            None,
        ));
    }
    if req.path.is_some_and(|p| p.len() > MAX_TARGET_BYTES) {
        return Err(refuse(
            ErrorKind::UriTooLong,
            &format!("the request target is over {MAX_TARGET_BYTES} bytes"),
            None,
        ));
    }
    // What hyper would refuse next, with its canned empty 400: a target or
    // method the `http` types do not take.
    if req
        .path
        .is_some_and(|p| axum::http::Uri::try_from(p).is_err())
    {
        return Err(refuse(
            ErrorKind::InvalidRequest,
            "the request target is not a valid URI",
            Some("path"),
        ));
    }
    if req
        .method
        .is_some_and(|m| axum::http::Method::from_bytes(m.as_bytes()).is_err())
    {
        return Err(refuse(ErrorKind::InvalidRequest, "invalid method", None));
    }
    let named = |name: &'static str| -> Vec<&[u8]> {
        req.headers
            .iter()
            .filter(|h| h.name.eq_ignore_ascii_case(name))
            .map(|h| h.value)
            .collect()
    };
    let lengths = named("content-length");
    let codings = named("transfer-encoding");
    let length = match lengths.as_slice() {
        [] => None,
        [one] => Some(content_length(one).ok_or_else(|| {
            refuse(
                ErrorKind::InvalidRequest,
                "content-length must be a decimal number of bytes",
                Some("content-length"),
            )
        })?),
        _ => {
            return Err(refuse(
                ErrorKind::InvalidRequest,
                "send content-length once",
                Some("content-length"),
            ));
        }
    };
    if !codings.is_empty() && req.version == Some(0) {
        return Err(refuse(
            ErrorKind::InvalidRequest,
            "HTTP/1.0 has no transfer-encoding: send content-length",
            Some("transfer-encoding"),
        ));
    }
    let next = match (codings.as_slice(), length) {
        ([], None | Some(0)) => State::Head,
        ([], Some(n)) => State::Length(n),
        ([one], None) if one.trim_ascii().eq_ignore_ascii_case(b"chunked") => {
            State::Chunked(SIZE_LINE)
        }
        ([_, ..], Some(_)) => {
            return Err(refuse(
                ErrorKind::InvalidRequest,
                "send content-length or transfer-encoding, not both",
                Some("transfer-encoding"),
            ));
        }
        _ => {
            return Err(refuse(
                ErrorKind::InvalidRequest,
                "only `Transfer-Encoding: chunked` is accepted (no other coding, sent once)",
                Some("transfer-encoding"),
            ));
        }
    };
    Ok(Some((len, next)))
}

/// `1*DIGIT`, at most 19 digits (fits a u64).
fn content_length(v: &[u8]) -> Option<u64> {
    let v = v.trim_ascii();
    if v.is_empty() || v.len() > 19 || !v.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(v).ok()?.parse().ok()
}

fn chunk_byte(c: Chunk, b: u8) -> Result<State, Box<Refusal>> {
    let next = match c {
        Chunk::Size {
            digits,
            value,
            line,
            ext,
            space,
            cr,
        } => {
            if line >= MAX_LINE_BYTES {
                return Err(Box::new(Refusal::body("chunk-size line too long")));
            }
            let line = line + 1;
            if cr {
                if b != b'\n' {
                    return Err(Box::new(Refusal::body("chunk-size line must end in CRLF")));
                }
                return Ok(State::Chunked(if value == 0 {
                    Chunk::Trailer {
                        line: 0,
                        cr: false,
                        total: 0,
                    }
                } else {
                    Chunk::Data(value)
                }));
            }
            let size = |digits, value, ext, space| Chunk::Size {
                digits,
                value,
                line,
                ext,
                space,
                cr: false,
            };
            match b {
                b'\r' if digits == 0 => return Err(Box::new(Refusal::body("missing chunk size"))),
                b'\r' if space && !ext => {
                    return Err(Box::new(Refusal::body("a chunk size followed by spaces")));
                }
                b'\r' => Chunk::Size {
                    digits,
                    value,
                    line,
                    ext,
                    space,
                    cr: true,
                },
                b'\n' => return Err(Box::new(Refusal::body("chunk-size line must end in CRLF"))),
                _ if ext => {
                    if b.is_ascii_control() && b != b'\t' {
                        return Err(Box::new(Refusal::body(
                            "control character in a chunk extension",
                        )));
                    }
                    c_with_line(c, line)
                }
                b';' if digits > 0 => size(digits, value, true, space),
                b' ' | b'\t' if digits > 0 => size(digits, value, false, true),
                _ if b.is_ascii_hexdigit() && !space => {
                    if digits >= 16 {
                        return Err(Box::new(Refusal::body("chunk size too large")));
                    }
                    let d = u64::from((b as char).to_digit(16).unwrap_or(0));
                    size(digits + 1, (value << 4) | d, false, false)
                }
                _ => return Err(Box::new(Refusal::body("invalid chunk size"))),
            }
        }
        Chunk::Data(n) => Chunk::Data(n),
        Chunk::DataCr if b == b'\r' => Chunk::DataLf,
        Chunk::DataLf if b == b'\n' => SIZE_LINE,
        Chunk::DataCr | Chunk::DataLf => {
            return Err(Box::new(Refusal::body("chunk data must end in CRLF")));
        }
        Chunk::Trailer { line, cr, total } => {
            if total >= MAX_TRAILER_BYTES || line >= MAX_LINE_BYTES {
                return Err(Box::new(Refusal::body("trailers too long")));
            }
            match (b, cr) {
                (b'\n', true) if line == 0 => return Ok(State::Head),
                (b'\n', true) => Chunk::Trailer {
                    line: 0,
                    cr: false,
                    total: total + 1,
                },
                (b'\r', false) => Chunk::Trailer {
                    line,
                    cr: true,
                    total: total + 1,
                },
                (_, true) | (b'\n', false) => {
                    return Err(Box::new(Refusal::body("trailer lines must end in CRLF")));
                }
                _ => Chunk::Trailer {
                    line: line + 1,
                    cr: false,
                    total: total + 1,
                },
            }
        }
    };
    Ok(State::Chunked(next))
}

/// The same size-line state, one byte further along.
fn c_with_line(c: Chunk, line: usize) -> Chunk {
    match c {
        Chunk::Size {
            digits,
            value,
            ext,
            space,
            cr,
            ..
        } => Chunk::Size {
            digits,
            value,
            line,
            ext,
            space,
            cr,
        },
        other => other,
    }
}

#[cfg(test)]
#[path = "h1_tests.rs"]
mod tests;
