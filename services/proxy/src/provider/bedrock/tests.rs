use super::*;
use aws_smithy_types::event_stream::{Header, HeaderValue as EventHeader, Message};
use futures_util::StreamExt;
use serde_json::json;
use shield_core::exchange::{Block, Delta, Stop};

use crate::provider::Decoded;

fn target(extra: Value) -> Target {
    let mut body = json!({"base_url": "https://bedrock-runtime.us-west-2.amazonaws.com", "flavor": "bedrock",
        "model": "anthropic.claude-sonnet-4-20250514-v1:0"});
    for (k, v) in extra.as_object().into_iter().flatten() {
        body[k] = v.clone();
    }
    serde_json::from_value(body).unwrap()
}

fn body_of(caller: Value, extra: Value) -> Value {
    let request = ChatRequest::parse(caller.to_string().as_bytes()).unwrap();
    serde_json::from_slice(&BEDROCK.body(&request, &target(extra), false).to_vec()).unwrap()
}

#[test]
fn the_model_id_is_one_encoded_segment_and_the_method_follows() {
    let endpoint = BEDROCK.endpoint(&target(json!({}))).unwrap();
    assert_eq!(
        BEDROCK.call_url(&endpoint, false).as_str(),
        "https://bedrock-runtime.us-west-2.amazonaws.com/model/anthropic.claude-sonnet-4-20250514-v1%3A0/converse"
    );
    let arn = "arn:aws:bedrock:us-east-1:123456789012:inference-profile/us.anthropic.claude-3-haiku";
    let endpoint = BEDROCK.endpoint(&target(json!({"model": arn}))).unwrap();
    assert_eq!(
        BEDROCK.call_url(&endpoint, true).path(),
        "/model/arn%3Aaws%3Abedrock%3Aus-east-1%3A123456789012%3Ainference-profile%2Fus.anthropic.claude-3-haiku/converse-stream"
    );
}

#[test]
fn the_region_comes_from_the_host_or_the_target() {
    assert_eq!(target(json!({})).bedrock_region().as_deref(), Some("us-west-2"));
    let fips = target(json!({"base_url": "https://bedrock-runtime-fips.us-east-1.amazonaws.com"}));
    assert_eq!(fips.bedrock_region().as_deref(), Some("us-east-1"));
    let local = target(json!({"base_url": "http://127.0.0.1:9/x"}));
    assert_eq!(local.bedrock_region(), None);
    let named = target(json!({"base_url": "http://127.0.0.1:9/x", "bedrock": {"region": "eu-central-1"}}));
    assert_eq!(named.bedrock_region().as_deref(), Some("eu-central-1"));
}

#[test]
fn a_key_pair_signs_with_sigv4_and_an_api_key_is_a_bearer_token() {
    let target = target(json!({}));
    let pair = json!({"access_key_id": "AKIDEXAMPLE", "secret_access_key": "wJalrXUtnFEMI/K7MDENG", "session_token": "FQoGZXIvYXdzE"});
    let credential = BEDROCK.credential(&target, &pair.to_string()).unwrap();
    assert!(!format!("{credential:?}").contains("wJalr"), "Debug never shows a secret");
    let url = BEDROCK.call_url(&BEDROCK.endpoint(&target).unwrap(), false).into_owned();
    let mut headers = HeaderMap::new();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    BEDROCK.authenticate(&credential, &url, &b"{}".to_vec().into(), &mut headers);
    let authorization = headers["authorization"].to_str().unwrap();
    let date = &headers["x-amz-date"].to_str().unwrap()[..8];
    assert!(
        authorization
            .starts_with(&format!("AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/{date}/us-west-2/bedrock/aws4_request")),
        "{authorization}"
    );
    assert!(
        authorization.contains("SignedHeaders=content-type;host;x-amz-date;x-amz-security-token"),
        "{authorization}"
    );
    assert_eq!(headers["x-amz-security-token"], "FQoGZXIvYXdzE");
    assert!(headers["authorization"].is_sensitive() && headers["x-amz-security-token"].is_sensitive());
    // Signed anew for another body: a retry is signed over what it sends.
    let mut again = HeaderMap::new();
    BEDROCK.authenticate(&credential, &url, &b"{\"x\":1}".to_vec().into(), &mut again);
    assert_ne!(again["authorization"], headers["authorization"]);
    // A body in several parts is signed over its bytes in order, as one part would be (the
    // same second: `x-amz-date` is part of the signature).
    let source = bytes::Bytes::from(format!("\"{}\"", "a".repeat(shield_core::spliced::SHARE_FROM)));
    let mut parts = shield_core::spliced::Splicer::default();
    parts.text().extend_from_slice(b"{\"x\":");
    parts.share(&source, 0..source.len());
    parts.text().push(b'}');
    let parts = parts.finish();
    assert_eq!(parts.parts().len(), 3);
    let (mut split, mut whole) = (HeaderMap::new(), HeaderMap::new());
    loop {
        BEDROCK.authenticate(&credential, &url, &parts, &mut split);
        BEDROCK.authenticate(&credential, &url, &parts.to_vec().into(), &mut whole);
        if split["x-amz-date"] == whole["x-amz-date"] {
            break;
        }
    }
    assert_eq!(split["authorization"], whole["authorization"]);

    let api_key = BEDROCK.credential(&target, "ABSKQmVkcm9ja0FQSUtleQ==").unwrap();
    let mut headers = HeaderMap::new();
    BEDROCK.authenticate(&api_key, &url, &b"{}".to_vec().into(), &mut headers);
    assert_eq!(headers["authorization"], "Bearer ABSKQmVkcm9ja0FQSUtleQ==");
    assert!(headers.get("x-amz-date").is_none());

    assert!(BEDROCK.credential(&target, r#"{"access_key_id": "A"}"#).is_err(), "half a pair");
    let nowhere = super::tests::target(json!({"base_url": "http://127.0.0.1:9"}));
    assert!(BEDROCK.credential(&nowhere, &pair.to_string()).is_err(), "no region to sign for");
}

#[test]
fn requests_map_system_turns_tools_results_images_and_config() {
    let body = body_of(
        json!({"model": "m", "temperature": 1.7, "top_p": 0.9, "stop": ["END"], "max_tokens": 100,
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": [{"type": "text", "text": "see"},
                    {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBOR"}}]},
                {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
                    "function": {"name": "search", "arguments": "{\"q\":\"x\"}"}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "found"},
                {"role": "user", "content": "and?"},
            ],
            "tools": [{"type": "function", "function": {"name": "search", "description": "d",
                "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}}],
            "tool_choice": "required"}),
        json!({}),
    );
    assert_eq!(body["system"], json!([{"text": "Be brief."}]));
    assert!(body.get("modelId").is_none() && body.get("model").is_none(), "the model is in the path");
    let messages = body["messages"].as_array().unwrap();
    assert_eq!(messages.len(), 3, "the tool result and the next user text are one user turn: {messages:?}");
    assert_eq!(messages[0]["content"][1], json!({"image": {"format": "png", "source": {"bytes": "iVBOR"}}}));
    assert_eq!(
        messages[1],
        json!({"role": "assistant", "content": [{"toolUse": {"toolUseId": "call_1", "name": "search", "input": {"q": "x"}}}]})
    );
    assert_eq!(
        messages[2]["content"],
        json!([{"toolResult": {"toolUseId": "call_1", "content": [{"text": "found"}], "status": "success"}}, {"text": "and?"}])
    );
    assert_eq!(
        body["inferenceConfig"],
        json!({"maxTokens": 100, "temperature": 1.0, "topP": 0.9, "stopSequences": ["END"]})
    );
    assert_eq!(
        body["toolConfig"],
        json!({"tools": [{"toolSpec": {"name": "search", "description": "d", "inputSchema": {"json":
            {"type": "object", "properties": {"q": {"type": "string"}}}}}}], "toolChoice": {"any": {}}})
    );
}

#[test]
fn thinking_goes_back_signed_and_an_effort_becomes_claude_thinking_on_a_reasoning_target() {
    let caller = json!({"model": "m", "max_tokens": 20000, "messages": [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "hmm", "signature": "sig-claude"},
            {"type": "thinking", "thinking": "other", "signature": "gemini:abc"},
            {"type": "text", "text": "hello"}]},
        {"role": "user", "content": "go on"}],
        "thinking": {"type": "enabled", "budget_tokens": 8000}});
    let request = crate::messages::request::normalise(
        &caller.to_string().into(),
        crate::messages::request::Headers::default(),
        false,
    )
    .unwrap();
    let reasoning = target(json!({"capabilities": {"reasoning": true}}));
    let body: Value = serde_json::from_slice(&BEDROCK.body(&request, &reasoning, false).to_vec()).unwrap();
    assert_eq!(
        body["messages"][1]["content"],
        json!([{"reasoningContent": {"reasoningText": {"text": "hmm", "signature": "sig-claude"}}}, {"text": "hello"}]),
        "Claude's signed thinking goes back; Gemini's does not"
    );
    assert_eq!(body["additionalModelRequestFields"]["thinking"]["type"], "enabled");
    assert!(body["additionalModelRequestFields"]["thinking"]["budget_tokens"].as_u64().unwrap() >= 1024);
    let plain: Value = serde_json::from_slice(&BEDROCK.body(&request, &target(json!({})), false).to_vec()).unwrap();
    assert!(plain.get("additionalModelRequestFields").is_none());
    assert_eq!(BEDROCK.dropped(&request, &target(json!({}))), vec!["thinking".to_string()]);
}

#[test]
fn answers_map_text_tool_use_reasoning_stops_and_usage() {
    let body = json!({"output": {"message": {"role": "assistant", "content": [
            {"reasoningContent": {"reasoningText": {"text": "hmm", "signature": "c2ln"}}},
            {"text": "let me look"},
            {"toolUse": {"toolUseId": "tooluse_1", "name": "search", "input": {"q": "x"}}}]}},
        "stopReason": "tool_use",
        "usage": {"inputTokens": 10, "outputTokens": 5, "totalTokens": 45, "cacheReadInputTokens": 20, "cacheWriteInputTokens": 10}});
    let answer = BEDROCK.answer(body.to_string().into_bytes()).unwrap();
    assert_eq!(
        answer.body.answer.blocks,
        vec![
            Block::Thinking { thinking: "hmm".into(), signature: "c2ln".into() },
            Block::Text("let me look".into()),
            Block::ToolUse { id: "tooluse_1".into(), name: "search".into(), input: "{\"q\":\"x\"}".into() },
        ]
    );
    assert_eq!(answer.body.answer.stop, Some(Stop::ToolUse));
    assert!(answer.body.answer.id.starts_with("bedrock-"));
    let usage = answer.usage.unwrap();
    assert_eq!((usage.input, usage.output, usage.cache_read, usage.cache_write), (40, 5, 20, 10));
    // A total that already counts the cached tokens in `inputTokens`.
    let inclusive = json!({"output": {"message": {"role": "assistant", "content": [{"text": "x"}]}}, "stopReason": "max_tokens",
        "usage": {"inputTokens": 30, "outputTokens": 5, "totalTokens": 35, "cacheReadInputTokens": 20}});
    let answer = BEDROCK.answer(inclusive.to_string().into_bytes()).unwrap();
    assert_eq!(answer.usage.unwrap().input, 30);
    assert_eq!(answer.body.answer.stop, Some(Stop::MaxTokens));
    let malformed =
        json!({"output": {"message": {"role": "assistant", "content": []}}, "stopReason": "malformed_tool_use"});
    assert!(BEDROCK.answer(malformed.to_string().into_bytes()).is_none(), "a failed generation is not an answer");
    assert!(BEDROCK.answer(b"{}".to_vec()).is_none());
}

fn failure(status: u16, kind: &str, message: &str) -> Failure {
    let mut headers = HeaderMap::new();
    if !kind.is_empty() {
        headers.insert(
            "x-amzn-errortype",
            HeaderValue::from_str(&format!("{kind}:http://internal.amazon.com/coral/")).unwrap(),
        );
    }
    BEDROCK.failure(status, &headers, json!({"message": message}).to_string().into_bytes())
}

#[test]
fn aws_errors_map_to_failure_classes() {
    assert_eq!(failure(429, "ThrottlingException", "Too many requests").class, Class::RateLimited);
    assert_eq!(failure(429, "ModelNotReadyException", "loading").class, Class::ServerError);
    assert_eq!(failure(503, "ServiceUnavailableException", "x").class, Class::ServerError);
    assert_eq!(failure(500, "InternalServerException", "x").class, Class::ServerError);
    assert_eq!(failure(408, "ModelTimeoutException", "x").class, Class::Timeout);
    assert_eq!(
        failure(400, "ValidationException", "Input is too long for requested model.").class,
        Class::ContextLength
    );
    assert_eq!(failure(400, "ValidationException", "messages: required").class, Class::ClientError);
    assert_eq!(failure(403, "AccessDeniedException", "no").class, Class::ClientError);
    assert_eq!(failure(403, "UnrecognizedClientException", "bad token").class, Class::ClientError);
    // The type in the body when the header is absent.
    let body = json!({"__type": "com.amazon.coral.availability#ThrottlingException", "message": "slow down"});
    assert_eq!(BEDROCK.failure(429, &HeaderMap::new(), body.to_string().into_bytes()).class, Class::RateLimited);
    assert_eq!(failure(502, "", "bad gateway").class, Class::ServerError);
}

fn message(kind: &str, name: &str, payload: Value) -> Vec<u8> {
    let name_header = if kind == "event" { ":event-type" } else { ":exception-type" };
    let headers = vec![
        Header::new(":message-type", EventHeader::String(kind.to_string().into())),
        Header::new(name_header, EventHeader::String(name.to_string().into())),
        Header::new(":content-type", EventHeader::String("application/json".into())),
    ];
    let message = Message::new_from_parts(headers, bytes::Bytes::from(payload.to_string()));
    let mut out = Vec::new();
    aws_smithy_eventstream::frame::write_message_to(&message, &mut out).unwrap();
    out
}

async fn frames_of(chunks: Vec<Vec<u8>>) -> Vec<Result<crate::provider::Frame, String>> {
    let body: BodyBytes =
        Box::pin(futures_util::stream::iter(chunks.into_iter().map(|c| Ok::<_, String>(bytes::Bytes::from(c)))));
    BEDROCK.frames(body).collect().await
}

#[tokio::test]
async fn event_stream_frames_decode_across_chunk_boundaries_and_exceptions_and_bad_crcs_end_them() {
    let mut bytes = message("event", "messageStart", json!({"role": "assistant", "p": "abc"}));
    bytes.extend(message("event", "contentBlockDelta", json!({"contentBlockIndex": 0, "delta": {"text": "hi"}})));
    bytes.extend(message("exception", "throttlingException", json!({"message": "Rate exceeded"})));
    // Split at every 7 bytes: frames arrive in pieces.
    let chunks: Vec<Vec<u8>> = bytes.chunks(7).map(<[u8]>::to_vec).collect();
    let frames = frames_of(chunks).await;
    assert_eq!(frames.len(), 3, "{frames:?}");
    let first = frames[0].as_ref().unwrap();
    assert_eq!(first.event, "messageStart");
    let exception = frames[2].as_ref().unwrap();
    assert_eq!(exception.event, "exception");
    let data: Value = serde_json::from_str(&exception.data).unwrap();
    assert_eq!(
        (data["__type"].as_str(), data["message"].as_str()),
        (Some("throttlingException"), Some("Rate exceeded"))
    );

    let mut corrupt = message("event", "contentBlockDelta", json!({"contentBlockIndex": 0, "delta": {"text": "x"}}));
    *corrupt.last_mut().unwrap() ^= 0xff;
    let mut bytes = message("event", "messageStart", json!({"role": "assistant"}));
    bytes.extend(corrupt);
    bytes.extend(message("event", "messageStop", json!({"stopReason": "end_turn"})));
    let frames = frames_of(vec![bytes]).await;
    assert_eq!(frames.len(), 2, "nothing after a bad frame: {frames:?}");
    assert!(frames[1].as_ref().unwrap_err().contains("malformed"), "{frames:?}");
}

#[test]
fn stream_events_decode_to_deltas_and_exceptions_to_errors() {
    let mut decoder = BEDROCK.decoder();
    let mut out = Vec::new();
    let events = [
        ("messageStart", json!({"role": "assistant", "p": "x"})),
        ("contentBlockDelta", json!({"contentBlockIndex": 0, "delta": {"reasoningContent": {"text": "hmm"}}})),
        ("contentBlockDelta", json!({"contentBlockIndex": 0, "delta": {"reasoningContent": {"signature": "c2ln"}}})),
        ("contentBlockStop", json!({"contentBlockIndex": 0})),
        ("contentBlockDelta", json!({"contentBlockIndex": 1, "delta": {"text": "hi"}})),
        (
            "contentBlockStart",
            json!({"contentBlockIndex": 2, "start": {"toolUse": {"toolUseId": "t1", "name": "search"}}}),
        ),
        ("contentBlockDelta", json!({"contentBlockIndex": 2, "delta": {"toolUse": {"input": "{\"q\":"}}})),
        ("contentBlockDelta", json!({"contentBlockIndex": 2, "delta": {"toolUse": {"input": "1}"}}})),
    ];
    for (event, data) in events {
        assert_eq!(decoder.decode(event, &data.to_string(), &mut out), Decoded::Continue, "{event}");
    }
    let stop = json!({"stopReason": "tool_use"}).to_string();
    assert_eq!(decoder.decode("messageStop", &stop, &mut out), Decoded::Continue);
    let metadata = json!({"usage": {"inputTokens": 3, "outputTokens": 4, "totalTokens": 7}});
    assert_eq!(decoder.decode("metadata", &metadata.to_string(), &mut out), Decoded::Done);
    let deltas: Vec<Delta> = out.iter().flat_map(|c| c.deltas.clone()).collect();
    assert_eq!(
        deltas,
        vec![
            Delta::ThinkingStart,
            Delta::Thinking("hmm".into()),
            Delta::Signature("c2ln".into()),
            Delta::Text("hi".into()),
            Delta::ToolCall { index: 0, id: "t1".into(), name: "search".into() },
            Delta::ToolArguments { index: 0, json: "{\"q\":".into() },
            Delta::ToolArguments { index: 0, json: "1}".into() },
            Delta::Stop(Stop::ToolUse),
        ]
    );
    assert_eq!(decoder.usage().map(|u| (u.input, u.output)), Some((3, 4)));
    assert!(decoder.usage_final() && decoder.message_id().starts_with("bedrock-"));

    let mut decoder = BEDROCK.decoder();
    let throttled = json!({"__type": "throttlingException", "message": "Rate exceeded"}).to_string();
    match decoder.decode("exception", &throttled, &mut Vec::new()) {
        Decoded::Error(class, _) => assert_eq!(class, Class::RateLimited),
        other => panic!("{other:?}"),
    }
    let unknown = json!({"__type": "modelStreamErrorException", "message": "x"}).to_string();
    assert!(matches!(decoder.decode("exception", &unknown, &mut Vec::new()), Decoded::Error(Class::ServerError, _)));
    assert_eq!(decoder.decode("contentBlockDelta", "{not json", &mut Vec::new()), Decoded::Malformed);
}
