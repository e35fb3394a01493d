//! Rules and guardrails end to end (seed §1's observable success, §5 "Guardrails are not
//! bypassable by routing", §8 items 2 and 3): flagged prompts stay on-prem even when a cloud
//! target is first and cheaper, and when the on-prem target fails the call fails rather than
//! leaking; deny rules, data classes, input and output blocks, tool RBAC, the native endpoint.

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use shield_e2e::stack::{Stack, chat_body};

fn say(text: &str) -> Value {
    json!({"model": "smart", "messages": [{"role": "user", "content": text}]})
}

async fn guardrails(stack: &Stack, policy: Value) {
    let (status, body) = stack.admin_call(Method::PUT, "/v1/tenant/me/guardrails", Some(policy)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
}

/// Seed §3.2's route: a cheap cloud target first, on-prem for flagged prompts.
async fn seed_route(stack: &Stack, onprem_scenario: &str) {
    stack
        .mock_target(
            "openai-4o",
            "",
            json!({"location": "cloud", "price": {"input_per_mtok": 0.1, "output_per_mtok": 0.1}}),
        )
        .await;
    stack
        .mock_target(
            "onprem-qwen",
            onprem_scenario,
            json!({"location": "on_prem", "price": {"input_per_mtok": 5, "output_per_mtok": 5}}),
        )
        .await;
    stack
        .put_route(
            "smart",
            json!({"targets": ["openai-4o", "onprem-qwen"], "rules": [
                {"when": {"flagged": ["pii_detection"]}, "use": ["onprem-qwen"]},
                {"when": {"data_class": ["restricted"]}, "use": ["onprem-qwen"]},
                {"when": {"role": ["contractor"]}, "deny": "Contractors cannot use this model"}
            ]}),
        )
        .await;
}

const PII_PROMPT: &str = "Refund jane.doe@example.com, card 4111 1111 1111 1111";

#[tokio::test]
async fn a_flagged_prompt_goes_only_on_prem_and_never_leaks_when_on_prem_fails() {
    let stack = Stack::start().await;
    guardrails(&stack, json!({"pii_detection": {"mode": "monitor"}})).await;
    seed_route(&stack, "").await;
    let (key, _) = stack.key(None).await;

    let (status, headers, body) = stack.chat(&key, say(PII_PROMPT), &[]).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(headers["x-shield-target"], "onprem-qwen");
    assert_eq!(body["x_shield"]["routing"]["rule"]["index"], 0);
    assert_eq!(
        body["x_shield"]["routing"]["rule"]["description"],
        "If the prompt is flagged by PII detection → only onprem-qwen"
    );
    let input = &body["x_shield"]["guardrail_results"][0];
    assert_eq!(
        (input["phase"].as_str(), input["name"].as_str(), input["passed"].as_bool()),
        (Some("input"), Some("pii_detection"), Some(false))
    );
    assert_eq!(input["findings"], json!({"email": 1, "payment_card": 1}));
    assert!(!body["x_shield"].to_string().contains("jane.doe"), "results never carry the matched text");
    assert_eq!(stack.received("openai-4o").await.len(), 0, "the cheaper cloud target never saw the PII");

    // A clean prompt goes to the first (cloud) target.
    let (_, headers, _) = stack.chat(&key, say("What is the capital of France?"), &[]).await;
    assert_eq!(headers["x-shield-target"], "openai-4o");

    // With the on-prem target failing, the flagged call fails: no failover outside the rule.
    let failing = Stack::start().await;
    guardrails(&failing, json!({"pii_detection": {"mode": "monitor"}})).await;
    seed_route(&failing, "status:503").await;
    let (key, _) = failing.key(None).await;
    let (status, _, body) = failing.chat(&key, say(PII_PROMPT), &[]).await;
    assert_eq!(status, StatusCode::BAD_GATEWAY, "{body}");
    assert_eq!(body["x_shield"]["routing"]["halt"], "exhausted");
    assert_eq!(body["error"]["excluded"], json!([{"target": "openai-4o", "reason": "rule"}]));
    assert_eq!(failing.received("onprem-qwen").await.len(), 1);
    assert_eq!(failing.received("openai-4o").await.len(), 0, "the cloud target's mock received nothing");
}

#[tokio::test]
async fn deny_rules_data_classes_and_roles_come_from_the_key() {
    let stack = Stack::start().await;
    seed_route(&stack, "").await;
    let (contractor, _) = stack.key(Some("contractor")).await;
    let (staff, _) = stack.key(Some("staff")).await;
    let (status, headers, body) = stack.chat(&contractor, chat_body("smart"), &[]).await;
    assert_eq!(status, StatusCode::OK, "a refusal is a 200 completion: {body}");
    assert_eq!(body["choices"][0]["finish_reason"], "content_filter");
    assert_eq!(body["choices"][0]["message"]["content"], "Contractors cannot use this model");
    assert_eq!(body["x_shield"]["routing"]["reason"], "Contractors cannot use this model");
    assert_eq!(body["x_shield"]["routing"]["halt"], "denied");
    assert_eq!(headers["x-shield-route"], "smart");
    // A role header is not a role: only the key's attributes count.
    let (_, headers, _) = stack.chat(&staff, chat_body("smart"), &[("x-shield-role", "contractor")]).await;
    assert_eq!(headers["x-shield-target"], "openai-4o");
    let (_, headers, _) = stack.chat(&staff, chat_body("smart"), &[("x-shield-data-class", "restricted")]).await;
    assert_eq!(headers["x-shield-target"], "onprem-qwen", "a data class can only narrow");
    assert_eq!(stack.received("openai-4o").await.len(), 1);
}

#[tokio::test]
async fn input_blocks_refuse_before_any_target_and_output_blocks_never_fail_over() {
    let stack = Stack::start().await;
    guardrails(&stack, json!({"secrets_detection": {"mode": "block"}})).await;
    stack.mock_target("leaky", "say:secret", json!({})).await;
    stack.mock_target("backup", "", json!({})).await;
    stack.put_route("smart", json!({"targets": ["leaky", "backup"]})).await;
    let (key, _) = stack.key(None).await;

    let (status, _, body) = stack.chat(&key, say("deploy with AKIAIOSFODNN7EXAMPLE please"), &[]).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["choices"][0]["finish_reason"], "content_filter");
    assert_eq!(body["choices"][0]["message"]["content"], "Blocked by secrets detection (input)");
    assert_eq!(stack.received("leaky").await.len() + stack.received("backup").await.len(), 0, "nothing was sent");

    let (status, headers, body) = stack.chat(&key, say("what is the deploy key?"), &[]).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["choices"][0]["finish_reason"], "content_filter");
    assert_eq!(body["choices"][0]["message"]["content"], "Blocked by secrets detection (output)");
    assert!(!body.to_string().contains("sk-proj-"), "the blocked answer is not returned");
    assert_eq!(headers["x-shield-target"], "leaky");
    assert_eq!(stack.received("backup").await.len(), 0, "never 'try another model until one passes'");

    // Streams are checked as they flow: the chunk with the key is not sent.
    let mut streaming = say("stream it");
    streaming["stream"] = json!(true);
    let response = stack
        .client
        .post(format!("http://{}/v1/chat/completions", stack.proxy))
        .bearer_auth(&key)
        .json(&streaming)
        .send()
        .await
        .unwrap();
    let text = response.text().await.unwrap();
    assert!(!text.contains("sk-proj-"), "{text}");
    assert!(
        text.contains(r#""finish_reason":"content_filter""#) && text.trim_end().ends_with("data: [DONE]"),
        "{text}"
    );
}

#[tokio::test]
async fn tool_rbac_and_the_kill_switch_apply_to_whatever_target_answered() {
    let stack = Stack::start().await;
    guardrails(&stack, json!({"tools": {"kill_switch": false, "allowed_by_role": {"contractor": ["search"]}}})).await;
    stack.mock_target("shell", "tool:shell", json!({})).await;
    stack.put_route("smart", json!({"targets": ["shell"]})).await;
    let (contractor, _) = stack.key(Some("contractor")).await;
    let (admin, _) = stack.key(Some("admin")).await;
    let (_, _, body) = stack.chat(&contractor, chat_body("smart"), &[]).await;
    assert_eq!(body["choices"][0]["finish_reason"], "content_filter");
    assert_eq!(body["choices"][0]["message"]["content"], "Tool `shell` is not allowed for role contractor");
    let (_, _, body) = stack.chat(&admin, chat_body("smart"), &[]).await;
    assert_eq!(
        body["choices"][0]["message"]["tool_calls"][0]["function"]["name"], "shell",
        "other roles are not restricted"
    );
    guardrails(&stack, json!({"tools": {"kill_switch": true}})).await;
    let blocked = shield_e2e::eventually(5, "the kill switch to apply", || async {
        let (_, _, body) = stack.chat(&admin, chat_body("smart"), &[]).await;
        (body["choices"][0]["finish_reason"] == "content_filter").then_some(body)
    })
    .await;
    assert_eq!(blocked["choices"][0]["message"]["content"], "Tool calls are disabled for this tenant");
}

#[tokio::test]
async fn the_native_endpoint_shares_the_path_with_its_own_shapes() {
    let stack = Stack::start().await;
    guardrails(&stack, json!({"pii_detection": {"mode": "block"}})).await;
    stack.mock_target("a", "", json!({})).await;
    stack.mock_target("down", "status:503", json!({})).await;
    stack.put_route("smart", json!({"targets": ["a"]})).await;
    stack.put_route("broken", json!({"targets": ["down"]})).await;
    let (key, _) = stack.key(None).await;
    let url = format!("http://{}/v1/shield/chat/completions", stack.proxy);
    let call = |body: Value| {
        let request = stack.client.post(&url).bearer_auth(&key).json(&body);
        async move {
            let response = request.send().await.unwrap();
            let status = response.status();
            (status, response.json::<Value>().await.unwrap())
        }
    };
    let (status, body) = call(json!({"model": "smart", "prompt": "hello", "system": "be brief"})).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!((body["content"].as_str(), body["model"].as_str()), (Some("mock answer to: hello"), Some("model-a")));
    assert_eq!(body["routing"]["target"], "a");
    assert!(body["usage"]["total_tokens"].as_u64().is_some());
    let sent: Value = serde_json::from_str(stack.received("a").await[0]["body"].as_str().unwrap()).unwrap();
    assert_eq!(
        sent["messages"],
        json!([{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello"}])
    );
    assert!(sent.get("prompt").is_none() && sent.get("system").is_none(), "Shield-only fields are dropped");

    let (status, body) = call(json!({"model": "smart", "prompt": "mail me at jane@example.com"})).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert_eq!(body["error"], "Blocked by PII detection (input)");
    assert_eq!(body["guardrail_results"][0]["passed"], false);
    let (status, body) = call(json!({"model": "broken", "prompt": "hi"})).await;
    assert_eq!(status, StatusCode::BAD_GATEWAY, "{body}");
    assert_eq!(body["routing"]["halt"], "exhausted");
}

/// Issue 27: a digit of another script inside an IBAN-shaped run once panicked the PII
/// detector (a byte slice inside a character) and dropped the caller's connection. Through
/// both endpoints, with PII detection blocking input and output, the call is answered and the
/// proxy keeps serving.
#[tokio::test]
async fn an_iban_with_a_foreign_digit_is_answered_on_both_endpoints() {
    let stack = Stack::start().await;
    guardrails(&stack, json!({"pii_detection": {"mode": "block"}})).await;
    stack.mock_target("a", "", json!({})).await;
    stack.put_route("smart", json!({"targets": ["a"]})).await;
    let (key, _) = stack.key(None).await;
    let text = "Pay to DE3\u{663} 3704 0044 0532 0130 00 please";
    for _ in 0..2 {
        let (status, _, body) = stack.chat(&key, say(text), &[]).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert_eq!(body["choices"][0]["finish_reason"], "stop", "{body}");
        let response = stack
            .client
            .post(format!("http://{}/v1/messages", stack.proxy))
            .header("x-api-key", &key)
            .json(&json!({"model": "smart", "max_tokens": 32, "messages": [{"role": "user", "content": text}]}))
            .send()
            .await
            .expect("the proxy answers");
        assert_eq!(response.status(), StatusCode::OK);
        let body: Value = response.json().await.unwrap();
        assert_eq!(body["type"], "message", "{body}");
    }
    // A valid IBAN is still caught, by the same process.
    let (status, _, body) = stack.chat(&key, say("Pay to DE89 3704 0044 0532 0130 00"), &[]).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["choices"][0]["finish_reason"], "content_filter", "{body}");
    assert!(!stack.all_logs().contains("panicked"), "no panic was logged");
}

/// Issue 27: nothing an upstream sends is taken as Shield's own data. An OpenAI-flavour
/// upstream that adds a field named like Shield's old internal side channel
/// (`x_anthropic_content`) carrying an e-mail address does not get it past the output
/// guardrails to a `/v1/messages` caller: the answer is built from the completion itself.
#[tokio::test]
async fn an_upstream_field_is_never_taken_as_shields_own_blocks() {
    let stack = Stack::start().await;
    guardrails(&stack, json!({"pii_detection": {"mode": "block"}})).await;
    stack.mock_target("a", "body:native", json!({})).await;
    stack.put_route("smart", json!({"targets": ["a"]})).await;
    let (key, _) = stack.key(None).await;
    let response = stack
        .client
        .post(format!("http://{}/v1/messages", stack.proxy))
        .header("x-api-key", &key)
        .json(&json!({"model": "smart", "max_tokens": 32, "messages": [{"role": "user", "content": "hello"}]}))
        .send()
        .await
        .expect("the proxy answers");
    assert_eq!(response.status(), StatusCode::OK);
    let text = response.text().await.unwrap();
    assert!(!text.contains("leak@example.com"), "{text}");
    let body: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(body["type"], "message", "{body}");
    assert_eq!(body["content"][0]["type"], "text", "{body}");
    assert!(body["content"][0]["text"].as_str().unwrap().contains("hello"), "the completion's own text: {body}");
}

/// `shield_guardrail_units_total{result}` now.
async fn units(stack: &Stack) -> (f64, f64) {
    let rows = stack.metric("shield_guardrail_units_total").await;
    (shield_e2e::stack::labelled(&rows, &["reused"]), shield_e2e::stack::labelled(&rows, &["scanned"]))
}

fn conversation(turns: &[&str]) -> Value {
    let messages: Vec<Value> = turns
        .iter()
        .enumerate()
        .map(|(i, text)| json!({"role": if i % 2 == 0 { "user" } else { "assistant" }, "content": text}))
        .collect();
    json!({"model": "smart", "messages": messages})
}

/// Issue 33: an agent's resent history is judged from the tenant's memo, not scanned again; what
/// is remembered still counts; a new message, or a detector switched on, is scanned; a mode
/// change applies at once.
#[tokio::test]
async fn a_resent_history_is_read_back_and_still_counts() {
    let stack = Stack::start().await;
    guardrails(&stack, json!({"pii_detection": {"mode": "monitor"}})).await;
    seed_route(&stack, "").await;
    let (key, _) = stack.key(None).await;
    let secret = "deploy with sk-proj-Zq8xWv2LmN4pR7tY1uI0oP3aS6dF9gHj";

    let (status, headers, body) = stack.chat(&key, conversation(&[PII_PROMPT]), &[]).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(headers["x-shield-target"], "onprem-qwen");
    assert_eq!(units(&stack).await, (0.0, 1.0));

    // Turn 2: the flagged message comes back as history; only the two new ones are scanned,
    // and the remembered finding still sends the call on-prem.
    let turn2 = conversation(&[PII_PROMPT, "Done.", "Now list my open orders."]);
    let (status, headers, body) = stack.chat(&key, turn2.clone(), &[]).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(headers["x-shield-target"], "onprem-qwen", "a remembered finding routes as a fresh one");
    assert_eq!(units(&stack).await, (1.0, 3.0));
    let input = &body["x_shield"]["guardrail_results"][0];
    assert_eq!((input["phase"].as_str(), input["passed"].as_bool()), (Some("input"), Some(false)), "{body}");
    assert_eq!(input["findings"], json!({"email": 1, "payment_card": 1}), "remembered counts are the counts");

    // A history whose last message changed is scanned for that message.
    let (_, headers, _) = stack.chat(&key, conversation(&["hello", "Hi!", "What is 2+2?"]), &[]).await;
    assert_eq!(headers["x-shield-target"], "openai-4o");
    let (_, headers, _) =
        stack.chat(&key, conversation(&["hello", "Hi!", "Mail me at jane.doe@example.com"]), &[]).await;
    assert_eq!(headers["x-shield-target"], "onprem-qwen", "the changed message was scanned");

    // A secret sent while the secrets detector was off was never judged for secrets: switched
    // on (in block mode), the same history is scanned again and refused.
    let with_secret = conversation(&["hello", "Hi!", secret]);
    let (_, headers, _) = stack.chat(&key, with_secret.clone(), &[]).await;
    assert_eq!(headers["x-shield-target"], "openai-4o");
    guardrails(&stack, json!({"pii_detection": {"mode": "monitor"}, "secrets_detection": {"mode": "block"}})).await;
    let refused = |body: Value| (body["choices"][0]["finish_reason"] == "content_filter").then_some(body);
    let blocked = shield_e2e::eventually(5, "the secrets detector to apply", || async {
        refused(stack.chat(&key, with_secret.clone(), &[]).await.2)
    })
    .await;
    assert_eq!(blocked["choices"][0]["message"]["content"], "Blocked by secrets detection (input)");
    // block → monitor: the same findings, read back, now only flag.
    let scanned = units(&stack).await.1;
    guardrails(&stack, json!({"pii_detection": {"mode": "monitor"}, "secrets_detection": {"mode": "monitor"}})).await;
    shield_e2e::eventually(5, "monitor mode to apply", || async {
        let (_, _, body) = stack.chat(&key, with_secret.clone(), &[]).await;
        refused(body.clone()).is_none().then_some(body)
    })
    .await;
    assert_eq!(units(&stack).await.1, scanned, "a mode change needs no rescan");
}
