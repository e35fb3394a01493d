//! Vertex AI as a target (issue 30): the real `shield` against the mock's Vertex endpoints and
//! its OAuth token endpoint, which verifies each signed JWT assertion with the test service
//! account's public key. Google's and Anthropic's models are reached through every caller
//! shape, streamed and not, with one token for all concurrent requests, refreshed before it
//! expires; a refused token exchange, or a key file naming another token endpoint, excludes
//! the target as its credential is unavailable, and the route fails over.

use reqwest::StatusCode;
use serde_json::{Value, json};
use shield_e2e::clouds;
use shield_e2e::stack::Stack;

/// A Vertex target on the mock for `publisher`'s `model`, with the vault secret `secret`.
async fn vertex_target(
    stack: &Stack,
    id: &str,
    scenario: &str,
    publisher: &str,
    model: &str,
    secret: &str,
    extra: Value,
) {
    let base = format!("http://{}/mock/id:{id};{scenario}/v1/projects/shield-test/locations/us-east5", stack.mock);
    let mut body = json!({"flavor": "vertex", "base_url": base, "model": model, "vertex": {"publisher": publisher},
        "allow_private": true, "auth": {"mode": "vault", "secret_ref": format!("shield://{secret}")}});
    for (k, v) in extra.as_object().into_iter().flatten() {
        body[k] = v.clone();
    }
    stack.put_target(id, body).await;
}

fn sent(received: &Value) -> Value {
    serde_json::from_str(received["body"].as_str().unwrap()).unwrap()
}

/// Anthropic-shaped calls carry a beta flag, to see it reach Claude on Vertex.
async fn post(stack: &Stack, key: &str, path: &str, body: Value) -> (StatusCode, reqwest::header::HeaderMap, String) {
    let beta: &[(&str, &str)] =
        if path == "/v1/messages" { &[("anthropic-beta", "context-1m-2025-08-07")] } else { &[] };
    stack.post(key, path, body, beta).await
}

async fn token_calls(stack: &Stack, id: &str) -> u64 {
    let url = format!("http://{}/_mock/calls?id={id}", stack.mock);
    let calls: Value = stack.client.get(url).send().await.unwrap().json().await.unwrap();
    calls["calls"].as_u64().unwrap()
}

#[tokio::test]
async fn both_publishers_answer_every_caller_shape_with_one_token_for_all() {
    let stack = Stack::start().await;
    clouds::service_account(&stack, "gcp", None).await;
    let price = json!({"price": {"input_per_mtok": 1.25, "output_per_mtok": 10}});
    vertex_target(&stack, "vx-gem", "usage:12-20", "google", "gemini-2.5-flash", "gcp", price).await;
    vertex_target(&stack, "vx-claude", "usage:7-9", "anthropic", "claude-sonnet-4@20250514", "gcp", json!({})).await;
    vertex_target(&stack, "vx-claude-tool", "tool:search", "anthropic", "claude-sonnet-4@20250514", "gcp", json!({}))
        .await;
    for id in ["vx-gem", "vx-claude", "vx-claude-tool"] {
        stack.put_route(id, json!({"targets": [id]})).await;
    }
    let (key, _) = stack.key(None).await;

    // Twenty concurrent first calls: one token exchange.
    let chat = |model: &str| json!({"model": model, "messages": [{"role": "user", "content": "hello"}]});
    let calls = (0..20).map(|_| post(&stack, &key, "/v1/chat/completions", chat("vx-gem")));
    for (status, headers, text) in futures_util::future::join_all(calls).await {
        assert_eq!(status, StatusCode::OK, "{text}");
        assert_eq!(headers["x-shield-target"], "vx-gem");
    }
    assert_eq!(token_calls(&stack, "gcp-token").await, 1, "one exchange for every concurrent request");
    let received = stack.received("vx-gem").await;
    assert!(
        received[0]["path"].as_str().unwrap().ends_with(
            "/v1/projects/shield-test/locations/us-east5/publishers/google/models/gemini-2.5-flash:generateContent"
        ),
        "{}",
        received[0]
    );
    assert!(received.iter().all(|r| r["headers"]["authorization"].as_str().unwrap().starts_with("Bearer ya29.mock-")));
    assert_eq!(sent(&received[0])["contents"], json!([{"role": "user", "parts": [{"text": "hello"}]}]));
    let (_, _, text) = post(&stack, &key, "/v1/chat/completions", chat("vx-gem")).await;
    let answer: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(answer["choices"][0]["message"]["content"], "mock answer to: hello");
    assert_eq!(answer["x_shield"]["routing"]["cost_micros"], 215, "12 × 1.25 + 20 × 10 micro-USD");

    // Gemini's stream, in each caller shape.
    let (status, _, text) = post(
        &stack,
        &key,
        "/v1/messages",
        json!({"model": "vx-gem", "max_tokens": 100, "stream": true, "messages": [{"role": "user", "content": "hello"}]}),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert!(text.contains("event: message_stop") && text.contains("part1"), "{text}");
    assert!(
        stack.received("vx-gem").await.last().unwrap()["path"]
            .as_str()
            .unwrap()
            .ends_with(":streamGenerateContent?alt=sse")
    );
    let (status, _, text) = post(
        &stack,
        &key,
        "/v1/responses",
        json!({"model": "vx-gem", "input": "hello", "stream": true, "store": false}),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert!(text.contains("response.completed") && text.contains("part2"), "{text}");

    // Claude through rawPredict: the Messages body with Vertex's version, no model; betas kept.
    let (status, _, text) = post(
        &stack,
        &key,
        "/v1/messages",
        json!({"model": "vx-claude", "max_tokens": 100, "messages": [{"role": "user", "content": "hello"}]}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let message: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(message["content"][0]["text"], "mock answer to: hello");
    assert_eq!(
        (message["usage"]["input_tokens"].as_u64(), message["usage"]["output_tokens"].as_u64()),
        (Some(7), Some(9))
    );
    let received = stack.received("vx-claude").await;
    let last = received.last().unwrap();
    assert!(
        last["path"].as_str().unwrap().ends_with("/publishers/anthropic/models/claude-sonnet-4@20250514:rawPredict")
    );
    assert_eq!(last["headers"]["anthropic-beta"], "context-1m-2025-08-07");
    assert!(last["headers"].get("anthropic-version").is_none());
    let body = sent(last);
    assert_eq!(body["anthropic_version"], "vertex-2023-10-16");
    assert!(body.get("model").is_none());
    for (path, request) in [
        (
            "/v1/chat/completions",
            json!({"model": "vx-claude", "stream": true, "messages": [{"role": "user", "content": "hello"}]}),
        ),
        (
            "/v1/messages",
            json!({"model": "vx-claude", "stream": true, "max_tokens": 50, "messages": [{"role": "user", "content": "hello"}]}),
        ),
        ("/v1/responses", json!({"model": "vx-claude", "stream": true, "input": "hello", "store": false})),
    ] {
        let (status, _, text) = post(&stack, &key, path, request).await;
        assert_eq!(status, StatusCode::OK, "{path}: {text}");
        assert!(text.contains("part1"), "{path}: {text}");
    }
    assert!(stack.received("vx-claude").await.last().unwrap()["path"].as_str().unwrap().ends_with(":streamRawPredict"));

    // A tool call through Claude on Vertex, and its result back.
    let tools = json!([{"type": "function", "function": {"name": "search", "parameters": {"type": "object"}}}]);
    let (status, _, text) = post(
        &stack,
        &key,
        "/v1/chat/completions",
        json!({"model": "vx-claude-tool", "tools": tools, "messages": [{"role": "user", "content": "find x"}]}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let answer: Value = serde_json::from_str(&text).unwrap();
    let message = answer["choices"][0]["message"].clone();
    assert_eq!(message["tool_calls"][0]["function"]["name"], "search");
    let (status, _, _) = post(
        &stack,
        &key,
        "/v1/chat/completions",
        json!({"model": "vx-claude-tool", "tools": tools, "messages": [{"role": "user", "content": "find x"}, message,
            {"role": "tool", "tool_call_id": "toolu_mock1", "content": "x is 42"}]}),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let body = sent(stack.received("vx-claude-tool").await.last().unwrap());
    assert_eq!(body["messages"][2]["content"][0]["type"], "tool_result");
    assert_eq!(token_calls(&stack, "gcp-token").await, 1, "still the one token");
    for id in ["vx-gem", "vx-claude", "vx-claude-tool"] {
        clouds::record_tokens(&stack, id).await;
    }
}

#[tokio::test]
async fn credential_failures_exclude_the_target_and_tokens_are_refreshed_before_they_expire() {
    let mut stack = Stack::start().await;
    clouds::service_account(&stack, "gcp", None).await;
    // A key file that names another token endpoint: never used.
    clouds::service_account(&stack, "gcp-evil", Some("https://evil.example.com/token")).await;
    vertex_target(&stack, "vx", "", "google", "gemini-2.5-flash", "gcp", json!({})).await;
    vertex_target(&stack, "vx-evil", "", "google", "gemini-2.5-flash", "gcp-evil", json!({})).await;
    stack.mock_target("gpt-ok", "", json!({})).await;
    stack.put_route("vx", json!({"targets": ["vx"]})).await;
    stack.put_route("vx-or-gpt", json!({"targets": ["vx", "gpt-ok"]})).await;
    stack.put_route("evil-or-gpt", json!({"targets": ["vx-evil", "gpt-ok"]})).await;
    let (key, _) = stack.key(None).await;
    let chat = |model: &str| json!({"model": model, "messages": [{"role": "user", "content": "hi"}]});

    let (status, headers, text) = post(&stack, &key, "/v1/chat/completions", chat("evil-or-gpt")).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    assert_eq!(headers["x-shield-target"], "gpt-ok");
    let body: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(
        body["x_shield"]["routing"]["excluded"],
        json!([{"target": "vx-evil", "reason": "credential_unavailable"}]),
        "{body}"
    );
    assert!(stack.received("vx-evil").await.is_empty());
    assert!(stack.all_logs().contains("token_uri"), "the log says why the key file is not used");

    // The token endpoint refuses: the target is excluded for its credential, the run moves on.
    stack
        .restart_proxy(&[(
            "SHIELD_GCP_TOKEN_URL",
            format!("http://{}/mock/id:gcp-refuse;status:400/token", stack.mock),
        )])
        .await;
    let (status, headers, text) = post(&stack, &key, "/v1/chat/completions", chat("vx-or-gpt")).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    assert_eq!(headers["x-shield-target"], "gpt-ok");
    let body: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(body["x_shield"]["routing"]["attempts"][0]["class"], "credential_unavailable", "{body}");
    assert!(stack.received("vx").await.is_empty(), "no call without a token");
    assert_eq!(token_calls(&stack, "gcp-refuse").await, 1);
    let (status, _, text) = post(&stack, &key, "/v1/chat/completions", chat("vx")).await;
    assert_eq!(status, StatusCode::BAD_GATEWAY, "{text}");
    assert_eq!(token_calls(&stack, "gcp-refuse").await, 1, "a failed exchange is not retried at once");
    assert!(stack.all_logs().contains("could not be refreshed"));

    // Tokens that live two seconds: refreshed after half their life, never used expired (the
    // mock refuses an expired token with a 401).
    stack
        .restart_proxy(&[("SHIELD_GCP_TOKEN_URL", format!("http://{}/mock/id:gcp-short;ttl:2/token", stack.mock))])
        .await;
    for _ in 0..3 {
        let (status, _, text) = post(&stack, &key, "/v1/chat/completions", chat("vx")).await;
        assert_eq!(status, StatusCode::OK, "{text}");
        tokio::time::sleep(std::time::Duration::from_millis(1200)).await;
    }
    assert_eq!(token_calls(&stack, "gcp-short").await, 3, "a new token for each call past half-life");
    let tokens = clouds::record_tokens(&stack, "vx").await;
    assert_eq!(tokens.len(), 3);
}
