"""The official OpenAI Python SDK through kvgate against the test upstreams
(tests/common): the Responses API (plain, streamed, follow-ups landing on the
instance that stored the response, retrieve), embeddings and models.retrieve.
Run by tests/http/sdk.rs with the gateway's base URL and model."""
import sys

import openai
from openai import OpenAI

base_url, model = sys.argv[1], sys.argv[2]
client = OpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0, timeout=30)

first = client.responses.create(model=model, instructions="Be brief.", input="Say hi.")
assert first.id.startswith("resp_kvg1_"), first.id
home = first.output_text.removeprefix("hi from ")
assert home.startswith("u"), first.output_text
assert first.usage.output_tokens == 3, first.usage

# Streaming: the events' ids are kvgate's, the text arrives as deltas.
created, deltas, completed = None, [], None
with client.responses.stream(model=model, input="Stream please.") as stream:
    for event in stream:
        if event.type == "response.created":
            created = event.response.id
        elif event.type == "response.output_text.delta":
            deltas.append(event.delta)
        elif event.type == "response.completed":
            completed = event.response
assert created and created.startswith("resp_kvg1_"), created
assert completed.id == created, (completed.id, created)
assert "".join(deltas).startswith("hi from u"), deltas
streamed = client.responses.create(model=model, input="Raw stream.", stream=True)
kinds = [e.type for e in streamed]
assert kinds[0] == "response.created" and kinds[-1] == "response.completed", kinds
assert "response.output_text.delta" in kinds, kinds

# Follow-ups with other prompts land where the first was stored.
prev = first.id
for turn in range(6):
    nxt = client.responses.create(model=model, input=f"Turn {turn}: " + "more " * (turn * 40), previous_response_id=prev)
    assert nxt.output_text == f"hi from {home}", (turn, nxt.output_text, home)
    assert nxt.previous_response_id == prev
    prev = nxt.id
got = client.responses.retrieve(prev)
assert got.id == prev and got.output_text == f"hi from {home}", got

try:
    client.responses.create(model=model, input="x", previous_response_id="resp_unknown")
    raise AssertionError("unknown previous_response_id accepted")
except openai.NotFoundError as e:
    assert e.code == "response_not_found" and e.param == "previous_response_id", e

emb = client.embeddings.create(model=model, input=["a", "b"])
assert len(emb.data) == 2 and len(emb.data[0].embedding) == 3, emb
assert emb.usage.prompt_tokens == 3, emb.usage

m = client.models.retrieve(model)
assert m.id == model, m
try:
    client.models.retrieve("org/no-such-model")
    raise AssertionError("unknown model retrieved")
except openai.NotFoundError as e:
    assert e.status_code == 404, e

print("ok", home)
