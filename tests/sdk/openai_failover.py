"""Seed §1's observable success, through the official OpenAI Python SDK.

Usage: openai_failover.py <proxy base url> <shield key> <model>
Prints one JSON object: the answer, the model and the routing headers.
"""
import json
import sys

from openai import OpenAI

base_url, key, model = sys.argv[1:4]
client = OpenAI(base_url=base_url, api_key=key, max_retries=0)
raw = client.chat.completions.with_raw_response.create(
    model=model, messages=[{"role": "user", "content": "hello from the SDK"}]
)
completion = raw.parse()
print(json.dumps({
    "content": completion.choices[0].message.content,
    "model": completion.model,
    "failovers": raw.headers.get("x-shield-failovers"),
    "target": raw.headers.get("x-shield-target"),
    "route": raw.headers.get("x-shield-route"),
}))

# An unknown key surfaces as the SDK's AuthenticationError (OpenAI error shape, 401).
try:
    OpenAI(base_url=base_url, api_key="sk-shield-wrong", max_retries=0).chat.completions.create(
        model=model, messages=[{"role": "user", "content": "x"}]
    )
    print(json.dumps({"auth": "accepted"}))
except Exception as err:  # noqa: BLE001 - the class name is the assertion
    print(json.dumps({"auth": type(err).__name__}))
