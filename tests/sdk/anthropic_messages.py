"""The official Anthropic Python SDK against Shield's /v1/messages, unchanged.

Usage: anthropic_messages.py <proxy base url> <shield key> <route> <route whose model calls tools>
Prints one JSON object per case (sync, sync with tools, stream event by event, stream with
tools), each with what the SDK parsed and Shield's routing headers.
"""
import json
import sys

import anthropic

base_url, key, route, tools_route = sys.argv[1:5]
client = anthropic.Anthropic(base_url=base_url, api_key=key, max_retries=0)
TOOLS = [{"name": "search", "description": "Search the web",
          "input_schema": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}}]
out = {}

raw = client.messages.with_raw_response.create(
    model=route, max_tokens=256, system="Be brief.", messages=[{"role": "user", "content": "hello from the SDK"}])
message = raw.parse()
out["sync"] = {
    "type": message.type, "role": message.role, "model": message.model, "stop_reason": message.stop_reason,
    "text": "".join(b.text for b in message.content if b.type == "text"),
    "usage": {"input": message.usage.input_tokens, "output": message.usage.output_tokens},
    "target": raw.headers.get("x-shield-target"), "failovers": raw.headers.get("x-shield-failovers"),
    "route": raw.headers.get("x-shield-route"), "request_id": raw.headers.get("x-request-id"),
    # What the SDK reads as the request id (Anthropic's `request-id` header).
    "sdk_request_id": message._request_id,
}

# The model list and one model, in Anthropic's shape (the SDK sends anthropic-version).
models = client.models.list()
out["models"] = {"ids": [m.id for m in models.data], "types": sorted({m.type for m in models.data}),
                 "one": client.models.retrieve(route).id}

# A tool round: the model calls `search`, the caller answers with a tool_result.
first = client.messages.create(model=tools_route, max_tokens=256, tools=TOOLS,
                               messages=[{"role": "user", "content": "find x"}])
calls = [b for b in first.content if b.type == "tool_use"]
second = client.messages.create(model=tools_route, max_tokens=256, tools=TOOLS, messages=[
    {"role": "user", "content": "find x"},
    {"role": "assistant", "content": [b.model_dump() for b in first.content]},
    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": calls[0].id if calls else "none", "content": "x is 42"}]},
])
out["tools"] = {
    "stop_reason": first.stop_reason,
    "calls": [{"id": c.id, "name": c.name, "input": c.input} for c in calls],
    "after_result": second.stop_reason,
}

# A stream, event by event.
events = []
with client.messages.stream(model=route, max_tokens=256, messages=[{"role": "user", "content": "stream please"}]) as stream:
    for event in stream:
        events.append({"type": event.type, **({"index": event.index} if hasattr(event, "index") else {})})
        if event.type == "message_start":
            events[-1]["input_tokens"] = event.message.usage.input_tokens
        if event.type == "message_delta":
            events[-1]["stop_reason"] = event.delta.stop_reason
            events[-1]["output_tokens"] = event.usage.output_tokens
    final = stream.get_final_message()
    headers = stream.response.headers
out["stream"] = {
    "events": [e for e in events if e["type"] in
               ("message_start", "content_block_start", "content_block_delta", "content_block_stop", "message_delta", "message_stop")],
    "text": "".join(b.text for b in final.content if b.type == "text"),
    "usage": {"input": final.usage.input_tokens, "output": final.usage.output_tokens},
    "stop_reason": final.stop_reason, "target": headers.get("x-shield-target"),
}

# A stream with tools: the input arrives as JSON deltas and the SDK assembles it.
with client.messages.stream(model=tools_route, max_tokens=256, tools=TOOLS,
                            messages=[{"role": "user", "content": "find y"}]) as stream:
    final = stream.get_final_message()
out["stream_tools"] = {"stop_reason": final.stop_reason,
                       "calls": [{"name": b.name, "input": b.input} for b in final.content if b.type == "tool_use"]}

# Token counting.
out["count"] = client.messages.count_tokens(model=route, messages=[{"role": "user", "content": "x" * 40}]).input_tokens

# Errors surface as the SDK's own exception types.
errors = {}
try:
    anthropic.Anthropic(base_url=base_url, api_key="sk-shield-wrong", max_retries=0).messages.create(
        model=route, max_tokens=5, messages=[{"role": "user", "content": "x"}])
except anthropic.AuthenticationError as e:
    errors["auth"] = [e.status_code, e.body["error"]["type"] if isinstance(e.body, dict) else None]
try:
    client.messages.create(model="no-such-route", max_tokens=5, messages=[{"role": "user", "content": "x"}])
except anthropic.NotFoundError as e:
    errors["not_found"] = [e.status_code, e.body["error"]["type"] if isinstance(e.body, dict) else None]
try:
    client.messages.create(model=route, max_tokens=5, messages=[])
except anthropic.BadRequestError as e:
    errors["bad_request"] = [e.status_code, e.body["error"]["type"] if isinstance(e.body, dict) else None]
try:
    client.messages.count_tokens(model="no-such-route", messages=[{"role": "user", "content": "x"}])
except anthropic.NotFoundError as e:
    errors["count_not_found"] = [e.status_code, e.body["error"]["type"] if isinstance(e.body, dict) else None]
try:
    client.models.retrieve("no-such-route")
except anthropic.NotFoundError as e:
    errors["model_not_found"] = [e.status_code, e.body["error"]["type"] if isinstance(e.body, dict) else None]
out["errors"] = errors
print(json.dumps(out))
