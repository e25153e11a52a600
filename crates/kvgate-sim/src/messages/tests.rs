//! Messages bodies: how they become chat bodies (as vLLM converts them), which
//! answers call a tool, and what is refused.

use kvgate_tokenize::PromptTokenizer;
use serde_json::{Value, json};

use super::convert::{Converted, convert};
use crate::error::ApiError;
use crate::request::parse_chat;

fn conv(body: &Value) -> Converted {
    convert(body.to_string().as_bytes(), true, None).unwrap_or_else(|e| panic!("{e:?}"))
}

fn body(messages: Value, extra: Value) -> Value {
    let mut b = json!({"model": "m", "max_tokens": 5, "messages": messages});
    if let (Some(b), Some(e)) = (b.as_object_mut(), extra.as_object()) {
        b.extend(e.clone());
    }
    b
}

#[test]
fn system_tools_and_blocks_become_vllms_chat_messages() {
    let b = body(
        json!([
            {"role": "user", "content": [{"type": "text", "text": "Fix the bug."}]},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "look first", "signature": "s"},
                {"type": "text", "text": "Reading."},
                {"type": "tool_use", "id": "toolu_1", "name": "Read", "input": {"path": "a.rs", "n": 2}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": [
                    {"type": "text", "text": "fn main() {}"}, {"type": "text", "text": "// end"},
                    {"type": "image", "source": {"type": "url", "url": "http://x/i.png"}}]},
                {"type": "text", "text": "Go on."}]},
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t2", "content": "ok"}]},
        ]),
        json!({
            "system": [{"type": "text", "text": "x-anthropic-billing-header: cc=1"},
                       {"type": "text", "text": "You code. "}, {"type": "text", "text": "Tools:"}],
            "tools": [{"name": "Read", "description": "read a file", "input_schema": {"properties": {}}}],
            "metadata": {"user_id": "session-1"}, "cache_salt": "s1", "stream": true,
        }),
    );
    let c = conv(&b);
    assert_eq!(
        c.chat,
        json!({
            "model": "m", "max_tokens": 5, "stream": true, "cache_salt": "s1",
            "tools": [{"type": "function", "function": {"name": "Read", "description": "read a file",
                       "parameters": {"properties": {}, "type": "object"}}}],
            "messages": [
                {"role": "system", "content": "You code. Tools:"},
                {"role": "user", "content": "Fix the bug."},
                {"role": "assistant", "reasoning": "look first", "content": "Reading.",
                 "tool_calls": [{"id": "toolu_1", "type": "function",
                                 "function": {"name": "Read", "arguments": "{\"n\": 2, \"path\": \"a.rs\"}"}}]},
                {"role": "tool", "tool_call_id": "toolu_1", "content": "fn main() {}\n// end"},
                {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x/i.png"}}]},
                {"role": "user", "content": "Go on."},
                {"role": "system", "content": "Be brief."},
                {"role": "tool", "tool_call_id": "t2", "content": "ok"},
            ],
        })
    );
    assert_eq!(c.tool, None, "the last message answers a tool call");
}

#[test]
fn the_answer_calls_the_first_tool_unless_the_last_turn_is_a_tool_result() {
    let tools = json!({"tools": [{"name": "get_weather", "input_schema": {"type": "object"}},
                                 {"name": "other", "input_schema": {}}]});
    let ask = json!([{"role": "user", "content": "Weather in Paris?"}]);
    assert_eq!(
        conv(&body(ask.clone(), tools.clone())).tool.as_deref(),
        Some("get_weather")
    );
    assert_eq!(conv(&body(ask, json!({}))).tool, None, "no tools");
    let answered = json!([
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "get_weather", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": "sunny"}]},
    ]);
    let c = conv(&body(answered, tools));
    assert_eq!(c.tool, None);
    // An assistant turn of tool calls alone has no content; `{}` for no input.
    assert_eq!(
        c.chat["messages"][1],
        json!({"role": "assistant", "tool_calls": [{"id": "t", "type": "function",
               "function": {"name": "get_weather", "arguments": "{}"}}]})
    );
}

#[test]
fn a_messages_prompt_is_the_equivalent_chat_prompt() {
    let m = conv(&body(
        json!([{"role": "user", "content": "hello"},
               {"role": "assistant", "content": "hi"},
               {"role": "user", "content": [{"type": "text", "text": "more"}]}]),
        json!({"system": "sys"}),
    ));
    let from_messages = parse_chat(m.chat.to_string().as_bytes(), None).unwrap();
    let chat = json!({"model": "m", "max_tokens": 5, "messages": [
        {"role": "system", "content": "sys"}, {"role": "user", "content": "hello"},
        {"role": "assistant", "content": "hi"}, {"role": "user", "content": "more"}]});
    let from_chat = parse_chat(chat.to_string().as_bytes(), None).unwrap();
    assert_eq!(from_messages, from_chat);
    assert_eq!(
        String::from_utf8(from_messages.prompt).unwrap(),
        "<|system|>\nsys\n<|user|>\nhello\n<|assistant|>\nhi\n<|user|>\nmore\n<|assistant|>\n"
    );
}

#[test]
fn inline_system_messages_merge_when_the_template_refuses_them() {
    let template = "{% for m in messages %}{% if m.role == 'system' and not loop.first %}\
        {{ raise_exception('system first') }}{% endif %}[{{ m.role }}]{{ m.content }}{% endfor %}";
    let tok = PromptTokenizer::tiktoken("o200k_base", Some(template.into())).unwrap();
    let b = body(
        json!([{"role": "user", "content": "a"}, {"role": "system", "content": "late"},
               {"role": "user", "content": "b"}]),
        json!({"system": "first "}),
    );
    let c = convert(b.to_string().as_bytes(), true, Some(&tok)).unwrap();
    assert_eq!(
        c.chat["messages"],
        json!([{"role": "system", "content": "first late"},
               {"role": "user", "content": "a"}, {"role": "user", "content": "b"}])
    );
    let lenient = PromptTokenizer::tiktoken("o200k_base", Some("{{ messages }}".into())).unwrap();
    let c = convert(b.to_string().as_bytes(), true, Some(&lenient)).unwrap();
    assert_eq!(c.chat["messages"].as_array().unwrap().len(), 4);
}

#[test]
fn count_tokens_needs_no_max_tokens() {
    let b = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]});
    let c = convert(b.to_string().as_bytes(), false, None).unwrap();
    assert_eq!(c.chat.get("max_tokens"), None);
    assert!(convert(b.to_string().as_bytes(), true, None).is_err());
}

#[test]
fn malformed_bodies_are_400s_naming_the_field() {
    let user = json!([{"role": "user", "content": "x"}]);
    let cases: Vec<(Value, Option<&str>)> = vec![
        (json!("str"), None),
        (json!({"max_tokens": 5, "messages": user}), Some("model")),
        (
            json!({"model": "", "max_tokens": 5, "messages": user}),
            Some("model"),
        ),
        (json!({"model": "m", "messages": user}), Some("max_tokens")),
        (
            body(user.clone(), json!({"max_tokens": 0})),
            Some("max_tokens"),
        ),
        (
            body(user.clone(), json!({"max_tokens": -3})),
            Some("max_tokens"),
        ),
        (
            body(user.clone(), json!({"max_tokens": 1.5})),
            Some("max_tokens"),
        ),
        (
            body(user.clone(), json!({"max_tokens": "5"})),
            Some("max_tokens"),
        ),
        (body(json!("hi"), json!({})), Some("messages")),
        (body(json!([]), json!({})), Some("messages")),
        (json!({"model": "m", "max_tokens": 5}), Some("messages")),
        (
            body(json!([{"role": "tool", "content": "x"}]), json!({})),
            Some("messages"),
        ),
        (
            body(json!([{"role": "user", "content": 5}]), json!({})),
            Some("messages"),
        ),
        (
            body(
                json!([{"role": "user", "content": [{"type": "video"}]}]),
                json!({}),
            ),
            Some("messages"),
        ),
        (
            body(json!([{"role": "user", "content": ["text"]}]), json!({})),
            Some("messages"),
        ),
        (
            body(
                json!([{"role": "user", "content": [{"type": "text", "text": 7}]}]),
                json!({}),
            ),
            Some("messages"),
        ),
        (
            body(
                json!([{"role": "assistant", "content": [{"type": "tool_use", "input": "x"}]}]),
                json!({}),
            ),
            Some("messages"),
        ),
        (
            body(
                json!([{"role": "user", "content": [{"type": "tool_addition", "tool": {}}]}]),
                json!({}),
            ),
            Some("messages"),
        ),
        (body(user.clone(), json!({"system": 5})), Some("system")),
        (
            body(user.clone(), json!({"system": [{"type": "nope"}]})),
            Some("system"),
        ),
        (body(user.clone(), json!({"tools": {}})), Some("tools")),
        (
            body(user.clone(), json!({"tools": [{"name": "t"}]})),
            Some("tools"),
        ),
        (
            body(user.clone(), json!({"tools": [{"input_schema": {}}]})),
            Some("tools"),
        ),
        (body(user.clone(), json!({"stream": "yes"})), Some("stream")),
        (
            body(user.clone(), json!({"metadata": "u"})),
            Some("metadata"),
        ),
        (
            body(user.clone(), json!({"cache_salt": ""})),
            Some("cache_salt"),
        ),
    ];
    for (b, param) in cases {
        let err = convert(b.to_string().as_bytes(), true, None)
            .and_then(|c| parse_chat(c.chat.to_string().as_bytes(), None).map(|_| ()))
            .expect_err(&b.to_string());
        assert_eq!(err.status, 400, "{b}");
        assert_eq!(err.param, param, "{b}: {}", err.message);
    }
    for raw in [
        &b""[..],
        b"not json",
        b"{\"model\":",
        b"{\"model\": \"\xff\"}",
    ] {
        let err = convert(raw, true, None).expect_err("refused");
        assert_eq!(err.status, 400);
    }
    let deep = format!("{}{}", "[".repeat(200), "]".repeat(200));
    let b = format!(
        r#"{{"model":"m","max_tokens":1,"messages":[{{"role":"user","content":"x"}}],"tools":[{{"name":"t","input_schema":{{"a":{deep}}}}}]}}"#
    );
    assert_eq!(convert(b.as_bytes(), true, None).unwrap_err().status, 400);
}

#[test]
fn errors_have_anthropics_shape() {
    let body = ApiError::bad_request("nope", Some("n")).anthropic_body();
    assert_eq!(
        body,
        json!({"type": "error", "error": {"type": "invalid_request_error", "message": "nope"}})
    );
    let busy = ApiError::unavailable("busy").anthropic_body();
    assert_eq!(busy["error"]["type"], "overloaded_error");
    assert_eq!(
        ApiError::not_found("x").anthropic_body()["error"]["type"],
        "not_found_error"
    );
}
