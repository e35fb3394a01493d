//! Google's Gemini API as a target (issue 30): the real `shield` against the mock's Gemini
//! wire. Every caller shape reaches it (`/v1/chat/completions`, `/v1/messages`,
//! `/v1/responses`), streamed and not; the key goes in `x-goog-api-key` and nowhere else;
//! tool calls round-trip (the result names its function); a thought signature comes back on
//! the call it came with; Google's errors fail over in both directions with the right class
//! (a 429's `RetryInfo` parks the target for its delay); cost comes from Gemini's usage.

use reqwest::StatusCode;
use serde_json::{Value, json};
use shield_e2e::stack::Stack;

/// A Gemini target on the mock, its key from the vault.
async fn gemini_target(stack: &Stack, id: &str, scenario: &str, extra: Value) {
    let mut body = json!({"flavor": "gemini", "base_url": format!("http://{}/mock/id:{id};{scenario}/v1beta", stack.mock),
        "auth": {"mode": "vault", "secret_ref": "shield://gemini"}});
    for (k, v) in extra.as_object().into_iter().flatten() {
        body[k] = v.clone();
    }
    stack.mock_target(id, scenario, body).await;
}

fn sent(received: &Value) -> Value {
    serde_json::from_str(received["body"].as_str().unwrap()).unwrap()
}

async fn post(stack: &Stack, key: &str, path: &str, body: Value) -> (StatusCode, reqwest::header::HeaderMap, String) {
    stack.post(key, path, body, &[]).await
}

#[tokio::test]
async fn every_caller_shape_reaches_gemini_streamed_and_not() {
    let stack = Stack::start().await;
    let api_key = shield_e2e::unique("AIzaSy-test-");
    stack.put_secret("gemini", &api_key, &["127.0.0.1"]).await;
    gemini_target(&stack, "gem", "usage:12-20", json!({"price": {"input_per_mtok": 1.25, "output_per_mtok": 10}}))
        .await;
    gemini_target(&stack, "gem-tool", "tool:search", json!({})).await;
    gemini_target(&stack, "gem-think", "think;tool:search", json!({})).await;
    for id in ["gem", "gem-tool", "gem-think"] {
        stack.put_route(id, json!({"targets": [id]})).await;
    }
    let (key, _) = stack.key(None).await;

    // Chat Completions, not streamed: the URL, the key's header, the body; cost from usage.
    let (status, headers, text) = post(
        &stack,
        &key,
        "/v1/chat/completions",
        json!({"model": "gem",
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hello"}]}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let answer: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(answer["choices"][0]["message"]["content"], "mock answer to: hello");
    assert_eq!(
        (answer["usage"]["prompt_tokens"].as_u64(), answer["usage"]["completion_tokens"].as_u64()),
        (Some(12), Some(20))
    );
    assert_eq!(answer["x_shield"]["routing"]["cost_micros"], 215, "12 × 1.25 + 20 × 10 micro-USD");
    assert_eq!(headers["x-shield-target"], "gem");
    let received = stack.received("gem").await;
    let first = &received[0];
    assert!(first["path"].as_str().unwrap().ends_with("/v1beta/models/model-gem:generateContent"), "{first}");
    assert_eq!(first["headers"]["x-goog-api-key"], api_key.as_str());
    assert!(first["headers"].get("authorization").is_none(), "the key goes in x-goog-api-key only");
    let body = sent(first);
    assert_eq!(body["systemInstruction"], json!({"parts": [{"text": "Be brief."}]}));
    assert_eq!(body["contents"], json!([{"role": "user", "parts": [{"text": "hello"}]}]));

    // Streamed, in each caller shape.
    let (status, _, text) = post(
        &stack,
        &key,
        "/v1/chat/completions",
        json!({"model": "gem", "stream": true,
        "messages": [{"role": "user", "content": "hello"}]}),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert!(text.contains("mock ") && text.ends_with("data: [DONE]\n\n"), "{text}");
    assert!(
        stack.received("gem").await.last().unwrap()["path"]
            .as_str()
            .unwrap()
            .ends_with(":streamGenerateContent?alt=sse")
    );
    let (status, _, text) = post(
        &stack,
        &key,
        "/v1/messages",
        json!({"model": "gem", "max_tokens": 100, "stream": true,
        "messages": [{"role": "user", "content": "hello"}]}),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert!(text.contains("event: message_stop") && text.contains("part1"), "{text}");
    let (status, _, text) =
        post(&stack, &key, "/v1/responses", json!({"model": "gem", "input": "hello", "stream": true, "store": false}))
            .await;
    assert_eq!(status, StatusCode::OK);
    assert!(text.contains("response.completed") && text.contains("part2"), "{text}");

    // A tool call and its result: the result names the function the call named.
    let tools = json!([{"type": "function", "function": {"name": "search", "parameters": {"type": "object"}}}]);
    let (status, _, text) = post(
        &stack,
        &key,
        "/v1/chat/completions",
        json!({"model": "gem-tool", "tools": tools,
        "messages": [{"role": "user", "content": "find x"}]}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let answer: Value = serde_json::from_str(&text).unwrap();
    let call = answer["choices"][0]["message"]["tool_calls"][0].clone();
    assert_eq!(
        (call["function"]["name"].as_str(), answer["choices"][0]["finish_reason"].as_str()),
        (Some("search"), Some("tool_calls"))
    );
    assert!(call["id"].as_str().unwrap().starts_with("call_"), "an id minted for Gemini's call: {call}");
    let (status, _, _) = post(
        &stack,
        &key,
        "/v1/chat/completions",
        json!({"model": "gem-tool", "tools": tools,
        "messages": [{"role": "user", "content": "find x"}, answer["choices"][0]["message"],
            {"role": "tool", "tool_call_id": call["id"], "content": "x is 42"}]}),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let body = sent(stack.received("gem-tool").await.last().unwrap());
    assert_eq!(body["contents"][1]["parts"][0]["functionCall"]["name"], "search");
    assert_eq!(
        body["contents"][2]["parts"][0]["functionResponse"],
        json!({"id": call["id"], "name": "search", "response": {"content": "x is 42"}})
    );

    // A thought signature, through Anthropic's shape: out as a thinking block's signature,
    // back on the call it came with.
    let (status, _, text) = post(
        &stack,
        &key,
        "/v1/messages",
        json!({"model": "gem-think", "max_tokens": 100,
        "tools": [{"name": "search", "input_schema": {"type": "object"}}],
        "messages": [{"role": "user", "content": "find x"}]}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let message: Value = serde_json::from_str(&text).unwrap();
    let content = message["content"].as_array().unwrap().clone();
    let signed = content.iter().find(|b| b["type"] == "thinking" && b["signature"] == "gemini:Z2VtaW5pLXNpZw==");
    assert!(signed.is_some(), "{content:?}");
    let tool_use = content.iter().find(|b| b["type"] == "tool_use").unwrap().clone();
    let (status, _, text) = post(
        &stack,
        &key,
        "/v1/messages",
        json!({"model": "gem-think", "max_tokens": 100,
        "tools": [{"name": "search", "input_schema": {"type": "object"}}],
        "messages": [{"role": "user", "content": "find x"}, {"role": "assistant", "content": content},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": tool_use["id"], "content": "42"}]}]}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let body = sent(stack.received("gem-think").await.last().unwrap());
    let model_turn = &body["contents"][1];
    assert_eq!(model_turn["role"], "model");
    let call_part = model_turn["parts"].as_array().unwrap().iter().find(|p| p.get("functionCall").is_some()).unwrap();
    assert_eq!(call_part["thoughtSignature"], "Z2VtaW5pLXNpZw==", "{model_turn}");
}

#[tokio::test]
async fn routes_mixing_gemini_fail_over_both_ways_with_googles_error_classes() {
    let stack = Stack::start().await;
    stack.put_secret("gemini", &shield_e2e::unique("AIzaSy-test-"), &["127.0.0.1"]).await;
    gemini_target(&stack, "gem-busy", "status:429;retry-after:30", json!({})).await;
    gemini_target(&stack, "gem-ok", "", json!({})).await;
    gemini_target(&stack, "gem-long", "status:400;err:token_count", json!({})).await;
    gemini_target(&stack, "gem-denied", "status:403", json!({})).await;
    stack.mock_target("gpt-ok", "", json!({})).await;
    stack.mock_target("gpt-down", "status:503", json!({})).await;
    stack.put_route("to-gpt", json!({"targets": ["gem-busy", "gpt-ok"]})).await;
    stack.put_route("to-gemini", json!({"targets": ["gpt-down", "gem-ok"]})).await;
    stack
        .put_route("too-long", json!({"targets": ["gem-long", "gpt-ok"], "failover": {"on": ["context_length"]}}))
        .await;
    stack.put_route("denied", json!({"targets": ["gem-denied", "gpt-ok"]})).await;
    let (key, _) = stack.key(None).await;
    let chat = |model: &str, stream: bool| json!({"model": model, "stream": stream, "messages": [{"role": "user", "content": "hi"}]});

    for stream in [false, true] {
        let (status, headers, text) = post(&stack, &key, "/v1/chat/completions", chat("to-gpt", stream)).await;
        assert_eq!(status, StatusCode::OK, "{text}");
        // The first call fails over; after it the busy target is parked and not tried.
        let failovers = if stream { "0" } else { "1" };
        assert_eq!(
            (headers["x-shield-target"].to_str().unwrap(), headers["x-shield-failovers"].to_str().unwrap()),
            ("gpt-ok", failovers)
        );
        let (status, headers, text) = post(&stack, &key, "/v1/chat/completions", chat("to-gemini", stream)).await;
        assert_eq!(status, StatusCode::OK, "{text}");
        assert_eq!(headers["x-shield-target"], "gem-ok");
    }
    // The 429's RetryInfo parked the busy target: the next call does not try it.
    assert_eq!(stack.received("gem-busy").await.len(), 1, "parked for the 30 s Google asked");
    let (status, _, text) = post(&stack, &key, "/v1/chat/completions", chat("too-long", false)).await;
    assert_eq!(status, StatusCode::OK, "context_length fails over when the route opts in: {text}");
    // A refused key or project is the caller's answer, never a failover.
    let before = stack.received("gpt-ok").await.len();
    let (status, _, text) = post(&stack, &key, "/v1/chat/completions", chat("denied", false)).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{text}");
    assert_eq!(stack.received("gpt-ok").await.len(), before, "no failover from a 403");
    assert_eq!(stack.received("gem-denied").await.len(), 1);
}
