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

# The Responses API: a follow-up lands where its history is cached.
first = client.responses.create(model=model, instructions=system, input="Say hi.", max_output_tokens=8)
assert first.output_text and first.id.startswith("resp_kvg1_"), first
follow = client.responses.create(model=model, input="And again.", previous_response_id=first.id, max_output_tokens=8)
assert follow.previous_response_id == first.id, follow
details = follow.usage.input_tokens_details
assert details.cached_tokens >= 0.8 * follow.usage.input_tokens, ("history not cached", follow.usage)
assert client.responses.retrieve(follow.id).output_text == follow.output_text
deltas, done = [], None
with client.responses.stream(model=model, input="Stream.", previous_response_id=follow.id, max_output_tokens=8) as stream:
    for event in stream:
        if event.type == "response.output_text.delta":
            deltas.append(event.delta)
        elif event.type == "response.completed":
            done = event.response
assert done is not None and "".join(deltas) == done.output_text, (deltas, done)

# Embeddings and one model.
emb = client.embeddings.create(model=model, input=["a", "b c"])
assert len(emb.data) == 2 and len(emb.data[1].embedding) == 8, emb
assert client.models.retrieve(model).id == model

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
