//! Every request observable (issue 31), end to end: the real `shield` exporting traces with
//! OTLP/HTTP to a real receiver (tests/sdk/otlp_receiver.py, decoding the protobuf export
//! requests with OpenTelemetry's own classes).
//!
//! * A request that fails over once and a stream: one SERVER span each, one CLIENT span per
//!   attempt with the GenAI attributes, the caller's trace continued, and the `traceparent`
//!   each upstream received naming its own attempt's span; the GenAI metrics; the JSON log's
//!   access records carry the request and trace ids; the admin API traces its requests too.
//! * Every ending — 401, 400, 413, a rate limit, a guardrail, the default path, answered, a
//!   rule's refusal, all failed, a stream completed, broken, abandoned — has one access
//!   record, one count in `shield_http_requests_total` and one SERVER span, and they agree.
//! * A collector that is gone: requests still succeed, spans are dropped and counted.

use std::collections::BTreeMap;
use std::process::Stdio;

use futures_util::StreamExt;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use shield_e2e::eventually;
use shield_e2e::stack::{Stack, StackOptions, chat_body, labelled};

/// The OTLP receiver, stopped when dropped.
struct Receiver {
    port: u16,
    _child: tokio::process::Child,
}

impl Receiver {
    async fn start(dump: std::path::PathBuf) -> Receiver {
        let dir = tempfile_dir();
        let port_file = dir.join("port");
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/sdk/otlp_receiver.py");
        let child = tokio::process::Command::new("python3")
            .args([script, port_file.to_str().unwrap(), dump.to_str().unwrap()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("python3 runs the receiver");
        let port = eventually(30, "the OTLP receiver to listen", || {
            let port_file = port_file.clone();
            async move { std::fs::read_to_string(&port_file).ok().and_then(|p| p.trim().parse().ok()) }
        })
        .await;
        Receiver { port, _child: child }
    }

    fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    async fn spans(&self) -> Vec<Value> {
        let url = format!("{}/spans", self.endpoint());
        reqwest::get(url).await.unwrap().json().await.unwrap()
    }

    /// Waits until `check` finds what it wants among the spans received.
    async fn until<T>(&self, what: &str, check: impl Fn(&[Value]) -> Option<T>) -> T {
        eventually(20, what, || async { check(&self.spans().await) }).await
    }
}

fn tempfile_dir() -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(shield_e2e::unique("otlp-"));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Tracing on, exported within 100 ms; JSON logs.
fn traced_env(endpoint: &str) -> Vec<(&'static str, String)> {
    vec![
        ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.to_string()),
        ("OTEL_BSP_SCHEDULE_DELAY", "100".to_string()),
        ("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=e2e".to_string()),
        ("SHIELD_LOG_FORMAT", "json".to_string()),
    ]
}

const SERVER: i64 = 2;
const CLIENT: i64 = 3;

fn attr<'a>(span: &'a Value, key: &str) -> &'a Value {
    &span["attributes"][key]
}

fn server_span<'a>(spans: &'a [Value], request_id: &str) -> Option<&'a Value> {
    spans.iter().find(|s| s["kind"] == SERVER && attr(s, "shield.request_id") == request_id)
}

fn children<'a>(spans: &'a [Value], parent: &Value) -> Vec<&'a Value> {
    let mut out: Vec<&Value> = spans
        .iter()
        .filter(|s| {
            s["kind"] == CLIENT && s["parent_span_id"] == parent["span_id"] && s["trace_id"] == parent["trace_id"]
        })
        .collect();
    out.sort_by_key(|s| attr(s, "shield.attempt").as_i64());
    out
}

/// A streamed chat call to `model` with request id `id`: the SSE body.
async fn streamed(stack: &Stack, key: &str, id: &str, model: &str) -> String {
    let response = stack
        .client
        .post(format!("http://{}/v1/chat/completions", stack.proxy))
        .bearer_auth(key)
        .header("x-request-id", id)
        .json(&json!({"model": model, "stream": true, "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    response.text().await.unwrap()
}

/// The JSON log's access records (`shield::access`), by request id.
fn access_records(stack: &Stack) -> BTreeMap<String, Value> {
    let log = std::fs::read_to_string(stack.evidence.path("proxy.log")).unwrap();
    log.lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str::<Value>(l).unwrap_or_else(|_| panic!("not JSON: {l}")))
        .filter(|l| l["target"] == "shield::access")
        .map(|l| (l["fields"]["request_id"].as_str().unwrap_or_default().to_string(), l))
        .collect()
}

#[tokio::test]
async fn a_failover_and_a_stream_make_one_span_tree_each_and_the_upstreams_receive_their_attempts_context() {
    let mut stack = Stack::start().await;
    let receiver = Receiver::start(stack.evidence.path("spans.json")).await;
    stack.mock_target("down", "status:503", json!({})).await;
    stack.mock_target("up", "", json!({})).await;
    stack.mock_target("streams", "chunks:3", json!({})).await;
    stack.put_route("traced", json!({"targets": ["down", "up"]})).await;
    stack.put_route("traced-stream", json!({"targets": ["streams"]})).await;
    let (key, key_id) = stack.key(None).await;
    stack.restart_proxy(&traced_env(&receiver.endpoint())).await;
    // The admin picks the variables up too (restart_proxy extended the stack's environment).
    stack.restart_admin().await;

    // A caller that sends its own trace context.
    let caller_trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let caller_span = "00f067aa0ba902b7";
    let traceparent = format!("00-{caller_trace}-{caller_span}-01");
    let id = shield_e2e::unique("trace-");
    let mut body = chat_body("traced");
    body["max_tokens"] = json!(64);
    body["temperature"] = json!(0.5);
    let (status, headers, answer) =
        stack.chat(&key, body, &[("x-request-id", &id), ("traceparent", &traceparent)]).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(headers["x-shield-failovers"], "1");

    let (server, attempts) = receiver
        .until("the failover's spans", |spans| {
            let server = server_span(spans, &id)?.clone();
            let attempts: Vec<Value> = children(spans, &server).into_iter().cloned().collect();
            (attempts.len() == 2).then_some((server, attempts))
        })
        .await;
    // The SERVER span continues the caller's trace.
    assert_eq!(server["name"], "POST /v1/chat/completions");
    assert_eq!(server["trace_id"], caller_trace);
    assert_eq!(server["parent_span_id"], caller_span);
    assert_eq!(server["service"], "shield-proxy");
    assert_eq!(server["resource"]["deployment.environment"], "e2e");
    assert_eq!(server["scope"], "shield-proxy");
    assert_eq!(server["content_type"], "application/x-protobuf");
    for (key, value) in [
        ("http.request.method", json!("POST")),
        ("http.route", json!("/v1/chat/completions")),
        ("http.response.status_code", json!(200)),
        ("shield.tenant", json!(stack.tenant)),
        ("shield.key_id", json!(key_id)),
        ("shield.route", json!("traced")),
        ("shield.halt", json!("succeeded")),
        ("shield.budget", json!("ok")),
        ("shield.ending", json!("answered")),
    ] {
        assert_eq!(attr(&server, key), &value, "{key} on {server}");
    }
    // One CLIENT span per attempt.
    let (failed, answered) = (&attempts[0], &attempts[1]);
    for (span, target, n) in [(failed, "down", 1), (answered, "up", 2)] {
        assert_eq!(span["name"], format!("chat model-{target}"), "{span}");
        assert_eq!(attr(span, "gen_ai.operation.name"), "chat");
        assert_eq!(attr(span, "gen_ai.provider.name"), "openai");
        assert_eq!(attr(span, "gen_ai.request.model"), format!("model-{target}").as_str());
        assert_eq!(attr(span, "gen_ai.request.max_tokens"), 64);
        assert_eq!(attr(span, "gen_ai.request.temperature"), 0.5);
        assert_eq!(attr(span, "server.address"), "127.0.0.1");
        assert!(attr(span, "server.port").as_i64().is_some_and(|p| p > 0), "{span}");
        assert_eq!(attr(span, "shield.target"), target);
        assert_eq!(attr(span, "shield.attempt"), n);
        assert_eq!(attr(span, "shield.retry"), false);
        // The upstream received this attempt's span as its parent.
        let received = stack.received(target).await;
        assert_eq!(
            received[0]["headers"]["traceparent"],
            format!("00-{caller_trace}-{}-01", span["span_id"].as_str().unwrap()),
            "{target}"
        );
    }
    assert_eq!(attr(failed, "error.type"), "server_error");
    assert_eq!(attr(failed, "shield.failure_class"), "server_error");
    assert_eq!(attr(failed, "shield.committed"), false);
    assert_eq!(attr(failed, "http.response.status_code"), 503);
    assert_eq!(failed["status"], 2, "an error status");
    assert_eq!(attr(answered, "shield.committed"), true);
    assert!(attr(answered, "error.type").is_null());
    assert_eq!(attr(answered, "gen_ai.response.model"), "model-up");
    assert_eq!(attr(answered, "gen_ai.response.id").as_str(), answer["id"].as_str());
    assert_eq!(attr(answered, "gen_ai.response.finish_reasons"), &json!(["stop"]));
    assert_eq!(attr(answered, "gen_ai.usage.input_tokens"), &answer["usage"]["prompt_tokens"]);
    assert_eq!(attr(answered, "gen_ai.usage.output_tokens"), &answer["usage"]["completion_tokens"]);
    assert!(attr(answered, "gen_ai.usage.cache_read.input_tokens").is_i64());
    // Content is off by default: no prompt, no answer on any span.
    let everything = Value::from(receiver.spans().await).to_string();
    assert!(!everything.contains("gen_ai.input.messages") && !everything.contains("Hello"), "no content by default");

    // A stream: its attempt span covers the stream to its end, with the time to first chunk.
    let stream_id = shield_e2e::unique("trace-stream-");
    let text = streamed(&stack, &key, &stream_id, "traced-stream").await;
    assert!(text.contains("[DONE]"));
    let (server, attempts) = receiver
        .until("the stream's spans", |spans| {
            let server = server_span(spans, &stream_id)?.clone();
            let attempts: Vec<Value> = children(spans, &server).into_iter().cloned().collect();
            (attempts.len() == 1).then_some((server, attempts))
        })
        .await;
    let attempt = &attempts[0];
    assert_ne!(server["trace_id"], caller_trace, "no caller context: a new trace");
    assert_eq!(server["parent_span_id"], "", "a root span");
    assert_eq!(attr(&server, "shield.ending"), "stream_completed");
    assert_eq!(attr(attempt, "gen_ai.request.stream"), true);
    let first = attr(attempt, "gen_ai.response.time_to_first_chunk").as_f64().expect("time to first chunk");
    let lasted = (attempt["end"].as_u64().unwrap() - attempt["start"].as_u64().unwrap()) as f64 / 1e9;
    assert!(first > 0.0 && first <= lasted, "first chunk {first}s within the attempt's {lasted}s");
    assert!(attempt["end"].as_u64() <= server["end"].as_u64(), "the request's span outlives its stream");
    assert_eq!(attr(attempt, "gen_ai.response.finish_reasons"), &json!(["stop"]));
    assert!(attr(attempt, "gen_ai.usage.output_tokens").as_i64().is_some_and(|n| n > 0));

    // The admin API traces its requests as `shield-admin`.
    let (status, _) = stack.admin_call(Method::GET, "/v1/tenant/me/gateway/routes", None).await;
    assert_eq!(status, StatusCode::OK);
    let admin = receiver
        .until("the admin's span", |spans| {
            spans
                .iter()
                .find(|s| s["scope"] == "shield-admin" && s["name"] == "GET /v1/tenant/me/gateway/routes")
                .cloned()
        })
        .await;
    assert_eq!(admin["kind"], SERVER);
    assert_eq!(attr(&admin, "http.response.status_code"), 200);

    // The JSON log: each request's access record carries its request and trace ids.
    let records = eventually(10, "the access records", || async {
        let records = access_records(&stack);
        (records.contains_key(&id) && records.contains_key(&stream_id)).then_some(records)
    })
    .await;
    let record = &records[&id]["fields"];
    assert_eq!(record["trace_id"], caller_trace);
    assert_eq!((record["status"].as_u64(), record["ending"].as_str()), (Some(200), Some("answered")));
    assert_eq!((record["route"].as_str(), record["target"].as_str()), (Some("traced"), Some("up")));
    assert_eq!((record["attempts"].as_u64(), record["failovers"].as_u64()), (Some(2), Some(1)));
    assert_eq!(records[&stream_id]["fields"]["ending"], "stream_completed");
    // Every line written while serving the request carries the trace id too.
    let log = std::fs::read_to_string(stack.evidence.path("proxy.log")).unwrap();
    let parked = log.lines().filter(|l| l.contains("\"request_id\":\"") && l.contains(&id)).count();
    assert!(parked >= 1);
    assert!(
        log.lines().filter(|l| l.contains(&format!("\"request_id\":\"{id}\""))).all(|l| l.contains(caller_trace)),
        "each line of the request names its trace"
    );

    // The GenAI metrics.
    let duration = stack.metric("gen_ai_client_operation_duration_seconds_count").await;
    assert_eq!(labelled(&duration, &["target=\"down\"", "error_type=\"server_error\""]), 1.0, "{duration:?}");
    assert_eq!(labelled(&duration, &["target=\"up\"", "error_type=\"\"", "gen_ai_provider_name=\"openai\""]), 1.0);
    let tokens = stack.metric("gen_ai_client_token_usage_sum").await;
    let input = answer["usage"]["prompt_tokens"].as_f64().unwrap();
    assert_eq!(labelled(&tokens, &["target=\"up\"", "gen_ai_token_type=\"input\""]), input, "{tokens:?}");
    let first_chunk = stack.metric("gen_ai_client_operation_time_to_first_chunk_seconds_count").await;
    assert_eq!(labelled(&first_chunk, &["target=\"streams\"", "gen_ai_request_model=\"model-streams\""]), 1.0);
    let exported = stack.metric("shield_trace_spans_exported_total").await;
    assert!(exported.iter().map(|(_, v)| v).sum::<f64>() >= 5.0, "{exported:?}");

    // Content only when the operator opts in, and then with the secrets the guardrails'
    // detector knows replaced.
    stack.restart_proxy(&[("SHIELD_TRACE_CONTENT", "1".to_string())]).await;
    let content_id = shield_e2e::unique("trace-content-");
    let prompt =
        json!({"model": "traced", "messages": [{"role": "user", "content": "deploy with AKIAIOSFODNN7EXAMPLE today"}]});
    let (status, _, answer) = stack.chat(&key, prompt, &[("x-request-id", &content_id)]).await;
    assert_eq!(status, StatusCode::OK);
    let attempt = receiver
        .until("the span with content", |spans| {
            let server = server_span(spans, &content_id)?;
            children(spans, server).into_iter().find(|s| attr(s, "shield.committed") == true).cloned()
        })
        .await;
    let input = attr(&attempt, "gen_ai.input.messages").as_str().expect("input messages");
    assert!(input.contains("deploy with") && !input.contains("AKIAIOSFODNN7EXAMPLE"), "{input}");
    let output: Value =
        serde_json::from_str(attr(&attempt, "gen_ai.output.messages").as_str().expect("output")).unwrap();
    // The mock echoes the prompt: the answer on the span has the key replaced too.
    let answered = answer["choices"][0]["message"]["content"].as_str().unwrap();
    assert!(answered.contains("AKIAIOSFODNN7EXAMPLE"), "{answered}");
    assert_eq!(output[0]["parts"][0]["content"], answered.replace("AKIAIOSFODNN7EXAMPLE", "[redacted]"));

    // A stream's attempt span carries what the stream relayed.
    let stream_content_id = shield_e2e::unique("trace-stream-content-");
    let text = streamed(&stack, &key, &stream_content_id, "traced-stream").await;
    let relayed: String = text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str().map(str::to_string))
        .collect();
    assert!(!relayed.is_empty(), "{text}");
    let attempt = receiver
        .until("the stream's span with content", |spans| {
            let server = server_span(spans, &stream_content_id)?;
            children(spans, server).first().map(|s| (*s).clone())
        })
        .await;
    let output: Value =
        serde_json::from_str(attr(&attempt, "gen_ai.output.messages").as_str().expect("output")).unwrap();
    assert_eq!(output[0]["parts"][0]["content"], relayed.as_str());

    // The collector goes away: requests succeed as before, and the lost spans are counted.
    drop(receiver);
    for _ in 0..5 {
        let (status, _, body) = stack.chat(&key, chat_body("traced-stream"), &[]).await;
        assert_eq!(status, StatusCode::OK, "{body}");
    }
    eventually(20, "the dropped spans to be counted", || async {
        let dropped = stack.metric("shield_trace_spans_dropped_total").await;
        (labelled(&dropped, &["reason=\"export_failed\""]) >= 5.0).then_some(())
    })
    .await;
}

#[tokio::test]
async fn every_ending_has_one_access_record_one_count_and_one_span_that_agree() {
    let mut stack = Stack::start_with(StackOptions { default_upstream: true, ..Default::default() }).await;
    let receiver = Receiver::start(stack.evidence.path("spans.json")).await;
    let guard = json!({"secrets_detection": {"mode": "block"}});
    let (status, body) = stack.admin_call(Method::PUT, "/v1/tenant/me/guardrails", Some(guard)).await;
    assert!(status.is_success(), "{body}");
    stack.mock_target("answers", "", json!({})).await;
    stack.mock_target("fails-1", "status:503", json!({})).await;
    stack.mock_target("fails-2", "status:500", json!({})).await;
    stack.mock_target("streams", "chunks:3", json!({})).await;
    stack.mock_target("hangs", "hang", json!({"timeout_s": 30})).await;
    stack.put_route("deadline", json!({"targets": ["hangs"], "failover": {"deadline_s": 1}})).await;
    stack.mock_target("breaks", "chunks:5;break:2", json!({})).await;
    stack.mock_target("slow", "chunks:50;chunkdelay:100", json!({})).await;
    stack.put_route("answered", json!({"targets": ["answers"]})).await;
    stack
        .put_route(
            "refused",
            json!({"targets": ["answers"], "rules": [{"when": {"data_class": ["secret"]}, "deny": "not here"}]}),
        )
        .await;
    stack.put_route("failed", json!({"targets": ["fails-1", "fails-2"]})).await;
    stack.put_route("stream-done", json!({"targets": ["streams"]})).await;
    stack.put_route("stream-broken", json!({"targets": ["breaks"]})).await;
    stack.put_route("client-gone", json!({"targets": ["slow"]})).await;
    let (key, _) = stack.key(None).await;
    let (limited, _) = stack.key_with(json!({"name": "one-a-minute", "limits": {"rpm": 1}})).await;
    stack.restart_proxy(&traced_env(&receiver.endpoint())).await;

    let proxy = format!("http://{}/v1/chat/completions", stack.proxy);
    let send = |id: &str, key: &str, body: reqwest::Body, headers: &[(&str, &str)]| {
        let mut request = stack
            .client
            .post(&proxy)
            .bearer_auth(key)
            .header("x-request-id", id)
            .header("content-type", "application/json");
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        request.body(body).send()
    };
    let json_body = |v: Value| reqwest::Body::from(v.to_string());
    let stream = |model: &str| json!({"model": model, "stream": true, "messages": [{"role": "user", "content": "hi"}]});
    // (request id, expected status, expected ending)
    let mut expected: Vec<(String, u16, &str)> = Vec::new();
    let mut expect = |ending: &'static str, status: u16| {
        let id = shield_e2e::unique(&format!("end-{ending}-"));
        expected.push((id.clone(), status, ending));
        id
    };
    let id = expect("unauthorized", 401);
    assert_eq!(send(&id, "sk-shield-not-a-key", json_body(chat_body("answered")), &[]).await.unwrap().status(), 401);
    let id = expect("bad_request", 400);
    assert_eq!(send(&id, &key, reqwest::Body::from("{not json"), &[]).await.unwrap().status(), 400);
    let id = expect("too_large", 413);
    let huge = json!({"model": "answered", "messages": [{"role": "user", "content": "x".repeat(9 << 20)}]});
    assert_eq!(send(&id, &key, json_body(huge), &[]).await.unwrap().status(), 413);
    let id = expect("answered", 200);
    assert_eq!(send(&id, &limited, json_body(chat_body("answered")), &[]).await.unwrap().status(), 200);
    let id = expect("rate_limited", 429);
    assert_eq!(send(&id, &limited, json_body(chat_body("answered")), &[]).await.unwrap().status(), 429);
    let id = expect("guardrail_blocked", 200);
    let leaky =
        json!({"model": "answered", "messages": [{"role": "user", "content": "deploy with AKIAIOSFODNN7EXAMPLE"}]});
    assert_eq!(send(&id, &key, json_body(leaky), &[]).await.unwrap().status(), 200);
    let id = expect("default_path", 200);
    assert_eq!(send(&id, &key, json_body(chat_body("not-a-route")), &[]).await.unwrap().status(), 200);
    let id = expect("rule_refused", 200);
    let refused = send(&id, &key, json_body(chat_body("refused")), &[("x-shield-data-class", "secret")]);
    assert_eq!(refused.await.unwrap().status(), 200);
    let id = expect("all_failed", 502);
    assert_eq!(send(&id, &key, json_body(chat_body("failed")), &[]).await.unwrap().status(), 502);
    let id = expect("deadline", 504);
    assert_eq!(send(&id, &key, json_body(chat_body("deadline")), &[]).await.unwrap().status(), 504);
    let id = expect("stream_completed", 200);
    let text = send(&id, &key, json_body(stream("stream-done")), &[]).await.unwrap().text().await.unwrap();
    assert!(text.contains("[DONE]"));
    let id = expect("stream_broken", 200);
    let text = send(&id, &key, json_body(stream("stream-broken")), &[]).await.unwrap().text().await.unwrap();
    assert!(text.contains("stream_broken"), "{text}");
    let id = expect("client_gone", 200);
    let mut body = send(&id, &key, json_body(stream("client-gone")), &[]).await.unwrap().bytes_stream();
    assert!(body.next().await.is_some_and(|c| c.is_ok()));
    drop(body);

    // One access record each, with its status and ending.
    let records = eventually(20, "an access record for every request", || async {
        let records = access_records(&stack);
        expected.iter().all(|(id, _, _)| records.contains_key(id)).then_some(records)
    })
    .await;
    for (id, status, ending) in &expected {
        let record = &records[id]["fields"];
        assert_eq!(
            (record["status"].as_u64(), record["ending"].as_str()),
            (Some(u64::from(*status)), Some(*ending)),
            "{id}: {record}"
        );
    }
    // One count each in the metric, under the same ending.
    let counts = stack.metric("shield_http_requests_total").await;
    let mut by_ending: BTreeMap<&str, f64> = BTreeMap::new();
    for (_, _, ending) in &expected {
        *by_ending.entry(ending).or_default() += 1.0;
    }
    for (ending, n) in &by_ending {
        assert_eq!(labelled(&counts, &[&format!("ending=\"{ending}\"")]), *n, "{ending}: {counts:?}");
    }
    assert_eq!(counts.iter().map(|(_, v)| v).sum::<f64>(), expected.len() as f64, "nothing counted twice: {counts:?}");
    // One SERVER span each, ending the same way, with the status.
    // The attempts' spans too: a cancelled stream's attempt ends when its relay is dropped,
    // which can be after the request's own span was exported (seen under parallel tests).
    let attempts = |ending: &str| match ending {
        "all_failed" => 2,
        "answered" | "client_gone" => 1,
        _ => 0,
    };
    let spans = receiver
        .until("a span for every request and every attempt", |spans| {
            let all = expected.iter().all(|(id, _, ending)| match server_span(spans, id) {
                None => false,
                Some(span) => children(spans, span).len() >= attempts(ending),
            });
            all.then(|| spans.to_vec())
        })
        .await;
    for (id, status, ending) in &expected {
        let matching: Vec<&Value> =
            spans.iter().filter(|s| s["kind"] == SERVER && attr(s, "shield.request_id") == id.as_str()).collect();
        assert_eq!(matching.len(), 1, "{id}: one span");
        let span = matching[0];
        assert_eq!(attr(span, "shield.ending"), *ending, "{id}: {span}");
        assert_eq!(attr(span, "http.response.status_code"), *status, "{id}");
        assert_eq!(span["status"], if *status >= 500 { 2 } else { 0 }, "{id}: 5xx is an error, 4xx is not");
    }
    // The routed ones have their attempts beneath them; the refused before routing have none.
    let attempts_of = |ending: &str| {
        let (id, _, _) = expected.iter().find(|(_, _, e)| *e == ending).unwrap();
        children(&spans, server_span(&spans, id).unwrap()).len()
    };
    assert_eq!(attempts_of("all_failed"), 2);
    assert_eq!(attempts_of("answered"), 1);
    for ending in ["unauthorized", "bad_request", "too_large", "rate_limited", "guardrail_blocked", "rule_refused"] {
        assert_eq!(attempts_of(ending), 0, "{ending}");
    }
    let gone = &expected.iter().find(|(_, _, e)| *e == "client_gone").unwrap().0;
    let gone = children(&spans, server_span(&spans, gone).unwrap());
    assert_eq!(attr(gone[0], "error.type"), "cancelled");
}

#[tokio::test]
async fn a_collector_that_never_answers_slows_no_request_and_its_spans_are_counted_as_dropped() {
    let mut stack = Stack::start().await;
    // A collector that accepts connections and never answers.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let hold = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            held.push(socket);
        }
    });
    stack.mock_target("answers", "", json!({})).await;
    stack.put_route("answered", json!({"targets": ["answers"]})).await;
    let (key, _) = stack.key(None).await;
    let mut env = traced_env(&format!("http://127.0.0.1:{port}"));
    env.extend([
        ("OTEL_BSP_MAX_QUEUE_SIZE", "4".to_string()),
        ("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "2".to_string()),
        ("OTEL_EXPORTER_OTLP_TIMEOUT", "10000".to_string()),
    ]);
    stack.restart_proxy(&env).await;
    let started = std::time::Instant::now();
    for _ in 0..30 {
        let (status, _, body) = stack.chat(&key, chat_body("answered"), &[]).await;
        assert_eq!(status, StatusCode::OK, "{body}");
    }
    let took = started.elapsed();
    assert!(took < std::time::Duration::from_secs(5), "30 calls took {took:?} with a collector that hangs");
    let dropped = stack.metric("shield_trace_spans_dropped_total").await;
    assert!(labelled(&dropped, &["reason=\"queue_full\""]) >= 20.0, "the full queue dropped spans: {dropped:?}");
    hold.abort();
}
