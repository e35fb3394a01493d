"""Claude-Code-shaped requests for the agent benchmark (issue 33), in both API shapes.

What Claude Code sends on a turn (CLAUDE_CODE.md): a long system prompt in parts, two dozen
tool schemas, and the whole conversation so far — user turns, assistant text with tool calls,
and tool results (file contents, command output). `conversation(size)` builds one of about
`size` bytes (as Anthropic Messages JSON) and returns it with its Chat Completions twin: the
same system prompt, tools and history, with `tool_calls` and `tool` messages.

The text is code-like prose from a fixed vocabulary, drawn by a seeded generator: the same
seed gives the same bytes, and nothing in it is a finding for the PII or secrets detectors
(so the guardrails scan it all and flag nothing, as with most real traffic).
"""
import json
import random

VOCABULARY = (
    "the function returns a value when called with config path error handler request struct impl let match "
    "Some None Ok Err self async await fn pub use crate mod test assert_eq! vec![1,2,3] String::new() { } => // "
    "if else return file line read write buffer stream token route target tenant budget guardrail retry "
    "timeout status header body json parse render answer message tool result usage cost cache key"
).split()

TOOL_NAMES = [
    "Task", "Bash", "Glob", "Grep", "LS", "ExitPlanMode", "Read", "Edit", "MultiEdit", "Write", "NotebookEdit",
    "WebFetch", "TodoWrite", "WebSearch", "BashOutput", "KillShell", "SlashCommand", "ListMcpResources",
    "ReadMcpResource", "mcp__ide__getDiagnostics", "mcp__ide__executeCode", "AskUserQuestion", "Skill", "EnterPlanMode",
]


def _text(rng, size):
    words = []
    length = 0
    while length < size:
        line = " ".join(rng.choice(VOCABULARY) for _ in range(rng.randint(8, 14)))
        line = f"{line} // line {rng.randint(1, 9999)}"
        words.append(line)
        length += len(line) + 1
    return "\n".join(words)


def _tools(rng):
    tools = []
    for name in TOOL_NAMES:
        properties = {
            f"param_{i}": {"type": rng.choice(["string", "integer", "boolean"]), "description": _text(rng, 120)}
            for i in range(4)
        }
        tools.append({"name": name, "description": _text(rng, 700),
                      "input_schema": {"type": "object", "properties": properties, "required": ["param_0"],
                                       "additionalProperties": False, "$schema": "http://json-schema.org/draft-07/schema#"}})
    return tools


def conversation(size, seed=1, model="agent", stream=False):
    """(anthropic_body, openai_body) of about `size` bytes (the Anthropic one)."""
    rng = random.Random(seed)
    system = [
        {"type": "text", "text": "You are Claude Code, Anthropic's official CLI for Claude."},
        {"type": "text", "text": _text(rng, 14_000), "cache_control": {"type": "ephemeral"}},
    ]
    tools = _tools(rng)
    messages = [{"role": "user", "content": [{"type": "text", "text": "<system-reminder>" + _text(rng, 2_000) + "</system-reminder>"},
                                             {"type": "text", "text": _text(rng, 300)}]}]
    body = {"model": model, "max_tokens": 32000, "system": system, "tools": tools, "messages": messages,
            "metadata": {"user_id": f"user_bench_session_{seed}"}, "stream": stream}
    turn = 0
    while len(json.dumps(body)) < size:
        turn += 1
        call = f"toolu_{seed:04d}{turn:05d}"
        tool = rng.choice(["Read", "Grep", "Bash", "Glob"])
        messages.append({"role": "assistant", "content": [
            {"type": "text", "text": _text(rng, 200)},
            {"type": "tool_use", "id": call, "name": tool, "input": {"param_0": f"src/module_{turn}.rs"}}]})
        messages.append({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": call, "content": _text(rng, rng.randint(2_000, 6_000))}]})
        if turn % 3 == 0:
            messages.append({"role": "assistant", "content": [{"type": "text", "text": _text(rng, 400)}]})
            messages.append({"role": "user", "content": [{"type": "text", "text": _text(rng, 200)}]})
    if messages[-1]["role"] == "assistant":
        messages.append({"role": "user", "content": [{"type": "text", "text": "continue"}]})
    return body, to_openai(body)


def to_openai(body):
    """The same request in Chat Completions' shape."""
    messages = [{"role": "system", "content": "\n".join(part["text"] for part in body["system"])}]
    for message in body["messages"]:
        texts = [p["text"] for p in message["content"] if p["type"] == "text"]
        calls = [p for p in message["content"] if p["type"] == "tool_use"]
        results = [p for p in message["content"] if p["type"] == "tool_result"]
        for result in results:
            messages.append({"role": "tool", "tool_call_id": result["tool_use_id"], "content": result["content"]})
        if message["role"] == "assistant":
            out = {"role": "assistant", "content": "\n".join(texts) or None}
            if calls:
                out["tool_calls"] = [{"id": c["id"], "type": "function",
                                      "function": {"name": c["name"], "arguments": json.dumps(c["input"])}} for c in calls]
            messages.append(out)
        elif texts:
            messages.append({"role": "user", "content": [{"type": "text", "text": t} for t in texts]})
    tools = [{"type": "function", "function": {"name": t["name"], "description": t["description"],
                                                "parameters": t["input_schema"]}} for t in body["tools"]]
    return {"model": body["model"], "max_tokens": body["max_tokens"], "messages": messages, "tools": tools,
            "stream": body["stream"], "user": body["metadata"]["user_id"]}


if __name__ == "__main__":
    import sys
    anthropic, openai = conversation(int(sys.argv[1]) if len(sys.argv) > 1 else 150_000)
    print(len(json.dumps(anthropic)), len(json.dumps(openai)), len(anthropic["messages"]), len(anthropic["tools"]))
