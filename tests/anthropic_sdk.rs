//! Callers in Anthropic's shape (issue 16): the official `anthropic` Python SDK, unchanged,
//! against `POST /v1/messages` — sync and streaming, with and without tools — answered by an
//! Anthropic-flavoured target, by an OpenAI-flavoured one, and with a failover between them.
//! The streamed event order and usage are checked event by event. Needs
//! `python3 -m pip install anthropic` (scripts/test does it).

use serde_json::{Value, json};
use shield_e2e::stack::Stack;

async fn run_sdk(stack: &Stack, key: &str, route: &str, tools_route: &str) -> Value {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/sdk/anthropic_messages.py");
    let out = tokio::process::Command::new("python3")
        .args([script, &format!("http://{}", stack.proxy), key, route, tools_route])
        .output()
        .await
        .expect("python3 runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "the SDK script failed (is the anthropic package installed?): {stderr}");
    serde_json::from_slice(&out.stdout).expect("one JSON object")
}

fn anthropic(scenario_extra: Value) -> Value {
    let mut target = json!({"flavor": "anthropic", "auth": {"mode": "vault", "secret_ref": "shield://claude"}});
    for (k, v) in scenario_extra.as_object().into_iter().flatten() {
        target[k] = v.clone();
    }
    target
}

/// What every run must show, whichever flavor answered.
fn check(out: &Value, answered_by: &str, tools_by: &str) {
    let sync = &out["sync"];
    assert_eq!((sync["type"].as_str(), sync["role"].as_str()), (Some("message"), Some("assistant")), "{out}");
    assert_eq!(sync["stop_reason"], "end_turn");
    assert_eq!(sync["text"], "mock answer to: hello from the SDK");
    assert_eq!(sync["target"], answered_by);
    assert_eq!(sync["model"], format!("model-{answered_by}"));
    assert!(sync["usage"]["input"].as_u64().unwrap() > 0 && sync["usage"]["output"].as_u64().unwrap() > 0, "{sync}");
    assert!(sync["request_id"].as_str().is_some_and(|id| !id.is_empty()));
    assert_eq!(sync["sdk_request_id"], sync["request_id"], "Anthropic's request-id is the same id");
    let models = &out["models"];
    assert_eq!(models["types"], json!(["model"]), "{models}");
    assert!(models["ids"].as_array().unwrap().iter().any(|id| id == "gpt"), "{models}");
    assert!(models["one"].is_string(), "{models}");

    let tools = &out["tools"];
    assert_eq!(tools["stop_reason"], "tool_use", "{tools}");
    assert_eq!(tools["calls"][0]["name"], "search");
    assert_eq!(tools["calls"][0]["input"], json!({"q": "mock"}));
    assert!(tools["after_result"].is_string(), "a tool_result round trip is accepted");

    let stream = &out["stream"];
    let names: Vec<&str> = stream["events"].as_array().unwrap().iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(names.first(), Some(&"message_start"), "{names:?}");
    assert_eq!(&names[names.len() - 2..], ["message_delta", "message_stop"], "{names:?}");
    assert_eq!(names[1], "content_block_start");
    assert_eq!(names[names.len() - 3], "content_block_stop");
    assert!(names[2..names.len() - 3].iter().all(|n| *n == "content_block_delta"), "{names:?}");
    let start = &stream["events"][0];
    assert!(start["input_tokens"].as_u64().unwrap() > 0, "message_start carries real input usage, not zero: {start}");
    let delta = &stream["events"][names.len() - 2];
    assert_eq!(delta["stop_reason"], "end_turn");
    assert_eq!(delta["output_tokens"], 3, "the upstream's reported output, in message_delta");
    assert_eq!(stream["text"], "mock part1 part2 ");
    assert_eq!(stream["usage"]["output"], 3);
    assert_eq!(stream["target"], answered_by);

    let stream_tools = &out["stream_tools"];
    assert_eq!(stream_tools["stop_reason"], "tool_use", "{stream_tools} (tools answered by {tools_by})");
    assert_eq!(stream_tools["calls"], json!([{"name": "search", "input": {"q": "mock"}}]));

    assert_eq!(out["count"], 10, "40 characters at 4 a token");
    assert_eq!(out["errors"]["auth"], json!([401, "authentication_error"]));
    assert_eq!(out["errors"]["not_found"], json!([404, "not_found_error"]));
    assert_eq!(out["errors"]["bad_request"], json!([400, "invalid_request_error"]));
    assert_eq!(out["errors"]["count_not_found"], json!([404, "not_found_error"]));
    assert_eq!(out["errors"]["model_not_found"], json!([404, "not_found_error"]));
}

#[tokio::test]
async fn the_anthropic_sdk_works_unchanged_whichever_flavor_answers() {
    let stack = Stack::start().await;
    stack.put_secret("claude", &shield_e2e::unique("sk-ant-api03-"), &["127.0.0.1"]).await;
    stack.mock_target("claude", "", anthropic(json!({}))).await;
    stack.mock_target("claude-tools", "tool:search", anthropic(json!({}))).await;
    stack.mock_target("claude-down", "status:529", anthropic(json!({}))).await;
    stack.mock_target("gpt", "", json!({})).await;
    stack.mock_target("gpt-tools", "tool:search", json!({})).await;
    stack.mock_target("gpt-down", "status:503", json!({})).await;
    stack.put_route("claude-sonnet-4-5", json!({"targets": ["claude"]})).await;
    stack.put_route("claude-tools", json!({"targets": ["claude-tools"]})).await;
    stack.put_route("gpt", json!({"targets": ["gpt"]})).await;
    stack.put_route("gpt-tools", json!({"targets": ["gpt-tools"]})).await;
    stack.put_route("to-gpt", json!({"targets": ["claude-down", "gpt"]})).await;
    stack.put_route("to-claude-tools", json!({"targets": ["gpt-down", "claude-tools"]})).await;
    let (key, _) = stack.key(None).await;

    // Answered by an Anthropic-flavoured target (route names may look like model ids).
    let out = run_sdk(&stack, &key, "claude-sonnet-4-5", "claude-tools").await;
    check(&out, "claude", "claude-tools");
    assert_eq!(out["sync"]["failovers"], "0");
    // What Anthropic received from an Anthropic caller: its own fields, the system kept.
    let sent: Value = serde_json::from_str(stack.received("claude").await[0]["body"].as_str().unwrap()).unwrap();
    assert_eq!((sent["system"].clone(), sent["max_tokens"].clone()), (json!("Be brief."), json!(256)));

    // Answered by an OpenAI-flavoured target.
    let out = run_sdk(&stack, &key, "gpt", "gpt-tools").await;
    check(&out, "gpt", "gpt-tools");
    let sent: Value = serde_json::from_str(stack.received("gpt").await[0]["body"].as_str().unwrap()).unwrap();
    assert_eq!(sent["messages"][0], json!({"role": "system", "content": "Be brief."}));
    let tool_round: Value =
        serde_json::from_str(stack.received("gpt-tools").await[1]["body"].as_str().unwrap()).unwrap();
    let tool_message = tool_round["messages"].as_array().unwrap().iter().find(|m| m["role"] == "tool").cloned();
    assert_eq!(tool_message, Some(json!({"role": "tool", "tool_call_id": "call_1", "content": "x is 42"})));

    // A failover between flavors mid-run: Anthropic 529 → OpenAI; OpenAI 503 → Anthropic.
    let out = run_sdk(&stack, &key, "to-gpt", "to-claude-tools").await;
    check(&out, "gpt", "claude-tools");
    assert_eq!(out["sync"]["failovers"], "1");
}
