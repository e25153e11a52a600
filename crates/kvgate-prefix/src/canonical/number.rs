//! RFC 8785 §3.2.2.3 numbers: the shortest round-tripping ECMAScript form.

use serde_json::Number;

/// Every JSON number is an IEEE double to JCS (I-JSON), so integers print as the
/// double nearest them, as `JSON.stringify` would: 2^53 + 1 prints 9007199254740992.
pub(super) fn write(n: &Number, out: &mut Vec<u8>) {
    match n.as_f64() {
        Some(f) if f.is_finite() => {
            out.extend_from_slice(ryu_js::Buffer::new().format_finite(f).as_bytes());
        }
        _ => out.extend_from_slice(b"null"),
    }
}

#[cfg(test)]
mod tests {
    use super::write;
    use serde_json::Number;

    fn text(n: Number) -> String {
        let mut out = Vec::new();
        write(&n, &mut out);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn ecmascript_number_forms() {
        let f = |x: f64| text(Number::from_f64(x).unwrap());
        assert_eq!(f(-0.0), "0");
        assert_eq!(f(1.0), "1");
        assert_eq!(f(4.5), "4.5");
        assert_eq!(f(0.002), "0.002");
        assert_eq!(f(1e-7), "1e-7");
        assert_eq!(f(1e21), "1e+21");
        assert_eq!(f(1e20), "100000000000000000000");
        assert_eq!(f(-1.5e-300), "-1.5e-300");
        assert_eq!(f(f64::MAX), "1.7976931348623157e+308");
        assert_eq!(f(5e-324), "5e-324");
    }

    #[test]
    fn integers_print_as_the_nearest_double() {
        assert_eq!(text(u64::MAX.into()), "18446744073709552000");
        assert_eq!(text(9_007_199_254_740_993_u64.into()), "9007199254740992");
        assert_eq!(text(i64::MIN.into()), "-9223372036854776000");
        assert_eq!(text(0_u64.into()), "0");
        assert_eq!(text((-7_i64).into()), "-7");
    }
}
