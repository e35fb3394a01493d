use super::*;

fn target(extra: Value) -> Target {
    let mut body = json!({"base_url": "https://generativelanguage.googleapis.com/v1beta", "model": "gemini-2.5-flash",
        "flavor": "gemini"});
    for (k, v) in extra.as_object().into_iter().flatten() {
        body[k] = v.clone();
    }
    serde_json::from_value(body).unwrap()
}

fn body_of(caller: Value, extra: Value) -> Value {
    let request = ChatRequest::parse(caller.to_string().as_bytes()).unwrap();
    serde_json::from_slice(&GEMINI.body(&request, &target(extra), false).to_vec()).unwrap()
}

#[test]
fn urls_name_the_model_and_the_method() {
    let endpoint = GEMINI.endpoint(&target(json!({}))).unwrap();
    assert_eq!(endpoint.as_str(), "https://generativelanguage.googleapis.com/v1beta/models/gemini-2.5-flash");
    assert_eq!(
        GEMINI.call_url(&endpoint, false).as_str(),
        "https://generativelanguage.googleapis.com/v1beta/models/gemini-2.5-flash:generateContent"
    );
    assert_eq!(
        GEMINI.call_url(&endpoint, true).as_str(),
        "https://generativelanguage.googleapis.com/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse"
    );
    assert!(GEMINI.endpoint(&target(json!({"model": "../x"}))).is_err());
}

#[test]
fn requests_map_system_turns_tools_results_images_and_config() {
    let body = body_of(
        json!({"model": "m", "temperature": 0.2, "top_p": 0.9, "stop": ["END"], "max_tokens": 100,
            "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}},
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": [{"type": "text", "text": "see"},
                    {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBOR"}}]},
                {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
                    "function": {"name": "search", "arguments": "{\"q\":\"x\"}"}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "found"},
            ],
            "tools": [{"type": "function", "function": {"name": "search", "description": "d",
                "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}}],
            "tool_choice": {"type": "function", "function": {"name": "search"}}}),
        json!({}),
    );
    assert_eq!(body["systemInstruction"], json!({"parts": [{"text": "Be brief."}]}));
    let contents = body["contents"].as_array().unwrap();
    assert_eq!(contents[0]["role"], "user");
    assert_eq!(contents[0]["parts"][1], json!({"inlineData": {"mimeType": "image/png", "data": "iVBOR"}}));
    assert_eq!(contents[1]["role"], "model");
    let call = &contents[1]["parts"][0];
    assert_eq!(call["functionCall"], json!({"id": "call_1", "name": "search", "args": {"q": "x"}}));
    assert_eq!(call["thoughtSignature"], NO_SIGNATURE, "a call Gemini did not sign gets the documented stand-in");
    assert_eq!(
        contents[2]["parts"][0]["functionResponse"],
        json!({"id": "call_1", "name": "search", "response": {"content": "found"}}),
        "the result names the function its call named"
    );
    assert_eq!(
        body["tools"][0]["functionDeclarations"][0]["parametersJsonSchema"]["properties"]["q"]["type"],
        "string"
    );
    assert_eq!(
        body["toolConfig"],
        json!({"functionCallingConfig": {"mode": "ANY", "allowedFunctionNames": ["search"]}})
    );
    let config = &body["generationConfig"];
    assert_eq!(
        (config["maxOutputTokens"].clone(), config["temperature"].clone(), config["topP"].clone()),
        (json!(100), json!(0.2), json!(0.9))
    );
    assert_eq!(config["stopSequences"], json!(["END"]));
    assert_eq!(
        (config["responseMimeType"].as_str(), config["responseJsonSchema"].clone()),
        (Some("application/json"), json!({"type": "object"}))
    );
    assert!(config.get("thinkingConfig").is_none(), "no effort asked");
}

#[test]
fn an_effort_is_a_thinking_budget_on_a_target_that_reasons_and_named_otherwise() {
    let caller = json!({"model": "m", "reasoning_effort": "medium", "messages": [{"role": "user", "content": "hi"}]});
    let body = body_of(caller.clone(), json!({"capabilities": {"reasoning": true}}));
    assert_eq!(body["generationConfig"]["thinkingConfig"], json!({"thinkingBudget": 16384, "includeThoughts": true}));
    let request = ChatRequest::parse(caller.to_string().as_bytes()).unwrap();
    assert_eq!(GEMINI.dropped(&request, &target(json!({}))), ["reasoning_effort"]);
    assert!(GEMINI.dropped(&request, &target(json!({"capabilities": {"reasoning": true}}))).is_empty());
}

#[test]
fn a_signature_goes_back_on_the_call_it_came_with() {
    let answer = GEMINI
        .answer(
            serde_json::to_vec(&json!({"responseId": "r1", "candidates": [{"content": {"role": "model", "parts": [
                {"text": "Planning.", "thought": true},
                {"functionCall": {"name": "search", "args": {"q": "x"}}, "thoughtSignature": "c2lnMQ=="}]},
                "finishReason": "STOP"}],
                "usageMetadata": {"promptTokenCount": 12, "candidatesTokenCount": 5, "thoughtsTokenCount": 7,
                    "cachedContentTokenCount": 4, "totalTokenCount": 24}}))
            .unwrap(),
        )
        .unwrap();
    let blocks = &answer.body.answer.blocks;
    assert_eq!(blocks[0], Block::Thinking { thinking: "Planning.".into(), signature: String::new() });
    assert_eq!(
        blocks[1],
        Block::Thinking { thinking: String::new(), signature: "gemini:c2lnMQ==".into() },
        "tagged as Gemini's, so no other provider is handed it"
    );
    let Block::ToolUse { id, name, input } = &blocks[2] else { panic!("{blocks:?}") };
    assert!(id.starts_with("call_") && name == "search" && input == "{\"q\":\"x\"}", "minted id: {id}");
    assert_eq!(answer.body.answer.stop, Some(Stop::ToolUse), "a call is a tool-use stop");
    assert_eq!(
        answer.usage,
        Some(TokenUsage { input: 12, output: 12, cache_read: 4, cache_write: 0, reasoning: 7 }),
        "output counts the thoughts"
    );

    // The next turn: the typed history puts the signature back on the call.
    let history = exchange::Request {
        messages: vec![
            exchange::Message { role: Role::User, content: vec![Part::Text("find x".into())] },
            exchange::Message {
                role: Role::Assistant,
                content: vec![
                    Part::Thinking { thinking: "Planning.".into(), signature: String::new() },
                    Part::Thinking { thinking: String::new(), signature: "gemini:c2lnMQ==".into() },
                    Part::ToolUse { id: id.clone(), name: "search".into(), input: input.clone() },
                ],
            },
        ]
        .into(),
        ..Default::default()
    };
    let body = generate_request(&history, &target(json!({})));
    assert_eq!(
        body["contents"][1]["parts"],
        json!([{"functionCall": {"id": id, "name": "search", "args": {"q": "x"}},
        "thoughtSignature": "c2lnMQ=="}])
    );
}

#[test]
fn finish_reasons_and_a_refused_prompt() {
    let answer = |body: Value| GEMINI.answer(serde_json::to_vec(&body).unwrap()).unwrap().body.answer;
    let with = |reason: &str| {
        answer(json!({"candidates": [{"content": {"parts": [{"text": "x"}]}, "finishReason": reason}]})).stop
    };
    assert_eq!(with("STOP"), Some(Stop::EndTurn));
    assert_eq!(with("MAX_TOKENS"), Some(Stop::MaxTokens));
    assert_eq!(with("SAFETY"), Some(Stop::Refusal));
    let refused = answer(json!({"promptFeedback": {"blockReason": "SAFETY"}}));
    assert_eq!((refused.blocks.len(), refused.stop), (0, Some(Stop::Refusal)));
    assert!(GEMINI.answer(b"[]".to_vec()).is_none());
    assert!(GEMINI.answer(br#"{"something": "else"}"#.to_vec()).is_none(), "not an answer");
}

#[test]
fn streams_decode_text_thoughts_calls_stops_and_running_usage() {
    let mut decoder = GEMINI.decoder();
    let mut out = Vec::new();
    for event in [
        json!({"responseId": "r9", "candidates": [{"content": {"parts": [{"text": "Hmm", "thought": true}]}}]}),
        json!({"candidates": [{"content": {"parts": [{"text": "Hello"}]}}],
            "usageMetadata": {"promptTokenCount": 3, "candidatesTokenCount": 1}}),
        json!({"candidates": [{"content": {"parts": [{"functionCall": {"id": "f1", "name": "search", "args": {}},
            "thoughtSignature": "c2ln"}]}, "finishReason": "STOP"}],
            "usageMetadata": {"promptTokenCount": 3, "candidatesTokenCount": 4}}),
    ] {
        assert_eq!(decoder.decode("", &event.to_string(), &mut out), Decoded::Continue);
    }
    let deltas: Vec<Delta> = out.iter().flat_map(|c| c.deltas.clone()).collect();
    assert_eq!(
        deltas,
        vec![
            Delta::ThinkingStart,
            Delta::Thinking("Hmm".into()),
            Delta::Text("Hello".into()),
            Delta::ThinkingStart,
            Delta::Signature("gemini:c2ln".into()),
            Delta::ToolCall { index: 0, id: "f1".into(), name: "search".into() },
            Delta::ToolArguments { index: 0, json: "{}".into() },
            Delta::Stop(Stop::ToolUse),
        ]
    );
    assert_eq!(decoder.message_id(), "r9");
    assert_eq!(decoder.usage().map(|u| (u.input, u.output)), Some((3, 4)), "the running total's last figure");
    assert!(decoder.usage_final());
    assert_eq!(decoder.decode("", "not json", &mut out), Decoded::Malformed);
    let error = json!({"error": {"code": 429, "message": "Resource exhausted", "status": "RESOURCE_EXHAUSTED"}});
    assert!(matches!(decoder.decode("", &error.to_string(), &mut out), Decoded::Error(Class::RateLimited, _)));
}

#[test]
fn googles_errors_classify_and_carry_their_retry_delay() {
    let failure = |status: u16, body: Value| GEMINI.failure(status, &HeaderMap::new(), body.to_string().into_bytes());
    let limited = failure(
        429,
        json!({"error": {"code": 429, "status": "RESOURCE_EXHAUSTED", "message": "quota",
        "details": [{"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "37s"}]}}),
    );
    assert_eq!((limited.class, limited.reset_hint_ms), (Class::RateLimited, Some(37_000)));
    let daily = failure(
        429,
        json!({"error": {"code": 429, "status": "RESOURCE_EXHAUSTED", "details": [
        {"@type": "type.googleapis.com/google.rpc.QuotaFailure",
            "violations": [{"quotaId": "GenerateRequestsPerDayPerProjectPerModel-FreeTier"}]}]}}),
    );
    assert_eq!(daily.class, Class::QuotaExhausted);
    let long = failure(
        400,
        json!({"error": {"code": 400, "status": "INVALID_ARGUMENT",
        "message": "The input token count (2000000) exceeds the maximum number of tokens allowed (1048576)."}}),
    );
    assert_eq!(long.class, Class::ContextLength);
    assert_eq!(failure(503, json!({"error": {"status": "UNAVAILABLE"}})).class, Class::ServerError);
    assert_eq!(failure(403, json!({"error": {"status": "PERMISSION_DENIED"}})).class, Class::ClientError);
    let bad_key = failure(
        400,
        json!({"error": {"status": "INVALID_ARGUMENT", "message": "API key not valid",
        "details": [{"reason": "API_KEY_INVALID"}]}}),
    );
    assert_eq!(bad_key.class, Class::ClientError, "never failed over: the key is wrong");
}

#[test]
fn another_providers_signature_is_never_sent_and_the_stand_in_only_on_a_turns_first_call() {
    let call = |id: &str| Part::ToolUse { id: id.into(), name: "f".into(), input: "[1]".into() };
    let history = exchange::Request {
        messages: vec![
            exchange::Message { role: Role::User, content: vec![Part::Text("go".into())] },
            exchange::Message {
                role: Role::Assistant,
                content: vec![
                    Part::Thinking { thinking: "t".into(), signature: "anthropic-signature".into() },
                    call("a"),
                    call("b"),
                ],
            },
        ]
        .into(),
        ..Default::default()
    };
    let body = generate_request(&history, &target(json!({})));
    let parts = &body["contents"][1]["parts"];
    assert_eq!(parts[0]["thoughtSignature"], NO_SIGNATURE, "Anthropic's signature is not Gemini's");
    assert!(parts[1].get("thoughtSignature").is_none(), "only the first call of a turn is signed");
    assert_eq!(parts[0]["functionCall"]["args"], json!({}), "arguments that are not an object become {{}}");
}

#[test]
fn thinking_budgets_stay_within_what_gemini_takes() {
    let budget = |extra: Value| {
        let mut caller =
            json!({"model": "m", "reasoning_effort": "high", "messages": [{"role": "user", "content": "hi"}]});
        for (k, v) in extra.as_object().into_iter().flatten() {
            caller[k] = v.clone();
        }
        body_of(caller, json!({"capabilities": {"reasoning": true}}))["generationConfig"]["thinkingConfig"]["thinkingBudget"]
            .as_u64()
    };
    assert_eq!(budget(json!({})), Some(24_576), "2.5 Flash's ceiling");
    assert_eq!(budget(json!({"max_tokens": 1000})), Some(500), "room for the answer within the cap");
}

#[test]
fn failed_generations_wrapped_errors_bad_keys_and_daily_quotas() {
    let malformed = json!({"candidates": [{"content": {"parts": []}, "finishReason": "MALFORMED_FUNCTION_CALL"}]});
    assert!(GEMINI.answer(serde_json::to_vec(&malformed).unwrap()).is_none(), "a failed generation fails over");
    let mut decoder = GEMINI.decoder();
    assert!(matches!(
        decoder.decode("", &malformed.to_string(), &mut Vec::new()),
        Decoded::Error(Class::BadResponse, _)
    ));

    let wrapped = json!([{"error": {"code": 429, "status": "RESOURCE_EXHAUSTED",
        "details": [{"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "2s"}]}}]);
    let failure = GEMINI.failure(429, &HeaderMap::new(), wrapped.to_string().into_bytes());
    assert_eq!((failure.class, failure.reset_hint_ms), (Class::RateLimited, Some(2_000)), "unwrapped from its array");

    let bad_key = json!({"error": {"code": 400, "status": "INVALID_ARGUMENT", "message": "API key not valid.",
        "details": [{"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": "API_KEY_INVALID"}]}});
    let failure = GEMINI.failure(400, &HeaderMap::new(), bad_key.to_string().into_bytes());
    assert_eq!((failure.class, failure.status), (Class::ClientError, Some(401)), "a bad key is the credential's fault");

    let daily = json!({"error": {"code": 429, "status": "RESOURCE_EXHAUSTED", "details": [
        {"@type": "type.googleapis.com/google.rpc.QuotaFailure", "violations": [{"quotaId": "RequestsPerDay"}]},
        {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "30s"}]}});
    let failure = GEMINI.failure(429, &HeaderMap::new(), daily.to_string().into_bytes());
    assert_eq!(
        (failure.class, failure.reset_hint_ms),
        (Class::QuotaExhausted, None),
        "parked for the longest cooldown"
    );
}
