//! `POST /v1/messages` over plain HTTP (issue 16): every error type in Anthropic's shape,
//! refusals as a 200 message with `stop_reason: "refusal"`, a stream that breaks after the
//! commit point ending with an `error` event, fields only Anthropic honours mapped, dropped or
//! excluding other flavors (issue 28), `anthropic-beta` forwarded verbatim and only to
//! Anthropic targets, and the Shield key taken from `x-api-key`.

use reqwest::StatusCode;
use serde_json::{Value, json};
use shield_e2e::stack::Stack;

fn body(model: &str) -> Value {
    json!({"model": model, "max_tokens": 64, "messages": [{"role": "user", "content": "hello"}]})
}

async fn messages(
    stack: &Stack,
    key: &str,
    body: Value,
    headers: &[(&str, &str)],
) -> (StatusCode, reqwest::header::HeaderMap, String) {
    let mut request =
        stack.client.post(format!("http://{}/v1/messages", stack.proxy)).header("x-api-key", key).json(&body);
    for (k, v) in headers {
        request = request.header(*k, *v);
    }
    let response = request.send().await.unwrap();
    let (status, headers) = (response.status(), response.headers().clone());
    let text = response.text().await.unwrap();
    stack.evidence.response("POST proxy /v1/messages", status, &headers, &text);
    (status, headers, text)
}

fn error_of(text: &str) -> (String, String) {
    let value: Value = serde_json::from_str(text).unwrap_or_else(|_| panic!("not JSON: {text}"));
    assert_eq!(value["type"], "error", "{value}");
    (value["error"]["type"].as_str().unwrap().to_string(), value["error"]["message"].as_str().unwrap().to_string())
}

#[tokio::test]
async fn each_error_type_in_anthropics_shape() {
    let stack = Stack::start().await;
    stack.mock_target("ok", "", json!({})).await;
    stack.mock_target("forbidden", "status:403", json!({})).await;
    stack.mock_target("limited-1", "status:429", json!({})).await;
    stack.mock_target("limited-2", "status:429", json!({})).await;
    stack.mock_target("overloaded", "status:529", json!({})).await;
    stack.mock_target("broken-1", "status:500", json!({})).await;
    stack.mock_target("broken-2", "status:503", json!({})).await;
    stack.mock_target("hangs", "hang", json!({"timeout_s": 30})).await;
    for (route, targets) in [
        ("ok", json!(["ok"])),
        ("forbidden", json!(["forbidden"])),
        ("limited", json!(["limited-1", "limited-2"])),
        ("overloaded", json!(["overloaded"])),
        ("broken", json!(["broken-1", "broken-2"])),
    ] {
        stack.put_route(route, json!({"targets": targets})).await;
    }
    stack.put_route("slow", json!({"targets": ["hangs"], "failover": {"deadline_s": 1}})).await;
    let (key, _) = stack.key(None).await;

    let cases: Vec<(Value, &str, u16, &str)> = vec![
        (json!({"model": "ok", "messages": [{"role": "user", "content": "x"}]}), "", 400, "invalid_request_error"),
        (body("no-such-route"), "", 404, "not_found_error"),
        (body("ok"), "sk-shield-not-a-key", 401, "authentication_error"),
        (body("forbidden"), "", 403, "permission_error"),
        (body("limited"), "", 429, "rate_limit_error"),
        (body("broken"), "", 502, "api_error"),
        (body("overloaded"), "", 529, "overloaded_error"),
        (body("slow"), "", 504, "timeout_error"),
    ];
    for (request, other_key, status, kind) in cases {
        let key = if other_key.is_empty() { key.as_str() } else { other_key };
        let (got, headers, text) = messages(&stack, key, request.clone(), &[]).await;
        assert_eq!(got.as_u16(), status, "{request}: {text}");
        let final_ = matches!(status, 400 | 401 | 403 | 404);
        assert_eq!(headers.get("x-should-retry").is_some_and(|v| v == "false"), final_, "{request}: retry hint");
        let (got_kind, message) = error_of(&text);
        assert_eq!(got_kind, kind, "{request}: {text}");
        assert!(!message.is_empty());
    }
    // 413: a body over the limit.
    let huge =
        json!({"model": "ok", "max_tokens": 5, "messages": [{"role": "user", "content": "x".repeat(9 * 1024 * 1024)}]});
    let (status, _, text) = messages(&stack, &key, huge, &[]).await;
    assert_eq!((status.as_u16(), error_of(&text).0.as_str()), (413, "request_too_large"));
    // Malformed JSON names the problem.
    let response = stack
        .client
        .post(format!("http://{}/v1/messages", stack.proxy))
        .header("x-api-key", &key)
        .header("content-type", "application/json")
        .body("{\"model\": ")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 400);
    assert!(error_of(&response.text().await.unwrap()).1.contains("malformed JSON"));
    // The process keeps serving.
    assert_eq!(messages(&stack, &key, body("ok"), &[]).await.0, StatusCode::OK);
}

#[tokio::test]
async fn refusals_are_messages_with_a_refusal_stop_reason() {
    let stack = Stack::start().await;
    stack.mock_target("a", "", json!({})).await;
    stack.put_route("guarded", json!({"targets": ["a"], "rules": [{"when": {"data_class": ["secret"]}, "deny": "Secret data stays home"}]})).await;
    let (key, _) = stack.key(None).await;
    let (status, headers, text) = messages(&stack, &key, body("guarded"), &[("x-shield-data-class", "secret")]).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let message: Value = serde_json::from_str(&text).unwrap();
    assert_eq!((message["type"].clone(), message["stop_reason"].clone()), (json!("message"), json!("refusal")));
    assert_eq!(message["content"][0]["text"], "Secret data stays home");
    assert_eq!(headers["x-shield-route"], "guarded");
    assert!(stack.received("a").await.is_empty());
    // Streamed, the refusal is the event sequence.
    let mut streamed = body("guarded");
    streamed["stream"] = json!(true);
    let (status, _, text) = messages(&stack, &key, streamed, &[("x-shield-data-class", "secret")]).await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        text.starts_with("event: message_start")
            && text.contains("\"stop_reason\":\"refusal\"")
            && text.ends_with("event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"),
        "{text}"
    );
}

#[tokio::test]
async fn a_stream_that_breaks_after_the_commit_point_ends_with_an_error_event() {
    let stack = Stack::start().await;
    stack.mock_target("breaks", "chunks:5;break:2", json!({})).await;
    stack.put_route("r", json!({"targets": ["breaks"]})).await;
    let (key, _) = stack.key(None).await;
    let mut request = body("r");
    request["stream"] = json!(true);
    let (status, _, text) = messages(&stack, &key, request, &[]).await;
    assert_eq!(status, StatusCode::OK);
    let names: Vec<&str> = text.lines().filter_map(|l| l.strip_prefix("event: ")).collect();
    assert_eq!(names.first(), Some(&"message_start"));
    assert_eq!(names.last(), Some(&"error"), "{text}");
    assert!(!names.contains(&"message_stop"));
    assert!(text.contains("stream_broken") || text.contains("broke"), "{text}");
}

/// Issue 28: what only Anthropic's shape has. Thinking and effort become `reasoning_effort` on
/// a target that has it and are dropped (and named) on one that does not; content only
/// Anthropic can read excludes other flavors, and a route with none answers 400, not a 5xx a
/// client retries; `anthropic-beta` reaches Anthropic targets verbatim, never others; system
/// messages inside `messages` stay where they stand; an Anthropic target's own error reaches
/// the caller with its own type and wording.
#[tokio::test]
async fn anthropic_only_fields_map_drop_or_need_an_anthropic_target() {
    let stack = Stack::start().await;
    let anthropic_key = shield_e2e::unique("sk-ant-api03-");
    stack.put_secret("claude", &anthropic_key, &["127.0.0.1"]).await;
    let claude = json!({"flavor": "anthropic", "auth": {"mode": "vault", "secret_ref": "shield://claude"}});
    stack.mock_target("gpt", "", json!({})).await;
    stack.mock_target("gpt-reasoning", "", json!({"capabilities": {"reasoning": true}})).await;
    stack.mock_target("claude", "", claude.clone()).await;
    stack.mock_target("claude-strict", "status:400;err:thinking_blocks_cannot_be_modified", claude.clone()).await;
    // An upstream whose error message echoes a credential (the mock's message is the code).
    stack
        .mock_target("claude-echo", "status:400;err:bad_key_sk-ant-api03-abcdefghijklmnopqrstuvwxyz0123", claude)
        .await;
    stack.put_route("echo", json!({"targets": ["claude-echo"]})).await;
    stack.put_route("mixed", json!({"targets": ["gpt", "claude"]})).await;
    stack.put_route("reasoner", json!({"targets": ["gpt-reasoning"]})).await;
    stack.put_route("openai-only", json!({"targets": ["gpt"]})).await;
    stack.put_route("strict", json!({"targets": ["claude-strict"]})).await;
    let (key, _) = stack.key(None).await;
    let beta = ("anthropic-beta", "interleaved-thinking-2025-05-14,made-up-flag-2099-01-01");

    // Plain request: the OpenAI target answers, and gets no Anthropic header.
    let (status, headers, _) = messages(&stack, &key, body("mixed"), &[beta]).await;
    assert_eq!((status, headers["x-shield-target"].to_str().unwrap()), (StatusCode::OK, "gpt"));
    assert!(headers.get("x-shield-dropped-fields").is_none(), "nothing was dropped");
    let sent = &stack.received("gpt").await[0];
    assert!(sent["headers"].get("anthropic-beta").is_none(), "never to a non-Anthropic target");

    // What Claude Code sends on a route it does not know: the OpenAI target answers without
    // thinking, and the caller is told what was dropped.
    let mut agent = body("mixed");
    agent["max_tokens"] = json!(4096);
    agent["thinking"] = json!({"type": "adaptive"});
    agent["output_config"] = json!({"effort": "medium"});
    agent["context_management"] = json!({"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]});
    agent["messages"] = json!([{"role": "user", "content": "hello"}, {"role": "system", "content": "# Environment"},
        {"role": "assistant", "content": "ok"}, {"role": "user", "content": "go"}]);
    let (status, headers, text) = messages(&stack, &key, agent.clone(), &[beta]).await;
    assert_eq!((status, headers["x-shield-target"].to_str().unwrap()), (StatusCode::OK, "gpt"), "{text}");
    assert_eq!(headers["x-shield-dropped-fields"], "thinking, output_config.effort, context_management");
    let sent: Value = serde_json::from_str(stack.received("gpt").await[1]["body"].as_str().unwrap()).unwrap();
    let roles: Vec<&str> = sent["messages"].as_array().unwrap().iter().map(|m| m["role"].as_str().unwrap()).collect();
    assert_eq!(roles, ["user", "system", "assistant", "user"], "the system message where it stands");
    for absent in ["thinking", "output_config", "context_management", "reasoning_effort"] {
        assert!(sent.get(absent).is_none(), "{absent}: {sent}");
    }
    // On a target with a reasoning control the effort maps to it.
    agent["model"] = json!("reasoner");
    let (status, headers, text) = messages(&stack, &key, agent, &[beta]).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    assert_eq!(headers["x-shield-dropped-fields"], "context_management");
    let sent: Value = serde_json::from_str(stack.received("gpt-reasoning").await[0]["body"].as_str().unwrap()).unwrap();
    assert_eq!(sent["reasoning_effort"], "medium");

    // A document only Anthropic reads: the OpenAI target is excluded, visibly.
    let mut document = body("mixed");
    document["max_tokens"] = json!(4096);
    document["thinking"] = json!({"type": "enabled", "budget_tokens": 2048});
    document["messages"][0]["content"] = json!([{"type": "text", "text": "hello", "cache_control": {"type": "ephemeral"}},
        {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "a note"}}]);
    let (status, headers, text) = messages(&stack, &key, document.clone(), &[beta]).await;
    assert_eq!((status, headers["x-shield-target"].to_str().unwrap()), (StatusCode::OK, "claude"), "{text}");
    let answer: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(answer["x_shield"]["routing"]["excluded"], json!([{"target": "gpt", "reason": "unsupported_field"}]));
    let sent = &stack.received("claude").await[0];
    assert_eq!(sent["headers"]["anthropic-beta"], beta.1, "every flag, as sent");
    assert_eq!(sent["headers"]["anthropic-version"], "2023-06-01");
    let sent: Value = serde_json::from_str(sent["body"].as_str().unwrap()).unwrap();
    assert_eq!(sent["thinking"], json!({"type": "enabled", "budget_tokens": 2048}), "passed through unchanged");
    assert_eq!(sent["messages"][0]["content"][0]["cache_control"], json!({"type": "ephemeral"}));
    assert_eq!(stack.received("gpt").await.len(), 2, "the OpenAI target was not called for it");
    // On a route with no target that reads it: a 400 naming the block, not a retried 5xx.
    document["model"] = json!("openai-only");
    let (status, _, text) = messages(&stack, &key, document, &[]).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{text}");
    let (kind, message) = error_of(&text);
    assert_eq!(kind, "invalid_request_error");
    assert!(message.contains("messages.0.content.1 (document)") && message.contains("openai-only"), "{message}");
    assert_eq!(stack.received("gpt").await.len(), 2, "no upstream call");

    // An Anthropic target's error, in its own words.
    let (status, _, text) = messages(&stack, &key, body("strict"), &[]).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{text}");
    assert_eq!(error_of(&text), ("invalid_request_error".into(), "thinking blocks cannot be modified".into()));
    let (status, _, text) = messages(&stack, &key, body("echo"), &[]).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{text}");
    assert_eq!(error_of(&text).1, "bad key [redacted]", "credentials in an upstream's words are redacted");

    // count_tokens: the router's estimate, no upstream call; Bearer works too.
    let response = stack
        .client
        .post(format!("http://{}/v1/messages/count_tokens", stack.proxy))
        .bearer_auth(&key)
        .json(&json!({"model": "mixed", "system": "abcd", "messages": [{"role": "user", "content": "x".repeat(36)}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.json::<Value>().await.unwrap(), json!({"input_tokens": 10}));
}

/// Claude Code with extended thinking: an Anthropic target's thinking blocks stream to an
/// Anthropic-shaped caller as their own blocks (signature included), before the text; an
/// OpenAI-shaped caller of the same route gets the text only.
#[tokio::test]
async fn thinking_streams_to_anthropic_callers_and_never_into_text() {
    let stack = Stack::start().await;
    stack.put_secret("claude", &shield_e2e::unique("sk-ant-api03-"), &["127.0.0.1"]).await;
    stack
        .mock_target(
            "claude",
            "think",
            json!({"flavor": "anthropic", "auth": {"mode": "vault", "secret_ref": "shield://claude"}}),
        )
        .await;
    stack.put_route("thinker", json!({"targets": ["claude"]})).await;
    let (key, _) = stack.key(None).await;
    let mut request = body("thinker");
    request["stream"] = json!(true);
    request["max_tokens"] = json!(4096);
    request["thinking"] = json!({"type": "enabled", "budget_tokens": 2048});
    let (status, _, text) = messages(&stack, &key, request, &[]).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let events: Vec<(String, Value)> = text
        .split("\n\n")
        .filter(|e| !e.is_empty())
        .filter_map(|e| {
            let (name, data) = e.split_once('\n')?;
            Some((
                name.trim_start_matches("event: ").to_string(),
                serde_json::from_str(data.trim_start_matches("data: ")).ok()?,
            ))
        })
        .collect();
    let starts: Vec<(u64, String)> = events
        .iter()
        .filter(|(n, _)| n == "content_block_start")
        .map(|(_, d)| (d["index"].as_u64().unwrap(), d["content_block"]["type"].as_str().unwrap().to_string()))
        .collect();
    assert_eq!(starts, [(0, "thinking".to_string()), (1, "text".to_string())], "{text}");
    let deltas: Vec<&Value> =
        events.iter().filter(|(n, _)| n == "content_block_delta").map(|(_, d)| &d["delta"]).collect();
    assert_eq!(deltas[0], &json!({"type": "thinking_delta", "thinking": "Let me think."}));
    assert_eq!(deltas[1], &json!({"type": "signature_delta", "signature": "c2ln"}));
    assert!(deltas[2..].iter().all(|d| d["type"] == "text_delta"));

    // The same target to an OpenAI-shaped caller: the text, and no thinking anywhere.
    let (status, _, data) = stack
        .chat_stream(&key, json!({"model": "thinker", "stream": true, "messages": [{"role": "user", "content": "hi"}]}))
        .await;
    assert_eq!(status, StatusCode::OK);
    let content: String = data
        .iter()
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .filter_map(|v| v.pointer("/choices/0/delta/content").and_then(Value::as_str).map(str::to_string))
        .collect();
    assert_eq!(content, "mock part1 part2 ");
    assert!(!data.iter().any(|d| d.contains("Let me think") || d.contains("x_thinking")), "{data:?}");
}

/// Issue 28 (first part): what Claude Code and the Anthropic SDKs read besides messages —
/// `HEAD /`, Anthropic's `request-id` on every answer in its shape, the model list and one
/// model in either shape, and a 404 for counting tokens of a model that names no route.
#[tokio::test]
async fn models_request_ids_and_probes_in_anthropics_shape() {
    let stack = Stack::start().await;
    stack.mock_target("a", "", json!({})).await;
    stack.put_route("team-coder", json!({"targets": ["a"]})).await;
    let (key, _) = stack.key(None).await;
    let head = stack.client.head(format!("http://{}/", stack.proxy)).send().await.unwrap();
    assert_eq!(head.status(), StatusCode::OK, "Claude Code probes HEAD /");
    let hello = stack.client.head(format!("http://{}/api/hello", stack.proxy)).send().await.unwrap();
    assert_eq!(hello.status(), StatusCode::OK, "and HEAD /api/hello");

    let (status, headers, text) = messages(&stack, &key, body("team-coder"), &[]).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    assert_eq!(headers["request-id"], headers["x-request-id"], "one id, both names");

    let get = |path: &str, anthropic: bool| {
        let mut request = stack.client.get(format!("http://{}{path}", stack.proxy)).header("x-api-key", &key);
        if anthropic {
            request = request.header("anthropic-version", "2023-06-01");
        }
        request.send()
    };
    let response = get("/v1/models", true).await.unwrap();
    assert!(response.headers().contains_key("request-id"));
    let list: Value = response.json().await.unwrap();
    assert_eq!(
        list["data"][0],
        json!({"type": "model", "id": "team-coder", "display_name": "team-coder",
        "created_at": "1970-01-01T00:00:00Z"})
    );
    assert_eq!((list["has_more"].as_bool(), list["first_id"].as_str()), (Some(false), Some("team-coder")));
    let list: Value = get("/v1/models", false).await.unwrap().json().await.unwrap();
    assert_eq!((list["object"].as_str(), list["data"][0]["object"].as_str()), (Some("list"), Some("model")));
    let one: Value = get("/v1/models/team-coder", true).await.unwrap().json().await.unwrap();
    assert_eq!((one["type"].as_str(), one["id"].as_str()), (Some("model"), Some("team-coder")));
    let one: Value = get("/v1/models/team-coder", false).await.unwrap().json().await.unwrap();
    assert_eq!((one["object"].as_str(), one["id"].as_str()), (Some("model"), Some("team-coder")));
    let missing = get("/v1/models/nope", true).await.unwrap();
    assert_eq!(missing.status(), StatusCode::NOT_FOUND);
    assert_eq!(error_of(&missing.text().await.unwrap()).0, "not_found_error");
    let missing = get("/v1/models/nope", false).await.unwrap();
    assert_eq!(missing.status(), StatusCode::NOT_FOUND);
    let error: Value = missing.json().await.unwrap();
    assert_eq!(error["error"]["code"], "model_not_found");

    let count = stack
        .client
        .post(format!("http://{}/v1/messages/count_tokens", stack.proxy))
        .header("x-api-key", &key)
        .json(&json!({"model": "nope", "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(count.status(), StatusCode::NOT_FOUND);
    assert!(count.headers().contains_key("request-id"));
    assert_eq!(error_of(&count.text().await.unwrap()).0, "not_found_error");
}
