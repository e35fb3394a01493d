//! `POST /v1/responses` (issue 29, first part): callers in
//! OpenAI's Responses shape reach OpenAI- and Anthropic-flavour targets through the one
//! pipeline; input items, function and custom (freeform) tools, tool results and dropped tool
//! types map as the module says; the official openai SDK's `responses.create` reads the
//! answers, streamed and not, and structured output. Stored responses: `responses_store.rs`.

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

    // A response that was never stored cannot be continued: a 400 naming the field.
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

    // Structured output: the SDK's `responses.parse(text_format=…)` over each flavor; the
    // schema reaches an OpenAI target as `response_format`, an Anthropic one as
    // `output_config.format`.
    for route in ["r-gpt", "r-claude"] {
        let out = tokio::process::Command::new("python3")
            .args([script, &format!("http://{}", stack.proxy), &key, route, "structured"])
            .output()
            .await
            .expect("python3 runs");
        assert!(out.status.success(), "the SDK script failed: {}", String::from_utf8_lossy(&out.stderr));
        let out: Value = serde_json::from_slice(&out.stdout).unwrap();
        let city = json!({"name": "mock", "population": 1, "capital": true});
        assert_eq!((&out["parsed"], &out["streamed"]), (&city, &city), "{route}");
        let upstream = sent(&stack.received(route).await);
        let schema = if route == "r-gpt" {
            assert_eq!(upstream["response_format"]["type"], "json_schema");
            assert_eq!(upstream["response_format"]["json_schema"]["strict"], true);
            &upstream["response_format"]["json_schema"]["schema"]
        } else {
            assert_eq!(upstream["output_config"]["format"]["type"], "json_schema");
            &upstream["output_config"]["format"]["schema"]
        };
        assert_eq!(schema["required"], json!(["name", "population", "capital"]), "{upstream}");
    }

    // What an Anthropic target has no place for is named with the tool types dropped: JSON
    // mode, and an effort on a target that does not declare reasoning.
    let body = json!({"model": "r-claude", "input": "x", "tools": [{"type": "web_search"}],
        "text": {"format": {"type": "json_object"}}, "reasoning": {"effort": "high"}});
    let (status, headers, _) = post(&stack, &key, body).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(headers["x-shield-dropped-fields"], "tools (web_search), reasoning.effort, text.format");
    let upstream = sent(&stack.received("r-claude").await);
    assert!(upstream.get("thinking").is_none() && upstream.get("output_config").is_none(), "{upstream}");
}

/// One exchange through `/v1/chat/completions` and through `/v1/responses`, on twin routes
/// over the same targets (the first down, so each call fails over), with twin keys: the same
/// tokens, cost, failovers, budget state and rate-limit headers, and the same flushed usage.
#[tokio::test]
async fn usage_cost_budgets_limits_and_headers_match_chat_completions() {
    let stack = Stack::start().await;
    // Twin targets too: a target's health is shared by every route that uses it.
    for twin in ["chat", "resp"] {
        let (down, up) = (format!("eq-{twin}-down"), format!("eq-{twin}-up"));
        stack.mock_target(&down, "status:503", json!({"price": {"input_per_mtok": 1, "output_per_mtok": 1}})).await;
        stack.mock_target(&up, "usage:10-20", json!({"price": {"input_per_mtok": 2.5, "output_per_mtok": 10}})).await;
        let route = json!({"targets": [down, up], "budget": {"monthly": 0.0005, "at_limit": "warn"}});
        stack.put_route(&format!("eq-{twin}"), route).await;
    }
    let limits = json!({"name": "twin", "limits": {"rpm": 100, "tpm": 100000}});
    let (chat_key, _) = stack.key_with(limits.clone()).await;
    let (resp_key, _) = stack.key_with(limits).await;

    let shield_headers = |headers: &reqwest::header::HeaderMap| {
        let mut kept: Vec<(String, String)> = headers
            .iter()
            .filter(|(name, _)| {
                let name = name.as_str();
                // The reset times are clocks read a few ms apart.
                (name.starts_with("x-shield-") && name != "x-shield-route")
                    || (name.starts_with("x-ratelimit-") && !name.starts_with("x-ratelimit-reset-"))
            })
            .map(|(name, value)| {
                (name.to_string(), value.to_str().unwrap().replace("-chat-", "-").replace("-resp-", "-"))
            })
            .collect();
        kept.sort();
        kept
    };
    for n in 0..3 {
        let (status, chat_headers, chat) = stack
            .chat(&chat_key, json!({"model": "eq-chat", "messages": [{"role": "user", "content": "hello"}]}), &[])
            .await;
        assert_eq!(status, StatusCode::OK, "{chat}");
        let (status, resp_headers, resp) = post(&stack, &resp_key, json!({"model": "eq-resp", "input": "hello"})).await;
        assert_eq!(status, StatusCode::OK, "{resp}");
        assert_eq!(shield_headers(&chat_headers), shield_headers(&resp_headers), "call {n}");
        assert_eq!(chat_headers["x-shield-failovers"], "1");
        assert_eq!(
            (chat["usage"]["prompt_tokens"].as_u64(), chat["usage"]["completion_tokens"].as_u64()),
            (resp["usage"]["input_tokens"].as_u64(), resp["usage"]["output_tokens"].as_u64())
        );
        let (chat_routing, resp_routing) = (&chat["x_shield"]["routing"], &resp["x_shield"]["routing"]);
        assert_eq!(chat_routing["cost_micros"], 225, "10 × 2.5 + 20 × 10 micro-USD");
        for field in ["cost_micros", "halt", "budget"] {
            assert_eq!(chat_routing[field], resp_routing[field], "{field}, call {n}");
        }
    }
    let rows = |route: &'static str| {
        let stack = &stack;
        async move {
            let (status, body) = stack
                .admin_call(reqwest::Method::GET, &format!("/v1/tenant/me/gateway/usage?route={route}"), None)
                .await;
            assert_eq!(status, StatusCode::OK);
            let mut rows = body["rows"].as_array().cloned().unwrap_or_default();
            for row in &mut rows {
                let row = row.as_object_mut().unwrap();
                row.remove("route");
                row.remove("latency_ms_avg");
                let target = row["target"].as_str().unwrap().replace("-chat-", "-").replace("-resp-", "-");
                row.insert("target".into(), json!(target));
            }
            rows.sort_by_key(|r| r["target"].as_str().unwrap_or_default().to_string());
            rows
        }
    };
    let (chat_rows, resp_rows) = shield_e2e::eventually(10, "both routes' usage flushed", || async {
        let (chat, resp) = (rows("eq-chat").await, rows("eq-resp").await);
        let flushed = |rows: &[Value]| rows.iter().any(|r| r["target"] == "eq-up" && r["calls"] == 3);
        (flushed(&chat) && flushed(&resp)).then_some((chat, resp))
    })
    .await;
    assert_eq!(chat_rows, resp_rows);
}

/// Codex gives up on an HTTP 429 but waits on a stream that fails with
/// `rate_limit_exceeded` and "try again in N s": Codex is told that way; everyone else gets the
/// 429 with `Retry-After`.
#[tokio::test]
async fn codex_is_told_of_rate_limits_the_way_it_waits_on() {
    let stack = Stack::start().await;
    stack.mock_target("rl", "", json!({})).await;
    stack.put_route("rl", json!({"targets": ["rl"]})).await;
    let (key, _) = stack.key_with(json!({"name": "one-a-minute", "limits": {"rpm": 1}})).await;
    let send = |originator: Option<&'static str>, stream: bool| {
        let mut request = stack
            .client
            .post(format!("http://{}/v1/responses", stack.proxy))
            .bearer_auth(&key)
            .json(&json!({"model": "rl", "input": "hi", "stream": stream, "store": false}));
        if let Some(originator) = originator {
            request = request.header("originator", originator);
        }
        async move {
            let response = request.send().await.unwrap();
            let (status, headers) = (response.status(), response.headers().clone());
            (status, headers, response.text().await.unwrap())
        }
    };
    assert_eq!(send(None, false).await.0, StatusCode::OK);

    let (status, headers, text) = send(Some("codex_exec"), true).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    assert!(headers["content-type"].to_str().unwrap().starts_with("text/event-stream"));
    let events: Vec<Value> =
        text.lines().filter_map(|l| l.strip_prefix("data: ")).map(|d| serde_json::from_str(d).unwrap()).collect();
    let kinds: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["response.created", "response.in_progress", "response.failed"]);
    let error = &events[2]["response"]["error"];
    assert_eq!(error["code"], "rate_limit_exceeded");
    let message = error["message"].as_str().unwrap();
    let wait: u64 = message
        .split("try again in ")
        .nth(1)
        .and_then(|rest| rest.split('s').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("Codex reads the wait from the message: {message}"));
    assert!((1..=60).contains(&wait), "{message}");

    // The SDKs (and Codex's non-streamed calls) get the 429 they retry on.
    for (originator, stream) in [(None, true), (None, false), (Some("codex_exec"), false)] {
        let (status, headers, text) = send(originator, stream).await;
        assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{originator:?} {stream}: {text}");
        assert!(headers.contains_key("retry-after"));
        let error: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(error["error"]["code"], "rate_limit_exceeded");
    }
}

/// An Anthropic target's thinking goes back to it on the next turn: out as a `reasoning`
/// item (the thinking as the summary asked for, the blocks sealed in `encrypted_content`),
/// back in as the same blocks, signature and all, before the tool call they led to. Streamed
/// and not; a tampered copy is dropped, not forwarded.
#[tokio::test]
async fn reasoning_round_trips_to_an_anthropic_target() {
    let stack = Stack::start().await;
    stack
        .mock_target("think", "think;tool:search", json!({"flavor": "anthropic", "capabilities": {"reasoning": true}}))
        .await;
    stack.put_route("think", json!({"targets": ["think"]})).await;
    let (key, _) = stack.key(None).await;
    let tools = json!([{"type": "function", "name": "search", "parameters": {"type": "object"}}]);
    let ask = json!({"model": "think", "input": "find x", "tools": tools, "store": false,
        "reasoning": {"effort": "low", "summary": "auto"}, "include": ["reasoning.encrypted_content"]});

    // Not streamed: the output, then the next turn with it.
    let (status, _, answer) = post(&stack, &key, ask.clone()).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    let upstream = sent(&stack.received("think").await);
    assert_eq!(upstream["thinking"], json!({"type": "enabled", "budget_tokens": 4096}), "low effort");
    let output = answer["output"].as_array().unwrap().clone();
    let kinds: Vec<&str> = output.iter().map(|i| i["type"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["reasoning", "function_call"]);
    assert_eq!(output[0]["summary"], json!([{"type": "summary_text", "text": "Let me think."}]));
    let sealed = output[0]["encrypted_content"].as_str().unwrap().to_string();
    assert!(sealed.starts_with("shield1.") && !sealed.contains("c2ln"), "sealed, not readable: {sealed}");

    // Streamed: the reasoning item's events, then the call.
    let response = stack
        .client
        .post(format!("http://{}/v1/responses", stack.proxy))
        .bearer_auth(&key)
        .json(&{
            let mut ask = ask.clone();
            ask["stream"] = json!(true);
            ask
        })
        .send()
        .await
        .unwrap();
    let text = response.text().await.unwrap();
    let events: Vec<Value> =
        text.lines().filter_map(|l| l.strip_prefix("data: ")).map(|d| serde_json::from_str(d).unwrap()).collect();
    let kinds: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    let at = |kind: &str| kinds.iter().position(|k| *k == kind).unwrap_or_else(|| panic!("no {kind}: {kinds:?}"));
    assert!(at("response.reasoning_summary_part.added") < at("response.reasoning_summary_text.delta"));
    assert!(at("response.reasoning_summary_text.done") < at("response.function_call_arguments.delta"));
    let completed = &events.last().unwrap()["response"];
    assert_eq!(completed["output"][0]["type"], "reasoning", "{completed}");
    assert_eq!(completed["output"][0]["summary"][0]["text"], "Let me think.");
    let streamed = completed["output"].as_array().unwrap().clone();

    for (output, label) in [(output, "not streamed"), (streamed, "streamed")] {
        let call = output.iter().find(|i| i["type"] == "function_call").unwrap();
        let mut next = ask.clone();
        next["input"] = json!([{"type": "message", "role": "user", "content": "find x"}, output[0], call,
            {"type": "function_call_output", "call_id": call["call_id"], "output": "x is 42"}]);
        let (status, _, answer) = post(&stack, &key, next.clone()).await;
        assert_eq!(status, StatusCode::OK, "{label}: {answer}");
        let upstream = sent(&stack.received("think").await);
        let assistant = &upstream["messages"][1];
        assert_eq!(assistant["role"], "assistant");
        assert_eq!(
            assistant["content"][0],
            json!({"type": "thinking", "thinking": "Let me think.", "signature": "c2ln"}),
            "{label}: the thinking block comes back as it was, first: {upstream}"
        );
        assert_eq!(assistant["content"][1]["type"], "tool_use");
        assert_eq!(upstream["messages"][2]["content"][0]["type"], "tool_result");

        // A tampered copy does not open: no thinking is sent.
        let content = output[0]["encrypted_content"].as_str().unwrap();
        let flipped = if content.ends_with('A') { 'B' } else { 'A' };
        let tampered = format!("{}{flipped}", &content[..content.len() - 1]);
        next["input"][1]["encrypted_content"] = json!(tampered);
        let (status, _, _) = post(&stack, &key, next).await;
        assert_eq!(status, StatusCode::OK);
        let upstream = sent(&stack.received("think").await);
        assert_eq!(upstream["messages"][1]["content"][0]["type"], "tool_use", "{label}: {upstream}");
        assert!(upstream.get("thinking").is_none(), "Anthropic would refuse thinking over this history");
    }
}
