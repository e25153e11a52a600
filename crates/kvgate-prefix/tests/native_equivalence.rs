//! One native body written many ways must give one window and one key; the
//! sampling parameters must not reach a window shorter than the prompt.

use kvgate_prefix::{default_prompt_members, native_window, parse_strict, routing_key};

const MAX_BYTES: usize = 4096;

fn key_of(body: &str) -> Result<(Vec<u8>, u64), String> {
    let value = parse_strict(body.as_bytes()).map_err(|e| format!("{e}: {body}"))?;
    let window = native_window(&value, &default_prompt_members(), MAX_BYTES);
    let key = routing_key("tenant-a", "", &window);
    Ok((window, key))
}

#[test]
fn serialisations_of_one_body_share_window_and_key() {
    let spellings = [
        // compact, keys in canonical order
        r#"{"inputs":"Summarise: A cat.","parameters":{"max_new_tokens":64,"temperature":0.5}}"#,
        // keys reversed at both levels
        r#"{"parameters":{"temperature":0.5,"max_new_tokens":64},"inputs":"Summarise: A cat."}"#,
        // pretty-printed with two-space indentation and a trailing newline
        "{\n  \"parameters\": {\n    \"max_new_tokens\": 64,\n    \"temperature\": 0.5\n  },\n  \"inputs\": \"Summarise: A cat.\"\n}\n",
        // tabs, CRLF and spaces everywhere JSON allows whitespace
        "\t{ \"inputs\" :\r\n\"Summarise: A cat.\" , \"parameters\" : { \"temperature\" : 0.5 , \"max_new_tokens\" : 64 } }\r\n",
        // other number spellings of the same doubles
        r#"{"inputs":"Summarise: A cat.","parameters":{"max_new_tokens":64.0,"temperature":5e-1}}"#,
        r#"{"inputs":"Summarise: A cat.","parameters":{"max_new_tokens":6.4E1,"temperature":0.50}}"#,
        // escapes: \u0041 for A, \u0053 for S, \/ is /, and escaped key names
        r#"{"\u0069nputs":"\u0053ummarise: \u0041 cat.","param\u0065ters":{"max_new_tokens":640e-1,"temperature":0.5}}"#,
    ];
    let (window, key) = key_of(spellings[0]).unwrap();
    assert_eq!(
        String::from_utf8(window.clone()).unwrap(),
        r#"{"inputs":"Summarise: A cat.","parameters":{"max_new_tokens":64,"temperature":0.5}}"#
    );
    for body in &spellings[1..] {
        assert_eq!(key_of(body).unwrap(), (window.clone(), key), "{body}");
    }
    // And a genuinely different prompt does not.
    let other = key_of(
        r#"{"inputs":"Summarise: A dog.","parameters":{"max_new_tokens":64,"temperature":0.5}}"#,
    )
    .unwrap();
    assert_ne!(other.1, key);
}

#[test]
fn parameters_past_the_window_do_not_split_a_long_prompt() {
    let prompt = "You are a support agent for ACME. Follow the policy below. ".repeat(200);
    assert!(prompt.len() > 2 * MAX_BYTES);
    let a = format!(r#"{{"max_tokens":16,"parameters":{{"top_p":0.9}},"prompt":"{prompt}"}}"#);
    let b = format!(
        r#"{{"prompt":"{prompt}","max_tokens":2048,"parameters":{{"temperature":0,"stop":["\n"]}},"stream":true}}"#
    );
    let (window_a, key_a) = key_of(&a).unwrap();
    let (window_b, key_b) = key_of(&b).unwrap();
    assert_eq!(window_a.len(), MAX_BYTES);
    assert_eq!(window_a, window_b);
    assert_eq!(key_a, key_b);
    // Plain RFC 8785 order would have put max_tokens first and split them.
    let plain_a = native_window(&parse_strict(a.as_bytes()).unwrap(), &[], MAX_BYTES);
    let plain_b = native_window(&parse_strict(b.as_bytes()).unwrap(), &[], MAX_BYTES);
    assert_ne!(plain_a, plain_b);
}

#[test]
fn tenant_and_partition_separate_equal_windows() {
    let (window, key) = key_of(r#"{"inputs":"x"}"#).unwrap();
    assert_ne!(routing_key("tenant-b", "", &window), key);
    assert_ne!(routing_key("tenant-a", "session-1", &window), key);
}
