//! Parsing tests: what each API accepts, how chat is templated, what is refused.

use super::*;

fn chat(body: &str) -> Result<Job, ApiError> {
    parse_chat(body.as_bytes(), None)
}

#[test]
fn chat_template_is_role_then_content_per_message() {
    let job = chat(
        r#"{"model":"m","messages":[{"role":"system","content":"Be brief."},
        {"role":"user","content":[{"type":"text","text":"Hi"},{"type":"image_url","image_url":{"url":"x"}}]}],
        "max_completion_tokens":7,"max_tokens":3,"stream":true,
        "stream_options":{"include_usage":true},"cache_salt":"s1"}"#,
    )
    .unwrap();
    let text = String::from_utf8(job.prompt).unwrap();
    assert_eq!(
        text,
        "<|system|>\nBe brief.\n<|user|>\nHi{\"image_url\":{\"url\":\"x\"},\"type\":\"image_url\"}\n<|assistant|>\n"
    );
    assert_eq!(job.max_tokens, Some(7), "max_completion_tokens wins");
    assert!(job.stream && job.include_usage);
    assert_eq!(job.cache_salt.as_deref(), Some("s1"));
    assert_eq!(job.model.as_deref(), Some("m"));
    assert_eq!(job.api, Api::Chat);
}

#[test]
fn tools_come_first_and_null_content_is_allowed() {
    let job = chat(
        r#"{"tools":[{"type":"function"}],"messages":[{"role":"assistant","content":null,
        "tool_calls":[{"id":"1"}]}]}"#,
    )
    .unwrap();
    let text = String::from_utf8(job.prompt).unwrap();
    assert_eq!(
        text,
        "<|tools|>\n[{\"type\":\"function\"}]\n<|assistant|>\n[{\"id\":\"1\"}]\n<|assistant|>\n"
    );
    assert_eq!(job.max_tokens, None);
    assert!(!job.stream);
}

#[test]
fn completion_prompts_text_tokens_and_single_element_lists() {
    let p = |b: &str| parse_completion(b.as_bytes(), None).map(|j| j.prompt);
    assert_eq!(p(r#"{"prompt":"abcd"}"#).unwrap(), b"abcd");
    assert_eq!(p(r#"{"prompt":["abcd"]}"#).unwrap(), b"abcd");
    assert_eq!(
        p(r#"{"prompt":[1,258]}"#).unwrap(),
        [1, 0, 0, 0, 2, 1, 0, 0]
    );
    assert_eq!(p(r#"{"prompt":[[1]]}"#).unwrap(), [1, 0, 0, 0]);
    assert_eq!(
        parse_completion(br#"{"prompt":"x"}"#, None).unwrap().api,
        Api::Completion
    );
}

#[test]
fn invocations_take_messages_prompt_or_inputs() {
    let inv = |b: &str| parse_invocation(b.as_bytes(), None).unwrap();
    let job = inv(r#"{"inputs":"hello","parameters":{"max_new_tokens":5,"temperature":0.1}}"#);
    assert_eq!(
        (job.prompt.as_slice(), job.max_tokens),
        (&b"hello"[..], Some(5))
    );
    assert_eq!(inv(r#"{"prompt":"hey"}"#).prompt, b"hey");
    assert!(
        inv(r#"{"messages":[{"role":"user","content":"x"}]}"#)
            .prompt
            .starts_with(b"<|user|>")
    );
    assert_eq!(inv(r#"{"inputs":"x","stream":true}"#).api, Api::Chat);
}

#[test]
fn malformed_requests_are_400s_naming_the_field() {
    let cases: &[(&str, Parse, Option<&str>)] = &[
        ("", parse_chat, None),
        ("not json", parse_chat, None),
        ("[1,2]", parse_chat, None),
        ("\"str\"", parse_completion, None),
        ("{\"messages\":", parse_chat, None),
        ("{}", parse_chat, Some("messages")),
        (r#"{"messages":[]}"#, parse_chat, Some("messages")),
        (r#"{"messages":"hi"}"#, parse_chat, None),
        (r#"{"messages":[{"content":"x"}]}"#, parse_chat, None),
        (
            r#"{"messages":[{"role":"user","content":5}]}"#,
            parse_chat,
            None,
        ),
        (
            r#"{"messages":[{"role":"user","content":"x"}],"max_tokens":0}"#,
            parse_chat,
            Some("max_tokens"),
        ),
        (
            r#"{"messages":[{"role":"user","content":"x"}],"max_tokens":-1}"#,
            parse_chat,
            None,
        ),
        (
            r#"{"messages":[{"role":"user","content":"x"}],"max_tokens":1.5}"#,
            parse_chat,
            None,
        ),
        (
            r#"{"messages":[{"role":"user","content":"x"}],"n":2}"#,
            parse_chat,
            Some("n"),
        ),
        (
            r#"{"messages":[{"role":"user","content":"x"}],"stream":"yes"}"#,
            parse_chat,
            None,
        ),
        (
            r#"{"messages":[{"role":"user","content":"x"}],"cache_salt":""}"#,
            parse_chat,
            Some("cache_salt"),
        ),
        (
            r#"{"messages":[{"role":"user","content":"x"}],"cache_salt":7}"#,
            parse_chat,
            None,
        ),
        (
            r#"{"messages":[{"role":"user","content":"x"}],"model":7}"#,
            parse_chat,
            None,
        ),
        ("{}", parse_completion, Some("prompt")),
        (r#"{"prompt":""}"#, parse_completion, Some("prompt")),
        (r#"{"prompt":[]}"#, parse_completion, Some("prompt")),
        (r#"{"prompt":["a","b"]}"#, parse_completion, Some("prompt")),
        (r#"{"prompt":[-1]}"#, parse_completion, None),
        (r#"{"prompt":[4294967296]}"#, parse_completion, None),
        (r#"{"prompt":{"a":1}}"#, parse_completion, None),
        ("{}", parse_invocation, None),
        (r#"{"inputs":""}"#, parse_invocation, Some("prompt")),
        (
            r#"{"inputs":"x","parameters":{"max_new_tokens":0}}"#,
            parse_invocation,
            Some("max_tokens"),
        ),
    ];
    for (body, parse, param) in cases {
        let err = parse(body.as_bytes(), None).expect_err(body);
        assert_eq!(err.status, 400, "{body}");
        assert_eq!(err.param, *param, "{body}: {}", err.message);
        assert!(!err.message.is_empty());
    }
}

#[test]
fn error_body_has_openai_shape() {
    let body = ApiError::bad_request("nope", Some("n")).body();
    assert_eq!(
        body,
        serde_json::json!({"error":{"message":"nope","type":"BadRequestError","param":"n","code":400}})
    );
}
