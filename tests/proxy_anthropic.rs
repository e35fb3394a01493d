//! Anthropic's Messages API as a target (issue 15), end to end against the mock's
//! `/v1/messages`: routes that mix flavors fail over both ways, streamed and not, and the
//! caller sees the same OpenAI-shaped answer whichever answered; tool calls round-trip; cost
//! comes from Anthropic's usage fields (cache reads and writes at their own prices); the key
//! goes only to its bound host, in `x-api-key`, never as `Authorization`; Anthropic's errors
//! become the right failure classes.

use reqwest::StatusCode;
use serde_json::{Value, json};
use shield_e2e::stack::{Stack, chat_body, stream_content as content};

fn anthropic() -> Value {
    json!({"flavor": "anthropic", "auth": {"mode": "vault", "secret_ref": "shield://claude"}})
}

/// A stack with an Anthropic key in the vault bound to the mock's host.
async fn stack_with_key() -> (Stack, String) {
    let stack = Stack::start().await;
    let key = shield_e2e::unique("sk-ant-api03-");
    stack.put_secret("claude", &key, &["127.0.0.1"]).await;
    (stack, key)
}

fn sent_body(received: &Value) -> Value {
    serde_json::from_str(received["body"].as_str().unwrap()).unwrap()
}

#[tokio::test]
async fn mixed_flavors_fail_over_both_ways_and_answer_in_one_shape() {
    let (stack, anthropic_key) = stack_with_key().await;
    stack.mock_target("claude-down", "status:529", anthropic()).await;
    stack.mock_target("claude", "", anthropic()).await;
    stack.mock_target("gpt-down", "status:503", json!({})).await;
    stack.mock_target("gpt", "", json!({})).await;
    stack.put_route("to-openai", json!({"targets": ["claude-down", "gpt"]})).await;
    stack.put_route("to-anthropic", json!({"targets": ["gpt-down", "claude"]})).await;
    let (key, _) = stack.key(None).await;

    // Anthropic 529 → the OpenAI target answers.
    let (status, headers, body) = stack.chat(&key, chat_body("to-openai"), &[]).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        (headers["x-shield-target"].to_str().unwrap(), headers["x-shield-failovers"].to_str().unwrap()),
        ("gpt", "1")
    );
    let attempt = &body["x_shield"]["routing"]["attempts"][0];
    assert_eq!(
        (attempt["target"].clone(), attempt["class"].clone(), attempt["status"].clone()),
        (json!("claude-down"), json!("server_error"), json!(529))
    );

    // OpenAI 503 → the Anthropic target answers, in the same OpenAI shape.
    let mut request = chat_body("to-anthropic");
    request["messages"] = json!([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hello"}]);
    request["stop"] = json!(["END"]);
    let (status, headers, body) = stack.chat(&key, request, &[]).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(headers["x-shield-target"], "claude");
    assert_eq!(body["object"], "chat.completion");
    assert_eq!(body["model"], "model-claude");
    assert_eq!(body["choices"][0]["message"]["role"], "assistant");
    assert_eq!(body["choices"][0]["message"]["content"], "mock answer to: hello");
    assert_eq!(body["choices"][0]["finish_reason"], "stop");
    assert!(body["usage"]["prompt_tokens"].as_u64().unwrap() > 0);

    // What Anthropic received: its path, its headers, its body.
    let received = stack.received("claude").await;
    assert_eq!(received.len(), 1);
    assert!(received[0]["path"].as_str().unwrap().ends_with("/v1/messages"), "{}", received[0]["path"]);
    let sent_headers = &received[0]["headers"];
    assert_eq!(sent_headers["x-api-key"], json!(anthropic_key), "the vault key as x-api-key");
    assert_eq!(sent_headers["anthropic-version"], "2023-06-01");
    assert!(sent_headers.get("authorization").is_none(), "no Authorization header: {sent_headers}");
    let sent = sent_body(&received[0]);
    assert_eq!(sent["system"], json!([{"type": "text", "text": "Be brief."}]));
    assert_eq!(sent["messages"], json!([{"role": "user", "content": [{"type": "text", "text": "hello"}]}]));
    assert_eq!((sent["max_tokens"].clone(), sent["stop_sequences"].clone()), (json!(4096), json!(["END"])));
    assert_eq!(sent["model"], "model-claude");
    // And the OpenAI target never got Anthropic's key.
    for received in stack.received("gpt").await.iter().chain(stack.received("gpt-down").await.iter()) {
        assert!(!received.to_string().contains(&anthropic_key));
    }
}

#[tokio::test]
async fn streams_fail_over_both_ways_and_relay_anthropic_events_as_chunks() {
    let (stack, _) = stack_with_key().await;
    stack.mock_target("claude-errfirst", "errfirst", anthropic()).await;
    stack.mock_target("claude", "chunks:3;usage:12-3", anthropic()).await;
    stack.mock_target("gpt-down", "status:503", json!({})).await;
    stack.mock_target("gpt", "chunks:2", json!({})).await;
    stack.put_route("to-openai", json!({"targets": ["claude-errfirst", "gpt"]})).await;
    stack.put_route("to-anthropic", json!({"targets": ["gpt-down", "claude"]})).await;
    let (key, _) = stack.key(None).await;
    let stream = |model: &str| json!({"model": model, "stream": true, "messages": [{"role": "user", "content": "hi"}]});

    // An Anthropic `error` event before any content fails over.
    let (status, headers, data) = stack.chat_stream(&key, stream("to-openai")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        (headers["x-shield-target"].to_str().unwrap(), headers["x-shield-failovers"].to_str().unwrap()),
        ("gpt", "1")
    );
    assert_eq!(content(&data), "mock part1 ");
    assert!(!data.iter().any(|d| d.contains("Overloaded")), "the failed attempt's output is never sent");

    // OpenAI 503 → Anthropic streams, relayed as OpenAI chunks with the usage it reported.
    let mut body = stream("to-anthropic");
    body["stream_options"] = json!({"include_usage": true});
    let (status, headers, data) = stack.chat_stream(&key, body).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(headers["x-shield-target"], "claude");
    assert_eq!(content(&data), "mock part1 part2 ");
    assert_eq!(data.last().unwrap(), "[DONE]", "Anthropic's message_stop becomes [DONE]");
    let chunks: Vec<Value> = data.iter().filter_map(|d| serde_json::from_str(d).ok()).collect();
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    assert!(chunks.iter().all(|c| c["object"] == "chat.completion.chunk" && c["model"] == "model-claude"));
    let finish: Vec<&Value> = chunks.iter().filter(|c| !c["choices"][0]["finish_reason"].is_null()).collect();
    assert_eq!(finish.len(), 1);
    assert_eq!(finish[0]["choices"][0]["finish_reason"], "stop");
    let usage: Vec<&Value> = chunks.iter().filter(|c| !c["usage"].is_null()).collect();
    assert_eq!(usage.len(), 1, "one usage chunk, as the client asked");
    assert_eq!(
        (usage[0]["usage"]["prompt_tokens"].clone(), usage[0]["usage"]["completion_tokens"].clone()),
        (json!(12), json!(3))
    );
    assert_eq!(sent_body(&stack.received("claude").await[0])["stream"], true);

    // Without include_usage, no usage chunk reaches the client.
    let (_, _, data) = stack.chat_stream(&key, stream("to-anthropic")).await;
    assert!(data.iter().filter_map(|d| serde_json::from_str::<Value>(d).ok()).all(|c| c["usage"].is_null()));
}

#[tokio::test]
async fn tool_calls_round_trip_through_an_anthropic_target() {
    let (stack, _) = stack_with_key().await;
    stack.mock_target("claude", "tool:search", anthropic()).await;
    stack.put_route("agent", json!({"targets": ["claude"]})).await;
    let (key, _) = stack.key(None).await;
    let request = json!({"model": "agent", "tool_choice": "auto",
    "tools": [{"type": "function", "function": {"name": "search", "description": "Search the web",
        "parameters": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}}}],
    "messages": [
        {"role": "user", "content": "find x"},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "call_9", "type": "function",
            "function": {"name": "search", "arguments": "{\"q\":\"x\"}"}}]},
        {"role": "tool", "tool_call_id": "call_9", "content": "x is 42"},
        {"role": "user", "content": "and y?"},
    ]});
    let (status, _, body) = stack.chat(&key, request, &[]).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let message = &body["choices"][0]["message"];
    assert_eq!(body["choices"][0]["finish_reason"], "tool_calls");
    assert_eq!(message["tool_calls"][0]["id"], "toolu_mock1");
    assert_eq!(message["tool_calls"][0]["type"], "function");
    assert_eq!(message["tool_calls"][0]["function"]["name"], "search");
    assert_eq!(
        serde_json::from_str::<Value>(message["tool_calls"][0]["function"]["arguments"].as_str().unwrap()).unwrap(),
        json!({"q": "mock"})
    );

    let sent = sent_body(&stack.received("claude").await[0]);
    assert_eq!(sent["tools"][0]["name"], "search");
    assert_eq!(sent["tools"][0]["input_schema"]["required"], json!(["q"]));
    assert_eq!(sent["tool_choice"], json!({"type": "auto"}));
    let messages = sent["messages"].as_array().unwrap();
    assert_eq!(
        messages[1]["content"][0],
        json!({"type": "tool_use", "id": "call_9", "name": "search", "input": {"q": "x"}})
    );
    assert_eq!(messages[2]["role"], "user", "the tool result and the next user turn merge into one user turn");
    assert_eq!(messages[2]["content"][0]["type"], "tool_result");
    assert_eq!(messages[2]["content"][0]["tool_use_id"], "call_9");
    assert_eq!(messages[2]["content"][1], json!({"type": "text", "text": "and y?"}));
}

#[tokio::test]
async fn cost_comes_from_anthropics_usage_fields() {
    let (stack, _) = stack_with_key().await;
    let mut target = anthropic();
    target["price"] =
        json!({"input_per_mtok": 3, "output_per_mtok": 15, "cache_read_per_mtok": 0.3, "cache_write_per_mtok": 3.75});
    stack.mock_target("claude", "usage:100-50;cache:1000-200", target).await;
    stack.put_route("priced", json!({"targets": ["claude"]})).await;
    let (key, _) = stack.key(None).await;
    let (status, _, body) = stack.chat(&key, chat_body("priced"), &[]).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    // 100 × 3 + 1,000 cache reads × 0.3 + 200 cache writes × 3.75 + 50 × 15 = 2,100 micro-USD.
    assert_eq!(body["x_shield"]["routing"]["cost_micros"], 2100);
    assert_eq!(body["usage"]["prompt_tokens"], 1300, "every prompt token, cached ones included");
    assert_eq!(body["usage"]["prompt_tokens_details"]["cached_tokens"], 1000);
    assert_eq!(body["usage"]["completion_tokens"], 50);
    let (status, target) = stack.admin_call(reqwest::Method::GET, "/v1/tenant/me/gateway/targets/claude", None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(target["auth"]["header"], "x-api-key", "a read shows where the key goes");
    assert_eq!(target["auth"]["scheme"], "");
    assert_eq!(target["anthropic"]["version"], "2023-06-01");
}

#[tokio::test]
async fn anthropic_errors_become_failure_classes() {
    let (stack, anthropic_key) = stack_with_key().await;
    stack.mock_target("limited", "status:429;retry-after:120", anthropic()).await;
    stack.mock_target("long", "status:400;err:prompt_is_too_long", anthropic()).await;
    stack.mock_target("denied", "status:401", anthropic()).await;
    stack.mock_target("backup", "", json!({})).await;
    stack.put_route("limited", json!({"targets": ["limited", "backup"]})).await;
    stack.put_route("long", json!({"targets": ["long", "backup"]})).await;
    stack.put_route("denied", json!({"targets": ["denied", "backup"]})).await;
    let (key, _) = stack.key(None).await;

    // 429 with a reset hint: fails over and parks the target.
    let (status, _, body) = stack.chat(&key, chat_body("limited"), &[]).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["x_shield"]["routing"]["attempts"][0]["class"], "rate_limited");
    let (_, _, body) = stack.chat(&key, chat_body("limited"), &[]).await;
    assert_eq!(body["x_shield"]["routing"]["excluded"], json!([{"target": "limited", "reason": "exhausted"}]));
    assert_eq!(stack.received("limited").await.len(), 1, "parked for its Retry-After");

    // A prompt too long is context_length (opt-in): not failed over by default.
    let (status, _, body) = stack.chat(&key, chat_body("long"), &[]).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(body["x_shield"]["routing"]["attempts"][0]["class"], "context_length");
    assert!(body["error"]["message"].as_str().unwrap().contains("prompt is too long"), "{body}");

    // A 401 is the target's credential: never failed over, its text not relayed.
    let (status, _, body) = stack.chat(&key, chat_body("denied"), &[]).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
    assert_eq!(body["x_shield"]["routing"]["attempts"][0]["class"], "client_error");
    assert!(body["error"]["message"].as_str().unwrap().contains("check the target's credential"));
    assert!(!body.to_string().contains(&anthropic_key));
    assert_eq!(stack.received("backup").await.len(), 2, "only the rate limit moved on (then it was parked)");
}

/// A vault key goes only to a host it is bound to: the admin refuses a target (and a
/// rebinding) that would send it elsewhere, and the data plane re-checks at call time
/// (`tenant.rs` unit tests cover a snapshot whose binding does not match).
#[tokio::test]
async fn the_key_reaches_only_its_bound_host() {
    let (stack, anthropic_key) = stack_with_key().await;
    stack.mock_target("claude", "", anthropic()).await;
    let mut elsewhere = anthropic();
    let port = stack.mock.rsplit(':').next().unwrap().to_string();
    elsewhere["base_url"] = json!(format!("http://localhost:{port}/mock/id:elsewhere/v1"));
    elsewhere["model"] = json!("model-elsewhere");
    elsewhere["allow_private"] = json!(true);
    let put =
        |body: Value| stack.admin_call(reqwest::Method::PUT, "/v1/tenant/me/gateway/targets/elsewhere", Some(body));
    let (status, refused) = put(elsewhere.clone()).await;
    assert_eq!(
        (status, refused["error"]["field"].clone()),
        (StatusCode::UNPROCESSABLE_ENTITY, json!("auth.secret_ref"))
    );
    stack.put_secret("claude", &anthropic_key, &["127.0.0.1", "localhost"]).await;
    assert!(put(elsewhere).await.0.is_success());
    let rebind = json!({"value": anthropic_key, "bindings": ["127.0.0.1"]});
    let (status, _) = stack.admin_call(reqwest::Method::PUT, "/v1/tenant/me/secrets/claude", Some(rebind)).await;
    assert_eq!(status, StatusCode::CONFLICT, "a rebinding that would strand a target is refused");

    stack.mock_target("gpt", "", json!({})).await;
    stack.put_route("smart", json!({"targets": ["claude", "gpt"]})).await;
    let (key, _) = stack.key(None).await;
    let (status, headers, body) = stack.chat(&key, chat_body("smart"), &[]).await;
    assert_eq!((status, headers["x-shield-target"].to_str().unwrap()), (StatusCode::OK, "claude"));
    assert_eq!(stack.received("claude").await[0]["headers"]["x-api-key"], json!(anthropic_key));
    assert!(!body.to_string().contains(&anthropic_key));
    assert!(!stack.all_logs().contains(&anthropic_key), "the key is in no log");
}
