"""Anthropic's official Python SDK, unchanged, against kvgate's Messages API.

Usage: anthropic_interop.py GATEWAY_URL MODEL OVERLOADED_GATEWAY_URL
Keys: sk-a (a tenant), sk-b (a tenant not allowed MODEL), sk-slow (one request
a minute). OVERLOADED_GATEWAY_URL is a gateway whose only instance is down.
Prints "ok <the instance that served the session>" when every check passes.
"""

import sys

import anthropic

base, model, overloaded = sys.argv[1], sys.argv[2], sys.argv[3]


def client(key="sk-a", url=base):
    # No retries: each error must surface as its own class, once.
    return anthropic.Anthropic(base_url=url, api_key=key, max_retries=0)


c = client()
session = {"user_id": "session-42"}
system = "You are a terse coding agent. " * 40

# create
m = c.messages.create(
    model=model,
    max_tokens=16,
    system=system,
    metadata=session,
    messages=[{"role": "user", "content": "Say hello."}],
)
assert m.type == "message" and m.role == "assistant", m
assert m.content and m.content[0].type == "text" and m.content[0].text, m
assert m.usage.input_tokens > 0 and m.usage.output_tokens > 0, m.usage

# stream: the SDK's own event parser, text and final message
with c.messages.stream(
    model=model,
    max_tokens=16,
    system=system,
    metadata=session,
    messages=[{"role": "user", "content": "Say hello again."}],
) as stream:
    text = "".join(stream.text_stream)
    final = stream.get_final_message()
assert text and final.content[0].text == text, (text, final)
assert final.stop_reason in ("end_turn", "max_tokens"), final
# The same system prompt on the same instance: read from its cache.
assert (final.usage.cache_read_input_tokens or 0) > 0, final.usage

# tool use, then a turn with the tool's result
tools = [
    {
        "name": "read_file",
        "description": "Read a file of the repository.",
        "input_schema": {
            "type": "object",
            "properties": {"path": {"type": "string"}},
            "required": ["path"],
        },
    }
]
ask = {"role": "user", "content": "What does build.rs do?"}
r = c.messages.create(
    model=model, max_tokens=32, system=system, tools=tools, metadata=session, messages=[ask]
)
assert r.stop_reason == "tool_use", r
call = next(b for b in r.content if b.type == "tool_use")
assert call.name == "read_file" and call.id, call
r2 = c.messages.create(
    model=model,
    max_tokens=32,
    system=system,
    tools=tools,
    metadata=session,
    messages=[
        ask,
        {"role": "assistant", "content": r.content},
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": call.id, "content": "fn main() {}"}
            ],
        },
    ],
)
assert r2.stop_reason != "tool_use" and r2.content[0].type == "text", r2
assert (r2.usage.cache_read_input_tokens or 0) > 0, r2.usage

# count_tokens
n = c.messages.count_tokens(model=model, system=system, messages=[ask], tools=tools)
assert n.input_tokens > 0, n


def fails(cls, f):
    try:
        f()
    except cls as e:
        body = e.body if isinstance(e.body, dict) else {}
        assert body.get("type") == "error", body
        return e
    except anthropic.APIStatusError as e:
        raise AssertionError(f"{cls.__name__} expected, got {type(e).__name__}: {e}")
    raise AssertionError(f"{cls.__name__} expected, got a success")


one = [{"role": "user", "content": "hi"}]
e = fails(
    anthropic.BadRequestError,
    lambda: c.messages.create(
        model=model, max_tokens=8, messages=[{"role": "user", "content": [{"type": "hologram"}]}]
    ),
)
assert e.body["error"]["type"] == "invalid_request_error", e.body
e = fails(
    anthropic.AuthenticationError,
    lambda: client("sk-wrong").messages.create(model=model, max_tokens=8, messages=one),
)
assert e.body["error"]["type"] == "authentication_error", e.body
e = fails(
    anthropic.PermissionDeniedError,
    lambda: client("sk-b").messages.create(model=model, max_tokens=8, messages=one),
)
assert e.body["error"]["type"] == "permission_error", e.body
e = fails(
    anthropic.NotFoundError,
    lambda: c.messages.create(model="no-such-model", max_tokens=8, messages=one),
)
assert e.body["error"]["type"] == "not_found_error", e.body
slow = client("sk-slow")
slow.messages.create(model=model, max_tokens=8, messages=one)
e = fails(
    anthropic.RateLimitError,
    lambda: slow.messages.create(model=model, max_tokens=8, messages=one),
)
assert e.body["error"]["type"] == "rate_limit_error", e.body
down = client(url=overloaded)
try:  # the first attempt finds the instance down (502) and cools it down
    down.messages.create(model=model, max_tokens=8, messages=one)
except anthropic.APIStatusError:
    pass
e = fails(
    anthropic.OverloadedError,
    lambda: down.messages.create(model=model, max_tokens=8, messages=one),
)
assert e.body["error"]["type"] == "overloaded_error", e.body

print("ok")
