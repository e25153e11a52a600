//! The HTTP/1 framing checker on arbitrary bytes, offered whole and in the
//! pieces the first byte picks (as a socket would deliver them): never a
//! panic, never more passed than was offered, and the same verdict however
//! the bytes are split.
#![no_main]

use kvgate::server::conn::h1::{Framing, Scan};
use libfuzzer_sys::fuzz_target;

/// Offer `input` in pieces of `step` bytes, keeping back what was not passed.
fn run(input: &[u8], step: usize) -> (usize, Option<u16>) {
    let mut f = Framing::default();
    let mut pending: Vec<u8> = Vec::new();
    let mut passed = 0;
    for piece in input.chunks(step) {
        let seen = pending.len();
        pending.extend_from_slice(piece);
        let Scan { pass, refuse } = f.scan(&pending, seen);
        assert!(pass <= pending.len());
        passed += pass;
        pending.drain(..pass);
        if let Some(r) = refuse {
            let status = r.error.status().as_u16();
            assert!((400..500).contains(&status), "{status}");
            return (passed, Some(status));
        }
    }
    (passed, None)
}

fuzz_target!(|data: &[u8]| {
    let Some((&first, input)) = data.split_first() else {
        return;
    };
    let step = usize::from(first % 16) + 1;
    let whole = run(input, input.len().max(1));
    let split = run(input, step);
    assert_eq!(whole, split, "step {step}");
});
