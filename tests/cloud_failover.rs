//! Routes that mix the cloud flavors fail over in every direction (issue 30): Bedrock
//! throttling → Claude on Vertex unavailable → OpenAI, OpenAI down → Bedrock throttling →
//! Gemini on Vertex, Gemini on Vertex throttling → OpenAI failing → Bedrock; each through
//! `/v1/chat/completions`, `/v1/messages` and `/v1/responses`, streamed and not, with cost from
//! the answering provider's usage; and a tool call that round-trips after a failover.

use reqwest::StatusCode;
use serde_json::{Value, json};
use shield_e2e::clouds;
use shield_e2e::stack::Stack;

async fn cloud_target(stack: &Stack, id: &str, kind: &str, scenario: &str, extra: Value) {
    let mock = &stack.mock;
    let mut body = match kind {
        "bedrock" => json!({"flavor": "bedrock", "base_url": format!("http://{mock}/mock/id:{id};{scenario}"),
            "model": "anthropic.claude-sonnet-4-20250514-v1:0", "bedrock": {"region": "eu-west-1"},
            "auth": {"mode": "vault", "secret_ref": "shield://aws"}}),
        "vertex-gemini" | "vertex-claude" => {
            let (publisher, model) = if kind == "vertex-gemini" {
                ("google", "gemini-2.5-pro")
            } else {
                ("anthropic", "claude-opus-4@20250514")
            };
            json!({"flavor": "vertex", "vertex": {"publisher": publisher}, "model": model,
                "base_url": format!("http://{mock}/mock/id:{id};{scenario}/v1/projects/p/locations/europe-west4"),
                "auth": {"mode": "vault", "secret_ref": "shield://gcp"}})
        }
        _ => json!({"base_url": format!("http://{mock}/mock/id:{id};{scenario}/v1"), "model": format!("model-{id}")}),
    };
    body["allow_private"] = json!(true);
    for (k, v) in extra.as_object().into_iter().flatten() {
        body[k] = v.clone();
    }
    stack.put_target(id, body).await;
}

async fn post(stack: &Stack, key: &str, path: &str, body: Value) -> (StatusCode, reqwest::header::HeaderMap, String) {
    stack.post(key, path, body, &[]).await
}

fn request(path: &str, route: &str, stream: bool) -> Value {
    match path {
        "/v1/responses" => json!({"model": route, "input": "hello", "stream": stream, "store": false}),
        "/v1/messages" => {
            json!({"model": route, "max_tokens": 64, "stream": stream, "messages": [{"role": "user", "content": "hello"}]})
        }
        _ => json!({"model": route, "stream": stream, "messages": [{"role": "user", "content": "hello"}]}),
    }
}

#[tokio::test]
async fn routes_mixing_clouds_fail_over_in_every_direction_in_every_shape() {
    let stack = Stack::start().await;
    clouds::aws_keys(&stack, "aws").await;
    clouds::service_account(&stack, "gcp", None).await;
    let price = json!({"price": {"input_per_mtok": 2, "output_per_mtok": 8}});
    cloud_target(&stack, "br-throttled", "bedrock", "status:429", json!({})).await;
    cloud_target(&stack, "vc-down", "vertex-claude", "status:503", json!({})).await;
    cloud_target(&stack, "gpt-ok", "openai", "usage:10-5", price.clone()).await;
    cloud_target(&stack, "gpt-down", "openai", "status:503", json!({})).await;
    cloud_target(&stack, "br-throttled-2", "bedrock", "status:429", json!({})).await;
    cloud_target(&stack, "vg-ok", "vertex-gemini", "usage:20-10", price.clone()).await;
    cloud_target(&stack, "vg-throttled", "vertex-gemini", "status:429", json!({})).await;
    cloud_target(&stack, "gpt-failing", "openai", "status:500", json!({})).await;
    cloud_target(&stack, "br-ok", "bedrock", "usage:30-15", price).await;
    // The breaker is not what this test is about: failures here never open a circuit.
    let lenient = json!({"failover": {"deadline_s": 30}});
    let routes = [
        ("to-openai", ["br-throttled", "vc-down", "gpt-ok"], ["rate_limited", "server_error"], 60),
        ("to-vertex", ["gpt-down", "br-throttled-2", "vg-ok"], ["server_error", "rate_limited"], 120),
        ("to-bedrock", ["vg-throttled", "gpt-failing", "br-ok"], ["rate_limited", "server_error"], 180),
    ];
    for (route, targets, _, _) in &routes {
        let mut body = lenient.clone();
        body["targets"] = json!(targets);
        stack.put_route(route, body).await;
    }
    cloud_target(&stack, "br-tool-down", "bedrock", "status:503", json!({})).await;
    cloud_target(&stack, "vg-tool", "vertex-gemini", "tool:search", json!({})).await;
    stack.put_route("tools", json!({"targets": ["br-tool-down", "vg-tool"]})).await;
    let (key, _) = stack.key(None).await;
    for (route, targets, classes, cost) in routes {
        // The first call, not streamed, shows every attempt and the survivor's cost.
        let (status, headers, text) = post(&stack, &key, "/v1/chat/completions", request("", route, false)).await;
        assert_eq!(status, StatusCode::OK, "{route}: {text}");
        assert_eq!(headers["x-shield-target"], targets[2], "{route}");
        let body: Value = serde_json::from_str(&text).unwrap();
        let attempts = body["x_shield"]["routing"]["attempts"].as_array().unwrap();
        let tried: Vec<(&str, &str)> =
            attempts.iter().map(|a| (a["target"].as_str().unwrap(), a["class"].as_str().unwrap_or("ok"))).collect();
        assert_eq!(tried[..2], [(targets[0], classes[0]), (targets[1], classes[1])], "{route}: {body}");
        assert_eq!(body["x_shield"]["routing"]["cost_micros"], cost, "{route}: from the answering provider's usage");
        for path in ["/v1/chat/completions", "/v1/messages", "/v1/responses"] {
            for stream in [false, true] {
                let (status, headers, text) = post(&stack, &key, path, request(path, route, stream)).await;
                assert_eq!(status, StatusCode::OK, "{route} {path} stream {stream}: {text}");
                assert_eq!(headers["x-shield-target"], targets[2], "{route} {path} stream {stream}");
                assert!(text.contains("mock"), "{route} {path} stream {stream}: {text}");
            }
        }
    }

    // A tool call answered after a failover, and its result sent back to the one that made it.
    let tools = json!([{"type": "function", "function": {"name": "search", "parameters": {"type": "object"}}}]);
    let (status, _, text) = post(
        &stack,
        &key,
        "/v1/chat/completions",
        json!({"model": "tools", "tools": tools, "messages": [{"role": "user", "content": "find x"}]}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let answer: Value = serde_json::from_str(&text).unwrap();
    let message = answer["choices"][0]["message"].clone();
    let call_id = message["tool_calls"][0]["id"].as_str().unwrap().to_string();
    assert_eq!(message["tool_calls"][0]["function"]["name"], "search");
    let (status, _, text) = post(
        &stack,
        &key,
        "/v1/chat/completions",
        json!({"model": "tools", "tools": tools, "messages": [{"role": "user", "content": "find x"}, message,
            {"role": "tool", "tool_call_id": call_id, "content": "x is 42"}]}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let bedrock_body: Value =
        serde_json::from_str(stack.received("br-tool-down").await.last().unwrap()["body"].as_str().unwrap()).unwrap();
    assert_eq!(bedrock_body["messages"][2]["content"][0]["toolResult"]["toolUseId"], call_id.as_str());
    let vertex_body: Value =
        serde_json::from_str(stack.received("vg-tool").await.last().unwrap()["body"].as_str().unwrap()).unwrap();
    assert_eq!(vertex_body["contents"][2]["parts"][0]["functionResponse"]["name"], "search");
    for id in ["vc-down", "vg-ok", "vg-throttled", "vg-tool"] {
        clouds::record_tokens(&stack, id).await;
    }
}
