"""The official openai SDK's `responses.create` and `responses.stream` against Shield (issue 29):
a text answer, a function call and a streamed answer; or, with a fourth argument
`structured`, structured output through `responses.parse(text_format=…)`, non-streamed and
streamed. Printed as one JSON object for the Rust test to check."""
import json
import sys

import openai
import pydantic

base, key, route = sys.argv[1], sys.argv[2], sys.argv[3]
client = openai.OpenAI(base_url=f"{base}/v1", api_key=key, max_retries=0)


class City(pydantic.BaseModel):
    name: str
    population: int
    capital: bool


if sys.argv[4:] == ["structured"]:
    parsed = client.responses.parse(model=route, input="describe Paris", text_format=City, store=False)
    with client.responses.stream(model=route, input="describe Lyon", text_format=City, store=False) as stream:
        streamed = stream.get_final_response()
    print(json.dumps({"parsed": parsed.output_parsed.model_dump(), "streamed": streamed.output_parsed.model_dump()}))
    sys.exit(0)
text = client.responses.create(model=route, instructions="Be brief.", input="hello from the SDK", store=False)
tools = client.responses.create(
    model=route,
    input=[{"role": "user", "content": [{"type": "input_text", "text": "find x"}]}],
    tools=[{"type": "function", "name": "search", "description": "d", "parameters": {"type": "object"}}],
)
calls = [item for item in tools.output if item.type == "function_call"]
with client.responses.stream(model=route, input="hello streamed") as stream:
    streamed = stream.get_final_response()
print(json.dumps({
    "text": text.output_text,
    "status": text.status,
    "input_tokens": text.usage.input_tokens,
    "call": {"name": calls[0].name, "arguments": calls[0].arguments} if calls else None,
    "streamed": streamed.output_text if streamed.output and streamed.output[0].type == "message" else streamed.output[0].type,
}))
