//! `POST /v1/responses` (issue 29, first part): callers in
//! OpenAI's Responses shape reach OpenAI- and Anthropic-flavour targets through the one
//! pipeline; input items, function and custom (freeform) tools, tool results and dropped tool
//! types map as the module says; the official openai SDK's `responses.create` reads the
//! answers, streamed and not. Stored responses are refused by name until they exist.

use reqwest::StatusCode;
use serde_json::{Value, json};
use shield_e2e::stack::Stack;

async fn post(stack: &Stack, key: &str, body: Value) -> (StatusCode, reqwest::header::HeaderMap, Value) {
    let response = stack
        .client
        .post(format!("http://{}/v1/responses", stack.proxy))
        .bearer_auth(key)
        .json(&body)
        .send()
        .await
        .unwrap();
    let (status, headers) = (response.status(), response.headers().clone());
    let text = response.text().await.unwrap();
    stack.evidence.response("POST proxy /v1/responses", status, &headers, &text);
    (status, headers, serde_json::from_str(&text).unwrap_or(Value::Null))
}

fn sent(received: &[Value]) -> Value {
    serde_json::from_str(received.last().unwrap()["body"].as_str().unwrap()).unwrap()
}

#[tokio::test]
async fn responses_reach_every_flavor_with_tools_and_results() {
    let stack = Stack::start().await;
    for (id, scenario, extra) in [
        ("r-gpt", "", json!({})),
        ("r-claude", "", json!({"flavor": "anthropic"})),
        ("r-gpt-tool", "tool:search", json!({})),
        ("r-claude-tool", "tool:search", json!({"flavor": "anthropic"})),
    ] {
        stack.mock_target(id, scenario, extra).await;
        stack.put_route(id, json!({"targets": [id]})).await;
    }
    let (key, _) = stack.key(None).await;

    for route in ["r-gpt", "r-claude"] {
        // Text, with instructions and a tool type no target serves (dropped, named).
        let body = json!({"model": route, "instructions": "Be brief.", "input": "hello", "store": false,
            "tools": [{"type": "web_search"}], "prompt_cache_key": "t1", "include": ["reasoning.encrypted_content"]});
        let (status, headers, answer) = post(&stack, &key, body).await;
        assert_eq!(status, StatusCode::OK, "{route}: {answer}");
        assert_eq!((answer["object"].as_str(), answer["status"].as_str()), (Some("response"), Some("completed")));
        assert_eq!(answer["output"][0]["type"], "message");
        assert_eq!(answer["output"][0]["content"][0]["text"], "mock answer to: hello", "{route}");
        assert!(answer["usage"]["input_tokens"].as_u64().unwrap() > 0);
        assert_eq!(headers["x-shield-dropped-fields"], "tools (web_search)");
        assert_eq!(headers["x-shield-target"], route);
        let upstream = sent(&stack.received(route).await);
        if route == "r-gpt" {
            assert_eq!(
                upstream["messages"],
                json!([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hello"}])
            );
        } else {
            assert_eq!(upstream["system"], json!([{"type": "text", "text": "Be brief."}]));
            assert_eq!(upstream["messages"], json!([{"role": "user", "content": [{"type": "text", "text": "hello"}]}]));
        }
        assert!(upstream.get("tools").is_none(), "the dropped tool is not sent");

        // A tool call's result comes back in the target's own shape.
        let body = json!({"model": route, "input": [
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "find x"}]},
            {"type": "function_call", "call_id": "call_7", "name": "search", "arguments": "{\"q\":\"x\"}"},
            {"type": "function_call_output", "call_id": "call_7", "output": "result 42"},
            {"type": "reasoning", "summary": [], "encrypted_content": "not Shield's"}]});
        let (status, _, answer) = post(&stack, &key, body).await;
        assert_eq!(status, StatusCode::OK, "{route}: {answer}");
        let upstream = sent(&stack.received(route).await);
        assert!(!upstream.to_string().contains("not Shield's"), "reasoning items are not forwarded");
        if route == "r-gpt" {
            assert_eq!(upstream["messages"][1]["tool_calls"][0]["id"], "call_7");
            assert_eq!(
                upstream["messages"][2],
                json!({"role": "tool", "tool_call_id": "call_7", "content": "result 42"})
            );
        } else {
            assert_eq!(upstream["messages"][1]["content"][0]["type"], "tool_use");
            assert_eq!(upstream["messages"][2]["content"][0]["tool_use_id"], "call_7");
        }

        // The model calls a function tool, and a freeform (custom) one.
        let tool_route = format!("{route}-tool");
        let body = json!({"model": tool_route, "input": "find x",
            "tools": [{"type": "function", "name": "search", "parameters": {"type": "object"}}]});
        let (status, _, answer) = post(&stack, &key, body).await;
        assert_eq!(status, StatusCode::OK, "{answer}");
        let call = &answer["output"][0];
        assert_eq!((call["type"].as_str(), call["name"].as_str()), (Some("function_call"), Some("search")));
        assert_eq!(serde_json::from_str::<Value>(call["arguments"].as_str().unwrap()).unwrap(), json!({"q": "mock"}));
        let body = json!({"model": tool_route, "input": "patch it",
            "tools": [{"type": "custom", "name": "search", "description": "freeform"}]});
        let (status, _, answer) = post(&stack, &key, body).await;
        assert_eq!(status, StatusCode::OK, "{answer}");
        assert_eq!(answer["output"][0]["type"], "custom_tool_call");
        let upstream = sent(&stack.received(&tool_route).await);
        let schema = if route == "r-gpt" {
            &upstream["tools"][0]["function"]["parameters"]
        } else {
            &upstream["tools"][0]["input_schema"]
        };
        assert_eq!(schema["required"], json!(["input"]), "a freeform tool as a function of one string");
    }

    // Streamed, over each flavor: the event sequence, one terminal event, no [DONE].
    for route in ["r-gpt", "r-claude", "r-claude-tool"] {
        let response = stack
            .client
            .post(format!("http://{}/v1/responses", stack.proxy))
            .bearer_auth(&key)
            .json(&json!({"model": route, "input": "hello", "stream": true,
                "tools": [{"type": "function", "name": "search", "parameters": {"type": "object"}}]}))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        let text = response.text().await.unwrap();
        assert!(!text.contains("[DONE]"));
        let events: Vec<Value> = text
            .split("\n\n")
            .filter(|e| !e.trim().is_empty())
            .map(|e| serde_json::from_str(e.lines().find_map(|l| l.strip_prefix("data: ")).unwrap()).unwrap())
            .collect();
        let kinds: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
        assert_eq!(
            &kinds[..3],
            ["response.created", "response.in_progress", "response.output_item.added"],
            "{kinds:?}"
        );
        assert_eq!(kinds.last(), Some(&"response.completed"), "{kinds:?}");
        assert_eq!(
            kinds.iter().filter(|k| k.starts_with("response.completed") || k.starts_with("response.failed")).count(),
            1
        );
        let completed = &events.last().unwrap()["response"];
        if route == "r-claude-tool" {
            assert_eq!(completed["output"][0]["type"], "function_call", "{completed}");
            assert_eq!(
                serde_json::from_str::<Value>(completed["output"][0]["arguments"].as_str().unwrap()).unwrap(),
                json!({"q": "mock"})
            );
        } else {
            assert_eq!(completed["output"][0]["content"][0]["text"], "mock part1 part2 ", "{route}");
        }
        let numbers: Vec<u64> = events.iter().map(|e| e["sequence_number"].as_u64().unwrap()).collect();
        assert!(numbers.windows(2).all(|w| w[1] == w[0] + 1));
    }

    // Codex's WebSocket attempt: 426, so it falls back to HTTP at once.
    let upgrade = stack
        .client
        .get(format!("http://{}/v1/responses", stack.proxy))
        .bearer_auth(&key)
        .header("upgrade", "websocket")
        .header("connection", "upgrade")
        .send()
        .await
        .unwrap();
    assert_eq!(upgrade.status(), StatusCode::UPGRADE_REQUIRED);
    let error: Value = upgrade.json().await.unwrap();
    assert_eq!(error["error"]["code"], "websocket_unsupported");

    // What is not served yet is refused by name, as a 400 (never retried).
    let (status, _, error) =
        post(&stack, &key, json!({"model": "r-gpt", "input": "x", "previous_response_id": "resp_1"})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(error["error"]["message"].as_str().unwrap().contains("previous_response_id"), "{error}");
    let (status, _, _) = post(&stack, &key, json!({"model": "no-such-route", "input": "x"})).await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    // The official SDK reads the answers.
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/sdk/openai_responses.py");
    for route in ["r-gpt", "r-claude-tool"] {
        let out = tokio::process::Command::new("python3")
            .args([script, &format!("http://{}", stack.proxy), &key, route])
            .output()
            .await
            .expect("python3 runs");
        assert!(out.status.success(), "the SDK script failed: {}", String::from_utf8_lossy(&out.stderr));
        let out: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(out["status"], "completed");
        if route == "r-gpt" {
            assert_eq!(out["text"], "mock answer to: hello from the SDK");
            assert_eq!(out["streamed"], "mock part1 part2 ", "responses.stream().get_final_response()");
        } else {
            assert_eq!(out["call"]["name"], "search");
            assert_eq!(out["streamed"], "function_call");
        }
    }
}
