//! The Gemini API's wire format on the mock (issue 30): `POST …/v1beta/models/{model}:generateContent`
//! answers a `GenerateContentResponse`; `:streamGenerateContent?alt=sse` streams them (whole
//! responses with new parts only, no `[DONE]`, the end at EOF); errors are Google's
//! `{"error": {code, message, status, details}}` (a 429 carries `RetryInfo` when the scenario
//! sets `retry-after:S`). The shared directives (status, delays, breaks, stalls, malformed events,
//! `tool:NAME`, `think`, `say:…`, `usage:P-C`) apply as on the other wires; with `think` the
//! answer starts with a thought and a function call carries a thought signature.

use actix_web::web::{self, Bytes};
use actix_web::{HttpResponse, HttpResponseBuilder, http::StatusCode};
use serde_json::{Value, json};

use crate::{MockState, Piece, Scenario, Wire, canned, stream};

/// The signature the mock puts on a function call under `think`.
pub(crate) const SIGNATURE: &str = "Z2VtaW5pLXNpZw==";

fn status_name(status: StatusCode) -> &'static str {
    match status.as_u16() {
        400 => "INVALID_ARGUMENT",
        401 => "UNAUTHENTICATED",
        403 => "PERMISSION_DENIED",
        404 => "NOT_FOUND",
        429 => "RESOURCE_EXHAUSTED",
        503 => "UNAVAILABLE",
        504 => "DEADLINE_EXCEEDED",
        _ => "INTERNAL",
    }
}

/// Google's error body; `err:CODE` sets the message (`err:token_count` for a prompt too long).
fn error_body(status: StatusCode, scenario: &Scenario) -> Value {
    let message = match scenario.error_code.as_deref() {
        Some("token_count") => {
            "The input token count (2000000) exceeds the maximum number of tokens allowed (1048576).".to_string()
        }
        Some(code) => code.replace('_', " "),
        None => format!("mock failure {}", status.as_u16()),
    };
    let mut details = Vec::new();
    if status == StatusCode::TOO_MANY_REQUESTS
        && let Some(seconds) = &scenario.retry_after
    {
        details.push(json!({"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": format!("{seconds}s")}));
    }
    json!({"error": {"code": status.as_u16(), "message": message, "status": status_name(status), "details": details}})
}

/// The text of the last user turn's parts.
fn last_user_text(request: &Value) -> String {
    let contents = request.get("contents").and_then(Value::as_array);
    let last = contents.into_iter().flatten().rev().find(|c| c.get("role").and_then(Value::as_str) == Some("user"));
    last.and_then(|c| c.get("parts"))
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|p| p.get("text").and_then(Value::as_str))
        .collect::<Vec<_>>()
        .join("")
}

fn usage(request: &Value, scenario: &Scenario, output_chars: usize) -> Value {
    let prompt_chars = request.get("contents").map(|c| c.to_string().len()).unwrap_or(0) as u64;
    let (input, output) = scenario.usage.unwrap_or((prompt_chars.div_ceil(4), (output_chars as u64).div_ceil(4)));
    json!({"promptTokenCount": input, "candidatesTokenCount": output, "totalTokenCount": input + output})
}

fn call_part(scenario: &Scenario, name: &str) -> Value {
    let args: Value = serde_json::from_str(&scenario.tool_arguments()).unwrap_or_else(|_| json!({}));
    let mut part = json!({"functionCall": {"name": name, "args": args}});
    if scenario.think {
        part["thoughtSignature"] = json!(SIGNATURE);
    }
    part
}

/// `POST …:generateContent` / `:streamGenerateContent`, after the shared directives ran.
pub(crate) fn answer(
    mut response: HttpResponseBuilder,
    status: StatusCode,
    scenario: Scenario,
    body: &Bytes,
    state: web::Data<MockState>,
    streamed: bool,
) -> HttpResponse {
    if !status.is_success() {
        return response.json(error_body(status, &scenario));
    }
    let request: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    if streamed {
        let (input, output) = scenario.usage.unwrap_or((10, scenario.chunks.unwrap_or(3) as u64));
        let wire = GeminiWire {
            usage: json!({"promptTokenCount": input, "candidatesTokenCount": output, "totalTokenCount": input + output}),
            call: scenario.tool.as_ref().map(|name| call_part(&scenario, name)),
            think: scenario.think,
        };
        return response.content_type("text/event-stream").streaming(stream(state.into_inner(), scenario, wire, 0));
    }
    match scenario.body.as_deref() {
        Some("garbage") => return response.content_type("application/json").body("this is not json"),
        Some("nochoices") => return response.json(json!({"modelVersion": "mock"})),
        _ => {}
    }
    let text = scenario
        .reply
        .clone()
        .or_else(|| canned(scenario.say.as_deref()).map(str::to_string))
        .unwrap_or_else(|| format!("mock answer to: {}", last_user_text(&request)));
    let mut parts = Vec::new();
    if scenario.think {
        parts.push(json!({"text": "Let me think.", "thought": true}));
    }
    match &scenario.tool {
        Some(name) => parts.push(call_part(&scenario, name)),
        None => parts.push(json!({"text": text})),
    }
    response.json(json!({"responseId": "gemini-mock", "modelVersion": "mock",
        "candidates": [{"content": {"role": "model", "parts": parts}, "finishReason": "STOP", "index": 0}],
        "usageMetadata": usage(&request, &scenario, text.len())}))
}

/// Gemini's stream: each event a whole `GenerateContentResponse` with the new parts; the last
/// carries `finishReason` and the usage; the body ends after it.
struct GeminiWire {
    usage: Value,
    /// `tool:NAME`: the whole call, sent at once (Gemini does not stream arguments).
    call: Option<Value>,
    think: bool,
}

fn data(value: &Value) -> Option<Bytes> {
    Some(Bytes::from(format!("data: {value}\r\n\r\n")))
}

fn parts(parts: Value) -> Value {
    json!({"responseId": "gemini-mock", "candidates": [{"content": {"role": "model", "parts": parts}, "index": 0}]})
}

impl Wire for GeminiWire {
    fn render(&self, piece: &Piece) -> Option<Bytes> {
        match piece {
            Piece::Text { first, text } => {
                let mut out = Vec::new();
                if *first && self.think {
                    out.push(json!({"text": "Let me think.", "thought": true}));
                }
                out.push(json!({"text": text}));
                data(&parts(Value::Array(out)))
            }
            Piece::ToolCall { .. } => {
                let mut out = Vec::new();
                if self.think {
                    out.push(json!({"text": "Let me think.", "thought": true}));
                }
                out.extend(self.call.clone());
                data(&parts(Value::Array(out)))
            }
            Piece::ToolArgs(_) | Piece::Usage(..) | Piece::Done => None,
            Piece::Finish { .. } => {
                data(&json!({"responseId": "gemini-mock", "candidates": [{"content": {"role": "model",
                "parts": []}, "finishReason": "STOP", "index": 0}], "usageMetadata": self.usage}))
            }
            Piece::Error => {
                data(&json!({"error": {"code": 503, "message": "mock stream error", "status": "UNAVAILABLE"}}))
            }
            Piece::Malformed => Some(Bytes::from_static(b"data: {not json\r\n\r\n")),
        }
    }
}
