"""The official OpenAI and Anthropic SDKs against a Shield route limited to 2 requests a
minute: the first two calls answer and carry x-ratelimit-* headers the SDK exposes; the third
raises each SDK's RateLimitError with Shield's message and Retry-After. Retries are off, so
the SDKs' own backoff (which honours Retry-After) does not wait a minute.

Usage: rate_limits.py <base_url without /v1> <key> <route>. Prints one JSON line per call."""
import json
import sys

import anthropic
import openai

base, key, route = sys.argv[1], sys.argv[2], sys.argv[3]
oa = openai.OpenAI(base_url=f"{base}/v1", api_key=key, max_retries=0)
an = anthropic.Anthropic(base_url=base, api_key=key, max_retries=0)

raw = oa.chat.completions.with_raw_response.create(
    model=route, messages=[{"role": "user", "content": "one"}])
print(json.dumps({"sdk": "openai", "ok": True, "limit": raw.headers.get("x-ratelimit-limit-requests"),
                  "remaining": raw.headers.get("x-ratelimit-remaining-requests"),
                  "reset": raw.headers.get("x-ratelimit-reset-requests"),
                  "content": raw.parse().choices[0].message.content}))
raw = an.messages.with_raw_response.create(
    model=route, max_tokens=16, messages=[{"role": "user", "content": "two"}])
print(json.dumps({"sdk": "anthropic", "ok": True, "remaining": raw.headers.get("x-ratelimit-remaining-requests"),
                  "content": raw.parse().content[0].text}))
try:
    oa.chat.completions.create(model=route, messages=[{"role": "user", "content": "three"}])
    print(json.dumps({"sdk": "openai", "ok": True}))
except openai.RateLimitError as err:
    print(json.dumps({"sdk": "openai", "error": type(err).__name__, "status": err.status_code,
                      "code": err.code, "retry_after": err.response.headers.get("retry-after"),
                      "message": err.message}))
try:
    an.messages.create(model=route, max_tokens=16, messages=[{"role": "user", "content": "four"}])
    print(json.dumps({"sdk": "anthropic", "ok": True}))
except anthropic.RateLimitError as err:
    print(json.dumps({"sdk": "anthropic", "error": type(err).__name__, "status": err.status_code,
                      "type": err.body["error"]["type"], "retry_after": err.response.headers.get("retry-after")}))
