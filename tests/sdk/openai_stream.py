"""Streams a completion through Shield with the official OpenAI Python SDK's iterator.

Usage: openai_stream.py <proxy base url> <shield key> <model>
Prints {"content", "model", "failovers"} as JSON.
"""
import json
import sys

from openai import OpenAI

base_url, key, model = sys.argv[1:4]
client = OpenAI(base_url=base_url, api_key=key, max_retries=0)
raw = client.chat.completions.with_raw_response.create(
    model=model, messages=[{"role": "user", "content": "hello"}], stream=True
)
content, seen_model = "", None
for chunk in raw.parse():
    seen_model = chunk.model
    if chunk.choices and chunk.choices[0].delta.content:
        content += chunk.choices[0].delta.content
print(json.dumps({"content": content, "model": seen_model, "failovers": raw.headers.get("x-shield-failovers")}))
