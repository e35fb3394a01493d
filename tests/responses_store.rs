//! Stored responses (issue 29): a response sent with `store` (true unless it says false) is
//! kept in the data plane's store for the tenant's retention, so `previous_response_id`,
//! `item_reference` and `GET` / `DELETE /v1/responses/{id}` work on any proxy of the fleet;
//! ids never resolve for another tenant; the tenant sets the retention
//! (`/v1/tenant/me/responses`), and 0 keeps nothing.

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use shield_e2e::eventually;
use shield_e2e::stack::Stack;

async fn post(stack: &Stack, proxy: &str, key: &str, body: Value) -> (StatusCode, Value) {
    let response =
        stack.client.post(format!("http://{proxy}/v1/responses")).bearer_auth(key).json(&body).send().await.unwrap();
    let (status, headers) = (response.status(), response.headers().clone());
    let text = response.text().await.unwrap();
    stack.evidence.response("POST proxy /v1/responses", status, &headers, &text);
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

async fn call(stack: &Stack, method: Method, path: &str, key: &str) -> (StatusCode, Value) {
    let response =
        stack.client.request(method, format!("http://{}{path}", stack.proxy)).bearer_auth(key).send().await.unwrap();
    let (status, headers) = (response.status(), response.headers().clone());
    let text = response.text().await.unwrap();
    stack.evidence.response(&format!("proxy {path}"), status, &headers, &text);
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

fn body_of(received: &Value) -> Value {
    serde_json::from_str(received["body"].as_str().unwrap()).unwrap()
}

/// The texts of the messages an OpenAI-flavour target received, in order.
fn said(body: &Value) -> Vec<String> {
    body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| format!("{}: {}", m["role"].as_str().unwrap(), m["content"]))
        .collect()
}

#[tokio::test]
async fn a_stored_conversation_continues_on_any_proxy_and_stays_in_its_tenant() {
    let mut stack = Stack::start().await;
    stack.mock_target("keep", "", json!({})).await;
    stack.mock_target("keep-claude", "", json!({"flavor": "anthropic"})).await;
    stack.mock_target("keep-tool", "tool:search", json!({})).await;
    stack.put_route("keep", json!({"targets": ["keep"]})).await;
    stack.put_route("keep-claude", json!({"targets": ["keep-claude"]})).await;
    stack.put_route("keep-tool", json!({"targets": ["keep-tool"]})).await;
    let (key, _) = stack.key(None).await;
    let second_proxy = stack.extra_proxy().await;

    // Three turns through the SDK, alternating proxies, each continuing the last.
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/sdk/openai_responses_store.py");
    for route in ["keep", "keep-claude"] {
        let proxies = format!("http://{},http://{second_proxy}", stack.proxy);
        let out = tokio::process::Command::new("python3").args([script, &proxies, &key, route]).output().await.unwrap();
        assert!(out.status.success(), "the SDK script failed: {}", String::from_utf8_lossy(&out.stderr));
        let out: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(out["texts"][2], "mock answer to: what do you know about me?", "{out}");
        assert_eq!(out["fetched"]["id"], out["ids"][2], "GET on the other proxy");
        assert_eq!(out["fetched"]["text"], out["texts"][2]);
        assert_eq!(out["input_items"], 5, "two turns of history and the third question: {out}");
        let ids: Vec<&str> = out["ids"].as_array().unwrap().iter().map(|i| i.as_str().unwrap()).collect();
        assert!(ids.iter().all(|id| id.starts_with("resp_")) && ids[0] != ids[1] && ids[1] != ids[2], "{ids:?}");

        // The upstream received the whole history on the third turn.
        let received = stack.received(route).await;
        assert_eq!(received.len(), 3);
        let third = body_of(received.last().unwrap());
        let text = third.to_string();
        for part in
            ["my name is Ada", "mock answer to: my name is Ada", "I live in Paris", "what do you know about me?"]
        {
            assert!(text.contains(part), "`{part}` is in the third turn: {text}");
        }
        if route == "keep" {
            assert_eq!(said(&third).len(), 5, "user, assistant, user, assistant, user: {:?}", said(&third));
        } else {
            let roles: Vec<&str> =
                third["messages"].as_array().unwrap().iter().map(|m| m["role"].as_str().unwrap()).collect();
            assert_eq!(roles, ["user", "assistant", "user", "assistant", "user"]);
        }

        // Another tenant cannot read, continue or delete it.
        let other = stack.other_tenant_key().await;
        let path = format!("/v1/responses/{}", ids[2]);
        let (status, error) = call(&stack, Method::GET, &path, &other).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{error}");
        assert_eq!(call(&stack, Method::DELETE, &path, &other).await.0, StatusCode::NOT_FOUND);
        let (status, _) = post(
            &stack,
            &stack.proxy,
            &other,
            json!({"model": route, "input": "x",
            "previous_response_id": ids[2]}),
        )
        .await;
        assert!(status == StatusCode::BAD_REQUEST || status == StatusCode::NOT_FOUND, "{status}");
        assert_eq!(call(&stack, Method::GET, &path, &key).await.0, StatusCode::OK, "still there for its tenant");

        // A conversation is a chain: with its first response deleted, it cannot be continued.
        if route == "keep-claude" {
            let first = format!("/v1/responses/{}", ids[0]);
            assert_eq!(call(&stack, Method::DELETE, &first, &key).await.0, StatusCode::OK);
            let (status, error) = post(
                &stack,
                &second_proxy,
                &key,
                json!({"model": route, "input": "and now?", "previous_response_id": ids[2]}),
            )
            .await;
            assert_eq!(status, StatusCode::BAD_REQUEST, "{error}");
            let message = error["error"]["message"].as_str().unwrap();
            assert!(message.starts_with("`previous_response_id`") && message.contains(ids[0]), "{message}");
        }
    }

    // An item reference: a stored function call named by id, its output sent with it.
    let (status, answer) = post(
        &stack,
        &stack.proxy,
        &key,
        json!({"model": "keep-tool", "input": "find x", "tools": [
            {"type": "function", "name": "search", "parameters": {"type": "object"}}]}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    let call_item = answer["output"][0].clone();
    assert_eq!(call_item["type"], "function_call");
    let (status, answer) = post(
        &stack,
        &second_proxy,
        &key,
        json!({"model": "keep", "input": [
        {"type": "message", "role": "user", "content": "find x"},
        {"type": "item_reference", "id": call_item["id"]},
        {"type": "function_call_output", "call_id": call_item["call_id"], "output": "x is 42"}]}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    let upstream = body_of(stack.received("keep").await.last().unwrap());
    assert_eq!(upstream["messages"][1]["tool_calls"][0]["id"], call_item["call_id"], "{upstream}");
    assert_eq!(upstream["messages"][2]["content"], "x is 42");
    let (status, error) = post(
        &stack,
        &stack.proxy,
        &key,
        json!({"model": "keep", "input": [
        {"type": "item_reference", "id": "fc_never_stored"}]}),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(error["error"]["message"].as_str().unwrap().contains("input.0.id"), "{error}");

    // `store: false` keeps nothing; DELETE removes a kept one.
    let (_, unkept) = post(&stack, &stack.proxy, &key, json!({"model": "keep", "input": "x", "store": false})).await;
    let path = format!("/v1/responses/{}", unkept["id"].as_str().unwrap());
    assert_eq!(call(&stack, Method::GET, &path, &key).await.0, StatusCode::NOT_FOUND);
    let (_, kept) = post(&stack, &stack.proxy, &key, json!({"model": "keep", "input": "x"})).await;
    let path = format!("/v1/responses/{}", kept["id"].as_str().unwrap());
    let (status, deleted) = call(&stack, Method::DELETE, &path, &key).await;
    assert_eq!((status, deleted["deleted"].as_bool()), (StatusCode::OK, Some(true)));
    assert_eq!(call(&stack, Method::GET, &path, &key).await.0, StatusCode::NOT_FOUND);
    let (status, error) = post(
        &stack,
        &stack.proxy,
        &key,
        json!({"model": "keep", "input": "again",
        "previous_response_id": kept["id"]}),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(error["error"]["message"].as_str().unwrap().contains("previous_response_id"), "{error}");
}

#[tokio::test]
async fn the_tenant_sets_the_retention_and_zero_keeps_nothing() {
    let stack = Stack::start().await;
    stack.mock_target("ret", "", json!({})).await;
    stack.put_route("ret", json!({"targets": ["ret"]})).await;
    let (key, _) = stack.key(None).await;

    let (status, retention) = stack.admin_call(Method::GET, "/v1/tenant/me/responses", None).await;
    assert_eq!((status, retention), (StatusCode::OK, json!({"retention_s": 86400})), "a day by default");
    for bad in [
        json!({"retention_s": -1}),
        json!({"retention_s": "long"}),
        json!({"retention_s": 99_999_999}),
        json!({"retention_s": 60, "keep": true}),
    ] {
        let (status, error) = stack.admin_call(Method::PUT, "/v1/tenant/me/responses", Some(bad.clone())).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{bad}: {error}");
        assert!(error.to_string().contains("retention_s") || error.to_string().contains("keep"), "{error}");
    }

    // A short retention: kept, then gone.
    let (status, _) = stack.admin_call(Method::PUT, "/v1/tenant/me/responses", Some(json!({"retention_s": 2}))).await;
    assert_eq!(status, StatusCode::OK);
    let id = eventually(10, "a response kept for 2 s", || async {
        let (_, answer) = post(&stack, &stack.proxy, &key, json!({"model": "ret", "input": "x"})).await;
        let id = answer["id"].as_str()?.to_string();
        let ttl: i64 = redis::cmd("TTL")
            .arg(format!("{}gw_resp:{{{}}}:{id}", stack.prefix, stack.tenant))
            .query_async(&mut shield_e2e::redis_conn(&shield_e2e::redis_url()).await)
            .await
            .ok()?;
        (1..=2).contains(&ttl).then_some(id)
    })
    .await;
    let path = format!("/v1/responses/{id}");
    assert_eq!(call(&stack, Method::GET, &path, &key).await.0, StatusCode::OK);
    tokio::time::sleep(std::time::Duration::from_millis(2500)).await;
    assert_eq!(call(&stack, Method::GET, &path, &key).await.0, StatusCode::NOT_FOUND, "expired");

    // Retention 0: nothing is kept, and what needs stored state is refused by name.
    let (status, _) = stack.admin_call(Method::PUT, "/v1/tenant/me/responses", Some(json!({"retention_s": 0}))).await;
    assert_eq!(status, StatusCode::OK);
    let error = eventually(10, "retention 0 to reach the proxy", || async {
        let (status, error) = post(
            &stack,
            &stack.proxy,
            &key,
            json!({"model": "ret", "input": "x",
            "previous_response_id": "resp_anything"}),
        )
        .await;
        (status == StatusCode::BAD_REQUEST && error.to_string().contains("retention 0")).then_some(error)
    })
    .await;
    assert!(error["error"]["message"].as_str().unwrap().starts_with("`previous_response_id`"), "{error}");
    let (status, error) =
        post(&stack, &stack.proxy, &key, json!({"model": "ret", "input": [{"type": "item_reference", "id": "msg_1"}]}))
            .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(error["error"]["message"].as_str().unwrap().contains("input.0"), "{error}");
    let (status, answer) = post(&stack, &stack.proxy, &key, json!({"model": "ret", "input": "x"})).await;
    assert_eq!(status, StatusCode::OK);
    let path = format!("/v1/responses/{}", answer["id"].as_str().unwrap());
    assert_eq!(call(&stack, Method::GET, &path, &key).await.0, StatusCode::NOT_FOUND, "nothing kept");
    let mut conn = shield_e2e::redis_conn(&shield_e2e::redis_url()).await;
    let kept: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{}gw_resp*{{{}}}*", stack.prefix, stack.tenant))
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(kept.is_empty(), "{kept:?}");
    let (status, retention) = stack.admin_call(Method::GET, "/v1/tenant/me/responses", None).await;
    assert_eq!((status, retention), (StatusCode::OK, json!({"retention_s": 0})));
    let (status, audit) = stack.admin_call(Method::GET, "/v1/tenant/me/audit", None).await;
    assert_eq!(status, StatusCode::OK);
    assert!(audit.to_string().contains("response_retention_set"), "{audit}");
}

/// The same on a Redis Cluster: a conversation's keys share the tenant's slot, so the
/// pipelines that keep, renew and read them stay in one slot.
#[tokio::test]
async fn a_stored_conversation_works_on_a_redis_cluster() {
    let stack = Stack::start_with(shield_e2e::stack::StackOptions::on_cluster()).await;
    stack.mock_target("cl", "", json!({})).await;
    stack.mock_target("cl-tool", "tool:search", json!({})).await;
    stack.put_route("cl", json!({"targets": ["cl"]})).await;
    stack.put_route("cl-tool", json!({"targets": ["cl-tool"]})).await;
    let (key, _) = stack.key(None).await;

    let mut previous = Value::Null;
    for (n, said) in ["one", "two", "three"].iter().enumerate() {
        let mut body = json!({"model": "cl", "input": said, "previous_response_id": previous});
        if n == 1 {
            body["stream"] = json!(true);
            let response = stack
                .client
                .post(format!("http://{}/v1/responses", stack.proxy))
                .bearer_auth(&key)
                .json(&body)
                .send()
                .await
                .unwrap();
            let text = response.text().await.unwrap();
            let completed: Value = text
                .lines()
                .filter_map(|l| l.strip_prefix("data: "))
                .map(|d| serde_json::from_str::<Value>(d).unwrap())
                .find(|e| e["type"] == "response.completed")
                .unwrap();
            previous = completed["response"]["id"].clone();
            continue;
        }
        let (status, answer) = post(&stack, &stack.proxy, &key, body).await;
        assert_eq!(status, StatusCode::OK, "{answer}");
        previous = answer["id"].clone();
    }
    let third = body_of(stack.received("cl").await.last().unwrap());
    assert_eq!(said(&third).len(), 5, "{:?}", said(&third));
    let path = format!("/v1/responses/{}/input_items", previous.as_str().unwrap());
    let (status, items) = call(&stack, Method::GET, &path, &key).await;
    assert_eq!((status, items["data"].as_array().map(Vec::len)), (StatusCode::OK, Some(5)), "{items}");

    let (_, answer) = post(&stack, &stack.proxy, &key, json!({"model": "cl-tool", "input": "find x"})).await;
    let call_item = answer["output"][0].clone();
    let (status, _) = post(
        &stack,
        &stack.proxy,
        &key,
        json!({"model": "cl", "input": [
        {"type": "item_reference", "id": call_item["id"]},
        {"type": "function_call_output", "call_id": call_item["call_id"], "output": "42"}]}),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let path = format!("/v1/responses/{}", previous.as_str().unwrap());
    assert_eq!(call(&stack, Method::DELETE, &path, &key).await.0, StatusCode::OK);
    assert_eq!(call(&stack, Method::GET, &path, &key).await.0, StatusCode::NOT_FOUND);
}
