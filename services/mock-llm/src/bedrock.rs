//! Amazon Bedrock's Converse wire on the mock (issue 30): `POST …/model/{modelId}/converse`
//! answers a Converse response; `…/converse-stream` streams AWS's binary event stream
//! (`messageStart`, `contentBlockStart` for a tool call, `contentBlockDelta`,
//! `contentBlockStop`, `messageStop`, `metadata`), each payload with the random padding field
//! `p` AWS adds. Every request must be signed: SigV4 by a key pair the test trusted
//! (`POST /_mock/trust`), checked by [`crate::sigv4`], or `Authorization: Bearer` with a
//! trusted Bedrock API key; anything else is refused with 403, as AWS does.
//!
//! The shared directives apply. Errors are AWS's (`x-amzn-errortype` and `{"message"}`), the
//! type from the status (`err:not_ready` makes a 429 `ModelNotReadyException`, `err:too_long`
//! a 400 input-too-long `ValidationException`). In a stream, `errfirst` sends an exception
//! frame instead of the first event and `errat:N` one after N events (`throttlingException`,
//! or the `err:` type); `malformed:N` sends the N-th frame with a wrong CRC.

use actix_web::http::StatusCode;
use actix_web::web::{self, Bytes};
use actix_web::{HttpResponse, HttpResponseBuilder};
use aws_smithy_types::event_stream::{Header, HeaderValue, Message};
use serde_json::{Value, json};

use crate::{MockState, Piece, Scenario, Wire, canned, stream};

/// The signature the mock puts on its reasoning under `think`.
pub(crate) const SIGNATURE: &str = "YmVkcm9jay1zaWc=";

fn error_type(status: StatusCode, code: Option<&str>) -> &'static str {
    match (status.as_u16(), code) {
        (429, Some("not_ready")) => "ModelNotReadyException",
        (429, _) => "ThrottlingException",
        (400, _) => "ValidationException",
        (403, _) => "AccessDeniedException",
        (404, _) => "ResourceNotFoundException",
        (408, _) => "ModelTimeoutException",
        (424, _) => "ModelErrorException",
        (503, _) => "ServiceUnavailableException",
        _ => "InternalServerException",
    }
}

/// An AWS error answer: the type in `x-amzn-errortype` (with the namespace suffix AWS adds),
/// the words in `message`.
pub(crate) fn error(status: StatusCode, kind: &str, message: &str) -> HttpResponse {
    HttpResponse::build(status)
        .insert_header(("x-amzn-errortype", format!("{kind}:http://internal.amazon.com/coral/com.amazon.bedrock/")))
        .insert_header(("x-amzn-requestid", "mock-request"))
        .json(json!({"message": message}))
}

fn last_user_text(request: &Value) -> String {
    let messages = request.get("messages").and_then(Value::as_array);
    let last = messages.into_iter().flatten().rev().find(|m| m.get("role").and_then(Value::as_str) == Some("user"));
    last.and_then(|m| m.get("content"))
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|b| b.get("text").and_then(Value::as_str))
        .collect::<Vec<_>>()
        .join("")
}

/// Converse's usage: input without the cached tokens, the total with them.
fn usage(scenario: &Scenario, input: u64, output: u64) -> Value {
    let (read, write) = scenario.cache.unwrap_or((0, 0));
    json!({"inputTokens": input, "outputTokens": output, "totalTokens": input + output + read + write,
        "cacheReadInputTokens": read, "cacheWriteInputTokens": write})
}

/// `POST …/converse` / `…/converse-stream`, after the shared directives ran.
pub(crate) fn answer(
    mut response: HttpResponseBuilder,
    status: StatusCode,
    scenario: Scenario,
    body: &Bytes,
    state: web::Data<MockState>,
    streamed: bool,
) -> HttpResponse {
    if !status.is_success() {
        let code = scenario.error_code.as_deref();
        let message = match code {
            Some("too_long") => "Input is too long for requested model.".to_string(),
            Some(code) => code.replace('_', " "),
            None => format!("mock failure {}", status.as_u16()),
        };
        return error(status, error_type(status, code), &message);
    }
    let request: Value = match serde_json::from_slice(body) {
        Ok(Value::Object(fields)) if fields.get("messages").is_some_and(Value::is_array) => Value::Object(fields),
        _ => return error(StatusCode::BAD_REQUEST, "ValidationException", "messages is required"),
    };
    if request.get("modelId").is_some() || request.get("model").is_some() {
        return error(StatusCode::BAD_REQUEST, "ValidationException", "the model is named in the path, not the body");
    }
    if streamed {
        let (input, output) = scenario.usage.unwrap_or((10, scenario.chunks.unwrap_or(3) as u64));
        let wire = BedrockWire {
            usage: usage(&scenario, input, output),
            think: scenario.think,
            exception: match scenario.error_code.as_deref() {
                Some("not_ready" | "throttling") | None => "throttlingException".into(),
                Some(other) => other.to_string(),
            },
        };
        return response.content_type("application/vnd.amazon.eventstream").streaming(stream(
            state.into_inner(),
            scenario,
            wire,
            0,
        ));
    }
    if scenario.body.as_deref() == Some("garbage") {
        return response.content_type("application/json").body("this is not json");
    }
    let text = scenario
        .reply
        .clone()
        .or_else(|| canned(scenario.say.as_deref()).map(str::to_string))
        .unwrap_or_else(|| format!("mock answer to: {}", last_user_text(&request)));
    let mut content = Vec::new();
    if scenario.think {
        content.push(json!({"reasoningContent": {"reasoningText": {"text": "Let me think.", "signature": SIGNATURE}}}));
    }
    let stop = match &scenario.tool {
        Some(name) => {
            let input: Value = serde_json::from_str(&scenario.tool_arguments()).unwrap_or_else(|_| json!({}));
            content.push(json!({"toolUse": {"toolUseId": "tooluse_mock1", "name": name, "input": input}}));
            "tool_use"
        }
        None => {
            content.push(json!({"text": text}));
            "end_turn"
        }
    };
    let prompt_chars = request.get("messages").map(|m| m.to_string().len()).unwrap_or(0) as u64;
    let (input, output) = scenario.usage.unwrap_or((prompt_chars.div_ceil(4), (text.len() as u64).div_ceil(4)));
    response.insert_header(("x-amzn-requestid", "mock-request")).json(json!({
        "output": {"message": {"role": "assistant", "content": content}},
        "stopReason": stop,
        "usage": usage(&scenario, input, output),
        "metrics": {"latencyMs": 1},
    }))
}

/// One event-stream message.
fn frame(headers: Vec<Header>, payload: &Value) -> Vec<u8> {
    let message = Message::new_from_parts(headers, Bytes::from(payload.to_string()));
    let mut out = Vec::new();
    let _ = aws_smithy_eventstream::frame::write_message_to(&message, &mut out);
    out
}

fn event(kind: &str, payload: Value) -> Vec<u8> {
    let mut payload = payload;
    payload["p"] = json!("abcdefghijklmnopqrstuvwxyzABCDEF");
    frame(
        vec![
            Header::new(":message-type", HeaderValue::String("event".into())),
            Header::new(":event-type", HeaderValue::String(kind.to_string().into())),
            Header::new(":content-type", HeaderValue::String("application/json".into())),
        ],
        &payload,
    )
}

fn exception(kind: &str, message: &str) -> Vec<u8> {
    frame(
        vec![
            Header::new(":message-type", HeaderValue::String("exception".into())),
            Header::new(":exception-type", HeaderValue::String(kind.to_string().into())),
            Header::new(":content-type", HeaderValue::String("application/json".into())),
        ],
        &json!({"message": message}),
    )
}

/// ConverseStream's events for the shared pieces.
struct BedrockWire {
    usage: Value,
    think: bool,
    /// The exception type an error piece sends.
    exception: String,
}

impl Wire for BedrockWire {
    fn render(&self, piece: &Piece) -> Option<Bytes> {
        // With `think`, block 0 is the reasoning and the answer is block 1.
        let index = u64::from(self.think);
        let start = || {
            let mut out = event("messageStart", json!({"role": "assistant"}));
            if self.think {
                out.extend(event(
                    "contentBlockDelta",
                    json!({"contentBlockIndex": 0, "delta": {"reasoningContent": {"text": "Let me think."}}}),
                ));
                out.extend(event(
                    "contentBlockDelta",
                    json!({"contentBlockIndex": 0, "delta": {"reasoningContent": {"signature": SIGNATURE}}}),
                ));
                out.extend(event("contentBlockStop", json!({"contentBlockIndex": 0})));
            }
            out
        };
        let bytes = match piece {
            Piece::Text { first, text } => {
                let mut out = if *first { start() } else { Vec::new() };
                out.extend(event("contentBlockDelta", json!({"contentBlockIndex": index, "delta": {"text": text}})));
                out
            }
            Piece::ToolCall { name } => {
                let mut out = start();
                out.extend(event(
                    "contentBlockStart",
                    json!({"contentBlockIndex": index, "start": {"toolUse": {"toolUseId": "tooluse_mock1", "name": name}}}),
                ));
                out
            }
            Piece::ToolArgs(args) => {
                event("contentBlockDelta", json!({"contentBlockIndex": index, "delta": {"toolUse": {"input": args}}}))
            }
            Piece::Finish { tool } => {
                let mut out = event("contentBlockStop", json!({"contentBlockIndex": index}));
                let reason = if *tool { "tool_use" } else { "end_turn" };
                out.extend(event("messageStop", json!({"stopReason": reason})));
                out
            }
            Piece::Usage(..) => event("metadata", json!({"usage": self.usage, "metrics": {"latencyMs": 1}})),
            Piece::Done => return None,
            Piece::Error => exception(&self.exception, "mock: rate exceeded"),
            Piece::Malformed => {
                // A frame whose message CRC is wrong.
                let mut out = event("contentBlockDelta", json!({"contentBlockIndex": index, "delta": {"text": "x"}}));
                if let Some(last) = out.last_mut() {
                    *last ^= 0xff;
                }
                out
            }
        };
        Some(Bytes::from(bytes))
    }
}
