//! The HTTP/1 framing checker on byte strings, fed whole and a byte at a time.

use super::*;

/// Feed `input` in pieces of `step` bytes as the guard does (unpassed bytes
/// offered again with the new ones); the total passed and the refusal.
fn run(input: &[u8], step: usize) -> (usize, Option<Refusal>) {
    let mut f = Framing::default();
    let mut pending: Vec<u8> = Vec::new();
    let mut passed = 0;
    for piece in input.chunks(step) {
        let seen = pending.len();
        pending.extend_from_slice(piece);
        let scan = f.scan(&pending, seen);
        passed += scan.pass;
        pending.drain(..scan.pass);
        if scan.refuse.is_some() {
            return (passed, scan.refuse);
        }
    }
    (passed, None)
}

fn both(input: &[u8]) -> (usize, Option<Refusal>) {
    let whole = run(input, input.len().max(1));
    let bytewise = run(input, 1);
    assert_eq!(whole.0, bytewise.0, "{}", String::from_utf8_lossy(input));
    assert_eq!(whole.1.is_some(), bytewise.1.is_some());
    whole
}

fn refused(input: &[u8]) -> Refusal {
    both(input)
        .1
        .unwrap_or_else(|| panic!("accepted: {}", String::from_utf8_lossy(input)))
}

#[test]
fn good_requests_pass_whole() {
    let reqs: &[&[u8]] = &[
        b"GET / HTTP/1.1\r\nhost: x\r\n\r\n",
        b"POST /v1/x HTTP/1.1\r\nhost: x\r\ncontent-length: 5\r\n\r\nhello",
        b"POST / HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
        b"POST / HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n5;a=b\r\nhello\r\nA ;x\r\n0123456789\r\n0\r\nx-t: 1\r\n\r\n",
    ];
    for r in reqs {
        let twice = [*r, *r].concat();
        let (n, refusal) = both(&twice);
        assert_eq!(n, twice.len(), "{}", String::from_utf8_lossy(r));
        assert!(refusal.is_none());
    }
}

#[test]
fn an_incomplete_head_is_held_back() {
    let (n, r) = both(b"POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 5\r\n\r\nhel");
    assert!(r.is_none());
    assert_eq!(n, 50, "the head and the body bytes so far");
    let (n, r) = both(b"GET / HTTP/1.1\r\nhost: x\r\n");
    assert!(r.is_none());
    assert_eq!(n, 0);
}

#[test]
fn framing_the_rfcs_forbid_is_refused() {
    for (input, status) in [
        (&b"POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 1\r\ncontent-length: 1\r\n\r\nx"[..], 400),
        (b"POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 1x\r\n\r\n", 400),
        (b"POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 1\r\ntransfer-encoding: chunked\r\n\r\n", 400),
        (b"POST / HTTP/1.1\r\nhost: x\r\ntransfer-encoding: gzip, chunked\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nbad header\r\n\r\n", 400),
        (b"GET /\x01 HTTP/1.1\r\n\r\n", 400),
        (b"GET /a\xffb HTTP/1.1\r\nhost: x\r\n\r\n", 400),
        (b"POST / HTTP/1.0\r\ntransfer-encoding: chunked\r\n\r\n", 400),
    ] {
        let r = refused(input);
        assert_eq!(r.error.status().as_u16(), status, "{}", String::from_utf8_lossy(input));
        assert!(!r.in_body);
    }
}

#[test]
fn oversized_heads_and_targets_get_431_and_414() {
    let long_target = format!(
        "GET /{} HTTP/1.1\r\nhost: x\r\n\r\n",
        "a".repeat(MAX_TARGET_BYTES)
    );
    assert_eq!(refused(long_target.as_bytes()).error.status(), 414);
    let unterminated = format!("GET /{}", "a".repeat(MAX_TARGET_BYTES + 100));
    assert_eq!(refused(unterminated.as_bytes()).error.status(), 414);
    let big = format!(
        "GET / HTTP/1.1\r\nx: {}\r\n\r\n",
        "a".repeat(MAX_HEAD_BYTES)
    );
    assert_eq!(refused(big.as_bytes()).error.status(), 431);
    let many = format!(
        "GET / HTTP/1.1\r\n{}\r\n",
        "a: b\r\n".repeat(MAX_HEADERS + 1)
    );
    assert_eq!(refused(many.as_bytes()).error.status(), 431);
    let r = refused(long_target.as_bytes());
    assert_eq!(r.method.as_deref(), Some("GET"));
}

#[test]
fn bad_chunk_lines_are_refused_inside_the_body() {
    let head = b"POST /p HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n";
    for body in [
        &b"5 \r\nhello\r\n0\r\n\r\n"[..],
        b"5\nhello\r\n0\r\n\r\n",
        b"\r\n",
        b"x\r\n",
        b"5\r\nhelloX\r\n",
        b"11111111111111111\r\n",
        b"0\r\nx: y\n\r\n",
    ] {
        let input = [&head[..], body].concat();
        let (n, r) = both(&input);
        let r = r.unwrap_or_else(|| panic!("accepted {}", String::from_utf8_lossy(body)));
        assert!(r.in_body);
        assert_eq!(r.error.status(), 400);
        assert!(n >= head.len());
    }
}

#[test]
fn a_timed_out_head_names_its_path() {
    let r = Refusal::head_timeout(
        b"POST /endpoints/a/invocations HTT",
        std::time::Duration::from_secs(1),
    );
    assert_eq!(r.error.status(), 408);
    assert_eq!(r.path.as_deref(), Some("/endpoints/a/invocations"));
}

/// Found by `fuzz/` (framing target): an error after the last line end was
/// seen when the bytes came at once and not when they came in pieces.
#[test]
fn the_verdict_does_not_depend_on_how_the_bytes_are_split() {
    for input in [
        &b"POST /e HTTP/1.1\r\nhost: x\r\ncontent-length: 12\rts\":1inputs\":1}"[..],
        b"GET / HTTP/1.1\r\nho\x01st",
    ] {
        for step in 1..8 {
            let (n, r) = run(input, step);
            let (whole_n, whole_r) = run(input, input.len());
            assert_eq!(
                (n, r.is_some()),
                (whole_n, whole_r.is_some()),
                "step {step}"
            );
        }
    }
}
