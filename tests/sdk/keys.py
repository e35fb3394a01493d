"""Issue 32 as the official SDKs meet it: each operation is a call through the OpenAI or the
Anthropic SDK with a given key, and prints one JSON line saying what the SDK made of it
(answered, or which error class with which status, code or type, message and headers).
Retries are off: a refusal shows as the SDK raised it.

Usage: keys.py <base_url without /v1> <JSON list of {sdk, op: chat|models, key, model?}>."""
import json
import sys

import anthropic
import openai

base, ops = sys.argv[1], json.loads(sys.argv[2])
HEADERS = ("x-shield-key-budget", "x-shield-tenant-budget", "retry-after", "x-should-retry")


def headers(h):
    return {name: h.get(name) for name in HEADERS if h.get(name) is not None}


def run(op):
    key, model = op["key"], op.get("model")
    if op["sdk"] == "openai":
        client = openai.OpenAI(base_url=f"{base}/v1", api_key=key, max_retries=0)
        try:
            if op["op"] == "models":
                return {"ok": True, "models": sorted(m.id for m in client.models.list())}
            raw = client.chat.completions.with_raw_response.create(
                model=model, messages=[{"role": "user", "content": "hello"}])
            return {"ok": True, "content": raw.parse().choices[0].message.content, "headers": headers(raw.headers)}
        except openai.APIStatusError as err:
            return {"ok": False, "error": type(err).__name__, "status": err.status_code, "code": err.code,
                    "message": err.message, "headers": headers(err.response.headers)}
    client = anthropic.Anthropic(base_url=base, api_key=key, max_retries=0)
    try:
        if op["op"] == "models":
            return {"ok": True, "models": sorted(m.id for m in client.models.list())}
        raw = client.messages.with_raw_response.create(
            model=model, max_tokens=16, messages=[{"role": "user", "content": "hello"}])
        return {"ok": True, "content": raw.parse().content[0].text, "headers": headers(raw.headers)}
    except anthropic.APIStatusError as err:
        return {"ok": False, "error": type(err).__name__, "status": err.status_code,
                "type": err.body["error"]["type"], "message": err.body["error"]["message"],
                "headers": headers(err.response.headers)}


for op in ops:
    print(json.dumps(run(op)), flush=True)
