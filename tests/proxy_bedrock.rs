//! Amazon Bedrock as a target (issue 30): the real `shield` against the mock's Converse wire,
//! which checks every request's SigV4 signature with its own signer (proven against botocore
//! below) and refuses a wrong one. Every caller shape reaches Bedrock, streamed (AWS's binary
//! event stream) and not; tool calls and Claude's signed reasoning round-trip; cost comes from
//! Converse's usage; AWS's errors fail over with the right class, and an exception inside a
//! stream fails over before the first content and breaks the stream after it.

use reqwest::StatusCode;
use serde_json::{Value, json};
use shield_e2e::clouds;
use shield_e2e::stack::Stack;

const MODEL: &str = "us.anthropic.claude-sonnet-4-20250514-v1:0";

/// A Bedrock target on the mock, signed for us-west-2 with the vault secret `secret`.
async fn bedrock_target(stack: &Stack, id: &str, scenario: &str, secret: &str, extra: Value) {
    let mut body = json!({"flavor": "bedrock", "base_url": format!("http://{}/mock/id:{id};{scenario}", stack.mock),
        "model": MODEL, "bedrock": {"region": "us-west-2"}, "allow_private": true,
        "auth": {"mode": "vault", "secret_ref": format!("shield://{secret}")}});
    for (k, v) in extra.as_object().into_iter().flatten() {
        body[k] = v.clone();
    }
    stack.put_target(id, body).await;
}

fn sent(received: &Value) -> Value {
    serde_json::from_str(received["body"].as_str().unwrap()).unwrap()
}

async fn post(stack: &Stack, key: &str, path: &str, body: Value) -> (StatusCode, reqwest::header::HeaderMap, String) {
    stack.post(key, path, body, &[]).await
}

#[tokio::test]
async fn every_caller_shape_reaches_bedrock_signed_streamed_and_not() {
    let stack = Stack::start().await;
    let keys = clouds::aws_keys(&stack, "aws").await;
    bedrock_target(&stack, "br", "usage:12-20", "aws", json!({"price": {"input_per_mtok": 3, "output_per_mtok": 15}}))
        .await;
    bedrock_target(&stack, "br-tool", "tool:search", "aws", json!({})).await;
    bedrock_target(&stack, "br-think", "think;tool:search", "aws", json!({"capabilities": {"reasoning": true}})).await;
    let api_key = clouds::bedrock_api_key(&stack, "bedrock-key").await;
    bedrock_target(&stack, "br-key", "", "bedrock-key", json!({})).await;
    for id in ["br", "br-tool", "br-think", "br-key"] {
        stack.put_route(id, json!({"targets": [id]})).await;
    }
    let (key, _) = stack.key(None).await;

    // Chat Completions, not streamed: the encoded model id, the signature, the body; cost.
    let (status, headers, text) = post(
        &stack,
        &key,
        "/v1/chat/completions",
        json!({"model": "br",
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
    assert_eq!(answer["x_shield"]["routing"]["cost_micros"], 336, "12 × 3 + 20 × 15 micro-USD");
    assert_eq!(headers["x-shield-target"], "br");
    let received = stack.received("br").await;
    let first = &received[0];
    assert!(
        first["path"].as_str().unwrap().ends_with("/model/us.anthropic.claude-sonnet-4-20250514-v1%3A0/converse"),
        "{first}"
    );
    let authorization = first["headers"]["authorization"].as_str().unwrap();
    assert!(
        authorization.starts_with(&format!("AWS4-HMAC-SHA256 Credential={}/", keys.access_key_id))
            && authorization.contains("/us-west-2/bedrock/aws4_request"),
        "{authorization}"
    );
    assert_eq!(first["headers"]["x-amz-security-token"], keys.session_token.as_str());
    let body = sent(first);
    assert_eq!(body["system"], json!([{"text": "Be brief."}]));
    assert_eq!(body["messages"], json!([{"role": "user", "content": [{"text": "hello"}]}]));

    // Streamed, in each caller shape: AWS's event stream re-framed for the caller.
    let (status, _, text) = post(
        &stack,
        &key,
        "/v1/chat/completions",
        json!({"model": "br", "stream": true, "stream_options": {"include_usage": true},
        "messages": [{"role": "user", "content": "hello"}]}),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        text.contains("part1") && text.contains("\"prompt_tokens\":12") && text.ends_with("data: [DONE]\n\n"),
        "{text}"
    );
    assert!(stack.received("br").await.last().unwrap()["path"].as_str().unwrap().ends_with("/converse-stream"));
    let (status, _, text) = post(
        &stack,
        &key,
        "/v1/messages",
        json!({"model": "br", "max_tokens": 100, "stream": true,
        "messages": [{"role": "user", "content": "hello"}]}),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert!(text.contains("event: message_stop") && text.contains("part2"), "{text}");
    let (status, _, text) =
        post(&stack, &key, "/v1/responses", json!({"model": "br", "input": "hello", "stream": true, "store": false}))
            .await;
    assert_eq!(status, StatusCode::OK);
    assert!(text.contains("response.completed") && text.contains("part2"), "{text}");
    let (status, _, text) =
        post(&stack, &key, "/v1/responses", json!({"model": "br", "input": "hello", "store": false})).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    assert!(text.contains("mock answer to: hello"), "{text}");

    // A tool call and its result, streamed and not.
    let tools = json!([{"type": "function", "function": {"name": "search", "parameters": {"type": "object"}}}]);
    let (status, _, text) = post(
        &stack,
        &key,
        "/v1/chat/completions",
        json!({"model": "br-tool", "tools": tools, "messages": [{"role": "user", "content": "find x"}]}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let answer: Value = serde_json::from_str(&text).unwrap();
    let call = answer["choices"][0]["message"]["tool_calls"][0].clone();
    assert_eq!(
        (call["function"]["name"].as_str(), call["id"].as_str(), answer["choices"][0]["finish_reason"].as_str()),
        (Some("search"), Some("tooluse_mock1"), Some("tool_calls"))
    );
    let (status, _, text) = post(
        &stack,
        &key,
        "/v1/chat/completions",
        json!({"model": "br-tool", "tools": tools, "stream": true, "messages": [{"role": "user", "content": "find x"},
            answer["choices"][0]["message"], {"role": "tool", "tool_call_id": "tooluse_mock1", "content": "x is 42"}]}),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert!(text.contains("\"name\":\"search\"") && text.contains("\\\"q\\\""), "the streamed call: {text}");
    let body = sent(stack.received("br-tool").await.last().unwrap());
    assert_eq!(body["messages"][1]["content"][0]["toolUse"]["toolUseId"], "tooluse_mock1");
    assert_eq!(
        body["messages"][2]["content"][0]["toolResult"],
        json!({"toolUseId": "tooluse_mock1", "content": [{"text": "x is 42"}], "status": "success"})
    );
    assert_eq!(body["toolConfig"]["tools"][0]["toolSpec"]["name"], "search");

    // Claude's reasoning through Anthropic's shape: out with its signature, back the same.
    let anthropic_tools = json!([{"name": "search", "input_schema": {"type": "object"}}]);
    let (status, _, text) = post(
        &stack,
        &key,
        "/v1/messages",
        json!({"model": "br-think", "max_tokens": 100, "tools": anthropic_tools,
        "messages": [{"role": "user", "content": "find x"}]}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let message: Value = serde_json::from_str(&text).unwrap();
    let content = message["content"].as_array().unwrap().clone();
    assert_eq!(content[0], json!({"type": "thinking", "thinking": "Let me think.", "signature": "YmVkcm9jay1zaWc="}));
    let (status, _, text) = post(
        &stack,
        &key,
        "/v1/messages",
        json!({"model": "br-think", "max_tokens": 100, "tools": anthropic_tools,
        "messages": [{"role": "user", "content": "find x"}, {"role": "assistant", "content": content},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "tooluse_mock1", "content": "42"}]}]}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let body = sent(stack.received("br-think").await.last().unwrap());
    assert_eq!(
        body["messages"][1]["content"][0],
        json!({"reasoningContent": {"reasoningText": {"text": "Let me think.", "signature": "YmVkcm9jay1zaWc="}}})
    );

    // A Bedrock API key goes as a bearer token, unsigned.
    let (status, _, text) = post(
        &stack,
        &key,
        "/v1/chat/completions",
        json!({"model": "br-key", "messages": [{"role": "user", "content": "hi"}]}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let received = stack.received("br-key").await;
    assert_eq!(received[0]["headers"]["authorization"], format!("Bearer {api_key}"));
    assert!(received[0]["headers"].get("x-amz-date").is_none());
}

#[tokio::test]
async fn aws_errors_fail_over_with_their_class_and_stream_exceptions_break_after_the_commit_point() {
    let stack = Stack::start().await;
    clouds::aws_keys(&stack, "aws").await;
    // The mock trusts another secret for this key id's twin: a signature it cannot match.
    let forged = clouds::AwsKeys {
        access_key_id: clouds::aws_keys(&stack, "aws-2").await.access_key_id,
        secret_access_key: "not-the-secret-the-mock-trusts".into(),
        session_token: String::new(),
    };
    stack
        .put_secret(
            "aws-forged",
            &json!({"access_key_id": forged.access_key_id, "secret_access_key": forged.secret_access_key}).to_string(),
            &["127.0.0.1"],
        )
        .await;
    for (id, scenario, secret) in [
        ("br-throttled", "status:429", "aws"),
        ("br-not-ready", "status:429;err:not_ready", "aws"),
        ("br-unavailable", "status:503", "aws"),
        ("br-timeout", "status:408", "aws"),
        ("br-long", "status:400;err:too_long", "aws"),
        ("br-denied", "status:403", "aws"),
        ("br-forged", "", "aws-forged"),
        ("br-errfirst", "errfirst", "aws"),
        ("br-badcrc", "malformed:1", "aws"),
        ("br-midstream", "chunks:4;errat:2", "aws"),
        ("br-ok", "", "aws"),
    ] {
        bedrock_target(&stack, id, scenario, secret, json!({})).await;
    }
    stack.mock_target("gpt-ok", "", json!({})).await;
    stack.mock_target("gpt-down", "status:503", json!({})).await;
    for (route, first) in [
        ("throttled", "br-throttled"),
        ("not-ready", "br-not-ready"),
        ("unavailable", "br-unavailable"),
        ("timeout", "br-timeout"),
        ("denied", "br-denied"),
        ("forged", "br-forged"),
        ("errfirst", "br-errfirst"),
        ("badcrc", "br-badcrc"),
        ("midstream", "br-midstream"),
    ] {
        stack.put_route(route, json!({"targets": [first, "gpt-ok"]})).await;
    }
    stack
        .put_route("too-long", json!({"targets": ["br-long", "gpt-ok"], "failover": {"on": ["context_length"]}}))
        .await;
    stack.put_route("to-bedrock", json!({"targets": ["gpt-down", "br-ok"]})).await;
    let (key, _) = stack.key(None).await;
    let chat = |model: &str, stream: bool| json!({"model": model, "stream": stream, "messages": [{"role": "user", "content": "hi"}]});

    for (route, class) in [
        ("throttled", "rate_limited"),
        ("not-ready", "server_error"),
        ("unavailable", "server_error"),
        ("timeout", "timeout"),
        ("too-long", "context_length"),
    ] {
        let (status, headers, text) = post(&stack, &key, "/v1/chat/completions", chat(route, false)).await;
        assert_eq!(status, StatusCode::OK, "{route}: {text}");
        assert_eq!(headers["x-shield-target"], "gpt-ok", "{route}");
        let body: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(body["x_shield"]["routing"]["attempts"][0]["class"], class, "{route}: {body}");
    }
    // Access denied and a signature AWS cannot match are the caller's answer: no failover.
    for route in ["denied", "forged"] {
        let before = stack.received("gpt-ok").await.len();
        let (status, _, text) = post(&stack, &key, "/v1/chat/completions", chat(route, false)).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{route}: {text}");
        assert_eq!(stack.received("gpt-ok").await.len(), before, "{route}: no failover from a 403");
    }
    // Before the first content an exception frame or a frame with a bad CRC fails over.
    for route in ["errfirst", "badcrc"] {
        let (status, headers, text) = post(&stack, &key, "/v1/chat/completions", chat(route, true)).await;
        assert_eq!(status, StatusCode::OK, "{route}: {text}");
        assert_eq!(headers["x-shield-target"], "gpt-ok", "{route}: {text}");
        assert!(text.ends_with("data: [DONE]\n\n"), "{route}: {text}");
    }
    // After it, the stream is broken: the caller gets what came and an error, not a new answer.
    let (status, headers, text) = post(&stack, &key, "/v1/chat/completions", chat("midstream", true)).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(headers["x-shield-target"], "br-midstream");
    assert!(text.contains("part1") && text.contains("stream_broken") && !text.contains("part3"), "{text}");
    let (status, _, text) = post(
        &stack,
        &key,
        "/v1/messages",
        json!({"model": "midstream", "max_tokens": 50, "stream": true, "messages": [{"role": "user", "content": "hi"}]}),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert!(text.contains("part1") && text.contains("event: error"), "{text}");
    // And the other way: an OpenAI target down, Bedrock answers.
    for stream in [false, true] {
        let (status, headers, text) = post(&stack, &key, "/v1/chat/completions", chat("to-bedrock", stream)).await;
        assert_eq!(status, StatusCode::OK, "{text}");
        assert_eq!(headers["x-shield-target"], "br-ok");
    }
}

/// The mock's SigV4 checker and Converse wire agree with AWS's own client: botocore signs
/// (its signer, not the gateway's) and the mock accepts it; botocore parses the mock's
/// answers and its event stream (CRCs included); a signature made with the wrong secret is
/// refused. So a test that passes through the mock passes only with a correct signer.
#[tokio::test]
async fn botocore_signs_what_the_mock_checks_and_reads_what_it_sends() {
    let stack = Stack::start().await;
    let keys = clouds::aws_keys(&stack, "aws").await;
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/sdk/bedrock_botocore.py");
    let out = tokio::process::Command::new("python3")
        .arg(script)
        .env("MOCK_URL", format!("http://{}/mock/id:boto", stack.mock))
        .env("AWS_KEYS", keys.secret())
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    stack.evidence.write("botocore.txt", &stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    let report: Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    assert_eq!(report["converse"], "mock answer to: hello from botocore");
    assert_eq!(report["stream"], "mock part1 part2 ");
    assert_eq!(report["stream_stop"], "end_turn");
    assert_eq!(report["forged"], "InvalidSignatureException");
    assert_eq!(report["unknown_key"], "UnrecognizedClientException");
    assert_eq!(stack.received("boto").await.len(), 4);
}
