"""A three-turn conversation kept by Shield (issue 29): each turn is sent with the official openai
SDK's `responses.create(previous_response_id=…)` (the second one streamed) to the next proxy of
a fleet, given as a comma-separated list; printed as one JSON object for the Rust test."""
import json
import sys

import openai

proxies, key, route = sys.argv[1].split(","), sys.argv[2], sys.argv[3]
clients = [openai.OpenAI(base_url=f"{p}/v1", api_key=key, max_retries=0) for p in proxies]

first = clients[0].responses.create(model=route, input="my name is Ada", store=True)
with clients[1 % len(clients)].responses.stream(
    model=route, input="I live in Paris", previous_response_id=first.id
) as stream:
    second = stream.get_final_response()
third = clients[0].responses.create(model=route, input="what do you know about me?", previous_response_id=second.id)
fetched = clients[1 % len(clients)].responses.retrieve(third.id)
items = clients[1 % len(clients)].responses.input_items.list(third.id)
print(json.dumps({
    "ids": [first.id, second.id, third.id],
    "texts": [first.output_text, second.output_text, third.output_text],
    "fetched": {"id": fetched.id, "text": fetched.output_text},
    "input_items": len(items.data),
}))
