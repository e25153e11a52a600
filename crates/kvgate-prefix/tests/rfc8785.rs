//! RFC 8785 test vectors (fixtures/rfc8785): the RFC's own examples and the
//! cyberphone json-canonicalization testdata, checked against our writer and
//! against serde_json_canonicalizer as an independent reference.

use std::path::{Path, PathBuf};

use kvgate_prefix::{parse_strict, write_canonical};
use serde_json::{Number, Value};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/rfc8785")
}

fn canonical(value: &Value) -> Vec<u8> {
    let mut out = Vec::new();
    write_canonical(value, &mut out);
    out
}

#[test]
fn structure_vectors() {
    let mut names: Vec<_> = std::fs::read_dir(fixtures().join("input"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(
        names,
        [
            "arrays",
            "french",
            "rfc-sorting",
            "structures",
            "unicode",
            "values",
            "weird"
        ]
        .map(|n| format!("{n}.json"))
    );
    for name in names {
        let input = std::fs::read(fixtures().join("input").join(&name)).unwrap();
        let expected = std::fs::read(fixtures().join("output").join(&name)).unwrap();
        let value = parse_strict(&input).unwrap_or_else(|e| panic!("{name}: {e}"));
        let ours = canonical(&value);
        assert_eq!(
            String::from_utf8_lossy(&ours),
            String::from_utf8_lossy(&expected),
            "{name}: ours vs vector"
        );
        assert_eq!(
            serde_json_canonicalizer::to_vec(&value).unwrap(),
            expected,
            "{name}: reference vs vector"
        );
        // Canonical output is a fixed point.
        assert_eq!(
            canonical(&parse_strict(&ours).unwrap()),
            ours,
            "{name}: idempotence"
        );
    }
}

/// Rows of `<a> <b>` from a fixture file, skipping `#` comments.
fn rows(file: &str) -> Vec<(String, String)> {
    let text = std::fs::read_to_string(fixtures().join(file)).unwrap_or_default();
    let rows: Vec<_> = text
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
        .map(|l| {
            let (a, b) = l.split_once(' ').unwrap_or((l, "<no expected value>"));
            (a.to_owned(), b.to_owned())
        })
        .collect();
    assert!(rows.len() > 10, "{file} has too few rows");
    rows
}

#[test]
fn appendix_b_number_vectors() {
    for (hex, expected) in rows("numbers-appendix-b.txt") {
        let f = f64::from_bits(u64::from_str_radix(&hex, 16).unwrap());
        match Number::from_f64(f) {
            None => assert_eq!(expected, "error", "{hex}"),
            Some(n) => {
                let value = Value::Number(n);
                assert_eq!(
                    String::from_utf8(canonical(&value)).unwrap(),
                    expected,
                    "{hex}"
                );
                assert_eq!(
                    serde_json_canonicalizer::to_string(&value).unwrap(),
                    expected,
                    "{hex}"
                );
            }
        }
    }
}

#[test]
fn number_text_vectors() {
    for (text, expected) in rows("numbers-text.txt") {
        let value = parse_strict(text.as_bytes()).unwrap_or_else(|e| panic!("{text}: {e}"));
        assert_eq!(
            String::from_utf8(canonical(&value)).unwrap(),
            expected,
            "{text}"
        );
        assert_eq!(
            serde_json_canonicalizer::to_string(&value).unwrap(),
            expected,
            "{text}"
        );
    }
}

#[test]
fn values_jcs_must_refuse_are_refused_at_parse_time() {
    for text in ["NaN", "Infinity", "-Infinity", "1e309", "-1e309"] {
        assert!(parse_strict(text.as_bytes()).is_err(), "{text}");
    }
}
