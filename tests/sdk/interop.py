"""Interop with the official OpenAI Python SDK, through kvgate, against the
simulated fleet. Run by tests/demo_sdk.rs with the gateway's base URL and model."""
import sys

import openai
from openai import OpenAI

base_url, model = sys.argv[1], sys.argv[2]
client = OpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0, timeout=60)
system = "You are a helpful assistant for the ACME corporation. " * 120
messages = [{"role": "system", "content": system}, {"role": "user", "content": "Say hi."}]

# Chat, twice with the same long prefix: the second lands on the warm instance.
first = client.chat.completions.create(model=model, messages=messages, max_tokens=8)
assert first.choices[0].message.content, first
assert first.usage.prompt_tokens > 1000, first.usage
second = client.chat.completions.create(model=model, messages=messages, max_tokens=8)
cached = second.usage.prompt_tokens_details.cached_tokens
assert cached >= 0.9 * second.usage.prompt_tokens, ("repeated prefix was not cached", second.usage)

# Streaming chat with usage.
text, usage = [], None
for chunk in client.chat.completions.create(
    model=model, messages=messages, max_tokens=8, stream=True, stream_options={"include_usage": True}
):
    if chunk.choices:
        text.append(chunk.choices[0].delta.content or "")
    if chunk.usage:
        usage = chunk.usage
assert "".join(text), "no streamed text"
assert usage is not None and usage.prompt_tokens_details.cached_tokens > 0, usage

# Completions.
comp = client.completions.create(model=model, prompt="Once upon a time", max_tokens=4)
assert comp.choices[0].text, comp

# Models.
ids = [m.id for m in client.models.list()]
assert model in ids, ids

# Errors map to the SDK's exception classes.
try:
    client.chat.completions.create(model="no-such-model", messages=messages)
    raise AssertionError("unknown model accepted")
except openai.NotFoundError as e:
    assert e.status_code == 404 and e.code == "model_not_found", e
try:
    client.chat.completions.create(model=model, messages="not a list")
    raise AssertionError("bad messages accepted")
except openai.BadRequestError as e:
    assert e.status_code == 400 and e.param == "messages", e

print("ok", cached)
