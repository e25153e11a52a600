"""The official OpenAI Python SDK, through kvgate, against real llama.cpp
servers (SmolLM2-135M). Run by tests/llama.rs with the gateway's base URL and
model name. Prints one JSON line, the figures the Rust side checks.

A random nonce opens the system prompt so that no earlier run, nor the RAM
prompt cache, can make the first request warm.
"""
import json
import secrets
import sys
import time

from openai import OpenAI

base_url, model = sys.argv[1], sys.argv[2]
client = OpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0, timeout=300)
nonce = secrets.token_hex(8)
# About 1,400 SmolLM2 tokens; the nonce leads the prefix kvgate hashes.
system = f"Session {nonce}. " + "You are a helpful assistant for the ACME corporation. " * 125


def stream(question):
    """Stream one chat completion; return (seconds to first chunk, text, usage)."""
    messages = [{"role": "system", "content": system}, {"role": "user", "content": question}]
    start = time.perf_counter()
    first, text, usage = None, [], None
    for chunk in client.chat.completions.create(
        model=model,
        messages=messages,
        max_tokens=8,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    ):
        if first is None:
            first = time.perf_counter() - start
        if chunk.choices:
            text.append(chunk.choices[0].delta.content or "")
        if chunk.usage:
            usage = chunk.usage
    assert usage is not None, "no usage chunk (stream_options.include_usage) came through kvgate"
    assert usage.prompt_tokens_details is not None, ("no prompt_tokens_details", usage)
    return first, "".join(text), usage


cold_ttft, cold_text, cold = stream("Say hi.")
assert cold_text, "no streamed text"
assert cold.prompt_tokens > 1000, cold
cold_cached = cold.prompt_tokens_details.cached_tokens or 0
# Only the chat template's opening tokens can match an older prompt.
assert cold_cached < 0.1 * cold.prompt_tokens, ("a fresh prefix was already cached", cold)

warm_ttft, warm_text, warm = stream("Say bye.")
assert warm_text, "no streamed text"
warm_cached = warm.prompt_tokens_details.cached_tokens or 0
assert warm_cached > 0, ("repeated prefix was not cached", warm)
assert warm_cached >= 0.9 * warm.prompt_tokens, ("repeated prefix mostly uncached", warm)

# Not streamed: the same usage shape.
plain = client.chat.completions.create(
    model=model,
    messages=[{"role": "system", "content": system}, {"role": "user", "content": "Say yes."}],
    max_tokens=4,
    temperature=0,
)
assert plain.choices[0].message.content is not None, plain
plain_cached = plain.usage.prompt_tokens_details.cached_tokens or 0
assert plain_cached >= 0.9 * plain.usage.prompt_tokens, ("repeated prefix mostly uncached", plain.usage)

print(
    json.dumps(
        {
            "ok": True,
            "prompt_tokens": warm.prompt_tokens,
            "cold": {"ttft_s": round(cold_ttft, 3), "cached_tokens": cold_cached},
            "warm": {"ttft_s": round(warm_ttft, 3), "cached_tokens": warm_cached},
            "plain_cached_tokens": plain_cached,
        }
    )
)
