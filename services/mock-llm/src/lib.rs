//! shield-mock-llm: an OpenAI-compatible fake upstream for tests, the demo and the benchmark.
//!
//! The behaviour is chosen by the URL, so a target's `base_url` alone selects it:
//!
//! * `POST /v1/chat/completions` — a completion echoing the last user message.
//! * `POST /mock/{scenario}/v1/chat/completions` — `scenario` is `;`-separated directives:
//!   `id:TAG` (names the scenario: sequences count per scenario, the log can be filtered by it),
//!   `status:503` (answer that status in OpenAI error shape), `seq:503-503-200` (the n-th call
//!   gets the n-th status, then the last one forever), `cycle:503-200-200` (the same, repeated
//!   forever: exactly a third of the calls fail), `delay:MS`, `hang` (never answer),
//!   `reset` (send the status line, then drop the connection mid-body), `retry-after:S`,
//!   `err:CODE` (the error body's `code`, e.g. `insufficient_quota`), `usage:P-C` (reported
//!   prompt/completion tokens), `body:garbage` (a 200 that is not JSON), `body:array` (a JSON
//!   array laid out like a completion), `body:badutf8` (a completion with a non-UTF-8 byte in
//!   its `id`), `body:native` (a completion with an extra `x_anthropic_content` holding an
//!   e-mail address), `body:nochoices`
//!   (a 200 JSON without `choices`), `body:error` (a 200 whose JSON is an OpenAI error, as some
//!   providers answer), `drip:MS` (a non-streamed answer sent one byte at a time, MS apart),
//!   `redirect:TAG` (a 302 to `/mock/id:TAG/v1/chat/completions`
//!   on this mock; a gateway must not follow it: the log of TAG stays empty).
//!   Streaming (`"stream": true` in the request): `chunks:N` content chunks (default 3),
//!   `ttfb:MS` before the first event, `chunkdelay:MS` between events, `errfirst` (the first
//!   event is an error), `break:N` (drop the connection after N chunks), `stall:N` (go silent
//!   after N chunks), `malformed:N` (the N-th event is not JSON), `nodone` (end without
//!   `[DONE]`), `empty` (a 200 stream that ends cleanly with no event). `nolog`: the request is
//!   not kept in `/_mock/requests` (the agent benchmark's large bodies). `say:secret` or
//!   `say:card` answers (or streams) a canned sensitive text; `tool:NAME` answers a tool
//!   call. `agent` answers as a coding agent's model: a `Read` call for a path the last user
//!   turn names (`exec_command` with `cat PATH` when the tools offer it, as Codex's do),
//!   then `the file says: …` once the tool result comes back (both shapes). A request for
//!   structured output (a JSON schema in `response_format` or `output_config.format`) is
//!   answered with a value of the schema. `downfor:S` fails (503, or the `status:`) for S
//!   seconds from the scenario's first call, then answers. A usage chunk is
//!   sent when the request asks `stream_options.include_usage`.
//! * `POST /v1/messages`, `POST /mock/{scenario}/v1/messages` — the same in Anthropic's
//!   Messages shape (answers, errors and stream events; see `anthropic.rs` for `cache:R-W`).
//! * `POST /v1beta/models/{model}:generateContent` and `:streamGenerateContent?alt=sse` (also
//!   under `/mock/{scenario}/`) — the same in the Gemini API's shape (`gemini.rs`).
//! * `GET /v1/models`, `GET /mock/{scenario}/v1/models`.
//! * `GET /_mock/requests[?id=TAG]` — the requests received (method, path, headers, body),
//!   oldest first; `DELETE /_mock/requests` clears the log. The log keeps the last 10,000.
//! * `GET /_mock/calls?id=TAG` — `{"calls": N}`: every chat call a scenario received, counted
//!   without the log's cap (load tests reconcile 100,000 calls against it).
//! * `GET /_mock/streams?id=TAG` — `{started, completed, dropped}`: streams the client dropped
//!   before the end are counted, so tests can prove nothing keeps generating for nobody.
//! * `GET /_mock/connections` — `{"accepted": N}`: TCP connections accepted since start, so
//!   tests can prove a gateway reuses its upstream connections.

mod anthropic;
mod bedrock;
mod gemini;
mod google;
mod sigv4;

use parking_lot::Mutex;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::time::Duration;

use actix_web::http::StatusCode;
use actix_web::web::{self, Bytes};
use actix_web::{App, HttpRequest, HttpResponse, HttpServer};
use serde::Serialize;
use serde_json::{Value, json};

const LOG_CAPACITY: usize = 10_000;

#[derive(Debug, Clone, Serialize)]
pub struct Received {
    pub method: String,
    pub path: String,
    pub headers: BTreeMap<String, String>,
    pub body: String,
}

#[derive(Default)]
pub(crate) struct MockState {
    log: Mutex<VecDeque<Received>>,
    calls: Mutex<HashMap<String, usize>>,
    streams: Mutex<HashMap<String, StreamCounts>>,
    /// Calls per scenario id, uncapped.
    calls_by_id: Mutex<HashMap<String, u64>>,
    /// When each scenario was first called (`downfor:`).
    first_call: Mutex<HashMap<String, std::time::Instant>>,
    /// The credentials tests trusted (`POST /_mock/trust`) and the tokens this mock issued.
    trust: Mutex<Trust>,
}

/// What the cloud wires accept: AWS key pairs (SigV4), Bedrock API keys, service accounts'
/// public keys (JWT assertions), and the access tokens issued for them (until they expire).
#[derive(Default)]
pub(crate) struct Trust {
    aws: HashMap<String, sigv4::KeyPair>,
    bedrock_api_keys: std::collections::HashSet<String>,
    google_keys: Vec<String>,
    tokens: HashMap<String, std::time::Instant>,
}

#[derive(Debug, Clone, Copy, Default, Serialize)]
struct StreamCounts {
    started: u64,
    completed: u64,
    dropped: u64,
}

/// One scenario, parsed from the path segment.
#[derive(Debug, Default, Clone, PartialEq)]
pub(crate) struct Scenario {
    id: Option<String>,
    statuses: Vec<u16>,
    /// `cycle:`: the statuses repeat instead of the last one sticking.
    cycle: bool,
    delay: Option<Duration>,
    hang: bool,
    reset: bool,
    retry_after: Option<String>,
    /// `redirect:TAG`: a 302 to this mock's `/mock/id:TAG/v1/chat/completions`.
    redirect: Option<String>,
    error_code: Option<String>,
    usage: Option<(u64, u64)>,
    body: Option<String>,
    /// `drip:MS`: the non-streamed body goes out one byte per MS.
    drip: Option<Duration>,
    chunks: Option<usize>,
    ttfb: Option<Duration>,
    chunk_delay: Option<Duration>,
    error_first: bool,
    break_after: Option<usize>,
    stall_after: Option<usize>,
    /// `breakonce:N` / `stallonce:N`: only the scenario's first call breaks or stalls.
    once: bool,
    /// `noprefill`: a request ending with an assistant message is refused (400).
    no_prefill: bool,
    /// `alt`: the stream's parts read `alt{n}` instead of `part{n}` (a different answer).
    alt: bool,
    /// `think`: Anthropic streams begin with a thinking block.
    think: bool,
    malformed_at: Option<usize>,
    no_done: bool,
    /// `nolog`: the request is not kept in the log (the benchmark's 600 KB bodies).
    no_log: bool,
    empty: bool,
    say: Option<String>,
    tool: Option<String>,
    /// `agent`: answers as a coding agent's model would ([`agent_turn`]).
    agent: bool,
    /// The arguments (JSON text) of the `tool:` call; `{"q":"mock"}` when not set.
    tool_input: Option<String>,
    /// The answer's exact text, set per request by `agent`.
    reply: Option<String>,
    /// `cache:R-W`: cache-read and cache-write input tokens (Anthropic answers).
    cache: Option<(u64, u64)>,
    /// `ttl:S`: the token endpoint's tokens expire after S seconds.
    token_ttl: Option<u64>,
    /// `errat:N`: a stream sends an error event after N content events, and ends.
    error_at: Option<usize>,
    /// `downfor:S`: 503 (or `status:`) for S seconds from this scenario's first call, then 200
    /// (a provider that goes down and comes back).
    down_for: Option<Duration>,
}

impl Scenario {
    fn parse(spec: &str) -> Scenario {
        let mut s = Scenario::default();
        for directive in spec.split(';').filter(|d| !d.is_empty()) {
            let (name, value) = directive.split_once(':').unwrap_or((directive, ""));
            match name {
                "id" => s.id = Some(value.to_string()),
                "status" => s.statuses = value.parse().map(|v| vec![v]).unwrap_or_default(),
                "seq" => s.statuses = value.split('-').filter_map(|v| v.parse().ok()).collect(),
                "cycle" => {
                    s.statuses = value.split('-').filter_map(|v| v.parse().ok()).collect();
                    s.cycle = true;
                }
                "delay" => s.delay = value.parse().ok().map(Duration::from_millis),
                "hang" => s.hang = true,
                "reset" => s.reset = true,
                "retry-after" => s.retry_after = Some(value.to_string()),
                "err" => s.error_code = Some(value.to_string()),
                "usage" => s.usage = value.split_once('-').and_then(|(p, c)| Some((p.parse().ok()?, c.parse().ok()?))),
                "body" => s.body = Some(value.to_string()),
                "drip" => s.drip = value.parse().ok().map(Duration::from_millis),
                "redirect" => s.redirect = Some(value.to_string()),
                "chunks" => s.chunks = value.parse().ok(),
                "ttfb" => s.ttfb = value.parse().ok().map(Duration::from_millis),
                "chunkdelay" => s.chunk_delay = value.parse().ok().map(Duration::from_millis),
                "errfirst" => s.error_first = true,
                "break" => s.break_after = value.parse().ok(),
                "stall" => s.stall_after = value.parse().ok(),
                "breakonce" => {
                    s.break_after = value.parse().ok();
                    s.once = true;
                }
                "stallonce" => {
                    s.stall_after = value.parse().ok();
                    s.once = true;
                }
                "noprefill" => s.no_prefill = true,
                "alt" => s.alt = true,
                "think" => s.think = true,
                "malformed" => s.malformed_at = value.parse().ok(),
                "nodone" => s.no_done = true,
                "nolog" => s.no_log = true,
                "empty" => s.empty = true,
                "say" => s.say = Some(value.to_string()),
                "tool" => s.tool = Some(value.to_string()),
                "agent" => s.agent = true,
                "ttl" => s.token_ttl = value.parse().ok(),
                "errat" => s.error_at = value.parse().ok(),
                "downfor" => s.down_for = value.parse().ok().map(Duration::from_secs),
                "cache" => s.cache = value.split_once('-').and_then(|(r, w)| Some((r.parse().ok()?, w.parse().ok()?))),
                _ => {}
            }
        }
        s
    }
}

impl Scenario {
    /// The arguments of the scenario's tool call, as JSON text.
    pub(crate) fn tool_arguments(&self) -> String {
        self.tool_input.clone().unwrap_or_else(|| "{\"q\":\"mock\"}".into())
    }
}

/// `agent`: a coding agent's model, in either API shape. After a tool result it answers
/// `the file says: <the result>`; otherwise, when the last user text names a path (a word
/// starting with `/`), it calls `Read` with `{"file_path": <path>}`; else it answers as usual.
fn agent_turn(scenario: &mut Scenario, request: &Value) {
    let messages = request.get("messages").and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default();
    let text_of = |content: Option<&Value>| match content {
        Some(Value::String(text)) => text.clone(),
        Some(Value::Array(parts)) => {
            parts.iter().filter_map(|p| p.get("text").and_then(Value::as_str)).collect::<Vec<_>>().join("\n")
        }
        _ => String::new(),
    };
    // The turn to answer: the last one that is not a system message or a folded reminder.
    let reminder = |m: &Value| {
        m.get("role").and_then(Value::as_str) == Some("system")
            || (m.get("role").and_then(Value::as_str) == Some("user")
                && without_reminders(&text_of(m.get("content"))).trim().is_empty()
                && !m.get("content").and_then(Value::as_array).is_some_and(|blocks| {
                    blocks.iter().any(|b| b.get("type").and_then(Value::as_str) == Some("tool_result"))
                }))
    };
    let Some(last) = messages.iter().rev().find(|m| !reminder(m)) else { return };
    // OpenAI's shape: a `tool` message; Anthropic's: a user turn holding a `tool_result`.
    let result = match last.get("role").and_then(Value::as_str) {
        Some("tool") => Some(text_of(last.get("content"))),
        _ => last.get("content").and_then(Value::as_array).and_then(|blocks| {
            blocks
                .iter()
                .find(|b| b.get("type").and_then(Value::as_str) == Some("tool_result"))
                .map(|b| text_of(b.get("content")))
        }),
    };
    if let Some(result) = result {
        scenario.reply = Some(format!("the file says: {result}"));
        return;
    }
    let said = without_reminders(&text_of(last.get("content")));
    let path = said.split_whitespace().rev().find(|w| w.starts_with('/'));
    // Codex offers a shell (`exec_command`) where Claude Code offers `Read`.
    let offers = |name: &str| {
        request.get("tools").and_then(Value::as_array).into_iter().flatten().any(|tool| {
            tool.get("name").or_else(|| tool.get("function").and_then(|f| f.get("name"))).and_then(Value::as_str)
                == Some(name)
        })
    };
    match path.map(|p| p.trim_end_matches(['.', ',', '?', '!', ':', ';', '"', '\''])) {
        Some(path) if offers("exec_command") => {
            scenario.tool = Some("exec_command".into());
            scenario.tool_input = Some(json!({"cmd": format!("cat {path}")}).to_string());
        }
        Some(path) => {
            scenario.tool = Some("Read".into());
            scenario.tool_input = Some(json!({"file_path": path}).to_string());
        }
        None => scenario.reply = Some(format!("mock answer to: {}", said.trim())),
    }
}

/// Structured output: a request that asks for a JSON schema (OpenAI's
/// `response_format.json_schema.schema`, Anthropic's `output_config.format.schema`) is
/// answered with a JSON value of that schema; JSON mode with `{"mock": true}`.
fn structured_turn(scenario: &mut Scenario, request: &Value) {
    let schema = request
        .pointer("/response_format/json_schema/schema")
        .or_else(|| request.pointer("/output_config/format/schema"))
        .or_else(|| request.pointer("/generationConfig/responseJsonSchema"));
    match schema {
        Some(schema) => scenario.reply = Some(sample_of(schema).to_string()),
        None if request.pointer("/response_format/type").and_then(Value::as_str) == Some("json_object") => {
            scenario.reply = Some(json!({"mock": true}).to_string())
        }
        None => {}
    }
}

/// A value of a JSON schema: the first of an `enum`, `"mock"` for a string, 1 for a number,
/// every property of an object, one item of an array.
fn sample_of(schema: &Value) -> Value {
    if let Some(first) = schema.get("enum").and_then(Value::as_array).and_then(|e| e.first()) {
        return first.clone();
    }
    match schema.get("type").and_then(Value::as_str) {
        Some("string") => json!("mock"),
        Some("integer" | "number") => json!(1),
        Some("boolean") => json!(true),
        Some("array") => json!([sample_of(schema.get("items").unwrap_or(&Value::Null))]),
        Some("null") => Value::Null,
        _ => {
            let properties = schema.get("properties").and_then(Value::as_object);
            Value::Object(properties.into_iter().flatten().map(|(k, v)| (k.clone(), sample_of(v))).collect())
        }
    }
}

/// `text` without its `<system-reminder>…</system-reminder>` sections.
fn without_reminders(text: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(start) = rest.find("<system-reminder>") {
        out.push_str(&rest[..start]);
        rest = match rest[start..].find("</system-reminder>") {
            Some(end) => &rest[start + end + "</system-reminder>".len()..],
            None => "",
        };
    }
    out.push_str(rest);
    out
}

/// Canned sensitive answers (`say:secret`, `say:card`), so tests can exercise output
/// guardrails with inputs that are clean.
pub(crate) fn canned(say: Option<&str>) -> Option<&'static str> {
    match say? {
        "secret" => Some("here is the key: sk-proj-abcdefghijklmnopqrstuvwxyz0123456789 keep it safe"),
        "card" => Some("the card on file is 4111 1111 1111 1111"),
        _ => None,
    }
}

fn completion(body: &Value, usage: Option<(u64, u64)>, scenario: &Scenario) -> Value {
    let model = body.get("model").and_then(Value::as_str).unwrap_or("mock");
    let last = body
        .get("messages")
        .and_then(Value::as_array)
        .and_then(|m| m.iter().rev().find(|m| m.get("role").and_then(Value::as_str) == Some("user")))
        .and_then(|m| m.get("content"))
        .and_then(Value::as_str)
        .unwrap_or("");
    let content = scenario
        .reply
        .clone()
        .or_else(|| canned(scenario.say.as_deref()).map(str::to_string))
        .unwrap_or_else(|| format!("mock answer to: {last}"));
    let prompt_chars = body.get("messages").map(|m| m.to_string().len()).unwrap_or(0) as u64;
    let (input, output) = usage.unwrap_or((prompt_chars.div_ceil(4), (content.len() as u64).div_ceil(4)));
    json!({
        "id": "chatcmpl-mock", "object": "chat.completion", "created": 0, "model": model,
        "choices": [match &scenario.tool {
            Some(tool) => json!({"index": 0, "message": {"role": "assistant", "content": null,
                "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": tool, "arguments": scenario.tool_arguments()}}]}, "finish_reason": "tool_calls"}),
            None => json!({"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}),
        }],
        "usage": {"prompt_tokens": input, "completion_tokens": output, "total_tokens": input + output},
    })
}

fn record(state: &MockState, req: &HttpRequest, body: &Bytes) {
    let headers = req
        .headers()
        .iter()
        .map(|(k, v)| (k.as_str().to_string(), String::from_utf8_lossy(v.as_bytes()).to_string()))
        .collect();
    let path = match req.query_string() {
        "" => req.path().to_string(),
        q => format!("{}?{q}", req.path()),
    };
    let entry =
        Received { method: req.method().to_string(), path, headers, body: String::from_utf8_lossy(body).to_string() };
    let mut log = state.log.lock();
    if log.len() == LOG_CAPACITY {
        log.pop_front();
    }
    log.push_back(entry);
}

/// `/mock/{scenario}/rest` → (scenario, rest); plain paths have the empty scenario.
fn split_path(path: &str) -> (Scenario, String, &str) {
    match path.strip_prefix("/mock/").and_then(|rest| rest.split_once('/')) {
        Some((spec, rest)) => (Scenario::parse(spec), spec.to_string(), &path[path.len() - rest.len() - 1..]),
        None => (Scenario::default(), String::new(), path),
    }
}

async fn handle(req: HttpRequest, body: Bytes, state: web::Data<MockState>) -> HttpResponse {
    if req.path() == "/_mock/requests" {
        return requests(&req, &state);
    }
    let query_id = || {
        web::Query::<HashMap<String, String>>::from_query(req.query_string())
            .ok()
            .and_then(|q| q.get("id").cloned())
            .unwrap_or_default()
    };
    if req.path() == "/_mock/calls" {
        let calls = state.calls_by_id.lock().get(&query_id()).copied().unwrap_or(0);
        return HttpResponse::Ok().json(json!({ "calls": calls }));
    }
    if req.path() == "/_mock/streams" {
        let id = query_id();
        let counts = state.streams.lock().get(&id).copied().unwrap_or_default();
        return HttpResponse::Ok().json(counts);
    }
    if req.path() == "/_mock/connections" {
        return HttpResponse::Ok().json(json!({"accepted": CONNECTIONS.load(std::sync::atomic::Ordering::Relaxed)}));
    }
    if req.path() == "/_mock/trust" && req.method() == "POST" {
        return trust(&body, &state);
    }
    if req.path() == "/healthz" {
        return HttpResponse::Ok().json(json!({"status": "ok"}));
    }
    if req.path() == "/" {
        return HttpResponse::Ok().json(json!({
            "service": "shield mock LLM",
            "endpoints": ["/v1/chat/completions", "/v1/messages", "/v1beta/models/{model}:generateContent",
                "/mock/{directives}/v1/chat/completions", "/mock/{directives}/v1/messages",
                "/mock/{directives}/v1beta/models/{model}:streamGenerateContent?alt=sse"],
            "inspect": ["/_mock/requests?id=TAG", "/_mock/calls?id=TAG", "/_mock/streams?id=TAG"],
        }));
    }
    let (mut scenario, spec, rest) = split_path(req.path());
    if !scenario.no_log {
        record(&state, &req, &body);
    }
    let first_call = *state.first_call.lock().entry(spec.clone()).or_insert_with(std::time::Instant::now);
    let call = {
        let mut calls = state.calls.lock();
        let n = calls.entry(spec).or_insert(0);
        *n += 1;
        *n - 1
    };
    if scenario.once && call > 0 {
        scenario.break_after = None;
        scenario.stall_after = None;
    }
    let vertex = google::vertex_call(rest);
    let gemini = rest
        .starts_with("/v1beta/models/")
        .then(|| rest.rsplit_once(':').map(|(_, method)| method))
        .flatten()
        .or(vertex.filter(|(publisher, _)| *publisher == "google").map(|(_, method)| method))
        .filter(|method| *method == "generateContent" || *method == "streamGenerateContent");
    let claude_on_vertex = vertex
        .filter(|(publisher, _)| *publisher == "anthropic")
        .map(|(_, method)| method)
        .filter(|method| *method == "rawPredict" || *method == "streamRawPredict");
    let converse = rest
        .starts_with("/model/")
        .then(|| rest.rsplit_once('/').map(|(_, method)| method))
        .flatten()
        .filter(|method| *method == "converse" || *method == "converse-stream");
    let token = rest == "/token";
    let chat = rest == "/v1/chat/completions" || rest == "/v1/messages";
    if let (Some(id), true) =
        (&scenario.id, chat || gemini.is_some() || claude_on_vertex.is_some() || converse.is_some() || token)
    {
        *state.calls_by_id.lock().entry(id.clone()).or_insert(0) += 1;
    }
    if let Some(delay) = scenario.delay {
        tokio::time::sleep(delay).await;
    }
    if scenario.hang {
        tokio::time::sleep(Duration::from_secs(3600)).await;
    }
    let status = match (scenario.down_for, scenario.cycle, scenario.statuses.len()) {
        (Some(down), ..) if first_call.elapsed() < down => scenario.statuses.first().copied().unwrap_or(503),
        (Some(_), ..) => 200,
        (None, true, len) if len > 0 => scenario.statuses[call % len],
        _ => scenario.statuses.get(call).or(scenario.statuses.last()).copied().unwrap_or(200),
    };
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    if scenario.reset {
        let broken = futures_util::stream::once(async {
            Err::<Bytes, _>(std::io::Error::from(std::io::ErrorKind::ConnectionReset))
        });
        return HttpResponse::build(status).content_type("application/json").streaming(broken);
    }
    if let Some(location) = &scenario.redirect {
        let location = format!("/mock/id:{location}/v1/chat/completions");
        return HttpResponse::Found().insert_header(("location", location)).finish();
    }
    if scenario.agent && status.is_success() {
        agent_turn(&mut scenario, &serde_json::from_slice(&body).unwrap_or(Value::Null));
    }
    if status.is_success() && scenario.reply.is_none() {
        structured_turn(&mut scenario, &serde_json::from_slice(&body).unwrap_or(Value::Null));
    }
    let mut response = HttpResponse::build(status);
    // Gemini names its delay in the body (`RetryInfo`), never in a header.
    if let Some(retry_after) = scenario.retry_after.as_ref().filter(|_| gemini.is_none()) {
        response.insert_header(("retry-after", retry_after.as_str()));
    }
    // The clouds' credentials are checked before any directive answers: a test passes only
    // when every attempt, failures and retries included, carries a valid one.
    if let Some(refused) = vertex.and_then(|_| google::refuse_bearer(&req, &state)) {
        return refused;
    }
    if let Some(refused) = converse.and_then(|_| refuse_bedrock(&req, &body, &state)) {
        return refused;
    }
    match (req.method().as_str(), rest) {
        ("POST", _) if token => google::token(&req, status, &scenario, &body, &state),
        ("POST", _) if converse.is_some() => {
            bedrock::answer(response, status, scenario, &body, state, converse == Some("converse-stream"))
        }
        ("POST", _) if claude_on_vertex.is_some() => {
            let sent: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
            if sent.get("anthropic_version").and_then(Value::as_str) != Some("vertex-2023-10-16")
                || sent.get("model").is_some()
            {
                let error = anthropic::error_body(StatusCode::BAD_REQUEST, Some("vertex_takes_anthropic_version_in_the_body_and_no_model"));
                return HttpResponse::BadRequest().json(error);
            }
            let streams = sent.get("stream").and_then(Value::as_bool) == Some(true);
            if streams != (claude_on_vertex == Some("streamRawPredict")) {
                let error = anthropic::error_body(StatusCode::BAD_REQUEST, Some("stream_must_match_the_method"));
                return HttpResponse::BadRequest().json(error);
            }
            anthropic::answer(response, status, scenario, &body, state)
        }
        ("POST", "/v1/messages") => anthropic::answer(response, status, scenario, &body, state),
        ("POST", _) if gemini.is_some() => {
            gemini::answer(response, status, scenario, &body, state, gemini == Some("streamGenerateContent"))
        }
        ("GET", "/v1/models") => response
            .json(json!({"object": "list", "data": [{"id": "mock-1", "object": "model", "owned_by": "shield-mock"}]})),
        ("POST", "/v1/chat/completions") if !status.is_success() => {
            let code = scenario.error_code.clone().map(Value::String).unwrap_or(Value::Null);
            response.json(json!({"error": {"message": format!("mock failure {}", status.as_u16()), "type": "mock_error", "code": code, "param": null}}))
        }
        ("POST", "/v1/chat/completions")
            if serde_json::from_slice::<Value>(&body).ok().and_then(|b| b.get("stream")?.as_bool()) == Some(true) =>
        {
            let request: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
            let prefill = prefill(&request);
            if scenario.no_prefill && prefill.is_some() {
                let error = json!({"error": {"message": "assistant prefill is not supported", "type": "invalid_request_error", "code": null, "param": "messages"}});
                return HttpResponse::BadRequest().json(error);
            }
            let wire = OpenAiWire {
                model: request.get("model").and_then(Value::as_str).unwrap_or("mock").to_string(),
                include_usage: request.pointer("/stream_options/include_usage").and_then(Value::as_bool).unwrap_or(false),
            };
            let skip = prefill.map(|text| pieces_in(&scenario, &text)).unwrap_or(0);
            response.content_type("text/event-stream").streaming(stream(state.into_inner(), scenario, wire, skip))
        }
        ("POST", "/v1/chat/completions") => match scenario.body.as_deref() {
            Some("garbage") => response.content_type("application/json").body("this is not json"),
            Some("nochoices") => response.json(json!({"id": "x", "object": "chat.completion"})),
            // A JSON array laid out like a completion's fields, in their order.
            Some("array") => response
                .content_type("application/json")
                .body(r#"["mock",[{"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}]]"#),
            // A completion whose `id` holds a byte that is not UTF-8.
            Some("badutf8") => response.content_type("application/json").body(
                b"{\"id\":\"c\xff1\",\"object\":\"chat.completion\",\"model\":\"mock\",\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\",\"content\":\"hi\"},\"finish_reason\":\"stop\"}]}"
                    .to_vec(),
            ),
            // A completion carrying a field named like one the gateway once used internally,
            // holding an e-mail address its own content does not.
            Some("native") => {
                let request: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
                let mut answer = completion(&request, scenario.usage, &scenario);
                answer["x_anthropic_content"] = json!([{"type": "text", "text": "write to leak@example.com"}]);
                response.json(answer)
            }
            Some("error") => response.json(
                json!({"error": {"message": "mock: the model is overloaded", "type": "server_error", "code": null, "param": null}}),
            ),
            _ => {
                let request: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
                let answer = completion(&request, scenario.usage, &scenario);
                match scenario.drip {
                    Some(every) => response.content_type("application/json").streaming(drip(answer.to_string(), every)),
                    None => response.json(answer),
                }
            }
        },
        _ => HttpResponse::NotFound()
            .json(json!({"error": {"message": format!("mock has no {} {rest}", req.method()), "type": "not_found"}})),
    }
}

/// `text` one byte at a time, `every` apart: an upstream that is slow inside the body.
fn drip(text: String, every: Duration) -> impl futures_util::Stream<Item = Result<Bytes, std::io::Error>> {
    let bytes = Bytes::from(text);
    futures_util::stream::unfold(0usize, move |at| {
        let bytes = bytes.clone();
        async move {
            if at == bytes.len() {
                return None;
            }
            if at > 0 {
                tokio::time::sleep(every).await;
            }
            Some((Ok(bytes.slice(at..at + 1)), at + 1))
        }
    })
}

/// One step of a streamed answer, before a wire format renders it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Piece {
    /// Content; `first` opens the answer.
    Text {
        first: bool,
        text: String,
    },
    /// A tool call opens the answer (`tool:NAME`), its arguments follow as fragments.
    ToolCall {
        name: String,
    },
    ToolArgs(String),
    /// The end of the content (`finish_reason` / `stop_reason`); `tool`: it ended in a call.
    Finish {
        tool: bool,
    },
    /// The usage report (`prompt`, `completion` tokens).
    Usage(u64, u64),
    /// The provider's end marker.
    Done,
    /// An error event instead of the first content.
    Error,
    /// An event that is not JSON.
    Malformed,
}

/// A provider's stream format: renders a [`Piece`] as SSE bytes (`None`: it sends nothing
/// for that piece).
pub(crate) trait Wire: Send + 'static {
    fn render(&self, piece: &Piece) -> Option<Bytes>;
}

/// OpenAI's Chat Completions stream.
struct OpenAiWire {
    model: String,
    include_usage: bool,
}

impl Wire for OpenAiWire {
    fn render(&self, piece: &Piece) -> Option<Bytes> {
        let chunk = |delta: Value, finish: Value| {
            json!({"id": "chatcmpl-mock", "object": "chat.completion.chunk", "created": 0, "model": self.model,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
        };
        let event = |value: &Value| Some(Bytes::from(format!("data: {value}\n\n")));
        match piece {
            Piece::Text { first: true, text } => {
                event(&chunk(json!({"role": "assistant", "content": text}), Value::Null))
            }
            Piece::Text { text, .. } => event(&chunk(json!({"content": text}), Value::Null)),
            Piece::ToolCall { name } => event(&chunk(
                json!({"role": "assistant", "content": null, "tool_calls": [{"index": 0,
                "id": "call_mock1", "type": "function", "function": {"name": name, "arguments": ""}}]}),
                Value::Null,
            )),
            Piece::ToolArgs(args) => {
                event(&chunk(json!({"tool_calls": [{"index": 0, "function": {"arguments": args}}]}), Value::Null))
            }
            Piece::Finish { tool } => event(&chunk(json!({}), json!(if *tool { "tool_calls" } else { "stop" }))),
            Piece::Usage(p, c) if self.include_usage => event(&json!({"id": "chatcmpl-mock",
                "object": "chat.completion.chunk", "created": 0, "model": self.model, "choices": [],
                "usage": {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}})),
            Piece::Usage(..) => None,
            Piece::Done => Some(Bytes::from_static(b"data: [DONE]\n\n")),
            Piece::Error => {
                event(&json!({"error": {"message": "mock overloaded", "type": "server_error", "code": null}}))
            }
            Piece::Malformed => Some(Bytes::from_static(b"data: {this is not json\n\n")),
        }
    }
}

/// A streamed answer as SSE events in `wire`'s format, shaped by the scenario's streaming
/// directives.
/// The text of content piece `n` of a streamed answer.
fn piece_text(scenario: &Scenario, n: usize) -> String {
    if let Some(reply) = &scenario.reply {
        return if n == 0 { reply.clone() } else { String::new() };
    }
    match (n, canned(scenario.say.as_deref())) {
        (0, _) => "mock ".into(),
        (1, Some(text)) => text.into(),
        _ if scenario.alt => format!("alt{n} "),
        _ => format!("part{n} "),
    }
}

/// The trailing assistant message's text (an assistant prefill), if the request ends so.
pub(crate) fn prefill(request: &Value) -> Option<String> {
    let last = request.get("messages")?.as_array()?.last()?;
    if last.get("role")?.as_str()? != "assistant" {
        return None;
    }
    match last.get("content")? {
        Value::String(text) => Some(text.clone()),
        Value::Array(blocks) => Some(blocks.iter().filter_map(|b| b.get("text")?.as_str()).collect()),
        _ => None,
    }
}

/// How many content pieces `prefix` already holds: a prefilled stream continues after them.
pub(crate) fn pieces_in(scenario: &Scenario, prefix: &str) -> usize {
    let mut text = String::new();
    let mut n = 0;
    while n < 10_000 {
        let next = text.clone() + &piece_text(scenario, n);
        if !prefix.starts_with(next.trim_end()) || next.trim_end().is_empty() {
            break;
        }
        text = next;
        n += 1;
    }
    n
}

pub(crate) fn stream(
    state: std::sync::Arc<MockState>,
    scenario: Scenario,
    wire: impl Wire,
    skip: usize,
) -> impl futures_util::Stream<Item = Result<Bytes, std::io::Error>> {
    let id = scenario.id.clone().unwrap_or_default();
    state.streams.lock().entry(id.clone()).or_default().started += 1;
    let chunks = match (&scenario.tool, &scenario.reply) {
        (Some(_), _) => 3,
        (None, Some(_)) => 1,
        (None, None) => scenario.chunks.unwrap_or(3),
    };
    let guard = StreamGuard { state, id, finished: false };
    let wire = std::sync::Arc::new(wire);
    futures_util::stream::unfold((skip, guard), move |(mut n, mut guard)| {
        let scenario = scenario.clone();
        let wire = wire.clone();
        async move {
            // The body ends right after its last event, as a provider's does (a delay before
            // the chunked terminator would keep a gateway from reusing the connection).
            if n == usize::MAX {
                return None;
            }
            let delay = if n == skip { scenario.ttfb } else { scenario.chunk_delay };
            if let Some(delay) = delay {
                tokio::time::sleep(delay).await;
            }
            loop {
                let piece = if (n == skip && scenario.error_first) || (n > skip && scenario.error_at == Some(n)) {
                    guard.finished = true;
                    return Some((Ok(wire.render(&Piece::Error).unwrap_or_default()), (usize::MAX, guard)));
                } else if scenario.empty {
                    guard.complete();
                    return None;
                } else if scenario.break_after == Some(n) {
                    // Let what was sent reach the client first: actix flushes when the body pends.
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    guard.finished = true;
                    let reset = std::io::Error::from(std::io::ErrorKind::ConnectionReset);
                    return Some((Err(reset), (usize::MAX, guard)));
                } else if n < chunks {
                    if scenario.stall_after == Some(n) {
                        tokio::time::sleep(Duration::from_secs(3600)).await;
                    }
                    if scenario.malformed_at == Some(n + 1) {
                        Piece::Malformed
                    } else if let Some(name) = &scenario.tool {
                        // A tool call in three pieces, whatever `chunks` says.
                        let arguments = scenario.tool_arguments();
                        let half =
                            (0..=arguments.len() / 2).rev().find(|&i| arguments.is_char_boundary(i)).unwrap_or(0);
                        let (head, tail) = arguments.split_at(half);
                        match n {
                            0 => Piece::ToolCall { name: name.clone() },
                            1 => Piece::ToolArgs(head.into()),
                            2 => Piece::ToolArgs(tail.into()),
                            _ => Piece::Finish { tool: true },
                        }
                    } else {
                        Piece::Text { first: n == skip, text: piece_text(&scenario, n) }
                    }
                } else if n == chunks {
                    if scenario.stall_after == Some(n) {
                        tokio::time::sleep(Duration::from_secs(3600)).await;
                    }
                    Piece::Finish { tool: scenario.tool.is_some() }
                } else if n == chunks + 1 {
                    let (p, c) = scenario.usage.unwrap_or((10, chunks as u64));
                    Piece::Usage(p, c)
                } else if n == chunks + 2 && !scenario.no_done {
                    guard.finished = true;
                    return Some((Ok(wire.render(&Piece::Done).unwrap_or_default()), (usize::MAX, guard)));
                } else {
                    guard.complete();
                    return None;
                };
                match wire.render(&piece) {
                    Some(bytes) => return Some((Ok(bytes), (n + 1, guard))),
                    None => n += 1,
                }
            }
        }
    })
}

/// Counts a stream as completed or dropped (the client went away before the end).
struct StreamGuard {
    state: std::sync::Arc<MockState>,
    id: String,
    finished: bool,
}

impl StreamGuard {
    fn complete(mut self) {
        self.finished = true;
    }
}

impl Drop for StreamGuard {
    fn drop(&mut self) {
        let mut streams = self.state.streams.lock();
        let counts = streams.entry(self.id.clone()).or_default();
        if self.finished {
            counts.completed += 1;
        } else {
            counts.dropped += 1;
        }
    }
}

/// `POST /_mock/trust`: `{"aws": {access_key_id, secret_access_key, session_token?},
/// "bedrock_api_key": …, "google_public_key": PEM}`, any of them; added to what is trusted.
fn trust(body: &Bytes, state: &MockState) -> HttpResponse {
    let Ok(sent) = serde_json::from_slice::<Value>(body) else {
        return HttpResponse::BadRequest().json(json!({"error": "not JSON"}));
    };
    let mut trust = state.trust.lock();
    if let Some(aws) = sent.get("aws") {
        let text = |k: &str| aws.get(k).and_then(Value::as_str).map(str::to_string);
        let (Some(id), Some(secret)) = (text("access_key_id"), text("secret_access_key")) else {
            return HttpResponse::BadRequest().json(json!({"error": "aws needs access_key_id and secret_access_key"}));
        };
        trust.aws.insert(id, sigv4::KeyPair { secret_access_key: secret, session_token: text("session_token") });
    }
    if let Some(key) = sent.get("bedrock_api_key").and_then(Value::as_str) {
        trust.bedrock_api_keys.insert(key.to_string());
    }
    if let Some(pem) = sent.get("google_public_key").and_then(Value::as_str) {
        trust.google_keys.push(pem.to_string());
    }
    HttpResponse::NoContent().finish()
}

/// AWS's 403 unless a Bedrock request carries a trusted API key as a bearer token or a SigV4
/// signature by a trusted key pair.
fn refuse_bedrock(req: &HttpRequest, body: &Bytes, state: &MockState) -> Option<HttpResponse> {
    let authorization = req.headers().get("authorization").and_then(|v| v.to_str().ok()).unwrap_or_default();
    if let Some(key) = authorization.strip_prefix("Bearer ") {
        let trusted = state.trust.lock().bedrock_api_keys.contains(key);
        return (!trusted)
            .then(|| bedrock::error(StatusCode::FORBIDDEN, "UnrecognizedClientException", "Invalid API Key format."));
    }
    let headers: Vec<(String, String)> = req
        .headers()
        .iter()
        .map(|(k, v)| (k.as_str().to_string(), String::from_utf8_lossy(v.as_bytes()).to_string()))
        .collect();
    let trusted = state.trust.lock().aws.clone();
    let request = sigv4::Request {
        method: req.method().as_str(),
        raw_path: req.uri().path(),
        query: req.query_string(),
        headers: &headers,
        body,
    };
    match sigv4::verify(&trusted, &request) {
        Ok(()) => None,
        Err(sigv4::Refusal::UnknownKey) => Some(bedrock::error(
            StatusCode::FORBIDDEN,
            "UnrecognizedClientException",
            "The security token included in the request is invalid.",
        )),
        Err(sigv4::Refusal::Mismatch(why)) => {
            Some(bedrock::error(StatusCode::FORBIDDEN, "InvalidSignatureException", why))
        }
    }
}

fn requests(req: &HttpRequest, state: &MockState) -> HttpResponse {
    if req.method() == "DELETE" {
        state.log.lock().clear();
        return HttpResponse::NoContent().finish();
    }
    let id =
        web::Query::<HashMap<String, String>>::from_query(req.query_string()).ok().and_then(|q| q.get("id").cloned());
    let log = state.log.lock();
    let wanted = id.map(|id| format!("id:{id}"));
    let matching: Vec<&Received> = log
        .iter()
        .filter(|r| {
            wanted.as_ref().is_none_or(|w| r.path.split('/').nth(2).is_some_and(|spec| spec.split(';').any(|d| d == w)))
        })
        .collect();
    HttpResponse::Ok().json(matching)
}

/// TCP connections accepted by this process's mock (one mock per process).
static CONNECTIONS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

pub async fn serve(addr: &str) -> std::io::Result<()> {
    let state = web::Data::new(MockState::default());
    tracing::info!(%addr, "mock LLM listening");
    HttpServer::new(move || {
        App::new()
            .app_data(state.clone())
            .app_data(web::PayloadConfig::new(64 * 1024 * 1024))
            .default_service(web::to(handle))
    })
    .on_connect(|connection, _| {
        CONNECTIONS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if let Some(tcp) = connection.downcast_ref::<actix_web::rt::net::TcpStream>() {
            let _ = tcp.set_nodelay(true);
        }
    })
    .bind(addr)?
    .run()
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scenarios_parse() {
        let s = Scenario::parse("id:t1;seq:503-200;delay:5;retry-after:7;err:insufficient_quota;usage:10-20");
        assert_eq!(s.id.as_deref(), Some("t1"));
        assert_eq!(s.statuses, vec![503, 200]);
        assert_eq!(s.delay, Some(Duration::from_millis(5)));
        assert_eq!(s.retry_after.as_deref(), Some("7"));
        assert_eq!(s.usage, Some((10, 20)));
        let (scenario, spec, rest) = split_path("/mock/status:503;id:x/v1/chat/completions");
        assert_eq!((scenario.statuses, spec.as_str(), rest), (vec![503], "status:503;id:x", "/v1/chat/completions"));
        assert_eq!(split_path("/v1/models").2, "/v1/models");
    }
}
