"""Issue 31: do two independent vLLM engines name the same block the same?
Subscribe to both engines' KV events, send each the same prompt, compare the
BlockStored hashes.

Run against engines started by `scripts/vllm.sh start 2` (its exports in the
environment), with the venv's python: `$KVGATE_VLLM_PYTHON scripts/vllm_same_hash.py`.
"""
import json, os, time, urllib.request
import zmq, msgpack

urls = os.environ["KVGATE_VLLM_URLS"].split(",")
events = os.environ["KVGATE_VLLM_EVENTS"].split(",")
model = os.environ["KVGATE_VLLM_SERVED_MODEL"]
ctx = zmq.Context()
subs = []
for e in events:
    s = ctx.socket(zmq.SUB)
    s.setsockopt(zmq.SUBSCRIBE, b"")
    s.connect(e)
    subs.append(s)
time.sleep(1.0)
prompt = "The history of the lighthouse keepers of the northern coast " * 40
for u in urls:
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": 2}).encode()
    req = urllib.request.Request(u + "/v1/completions", body, {"content-type": "application/json"})
    print(u, json.loads(urllib.request.urlopen(req, timeout=120).read())["usage"])
time.sleep(1.0)
stored = []
for s in subs:
    hashes = []
    while s.poll(200):
        frames = s.recv_multipart()
        ts, evs = msgpack.unpackb(frames[-1], raw=False)[:2]
        for ev in evs:
            kind = ev.get("type") if isinstance(ev, dict) else ev[0]
            if kind == "BlockStored":
                hashes += ev["block_hashes"] if isinstance(ev, dict) else ev[1]
    stored.append(hashes)
for i, h in enumerate(stored):
    print(f"engine {i}: {len(h)} blocks stored, first {h[:3]}")
same = sum(1 for a, b in zip(stored[0], stored[1]) if a == b)
print(f"same hash for the same block on both engines: {same} of {min(map(len, stored))}")
