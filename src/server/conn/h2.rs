//! HTTP/2 frame boundaries, followed (not parsed) so the connection guard
//! knows when a header block is half received.
//!
//! hyper's header read timeout is HTTP/1 only: an HTTP/2 client may send a
//! HEADERS frame without END_HEADERS and trickle CONTINUATIONs (or a frame a
//! byte at a time) for ever, holding the connection and its HPACK state
//! without ever reaching authentication. The guard runs the header-read clock
//! while [`Frames::in_header`] holds. Everything else (HPACK, flow control,
//! stream states) stays hyper's and h2's.

/// The client connection preface (RFC 9113 §3.4).
pub const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

const HEADERS: u8 = 0x1;
const PUSH_PROMISE: u8 = 0x5;
const CONTINUATION: u8 = 0x9;
const END_HEADERS: u8 = 0x4;

/// Where the client's byte stream is, frame-wise.
#[derive(Debug, Default)]
pub struct Frames {
    /// Preface bytes seen (the guard only switches here on a full preface).
    preface: usize,
    head: [u8; 9],
    head_len: usize,
    /// Payload bytes left in the current frame.
    left: u32,
    /// The current frame carries a header block fragment.
    header_frame: bool,
    /// A header block was started and its END_HEADERS not yet seen.
    block_open: bool,
}

impl Frames {
    pub fn feed(&mut self, mut buf: &[u8]) {
        let skip = (PREFACE.len() - self.preface).min(buf.len());
        self.preface += skip;
        buf = &buf[skip..];
        while !buf.is_empty() {
            if self.left > 0 {
                let take = (self.left as usize).min(buf.len());
                self.left -= take as u32;
                buf = &buf[take..];
                continue;
            }
            let take = (9 - self.head_len).min(buf.len());
            self.head[self.head_len..self.head_len + take].copy_from_slice(&buf[..take]);
            self.head_len += take;
            buf = &buf[take..];
            if self.head_len == 9 {
                self.head_len = 0;
                let h = self.head;
                self.left = u32::from_be_bytes([0, h[0], h[1], h[2]]);
                let (kind, flags) = (h[3], h[4]);
                self.header_frame = matches!(kind, HEADERS | PUSH_PROMISE | CONTINUATION);
                if self.header_frame {
                    self.block_open = flags & END_HEADERS == 0;
                }
            }
        }
    }

    /// A frame header, a header-carrying frame or a header block is incomplete.
    pub fn in_header(&self) -> bool {
        self.head_len > 0 || self.block_open || (self.header_frame && self.left > 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(kind: u8, flags: u8, payload: &[u8]) -> Vec<u8> {
        let len = (payload.len() as u32).to_be_bytes();
        let mut f = vec![len[1], len[2], len[3], kind, flags, 0, 0, 0, 1];
        f.extend_from_slice(payload);
        f
    }

    #[test]
    fn a_header_block_is_open_until_end_headers() {
        let mut f = Frames::default();
        f.feed(PREFACE);
        f.feed(&frame(0x4, 0, &[]));
        assert!(!f.in_header());
        let headers = frame(HEADERS, 0, b"abc");
        f.feed(&headers[..5]);
        assert!(f.in_header());
        f.feed(&headers[5..]);
        assert!(f.in_header(), "no END_HEADERS yet");
        f.feed(&frame(CONTINUATION, END_HEADERS, b"de"));
        assert!(!f.in_header());
        let data = frame(0x0, 0, b"body");
        f.feed(&data[..10]);
        assert!(
            !f.in_header(),
            "a DATA frame is the body's clock, not this one"
        );
        f.feed(&data[10..]);
        let one = frame(HEADERS, END_HEADERS, b"xyz");
        f.feed(&one[..10]);
        assert!(f.in_header());
        f.feed(&one[10..]);
        assert!(!f.in_header());
    }
}
