"""Interop with boto3's `sagemaker-runtime`, unchanged, through kvgate with
SigV4 tenants, against the model containers of tests/http/sagemaker.rs (which
runs this with a JSON argument and checks what reached the containers).

Bodies of requests that must be refused carry MUST-NOT-ARRIVE; the Rust side
asserts no container ever saw one."""
import datetime
import json
import sys
import urllib.request
from unittest import mock

import boto3
import botocore.auth
from botocore.config import Config
from botocore.exceptions import ClientError, EventStreamError

args = json.loads(sys.argv[1])
base = args["base"]
# One attempt each: botocore would otherwise retry 5xx and throttling.
config = Config(retries={"total_max_attempts": 1}, read_timeout=60, connect_timeout=10)


def runtime(key=args["key"], secret=args["secret"]):
    return boto3.client(
        "sagemaker-runtime",
        endpoint_url=base,
        region_name="us-east-1",
        aws_access_key_id=key,
        aws_secret_access_key=secret,
        config=config,
    )


def error_of(call):
    try:
        call()
    except ClientError as e:
        return e
    raise AssertionError("the call succeeded")


sm = runtime()

# invoke_endpoint: the body reaches a container, the variant and the custom
# attributes come back.
resp = sm.invoke_endpoint(
    EndpointName="chat",
    Body=json.dumps({"inputs": "hello"}),
    ContentType="application/json",
    CustomAttributes="trace=abc",
)
answer = json.loads(resp["Body"].read())
assert answer["received"]["inputs"] == "hello", answer
assert resp["ContentType"] == "application/json", resp
assert resp["InvokedProductionVariant"] == answer["instance"], (resp, answer)
assert resp["CustomAttributes"] == "seen=trace=abc", resp

# PrefixAwareId routing: one id with one prompt prefix (the first 1024
# bytes) sticks to one instance whatever follows; different ids with that
# same prefix spread over the instances.
shared = "You are the assistant of one long conversation. " * 30
placed = {}
for i in range(12):
    pid = f"conversation-{i}"
    seen = set()
    for turn in range(3):
        r = sm.invoke_endpoint(
            EndpointName="chat",
            Body=json.dumps({"inputs": f"{shared} turn {turn}"}),
            ContentType="application/json",
            PrefixAwareId=pid,
        )
        seen.add(r["InvokedProductionVariant"])
    assert len(seen) == 1, (pid, seen)
    placed[pid] = seen.pop()
assert len(set(placed.values())) >= 2, placed

# invoke_endpoint_with_response_stream, iterated to the end. Each container
# holds its last part until released; release it only once the first four
# parts are here, so a buffering gateway would never finish correctly.
resp = sm.invoke_endpoint_with_response_stream(
    EndpointName="chat",
    Body=json.dumps({"inputs": "stream me", "stream": True}),
    ContentType="application/json",
    CustomAttributes="trace=stream",
)
assert resp["ContentType"] == "text/event-stream", resp
assert resp["CustomAttributes"] == "seen=trace=stream", resp
variant = resp["InvokedProductionVariant"]
assert variant in ("i0", "i1", "i2"), variant
got, released = b"", False
for event in resp["Body"]:
    got += event["PayloadPart"]["Bytes"]
    if not released and got.endswith(b"part-3 "):
        url = args["release"][int(variant[1:])]
        urllib.request.urlopen(url, timeout=10).read()
        released = True
assert released, got
assert got == b"part-0 part-1 part-2 part-3 part-4-final", got

# A stream that breaks off mid-way: ModelStreamError, after the first part.
resp = sm.invoke_endpoint_with_response_stream(
    EndpointName="chat",
    Body=json.dumps({"inputs": "x", "stream": True, "break": True}),
    ContentType="application/json",
)
parts = []
try:
    for event in resp["Body"]:
        parts.append(event["PayloadPart"]["Bytes"])
        # The container breaks the stream off once the first part is here.
        variant = resp["InvokedProductionVariant"]
        urllib.request.urlopen(args["release"][int(variant[1:])], timeout=10).read()
    raise AssertionError("no ModelStreamError")
except EventStreamError as e:
    assert e.response["Error"]["Code"] == "ModelStreamError", e.response
assert parts == [b"part-0 "], parts

# Modeled exceptions.
e = error_of(lambda: sm.invoke_endpoint(EndpointName="nope", Body=b'{"inputs":"MUST-NOT-ARRIVE"}', ContentType="application/json"))
assert isinstance(e, sm.exceptions.ValidationError), e
assert e.response["ResponseMetadata"]["HTTPStatusCode"] == 400
assert "nope" in e.response["Error"]["Message"], e.response
e = error_of(lambda: sm.invoke_endpoint(EndpointName="chat", Body=b'{"inputs": MUST-NOT-ARRIVE', ContentType="application/json"))
assert isinstance(e, sm.exceptions.ValidationError), e
e = error_of(lambda: sm.invoke_endpoint(EndpointName="chat", Body=b"MUST-NOT-ARRIVE,1", ContentType="text/csv"))
assert isinstance(e, sm.exceptions.ValidationError), e
big = json.dumps({"inputs": "MUST-NOT-ARRIVE" + "a" * 70000})
# Its own client: kvgate answers an oversized body without reading it and the
# connection may close under botocore's pool (issue 11, item 6).
e = error_of(lambda: runtime().invoke_endpoint_with_response_stream(EndpointName="chat", Body=big, ContentType="application/json"))
assert isinstance(e, sm.exceptions.ValidationError), e
e = error_of(lambda: sm.invoke_endpoint(EndpointName="chat", Body=b'{"fail": 500}', ContentType="application/json"))
assert isinstance(e, sm.exceptions.ModelError), e
assert e.response["ResponseMetadata"]["HTTPStatusCode"] == 424
assert e.response["OriginalStatusCode"] == 500 and e.response["OriginalMessage"] == "boom", e.response
e = error_of(lambda: sm.invoke_endpoint(EndpointName="down", Body=b'{"inputs":"x"}', ContentType="application/json"))
assert isinstance(e, sm.exceptions.ModelError), e
e = error_of(lambda: sm.invoke_endpoint(EndpointName="down", Body=b'{"inputs":"x"}', ContentType="application/json"))
assert isinstance(e, sm.exceptions.ServiceUnavailable), e
assert e.response["ResponseMetadata"]["HTTPStatusCode"] == 503

# Throttling: the `limited` tenant may make one request a minute.
limited = runtime(args["limited_key"], args["limited_secret"])
limited.invoke_endpoint(EndpointName="chat", Body=b'{"inputs":"x"}', ContentType="application/json")
e = error_of(lambda: limited.invoke_endpoint(EndpointName="chat", Body=b'{"inputs":"MUST-NOT-ARRIVE"}', ContentType="application/json"))
assert e.response["Error"]["Code"] == "ThrottlingException", e.response
assert e.response["ResponseMetadata"]["HTTPStatusCode"] == 429

# SigV4: a wrong secret, an unknown key, a signature 20 minutes old, a body
# changed after signing. Each is a 403 with AWS's code, and forwards nothing.
refused = json.dumps({"inputs": "MUST-NOT-ARRIVE"})
e = error_of(lambda: runtime(secret="not-the-secret-0123456789").invoke_endpoint(EndpointName="chat", Body=refused, ContentType="application/json"))
assert e.response["Error"]["Code"] == "InvalidSignatureException", e.response
assert e.response["ResponseMetadata"]["HTTPStatusCode"] == 403
e = error_of(lambda: runtime(key="AKIANOBODYHERE").invoke_endpoint(EndpointName="chat", Body=refused, ContentType="application/json"))
assert e.response["Error"]["Code"] == "UnrecognizedClientException", e.response
assert e.response["ResponseMetadata"]["HTTPStatusCode"] == 403

stale = datetime.datetime.now(datetime.timezone.utc).replace(tzinfo=None) - datetime.timedelta(minutes=20)
with mock.patch.object(botocore.auth, "get_current_datetime", return_value=stale):
    e = error_of(lambda: sm.invoke_endpoint(EndpointName="chat", Body=refused, ContentType="application/json"))
assert e.response["Error"]["Code"] == "InvalidSignatureException", e.response
assert "expired" in e.response["Error"]["Message"], e.response

tamperer = runtime()


def tamper(request, **_):
    # After signing, before sending: same length, different bytes.
    body = request.body
    request.body = body.replace(b"ARRIVE", b"arrive") if isinstance(body, bytes) else body.replace("ARRIVE", "arrive")


tamperer.meta.events.register("before-send.sagemaker-runtime.InvokeEndpoint", tamper)
e = error_of(lambda: tamperer.invoke_endpoint(EndpointName="chat", Body=refused, ContentType="application/json"))
assert e.response["Error"]["Code"] == "InvalidSignatureException", e.response

# The valid tenant is still served.
sm.invoke_endpoint(EndpointName="chat", Body=b'{"inputs":"still here"}', ContentType="application/json")
print("ok")
