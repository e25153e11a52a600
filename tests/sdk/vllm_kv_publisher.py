"""A stand-in for vLLM's KV-event publisher on real libzmq (pyzmq) and msgspec,
the libraries vLLM itself uses: a PUB socket sending [topic, seq, payload] and a
ROUTER replay socket answering [b"", start_seq] with the buffered batches as
[b"", topic, seq, payload] and an end marker [b"", b"", -1, b""], as vLLM 0.32's
_service_replay does. The event structs are declared the way vLLM declares them, in the
encoding named on the command line:

  array  vLLM <= 0.10: msgspec array_like tagged structs, int block hashes
  map    current vLLM: tagged structs as maps ("type" member), bytes block hashes

Prints {"events": ..., "replay": ...} on its first line, then reads one JSON
command per line on stdin:
  {"store": {"hashes": [..], "parent": h|null, "tokens": [..], "block_size": 16}}
  {"remove": [..]}
  {"empty": true}
  {"skip": <any of the above>}   buffered for replay, not published (a gap)
Each command is one batch; "ok <seq>" is printed when it is sent.
"""

import json
import sys
import time

import msgspec
import zmq

ENCODING = sys.argv[1] if len(sys.argv) > 1 else "map"
ARRAY = ENCODING == "array"


class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list


if ARRAY:

    class KVCacheEvent(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
        pass

    class BlockStored(KVCacheEvent):
        block_hashes: list[int]
        parent_block_hash: int | None
        token_ids: list[int]
        block_size: int
        lora_id: int | None
        medium: str | None

else:

    class KVCacheEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
        pass

    class BlockStored(KVCacheEvent):
        block_hashes: list[bytes]
        parent_block_hash: bytes | None
        token_ids: list[int]
        block_size: int
        lora_id: int | None
        medium: str | None
        lora_name: str | None
        extra_keys: list | None = None
        group_idx: int | None = None


class BlockRemoved(KVCacheEvent):
    block_hashes: list
    medium: str | None


def h(x):
    return x if ARRAY else int(x).to_bytes(32, "big")


def event(cmd):
    if "store" in cmd:
        s = cmd["store"]
        parent = None if s["parent"] is None else h(s["parent"])
        fields = dict(
            block_hashes=[h(x) for x in s["hashes"]],
            parent_block_hash=parent,
            token_ids=s["tokens"],
            block_size=s["block_size"],
            lora_id=None,
            medium="GPU",
        )
        if not ARRAY:
            fields["lora_name"] = None
        return [BlockStored(**fields)]
    if "remove" in cmd:
        return [BlockRemoved(block_hashes=[h(x) for x in cmd["remove"]], medium="GPU")]
    return []


def main():
    ctx = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    pub_port = pub.bind_to_random_port("tcp://127.0.0.1")
    router = ctx.socket(zmq.ROUTER)
    router_port = router.bind_to_random_port("tcp://127.0.0.1")
    print(json.dumps({"events": f"tcp://127.0.0.1:{pub_port}", "replay": f"tcp://127.0.0.1:{router_port}"}), flush=True)
    enc = msgspec.msgpack.Encoder()
    buffer = []
    seq = 0
    poller = zmq.Poller()
    poller.register(router, zmq.POLLIN)
    poller.register(sys.stdin, zmq.POLLIN)
    while True:
        for sock, _ in poller.poll():
            if sock is router:
                frames = router.recv_multipart()
                if len(frames) != 3:
                    continue
                client, _, start = frames
                start = int.from_bytes(start, "big")
                for s, payload in buffer:
                    if s >= start:
                        router.send_multipart((client, b"", b"", s.to_bytes(8, "big"), payload))
                router.send_multipart((client, b"", b"", (-1).to_bytes(8, "big", signed=True), b""))
            else:
                line = sys.stdin.readline()
                if not line:
                    return
                cmd = json.loads(line)
                publish = "skip" not in cmd
                cmd = cmd.get("skip", cmd)
                payload = enc.encode(EventBatch(ts=time.time(), events=event(cmd)))
                buffer.append((seq, payload))
                if publish:
                    pub.send_multipart((b"", seq.to_bytes(8, "big"), payload))
                print(f"ok {seq}", flush=True)
                seq += 1


if __name__ == "__main__":
    main()
