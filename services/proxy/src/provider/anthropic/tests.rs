use super::*;
use shield_core::exchange::Block;

fn target(extra: Value) -> Target {
    let mut body =
        json!({"base_url": "https://api.anthropic.com/v1", "model": "claude-sonnet-4-5", "flavor": "anthropic"});
    for (k, v) in extra.as_object().into_iter().flatten() {
        body[k] = v.clone();
    }
    serde_json::from_value(body).unwrap()
}

fn request(body: Value) -> Value {
    let request = ChatRequest::parse(body.to_string().as_bytes()).unwrap();
    serde_json::from_slice(&ANTHROPIC.body(&request, &target(json!({})), false).to_vec()).unwrap()
}

#[test]
fn requests_map_system_roles_tools_images_and_stops() {
    let body = request(json!({
        "model": "smart", "temperature": 0.2, "top_p": 0.9, "stop": "END", "user": "u1",
        "presence_penalty": 1, "x_shield": {"x": 1},
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "hi"},
            {"role": "user", "content": [{"type": "text", "text": "see"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBOR"}}]},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
                "function": {"name": "search", "arguments": "{\"q\":\"x\"}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "found"},
        ],
        "tools": [{"type": "function", "function": {"name": "search", "description": "d",
            "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}}],
        "tool_choice": "required", "parallel_tool_calls": false,
    }));
    assert_eq!(body["model"], "claude-sonnet-4-5");
    assert_eq!(body["system"], json!([{"type": "text", "text": "Be brief."}]));
    assert_eq!(body["max_tokens"], 4096, "always sent");
    assert_eq!(body["stop_sequences"], json!(["END"]));
    assert_eq!((body["temperature"].clone(), body["top_p"].clone()), (json!(0.2), json!(0.9)));
    assert_eq!(body["metadata"], json!({"user_id": "u1"}));
    let messages = body["messages"].as_array().unwrap();
    assert_eq!(messages.len(), 3, "two user turns merged, then assistant, then the tool result: {messages:?}");
    assert_eq!(messages[0]["content"][0], json!({"type": "text", "text": "hi"}));
    assert_eq!(
        messages[0]["content"][2]["source"],
        json!({"type": "base64", "media_type": "image/png", "data": "iVBOR"})
    );
    assert_eq!(
        messages[1]["content"][0],
        json!({"type": "tool_use", "id": "call_1", "name": "search", "input": {"q": "x"}})
    );
    assert_eq!(messages[2]["role"], "user");
    assert_eq!(messages[2]["content"][0]["type"], "tool_result");
    assert_eq!(messages[2]["content"][0]["tool_use_id"], "call_1");
    assert_eq!(body["tools"][0]["input_schema"]["properties"]["q"]["type"], "string");
    assert_eq!(body["tool_choice"], json!({"type": "any", "disable_parallel_tool_use": true}));
    for foreign in ["presence_penalty", "x_shield", "user", "stop", "tool_calls"] {
        assert!(body.get(foreign).is_none(), "{foreign} is not sent");
    }
}

#[test]
fn max_tokens_comes_from_the_request_then_the_target() {
    let request = ChatRequest::parse(br#"{"model":"m","messages":[{"role":"user","content":"x"}]}"#).unwrap();
    let capped = target(json!({"capabilities": {"max_output_tokens": 1000}}));
    let body: Value = serde_json::from_slice(&ANTHROPIC.body(&request, &capped, true).to_vec()).unwrap();
    assert_eq!((body["max_tokens"].clone(), body["stream"].clone()), (json!(1000), json!(true)));
    let body = request_with_max(77);
    assert_eq!(body["max_tokens"], 77);
}

fn request_with_max(max: u64) -> Value {
    request(json!({"model": "m", "max_completion_tokens": max, "messages": [{"role": "user", "content": "x"}]}))
}

#[test]
fn answers_become_typed_answers_with_usage_and_tool_calls() {
    let message = json!({"id": "msg_1", "type": "message", "role": "assistant", "model": "claude-x",
        "content": [{"type": "text", "text": "Let me look."},
            {"type": "tool_use", "id": "toolu_1", "name": "search", "input": {"q": "x"}}],
        "stop_reason": "tool_use", "stop_sequence": null,
        "usage": {"input_tokens": 10, "output_tokens": 5, "cache_read_input_tokens": 100, "cache_creation_input_tokens": 20}});
    let answer = ANTHROPIC.answer(message.to_string().into_bytes()).unwrap();
    let usage = answer.usage;
    assert!(matches!(answer.body.native, Some(crate::provider::Native::Anthropic(_))), "kept as sent");
    let typed = answer.body.answer;
    assert_eq!(typed.id, "msg_1");
    assert_eq!(typed.stop, Some(Stop::ToolUse));
    assert_eq!(
        typed.blocks,
        [
            Block::Text("Let me look.".into()),
            Block::ToolUse { id: "toolu_1".into(), name: "search".into(), input: r#"{"q":"x"}"#.into() }
        ]
    );
    assert_eq!(usage, Some(TokenUsage { input: 130, output: 5, cache_read: 100, cache_write: 20, reasoning: 0 }));
    for (reason, stop) in
        [("end_turn", Stop::EndTurn), ("stop_sequence", Stop::EndTurn), ("max_tokens", Stop::MaxTokens)]
    {
        let message = json!({"type": "message", "content": [], "stop_reason": reason});
        let answer = ANTHROPIC.answer(message.to_string().into_bytes()).unwrap();
        assert_eq!(answer.body.answer.stop, Some(stop));
    }
    assert!(ANTHROPIC.answer(br#"{"type":"error","error":{"type":"api_error"}}"#.to_vec()).is_none());
    assert!(ANTHROPIC.answer(b"nope".to_vec()).is_none());
}

/// A whole text + tool stream, event by event: nothing before the first content, then deltas.
#[test]
fn streams_become_deltas_after_the_first_content() {
    let events = [
        (
            "message_start",
            json!({"type": "message_start", "message": {"id": "msg_1", "model": "claude-x", "usage": {"input_tokens": 12, "output_tokens": 1}}}),
        ),
        ("ping", json!({"type": "ping"})),
        (
            "content_block_start",
            json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
        ),
        (
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hel"}}),
        ),
        (
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "lo"}}),
        ),
        ("content_block_stop", json!({"type": "content_block_stop", "index": 0})),
        (
            "content_block_start",
            json!({"type": "content_block_start", "index": 1, "content_block": {"type": "tool_use", "id": "toolu_1", "name": "search", "input": {}}}),
        ),
        (
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": "{\"q\":"}}),
        ),
        (
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": "\"x\"}"}}),
        ),
        (
            "message_delta",
            json!({"type": "message_delta", "delta": {"stop_reason": "tool_use"}, "usage": {"output_tokens": 15}}),
        ),
    ];
    let mut decoder = ANTHROPIC.decoder();
    let mut out = Vec::new();
    for (i, (name, data)) in events.iter().enumerate() {
        assert_eq!(decoder.decode(name, &data.to_string(), &mut out), Decoded::Continue, "{name}");
        if i < 3 {
            assert!(out.is_empty(), "nothing before the first content ({name})");
        }
    }
    assert_eq!(decoder.decode("message_stop", r#"{"type":"message_stop"}"#, &mut out), Decoded::Done);
    let deltas: Vec<Delta> = out.iter().flat_map(|c| c.deltas.clone()).collect();
    assert_eq!(
        deltas,
        [
            Delta::Text("Hel".into()),
            Delta::Text("lo".into()),
            Delta::ToolCall { index: 0, id: "toolu_1".into(), name: "search".into() },
            Delta::ToolArguments { index: 0, json: "{\"q\":".into() },
            Delta::ToolArguments { index: 0, json: "\"x\"}".into() },
            Delta::Stop(Stop::ToolUse),
        ]
    );
    assert!(out.last().unwrap().usage, "message_delta reports the usage");
    assert!(out.iter().all(|c| c.openai.is_none()));
    assert_eq!(
        decoder.usage(),
        Some(TokenUsage { input: 12, output: 15, cache_read: 0, cache_write: 0, reasoning: 0 })
    );
    assert_eq!(decoder.message_id(), "msg_1");
}

#[test]
fn stream_errors_and_malformed_events() {
    let mut decoder = ANTHROPIC.decoder();
    let mut out = Vec::new();
    let overloaded = r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#;
    assert!(matches!(decoder.decode("error", overloaded, &mut out), Decoded::Error(Class::ServerError, _)));
    assert_eq!(decoder.decode("content_block_delta", "{not json", &mut out), Decoded::Malformed);
    assert!(out.is_empty());
}

#[test]
fn errors_become_classes() {
    let error = |kind: &str, message: &str| {
        json!({"type": "error", "error": {"type": kind, "message": message}}).to_string().into_bytes()
    };
    let mut headers = HeaderMap::new();
    headers.insert("retry-after", HeaderValue::from_static("7"));
    let cases: Vec<(u16, Vec<u8>, Class)> = vec![
        (429, error("rate_limit_error", "Number of request tokens has exceeded your per-minute rate limit"), Class::RateLimited),
        (529, error("overloaded_error", "Overloaded"), Class::ServerError),
        (500, error("api_error", "Internal server error"), Class::ServerError),
        (400, error("invalid_request_error", "prompt is too long: 210000 tokens > 200000 maximum"), Class::ContextLength),
        (400, error("invalid_request_error", "messages: field required"), Class::ClientError),
        (400, error("invalid_request_error", "Your credit balance is too low to access the Anthropic API."), Class::CreditExhausted),
        (401, error("authentication_error", "invalid x-api-key"), Class::ClientError),
        (403, error("permission_error", "no"), Class::ClientError),
        (
            429,
            json!({"type": "error", "error": {"type": "rate_limit_error", "message": "limit", "details": {"error_code": "enforced_spend_limit_reached"}}})
                .to_string()
                .into_bytes(),
            Class::QuotaExhausted,
        ),
    ];
    for (status, body, class) in cases {
        let failure = ANTHROPIC.failure(status, &headers, body.clone());
        assert_eq!(failure.class, class, "{status} {}", String::from_utf8_lossy(&body));
        let hinted = matches!(class, Class::RateLimited | Class::QuotaExhausted | Class::CreditExhausted);
        assert_eq!(failure.reset_hint_ms.is_some(), hinted, "{status}: reset hints only where they park");
    }
}

#[test]
fn the_version_header_and_the_key_header() {
    let mut headers = HeaderMap::new();
    let request = ChatRequest::parse(br#"{"model":"m","messages":[{"role":"user","content":"x"}]}"#).unwrap();
    ANTHROPIC.headers(&target(json!({"anthropic": {"version": "2024-01-01"}})), &request, &mut headers);
    assert_eq!(headers["anthropic-version"], "2024-01-01");
    let credential = super::super::Credential::for_target(&target(json!({})), "sk-ant-1").unwrap();
    let url = url::Url::parse("https://api.anthropic.com/v1/messages").unwrap();
    ANTHROPIC.authenticate(&credential, &url, &b"{}".to_vec().into(), &mut headers);
    assert_eq!(headers["x-api-key"], "sk-ant-1");
    assert!(headers.get("authorization").is_none());
}

#[test]
fn usage_is_final_only_after_message_delta_and_thinking_is_typed() {
    let mut decoder = ANTHROPIC.decoder();
    let mut out = Vec::new();
    let start =
        json!({"type": "message_start", "message": {"id": "m", "usage": {"input_tokens": 9, "output_tokens": 1}}});
    decoder.decode("message_start", &start.to_string(), &mut out);
    assert!(!decoder.usage_final(), "message_start's output count is a placeholder");
    let delta = json!({"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 30}});
    decoder.decode("message_delta", &delta.to_string(), &mut out);
    assert!(decoder.usage_final());

    let message = json!({"type": "message", "content": [{"type": "thinking", "thinking": "hm", "signature": "sig"},
        {"type": "text", "text": "42"}], "stop_reason": "end_turn"});
    let answer = ANTHROPIC.answer(message.to_string().into_bytes()).unwrap().body.answer;
    assert!(answer.text().contains("hm"), "the output guardrails read the thinking too");
    assert_eq!(answer.blocks[0], Block::Thinking { thinking: "hm".into(), signature: "sig".into() });
    assert_eq!(answer.visible_text(), "42", "no thinking in the text");
}

#[test]
fn openai_temperatures_above_one_are_clamped() {
    let body = request(json!({"model": "m", "temperature": 1.7, "messages": [{"role": "user", "content": "x"}]}));
    assert_eq!(body["temperature"], 1.0);
}

/// A request as the Anthropic ingress makes it, with the caller's headers.
fn from_anthropic(body: Value, beta: Option<&str>) -> ChatRequest {
    let headers =
        crate::messages::request::Headers { beta: beta.map(str::to_string), version: Some("2023-06-01".into()) };
    crate::messages::request::normalise(&bytes::Bytes::from(body.to_string()), headers, false).unwrap()
}

#[test]
fn system_messages_are_folded_for_a_model_that_does_not_take_them() {
    let caller = json!({"model": "team-coder", "max_tokens": 100, "system": [{"type": "text", "text": "S"}],
        "messages": [{"role": "system", "content": "first"}, {"role": "user", "content": "hi"},
            {"role": "system", "content": [{"type": "text", "text": "# Environment", "cache_control": {"type": "ephemeral"}}]},
            {"role": "assistant", "content": "ok"}, {"role": "user", "content": "go"}]});
    let request = from_anthropic(caller.clone(), None);
    let folded: Value = serde_json::from_slice(&ANTHROPIC.body(&request, &target(json!({})), false).to_vec()).unwrap();
    assert_eq!(folded["system"], json!([{"type": "text", "text": "S"}, {"type": "text", "text": "first"}]));
    assert_eq!(
        folded["messages"],
        json!([{"role": "user", "content": "hi"},
            {"role": "user", "content": [{"type": "text", "text": "<system-reminder>\n# Environment\n</system-reminder>"}]},
            {"role": "assistant", "content": "ok"}, {"role": "user", "content": "go"}])
    );
    let takes = target(json!({"capabilities": {"system_messages": true}}));
    let kept: Value = serde_json::from_slice(&ANTHROPIC.body(&request, &takes, false).to_vec()).unwrap();
    assert_eq!(kept["messages"], caller["messages"], "a model that takes them gets them where they stand");
}

#[test]
fn the_callers_beta_and_version_are_forwarded_as_sent_less_what_the_target_strips() {
    let caller = json!({"model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]});
    let flags = "claude-code-20250219,made-up-2099-01-01,context-management-2025-06-27";
    let request = from_anthropic(caller, Some(flags));
    let mut headers = HeaderMap::new();
    ANTHROPIC.headers(&target(json!({})), &request, &mut headers);
    assert_eq!(headers["anthropic-beta"], flags);
    assert_eq!(headers["anthropic-version"], "2023-06-01");
    let strips = target(json!({"anthropic": {"strip_beta": ["made-up-2099-01-01"]}}));
    let mut headers = HeaderMap::new();
    ANTHROPIC.headers(&strips, &request, &mut headers);
    assert_eq!(headers["anthropic-beta"], "claude-code-20250219,context-management-2025-06-27");
    let openai_caller =
        ChatRequest::parse(br#"{"model": "m", "messages": [{"role": "user", "content": "x"}]}"#).unwrap();
    let mut headers = HeaderMap::new();
    ANTHROPIC.headers(&strips, &openai_caller, &mut headers);
    assert!(headers.get("anthropic-beta").is_none());
}

#[test]
fn an_openai_callers_fields_without_a_place_are_named() {
    let request = ChatRequest::parse(
        br#"{"model": "m", "seed": 1, "response_format": {"type": "json_object"}, "temperature": 1, "messages": []}"#,
    )
    .unwrap();
    assert_eq!(ANTHROPIC.dropped(&request, &target(json!({}))), ["response_format", "seed"]);
}

#[test]
fn a_reminder_between_tool_calls_and_their_results_follows_the_results() {
    let caller = json!({"model": "m", "max_tokens": 10, "messages": [
        {"role": "user", "content": "read it"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "Read", "input": {}}]},
        {"role": "system", "content": "reminder"},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "42"}]}]});
    let folded: Value =
        serde_json::from_slice(&ANTHROPIC.body(&from_anthropic(caller, None), &target(json!({})), false).to_vec())
            .unwrap();
    let kinds: Vec<String> = folded["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| format!("{}:{}", m["role"].as_str().unwrap(), m["content"][0]["type"].as_str().unwrap_or("text")))
        .collect();
    assert_eq!(kinds, ["user:text", "assistant:tool_use", "user:tool_result", "user:text"]);
}

#[test]
fn thinking_is_dropped_when_another_flavor_answered_the_last_tool_call() {
    let history = |first: Value| {
        json!({"model": "m", "max_tokens": 4096, "thinking": {"type": "enabled", "budget_tokens": 2048}, "messages": [
            {"role": "user", "content": "read it"},
            {"role": "assistant", "content": [first, {"type": "tool_use", "id": "t1", "name": "Read", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "42"}]}]})
    };
    // The call came from an OpenAI target: no thinking block before it.
    let request = from_anthropic(history(json!({"type": "text", "text": "Reading."})), None);
    let sent: Value = serde_json::from_slice(&ANTHROPIC.body(&request, &target(json!({})), false).to_vec()).unwrap();
    assert!(sent.get("thinking").is_none(), "Anthropic would refuse it");
    assert_eq!(ANTHROPIC.dropped(&request, &target(json!({}))), ["thinking"]);
    // It came from an Anthropic target, thinking first: as sent.
    let thought = json!({"type": "thinking", "thinking": "hm", "signature": "s"});
    let request = from_anthropic(history(thought), None);
    let sent: Value = serde_json::from_slice(&ANTHROPIC.body(&request, &target(json!({})), false).to_vec()).unwrap();
    assert!(sent["thinking"].is_object());
    assert!(ANTHROPIC.dropped(&request, &target(json!({}))).is_empty());
}

#[test]
fn an_effort_becomes_thinking_on_a_target_that_reasons_within_the_callers_cap() {
    let body_for = |caller: Value, extra: Value| {
        let request = ChatRequest::parse(caller.to_string().as_bytes()).unwrap();
        let target = target(extra);
        let body: Value = serde_json::from_slice(&ANTHROPIC.body(&request, &target, false).to_vec()).unwrap();
        (body, ANTHROPIC.dropped(&request, &target))
    };
    let reasons = json!({"capabilities": {"reasoning": true}});
    let ask = |extra: Value| {
        let mut caller = json!({"model": "m", "reasoning_effort": "high", "temperature": 0.3,
            "messages": [{"role": "user", "content": "hi"}]});
        for (k, v) in extra.as_object().into_iter().flatten() {
            caller[k] = v.clone();
        }
        caller
    };

    // No cap: the budget is added to the default.
    let (body, dropped) = body_for(ask(json!({})), reasons.clone());
    assert_eq!(body["thinking"], json!({"type": "enabled", "budget_tokens": 32000 - 1024}));
    assert_eq!(body["max_tokens"], 32000, "within every current model's output limit");
    assert!(body.get("temperature").is_none(), "thinking takes no temperature");
    assert!(dropped.is_empty(), "{dropped:?}");
    // The caller's cap holds: the budget leaves 1,024 tokens of answer, or there is none.
    let (body, _) = body_for(ask(json!({"max_tokens": 8000})), reasons.clone());
    assert_eq!((body["max_tokens"].as_u64(), body["thinking"]["budget_tokens"].as_u64()), (Some(8000), Some(6976)));
    let (body, dropped) = body_for(ask(json!({"max_tokens": 1500})), reasons.clone());
    assert!(body.get("thinking").is_none());
    assert_eq!(dropped, ["reasoning_effort"]);
    // A target that does not say it reasons, or a forced tool: no thinking, the effort named.
    let (body, dropped) = body_for(ask(json!({})), json!({}));
    assert!(body.get("thinking").is_none() && body["temperature"] == 0.3);
    assert_eq!(dropped, ["reasoning_effort"]);
    let (body, _) = body_for(ask(json!({"reasoning_effort": "low"})), reasons.clone());
    assert_eq!((body["max_tokens"].as_u64(), body["thinking"]["budget_tokens"].as_u64()), (Some(8192), Some(4096)));
    // A tool-calling turn without its thinking (another flavor answered it): no thinking asked.
    let history = ask(json!({"messages": [{"role": "user", "content": "hi"},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
            "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "ok"}]}));
    let (body, dropped) = body_for(history, reasons.clone());
    assert!(body.get("thinking").is_none() && body["temperature"] == 0.3, "{body}");
    assert_eq!(dropped, ["reasoning_effort"]);
    let forced = ask(json!({"tool_choice": "required",
        "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]}));
    assert!(body_for(forced, reasons).0.get("thinking").is_none());
}

#[test]
fn thinking_anthropic_did_not_sign_is_not_sent() {
    let request = exchange::Request {
        messages: vec![
            exchange::Message { role: Role::User, content: vec![Part::Text("go".into())] },
            exchange::Message {
                role: Role::Assistant,
                content: vec![
                    Part::Thinking {
                        thinking: String::new(),
                        signature: format!("{}c2ln", super::super::GEMINI_SIGNATURE),
                    },
                    Part::Thinking { thinking: "unsigned".into(), signature: String::new() },
                    Part::ToolUse { id: "t1".into(), name: "f".into(), input: "{}".into() },
                ],
            },
            exchange::Message {
                role: Role::User,
                content: vec![Part::ToolResult { id: "t1".into(), content: "ok".into(), is_error: false }],
            },
        ]
        .into(),
        reasoning: Some(exchange::Reasoning { effort: Some(exchange::Effort::Low), fields: vec!["reasoning_effort"] }),
        ..Default::default()
    };
    let fields = messages_request(&request, &target(json!({"capabilities": {"reasoning": true}})));
    let body: Value = serde_json::from_slice(&MessagesBody { fields, converted: Some(&request) }.to_vec()).unwrap();
    assert_eq!(body["messages"][1]["content"], json!([{"type": "tool_use", "id": "t1", "name": "f", "input": {}}]));
    assert!(body.get("thinking").is_none(), "the tool-calling turn has no thinking Anthropic signed");
}

/// Issue 33: a same-shape body relayed from its text as sent reads exactly as the one written
/// from its parsed fields, whatever the target sets; bodies that must change inside
/// `messages` take the parsed path.
#[test]
fn a_messages_body_is_relayed_as_sent_and_reads_the_same() {
    let normalised =
        |body: Value| crate::messages::request::normalise(&body.to_string().into(), Default::default(), false).unwrap();
    let sent = json!({"model": "team", "max_tokens": 64, "stream": false, "top_k": 5,
        "system": [{"type": "text", "text": "Line one\nline \"two\" é", "cache_control": {"type": "ephemeral"}}],
        "messages": [{"role": "user", "content": [{"type": "text", "text": "hi\tthere"}]}],
        "metadata": {"user_id": "u"}, "pad": "p".repeat(shield_core::verbatim::WORTH_IT)});
    let request = normalised(sent.clone());
    assert!(request.anthropic().unwrap().verbatim.is_some());
    for (extra, stream) in
        [(json!({}), false), (json!({}), true), (json!({"extra_body": {"top_k": 9, "stream": false}}), true)]
    {
        let target = target(extra);
        let relayed = ANTHROPIC.relayed_as_sent(&request, &target, stream).unwrap().to_vec();
        let written = ANTHROPIC.request_body(&request, &target, stream).to_vec();
        assert_eq!(
            serde_json::from_slice::<Value>(&relayed).unwrap(),
            serde_json::from_slice::<Value>(&written).unwrap(),
            "{}",
            String::from_utf8_lossy(&relayed)
        );
        assert!(String::from_utf8_lossy(&relayed).contains(r#""text":"hi\tthere""#), "text as sent");
    }
    let mut with_reminder = sent.clone();
    with_reminder["messages"] = json!([{"role": "system", "content": "reminder"}, {"role": "user", "content": "hi"}]);
    assert!(ANTHROPIC.relayed_as_sent(&normalised(with_reminder), &target(json!({})), false).is_none(), "folded");
}

/// Issue 33: a Chat Completions body read directly keeps its messages' texts as sent (a string
/// content, a text part, a tool's output), and the body converted for an Anthropic target
/// carries them byte for byte, with or without the tenant's memo; it reads as the one converted
/// from the tree.
#[test]
fn a_converted_chat_body_carries_its_texts_as_sent() {
    let said = r#""line\none \u00e9 \/ \"q\"""#;
    let output = r#""total 8\n-rw-r--r-- 1 \u0041 file.rs\n""#;
    let part = r#""see \/tmp\t""#;
    let pad = "p".repeat(shield_core::verbatim::WORTH_IT);
    let body = format!(
        r#"{{"model": "m", "messages": [{{"role": "system", "content": {said}}}, {{"role": "user", "content": {said}}},
        {{"role": "assistant", "content": null, "tool_calls": [{{"id": "c1", "type": "function", "function": {{"name": "ls", "arguments": "{{}}"}}}}]}},
        {{"role": "tool", "tool_call_id": "c1", "content": {output}}},
        {{"role": "user", "content": [{{"type": "text", "text": {part}}}]}}], "pad": "{pad}"}}"#
    );
    let tree: Value = serde_json::from_str(&body).unwrap();
    let memo = shield_core::verdicts::Verdicts::default().of("tenant");
    let bytes = bytes::Bytes::from(body.clone());
    for memo in [None, Some(&*memo), Some(&*memo)] {
        let read = ChatRequest::parse_remembering(&bytes, memo).unwrap();
        let written = ANTHROPIC.body(&read, &target(json!({})), false).to_vec();
        let text = String::from_utf8(written).unwrap();
        for token in [said, output, part] {
            assert_eq!(text.matches(token).count(), if token == said { 2 } else { 1 }, "{token} in {text}");
        }
        let converted: Value = serde_json::from_str(&text).unwrap();
        // Padded no more, the body is read as a tree.
        let from_tree = {
            let mut tree = tree.clone();
            tree["pad"] = json!("short");
            request(tree)
        };
        assert_eq!(converted["messages"], from_tree["messages"]);
        assert_eq!(converted["system"], from_tree["system"]);
    }
}
