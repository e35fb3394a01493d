//! One request context, one end (issue 15): each way a routed request can end — answered,
//! refused by a rule, every attempt failed, the deadline, a stream completed, a stream broken,
//! a client gone mid-stream — is recorded once, and the usage rows the proxy flushed agree
//! with its metrics: per target, the calls in usage are the attempts in
//! `shield_upstream_seconds`, the `ok` are its `outcome="ok"` ones, and each route's one
//! request is counted once in `shield_requests_total` under the halt it ended with.

use std::collections::BTreeMap;

use futures_util::StreamExt;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use shield_e2e::eventually;
use shield_e2e::stack::{Stack, chat_body, labelled};

#[tokio::test]
async fn every_ending_is_recorded_once_and_usage_agrees_with_metrics() {
    let stack = Stack::start().await;
    let target = |id: &'static str, scenario: &'static str, extra: Value| {
        let stack = &stack;
        async move { stack.mock_target(id, scenario, extra).await }
    };
    target("answers", "", json!({})).await;
    target("fails-1", "status:503", json!({})).await;
    target("fails-2", "status:500", json!({})).await;
    target("hangs", "hang", json!({"timeout_s": 30})).await;
    target("streams", "chunks:3", json!({})).await;
    target("breaks", "chunks:5;break:2", json!({})).await;
    target("slow", "chunks:50;chunkdelay:100", json!({})).await;
    target("unused", "", json!({})).await;
    let routes = [
        ("answered", json!({"targets": ["answers"]})),
        (
            "refused",
            json!({"targets": ["unused"], "rules": [{"when": {"data_class": ["secret"]}, "deny": "not here"}]}),
        ),
        ("failed", json!({"targets": ["fails-1", "fails-2"]})),
        ("deadline", json!({"targets": ["hangs"], "failover": {"deadline_s": 1}})),
        ("stream-done", json!({"targets": ["streams"]})),
        ("stream-broken", json!({"targets": ["breaks"]})),
        ("client-gone", json!({"targets": ["slow"]})),
    ];
    for (name, body) in &routes {
        stack.put_route(name, body.clone()).await;
    }
    let (key, _) = stack.key(None).await;
    let stream = |model: &str| json!({"model": model, "stream": true, "messages": [{"role": "user", "content": "hi"}]});

    assert_eq!(stack.chat(&key, chat_body("answered"), &[]).await.0, StatusCode::OK);
    let (status, _, body) = stack.chat(&key, chat_body("refused"), &[("x-shield-data-class", "secret")]).await;
    assert_eq!((status, body["choices"][0]["finish_reason"].clone()), (StatusCode::OK, json!("content_filter")));
    assert_eq!(stack.chat(&key, chat_body("failed"), &[]).await.0, StatusCode::BAD_GATEWAY);
    assert_eq!(stack.chat(&key, chat_body("deadline"), &[]).await.0, StatusCode::GATEWAY_TIMEOUT);
    let (_, _, data) = stack.chat_stream(&key, stream("stream-done")).await;
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"));
    let (_, _, data) = stack.chat_stream(&key, stream("stream-broken")).await;
    assert!(data.iter().any(|d| d.contains("stream_broken")), "{data:?}");
    // The client reads the first chunk of a slow stream, then goes away.
    let response = stack
        .client
        .post(format!("http://{}/v1/chat/completions", stack.proxy))
        .bearer_auth(&key)
        .json(&stream("client-gone"))
        .send()
        .await
        .unwrap();
    let mut body = response.bytes_stream();
    assert!(body.next().await.is_some_and(|c| c.is_ok()));
    drop(body);

    let halts: BTreeMap<&str, &str> = BTreeMap::from([
        ("answered", "succeeded"),
        ("refused", "denied"),
        ("failed", "exhausted"),
        ("deadline", "deadline"),
        ("stream-done", "succeeded"),
        ("stream-broken", "visible_output"),
        ("client-gone", "cancelled"),
    ]);
    // Each request once, under its halt (the abandoned stream ends when the proxy notices).
    let requests = eventually(15, "every ending in the metrics", || async {
        let requests = stack.metric("shield_requests_total").await;
        let total: f64 = requests.iter().map(|(_, v)| v).sum();
        (total == halts.len() as f64).then_some(requests)
    })
    .await;
    for (route, halt) in &halts {
        let route_label = format!("route=\"{route}\"");
        let halt_label = format!("halt=\"{halt}\"");
        assert_eq!(labelled(&requests, &[&route_label]), 1.0, "{route}: one request, recorded once: {requests:?}");
        assert_eq!(labelled(&requests, &[&route_label, &halt_label]), 1.0, "{route} ended {halt}: {requests:?}");
    }
    let stream_broken = stack.metric("shield_stream_broken_total").await;
    assert_eq!(labelled(&stream_broken, &["route=\"stream-broken\""]), 1.0);

    // Usage, flushed, agrees with the metrics target by target.
    let (from, to) = {
        let today = chrono::Utc::now().date_naive();
        (today.pred_opt().unwrap_or(today), today.succ_opt().unwrap_or(today))
    };
    let attempts = stack.metric("shield_upstream_seconds_count").await;
    let expected_calls: f64 = attempts.iter().map(|(_, v)| v).sum();
    let rows = eventually(15, "the flushed usage", || async {
        let path = format!("/v1/tenant/me/gateway/usage?from={from}&to={to}");
        let (status, body) = stack.admin_call(Method::GET, &path, None).await;
        let rows = body["rows"].as_array().cloned().unwrap_or_default();
        let calls: f64 = rows.iter().filter_map(|r| r["calls"].as_f64()).sum();
        (status == StatusCode::OK && calls == expected_calls).then_some(rows)
    })
    .await;
    for target in ["answers", "fails-1", "fails-2", "hangs", "streams", "breaks", "slow"] {
        let row =
            rows.iter().find(|r| r["target"] == target).unwrap_or_else(|| panic!("no usage for {target}: {rows:?}"));
        let target_label = format!("target=\"{target}\"");
        assert_eq!(row["calls"].as_f64(), Some(labelled(&attempts, &[&target_label])), "{target}: calls");
        assert_eq!(row["ok"].as_f64(), Some(labelled(&attempts, &[&target_label, "outcome=\"ok\""])), "{target}: ok");
    }
    assert!(rows.iter().all(|r| r["target"] != "unused"), "a denied request calls nothing and bills nothing");
    let broken = rows.iter().find(|r| r["target"] == "breaks").unwrap();
    assert_eq!(broken["stream_broken"], 1);
    let slow = rows.iter().find(|r| r["target"] == "slow").unwrap();
    assert!(slow["output_tokens"].as_u64().unwrap() >= 1, "an abandoned stream is billed for what was relayed: {slow}");
}

/// Issue 31 (first part): the request's id — the caller's `X-Request-Id`, else one Shield
/// makes — goes to every upstream attempt, failovers included, and to the default path; with
/// `SHIELD_LOG_FORMAT=json` the proxy writes one JSON object per line, and a line written
/// while serving a request carries the request's id.
#[tokio::test]
async fn the_request_id_reaches_every_attempt_and_every_log_line_of_the_request() {
    let mut stack =
        Stack::start_with(shield_e2e::stack::StackOptions { default_upstream: true, ..Default::default() }).await;
    stack.restart_proxy(&[("SHIELD_LOG_FORMAT", "json".to_string())]).await;
    stack.mock_target("rid-busy", "status:429;retry-after:30", json!({})).await;
    stack.mock_target("rid-ok", "", json!({})).await;
    stack.put_route("rid", json!({"targets": ["rid-busy", "rid-ok"]})).await;
    let (key, _) = stack.key(None).await;
    let id = shield_e2e::unique("rid-");
    let (status, headers, body) = stack.chat(&key, chat_body("rid"), &[("x-request-id", &id)]).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(headers["x-request-id"], id.as_str());
    for target in ["rid-busy", "rid-ok"] {
        let received = stack.received(target).await;
        assert_eq!(received.len(), 1, "{target}");
        assert_eq!(received[0]["headers"]["x-request-id"], id.as_str(), "{target}: the caller's id goes upstream");
    }
    // Without one, Shield's own id goes upstream and comes back.
    let (_, headers, _) = stack.chat(&key, chat_body("rid"), &[]).await;
    let made = headers["x-request-id"].to_str().unwrap().to_string();
    assert_eq!(stack.received("rid-ok").await.last().unwrap()["headers"]["x-request-id"], made.as_str());
    // The default path forwards it too.
    let (status, _, _) = stack.chat(&key, chat_body("not-a-route"), &[("x-request-id", "rid-default-path-1")]).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(stack.received("default").await.last().unwrap()["headers"]["x-request-id"], "rid-default-path-1");

    // The JSON log: every line an object; the line the busy target's parking wrote names the
    // request it was serving.
    let log = std::fs::read_to_string(stack.evidence.path("proxy.log")).unwrap();
    let restarted = log.lines().skip_while(|l| !l.starts_with('{'));
    let lines: Vec<Value> =
        restarted.map(|l| serde_json::from_str(l).unwrap_or_else(|_| panic!("not JSON: {l}"))).collect();
    assert!(
        lines
            .iter()
            .all(|l| l["timestamp"].is_string() && l["level"].is_string() && l["fields"]["message"].is_string())
    );
    let parked =
        lines.iter().find(|l| l["fields"]["message"] == "target parked as exhausted").expect("the parking was logged");
    assert_eq!(parked["span"]["request_id"], id.as_str(), "{parked}");
    assert_eq!(
        (parked["target"].as_str(), parked["fields"]["target"].as_str()),
        (Some("shield_proxy::health"), Some("rid-busy"))
    );
}
