//! Circuit breakers, health and strategies end to end (seed §8 item 7): a target whose circuit
//! is open receives no request; opening is announced on `gw_events` once; each process's view
//! is flushed to `gw_health` and read back through the admin API. Breaker transitions
//! (half-open, probe, re-open) are unit-tested in shield-core with an injected clock.

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use shield_e2e::eventually;
use shield_e2e::stack::{Stack, chat_body};

#[tokio::test]
async fn an_open_circuit_is_skipped_announced_and_reported() {
    let stack = Stack::start().await;
    stack.mock_target("flaky", "status:503", json!({})).await;
    stack.mock_target("steady", "", json!({})).await;
    stack.put_route("smart", json!({"targets": ["flaky", "steady"]})).await;
    let (key, _) = stack.key(None).await;
    for _ in 0..5 {
        let (status, headers, _) = stack.chat(&key, chat_body("smart"), &[]).await;
        assert_eq!((status, headers["x-shield-failovers"].to_str().unwrap()), (StatusCode::OK, "1"));
    }
    assert_eq!(stack.received("flaky").await.len(), 5);
    // Five breaker failures within 60 s: the circuit is open and the target is not called.
    for _ in 0..3 {
        let (status, headers, body) = stack.chat(&key, chat_body("smart"), &[]).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(headers["x-shield-failovers"], "0");
        assert_eq!(body["x_shield"]["routing"]["excluded"], json!([{"target": "flaky", "reason": "circuit_open"}]));
    }
    assert_eq!(stack.received("flaky").await.len(), 5, "an open circuit receives no request");

    // gateway_target_down, once, on the gw_events stream.
    let client = redis::Client::open(shield_e2e::redis_url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let entries: Vec<(String, Vec<(String, String)>)> = redis::cmd("XRANGE")
        .arg(format!("{}gw_events", stack.prefix))
        .arg("-")
        .arg("+")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(entries.len(), 1, "{entries:?}");
    let fields: std::collections::BTreeMap<_, _> = entries[0].1.iter().cloned().collect();
    assert_eq!((fields["type"].as_str(), fields["tenant"].as_str()), ("gateway_target_down", stack.tenant.as_str()));
    let data: Value = serde_json::from_str(&fields["data"]).unwrap();
    assert_eq!(
        (data["target"].as_str(), data["failures"].as_u64(), data["last_error"].as_str()),
        (Some("flaky"), Some(5), Some("server_error"))
    );

    // The health flush (every second here) reaches gw_health and the admin API.
    let health = eventually(10, "the health flush", || async {
        let (status, body) = stack.admin_call(Method::GET, "/v1/tenant/me/gateway/health", None).await;
        (status == StatusCode::OK && body["targets"].as_array().is_some_and(|t| t.len() == 2)).then_some(body)
    })
    .await;
    let flaky = &health["targets"][0];
    assert_eq!((flaky["target"].as_str(), flaky["state"].as_str()), (Some("flaky"), Some("open")));
    assert_eq!(flaky["failures"], 5);
    assert_eq!(flaky["last_error"], "server_error");
    let steady = &health["targets"][1];
    assert_eq!((steady["state"].as_str(), steady["failures"].as_u64()), (Some("closed"), Some(0)));
    assert!(steady["last_ok_at"].as_i64().is_some());
    assert_eq!(flaky["process"], steady["process"]);

    // Metrics: closed label sets, the circuit, the failovers.
    let metrics = reqwest::get(format!("http://{}/metrics", stack.proxy)).await.unwrap().text().await.unwrap();
    let tenant = &stack.tenant;
    assert!(metrics.contains(&format!(r#"shield_circuit_state{{target="flaky",tenant="{tenant}"}} 2"#)), "{metrics}");
    assert!(
        metrics
            .contains(&format!(r#"shield_failovers_total{{class="server_error",route="smart",tenant="{tenant}"}} 5"#)),
        "{metrics}"
    );
    assert!(metrics.contains(&format!(
        r#"shield_requests_total{{halt="succeeded",route="smart",target="steady",tenant="{tenant}"}} 8"#
    )));
    assert!(metrics.contains("shield_gateway_added_seconds_bucket"));
    assert!(metrics.contains(&format!(r#"shield_config_snapshot_age_seconds{{tenant="{tenant}"}}"#)));
    assert!(!metrics.contains(&key), "no key in metrics");
}

#[tokio::test]
async fn client_errors_do_not_open_the_circuit() {
    let stack = Stack::start().await;
    stack.mock_target("strict", "status:400", json!({})).await;
    stack.put_route("strict", json!({"targets": ["strict"]})).await;
    let (key, _) = stack.key(None).await;
    for _ in 0..7 {
        assert_eq!(stack.chat(&key, chat_body("strict"), &[]).await.0, StatusCode::BAD_REQUEST);
    }
    assert_eq!(stack.received("strict").await.len(), 7, "a 4xx is the request's fault, not the target's");
}

#[tokio::test]
async fn lowest_latency_measures_every_target_then_prefers_the_fastest() {
    let stack = Stack::start().await;
    stack.mock_target("slow", "delay:150", json!({})).await;
    stack.mock_target("fast", "", json!({})).await;
    stack.put_route("quick", json!({"targets": ["slow", "fast"], "strategy": "lowest_latency"})).await;
    let (key, _) = stack.key(None).await;
    let mut answered = Vec::new();
    for _ in 0..6 {
        let (_, headers, _) = stack.chat(&key, chat_body("quick"), &[]).await;
        answered.push(headers["x-shield-target"].to_str().unwrap().to_string());
    }
    assert_eq!(answered, ["slow", "fast", "fast", "fast", "fast", "fast"], "untried first, then the fastest");
}

#[tokio::test]
async fn weighted_spreads_calls_by_weight() {
    let stack = Stack::start().await;
    stack.mock_target("heavy", "", json!({})).await;
    stack.mock_target("light", "", json!({})).await;
    stack
        .put_route(
            "split",
            json!({"targets": ["heavy", "light"], "strategy": "weighted", "weights": {"heavy": 80, "light": 20}}),
        )
        .await;
    let (key, _) = stack.key(None).await;
    for _ in 0..200 {
        assert_eq!(stack.chat(&key, chat_body("split"), &[]).await.0, StatusCode::OK);
    }
    let heavy = stack.received("heavy").await.len();
    assert_eq!(heavy + stack.received("light").await.len(), 200);
    // 80 % of 200 is 160; a binomial spread of ±30 is over 5 standard deviations.
    assert!((130..=190).contains(&heavy), "heavy answered {heavy} of 200");
}
