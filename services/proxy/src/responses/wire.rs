//! A committed stream in the Responses shape (RESPONSES.md §3): `response.created` and
//! `response.in_progress` at the commit point, then one output item at a time — `added`, its
//! deltas, `done` — and exactly one terminal event (`response.completed` with the whole
//! `output` and `usage`, `response.incomplete`, or `response.failed`); every event carries a
//! rising `sequence_number`; no `[DONE]`. Thinking becomes a `reasoning` item: its text as
//! the summary (`response.reasoning_summary_*` events) when the caller asked for summaries,
//! and the blocks sealed as `encrypted_content` ([`super::reasoning`]) for the next turn.

use bytes::Bytes;
use serde_json::{Value, json};
use shield_core::exchange::{Delta, Stop};
use shield_core::usage::TokenUsage;

use crate::client_wire::{ClientWire, StreamHead};
use crate::provider::Chunk;

/// The output item being streamed.
enum Open {
    Message {
        id: String,
        text: String,
    },
    /// Thinking blocks: those finished, and the one being streamed (text and signature).
    Reasoning {
        id: String,
        blocks: Vec<Value>,
        thinking: Option<(String, String)>,
        summary: String,
    },
    Call {
        id: String,
        call_id: String,
        name: String,
        arguments: String,
        custom: bool,
    },
}

pub struct ResponsesWire {
    /// The route name the caller sent, until the first chunk names the answering model.
    model: String,
    id: String,
    created_at: u64,
    sequence: u64,
    started: bool,
    open: Option<Open>,
    /// Finished output items, for `response.completed`.
    output: Vec<Value>,
    /// The caller's freeform tools: their calls go out as `custom_tool_call` items.
    custom: Vec<String>,
    stop: Option<Stop>,
    /// Keeps the response when it ends, when the request asked for it to be stored.
    keeper: Option<super::history::Keeper>,
    /// The terminal response, for the keeper.
    last: Option<Value>,
    /// The request's fields the response object echoes (`store`, `metadata`, …).
    echo: Value,
    /// Seals thinking; `None`: thinking is not sent.
    sealer: Option<super::reasoning::Sealer>,
    summaries: bool,
}

/// Usage in the Responses shape.
pub fn usage_json(usage: &TokenUsage) -> Value {
    json!({"input_tokens": usage.input, "input_tokens_details": {"cached_tokens": usage.cache_read},
        "output_tokens": usage.output, "output_tokens_details": {"reasoning_tokens": usage.reasoning},
        "total_tokens": usage.input + usage.output})
}

/// A finished `message` item.
pub fn message_item(id: &str, text: &str) -> Value {
    json!({"type": "message", "id": id, "status": "completed", "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": []}]})
}

/// A finished call: `function_call`, or `custom_tool_call` for a freeform tool (whose text is
/// the `input` of the function it was offered as). Its id is the response's and its place.
pub fn call_item(
    response: &str,
    output_index: usize,
    call_id: &str,
    name: &str,
    arguments: &str,
    custom: bool,
) -> Value {
    if custom {
        json!({"type": "custom_tool_call", "id": format!("ctc_{response}_{output_index}"), "call_id": call_id,
            "name": name, "input": custom_input(arguments), "status": "completed"})
    } else {
        json!({"type": "function_call", "id": format!("fc_{response}_{output_index}"), "call_id": call_id,
            "name": name, "arguments": arguments, "status": "completed"})
    }
}

/// A freeform tool's text from the arguments of the function it was offered as.
fn custom_input(arguments: &str) -> String {
    let arguments: Value = serde_json::from_str(arguments).unwrap_or(Value::Null);
    arguments.get("input").and_then(Value::as_str).unwrap_or_default().to_string()
}

/// A `reasoning` item: `summary` (empty when the caller asked for none) and the thinking
/// blocks sealed for the next turn.
pub fn reasoning_item(id: &str, summary: &str, sealed: String) -> Value {
    let summary = if summary.is_empty() { json!([]) } else { json!([{"type": "summary_text", "text": summary}]) };
    json!({"type": "reasoning", "id": id, "summary": summary, "encrypted_content": sealed})
}

impl ResponsesWire {
    /// `id`: the response id Shield answers under (its own, so that a stored response is found
    /// by it on any proxy).
    pub fn new(model: &str, custom: Vec<String>, id: String, keeper: Option<super::history::Keeper>) -> ResponsesWire {
        let created_at =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
        ResponsesWire {
            model: model.to_string(),
            id,
            created_at,
            sequence: 0,
            started: false,
            open: None,
            output: Vec::new(),
            custom,
            stop: None,
            keeper,
            last: None,
            sealer: None,
            summaries: false,
            echo: Value::Null,
        }
    }

    /// The request's fields every response object of the stream echoes.
    pub fn echo(&mut self, fields: Value) {
        self.echo = fields;
    }

    /// Thinking is sent as reasoning items sealed by `sealer`, with the text as the summary
    /// when `summaries`.
    pub fn reasoning(&mut self, sealer: super::reasoning::Sealer, summaries: bool) {
        self.sealer = Some(sealer);
        self.summaries = summaries;
    }

    fn event(&mut self, kind: &str, mut data: Value, out: &mut String) {
        crate::json::set(&mut data, &["type"], json!(kind));
        crate::json::set(&mut data, &["sequence_number"], json!(self.sequence));
        self.sequence += 1;
        out.push_str(&format!("event: {kind}\ndata: {data}\n\n"));
    }

    fn response(&self, status: &str, usage: Option<&TokenUsage>) -> Value {
        let mut response = json!({"id": self.id, "object": "response", "created_at": self.created_at, "status": status,
            "model": self.model, "output": self.output, "parallel_tool_calls": true, "tool_choice": "auto", "tools": [],
            "error": null, "incomplete_details": null});
        if let (Value::Object(response), Value::Object(echo)) = (&mut response, &self.echo) {
            for (key, value) in echo {
                response.insert(key.clone(), value.clone());
            }
        }
        if let Some(usage) = usage {
            crate::json::set(&mut response, &["usage"], usage_json(usage));
        }
        response
    }

    fn start(&mut self, head: Option<&StreamHead<'_>>, out: &mut String) {
        if std::mem::replace(&mut self.started, true) {
            return;
        }
        if let Some(head) = head {
            self.model = head.model.to_string();
        }
        let response = self.response("in_progress", None);
        self.event("response.created", json!({"response": response}), out);
        self.event("response.in_progress", json!({"response": response}), out);
    }

    fn close(&mut self, out: &mut String) {
        let output_index = self.output.len();
        let item = match self.open.take() {
            None => return,
            Some(Open::Reasoning { id, mut blocks, thinking, summary }) => {
                if let Some((said, signature)) = thinking {
                    blocks.push(super::reasoning::thinking_block(&said, &signature));
                }
                let summary = if self.summaries { summary } else { String::new() };
                if !summary.is_empty() {
                    let at = json!({"item_id": id, "output_index": output_index, "summary_index": 0});
                    let mut done = at.clone();
                    crate::json::set(&mut done, &["text"], json!(summary));
                    self.event("response.reasoning_summary_text.done", done, out);
                    let mut part_done = at;
                    crate::json::set(&mut part_done, &["part"], json!({"type": "summary_text", "text": summary}));
                    self.event("response.reasoning_summary_part.done", part_done, out);
                }
                let sealed = self.sealer.as_ref().map(|s| s.seal(&blocks)).unwrap_or_default();
                reasoning_item(&id, &summary, sealed)
            }
            Some(Open::Message { id, text }) => {
                let part = json!({"type": "output_text", "text": text, "annotations": []});
                let at = json!({"item_id": id, "output_index": output_index, "content_index": 0});
                let mut done = at.clone();
                crate::json::set(&mut done, &["text"], json!(text));
                crate::json::set(&mut done, &["logprobs"], json!([]));
                self.event("response.output_text.done", done, out);
                let mut part_done = at;
                crate::json::set(&mut part_done, &["part"], part);
                self.event("response.content_part.done", part_done, out);
                message_item(&id, &text)
            }
            Some(Open::Call { id, call_id, name, arguments, custom: false }) => {
                let done = json!({"item_id": id, "output_index": output_index, "arguments": arguments});
                self.event("response.function_call_arguments.done", done, out);
                call_item(&self.id, output_index, &call_id, &name, &arguments, false)
            }
            Some(Open::Call { id, call_id, name, arguments, custom: true }) => {
                let input = custom_input(&arguments);
                let delta = json!({"item_id": id, "output_index": output_index, "call_id": call_id, "delta": input});
                self.event("response.custom_tool_call_input.delta", delta, out);
                let done = json!({"item_id": id, "output_index": output_index, "call_id": call_id, "input": input});
                self.event("response.custom_tool_call_input.done", done, out);
                call_item(&self.id, output_index, &call_id, &name, &arguments, true)
            }
        };
        self.event("response.output_item.done", json!({"output_index": output_index, "item": item}), out);
        self.output.push(item);
    }

    fn text(&mut self, delta: &str, out: &mut String) {
        if !matches!(self.open, Some(Open::Message { .. })) {
            // Closing what was open adds it to the output: the message's index is after it.
            self.close(out);
            let output_index = self.output.len();
            let id = format!("msg_{}_{output_index}", self.id);
            let item =
                json!({"type": "message", "id": id, "status": "in_progress", "role": "assistant", "content": []});
            self.event("response.output_item.added", json!({"output_index": output_index, "item": item}), out);
            let part = json!({"type": "output_text", "text": "", "annotations": []});
            let added = json!({"item_id": id, "output_index": output_index, "content_index": 0, "part": part});
            self.event("response.content_part.added", added, out);
            self.open = Some(Open::Message { id, text: String::new() });
        }
        let output_index = self.output.len();
        let Some(Open::Message { id, text }) = &mut self.open else { return };
        text.push_str(delta);
        let data =
            json!({"item_id": id, "output_index": output_index, "content_index": 0, "delta": delta, "logprobs": []});
        self.event("response.output_text.delta", data, out);
    }

    /// A thinking block starts (a redacted one arrives whole): into the open reasoning item,
    /// or a new one.
    fn think(&mut self, redacted: Option<&str>, out: &mut String) {
        if self.sealer.is_none() {
            return;
        }
        if !matches!(self.open, Some(Open::Reasoning { .. })) {
            self.close(out);
            let output_index = self.output.len();
            let id = format!("rs_{}_{output_index}", self.id);
            let item = json!({"type": "reasoning", "id": id, "summary": []});
            self.event("response.output_item.added", json!({"output_index": output_index, "item": item}), out);
            self.open = Some(Open::Reasoning { id, blocks: Vec::new(), thinking: None, summary: String::new() });
        }
        let Some(Open::Reasoning { blocks, thinking, .. }) = &mut self.open else { return };
        if let Some((said, signature)) = thinking.take() {
            blocks.push(super::reasoning::thinking_block(&said, &signature));
        }
        match redacted {
            Some(data) => blocks.push(super::reasoning::redacted_block(data)),
            None => *thinking = Some((String::new(), String::new())),
        }
    }

    /// Thinking text (`signature`: false) or the block's signature.
    fn thought(&mut self, delta: &str, signature: bool, out: &mut String) {
        let output_index = self.output.len();
        let summaries = self.summaries;
        let Some(Open::Reasoning { id, thinking: Some((said, sig)), summary, .. }) = &mut self.open else { return };
        if signature {
            sig.push_str(delta);
            return;
        }
        said.push_str(delta);
        if !summaries || delta.is_empty() {
            return;
        }
        let (id, first) = (id.clone(), summary.is_empty());
        summary.push_str(delta);
        let at = json!({"item_id": id, "output_index": output_index, "summary_index": 0});
        if first {
            let mut added = at.clone();
            crate::json::set(&mut added, &["part"], json!({"type": "summary_text", "text": ""}));
            self.event("response.reasoning_summary_part.added", added, out);
        }
        let mut data = at;
        crate::json::set(&mut data, &["delta"], json!(delta));
        self.event("response.reasoning_summary_text.delta", data, out);
    }

    fn call(&mut self, call_id: &str, name: &str, out: &mut String) {
        self.close(out);
        let output_index = self.output.len();
        let custom = self.custom.iter().any(|c| c == name);
        let id = format!("{}_{}_{output_index}", if custom { "ctc" } else { "fc" }, self.id);
        let item = if custom {
            json!({"type": "custom_tool_call", "id": id, "call_id": call_id, "name": name, "input": "", "status": "in_progress"})
        } else {
            json!({"type": "function_call", "id": id, "call_id": call_id, "name": name, "arguments": "", "status": "in_progress"})
        };
        self.event("response.output_item.added", json!({"output_index": output_index, "item": item}), out);
        let (call_id, name) = (call_id.to_string(), name.to_string());
        self.open = Some(Open::Call { id, call_id, name, arguments: String::new(), custom });
    }

    /// The stream fails: `response.failed` with `code` (after `response.created` if it was not
    /// sent yet), and then the stream closes.
    pub fn failed(&mut self, code: &str, message: &str) -> Bytes {
        let mut out = String::new();
        self.start(None, &mut out);
        let mut response = self.response("failed", None);
        crate::json::set(&mut response, &["error"], json!({"code": code, "message": message}));
        self.event("response.failed", json!({"response": response}), &mut out);
        Bytes::from(out)
    }

    fn arguments(&mut self, delta: &str, out: &mut String) {
        let output_index = self.output.len();
        let Some(Open::Call { id, arguments, custom, .. }) = &mut self.open else { return };
        arguments.push_str(delta);
        if !*custom {
            let data = json!({"item_id": id, "output_index": output_index, "delta": delta});
            self.event("response.function_call_arguments.delta", data, out);
        }
    }
}

impl ClientWire for ResponsesWire {
    fn chunk(&mut self, chunk: Chunk, head: &StreamHead<'_>, _usage: TokenUsage) -> Option<Bytes> {
        let mut out = String::new();
        for delta in chunk.deltas {
            match delta {
                Delta::Text(text) if !text.is_empty() => {
                    self.start(Some(head), &mut out);
                    self.text(&text, &mut out);
                }
                Delta::ToolCall { id, name, .. } => {
                    self.start(Some(head), &mut out);
                    self.call(&id, &name, &mut out);
                }
                Delta::ToolArguments { json, .. } => self.arguments(&json, &mut out),
                Delta::ThinkingStart if self.sealer.is_some() => {
                    self.start(Some(head), &mut out);
                    self.think(None, &mut out);
                }
                Delta::RedactedThinking(data) if self.sealer.is_some() => {
                    self.start(Some(head), &mut out);
                    self.think(Some(&data), &mut out);
                }
                Delta::Thinking(text) => self.thought(&text, false, &mut out),
                Delta::Signature(signature) => self.thought(&signature, true, &mut out),
                Delta::Stop(stop) => self.stop = Some(stop),
                _ => {}
            }
        }
        (!out.is_empty()).then(|| Bytes::from(out))
    }

    fn done(&mut self, usage: TokenUsage) -> Bytes {
        let mut out = String::new();
        self.start(None, &mut out);
        self.close(&mut out);
        let (kind, status, reason) = match self.stop {
            Some(Stop::MaxTokens) => ("response.incomplete", "incomplete", Some("max_output_tokens")),
            Some(Stop::Refusal) => ("response.incomplete", "incomplete", Some("content_filter")),
            _ => ("response.completed", "completed", None),
        };
        let mut response = self.response(status, Some(&usage));
        if let Some(reason) = reason {
            crate::json::set(&mut response, &["incomplete_details"], json!({"reason": reason}));
        }
        self.event(kind, json!({"response": response.clone()}), &mut out);
        self.last = Some(response);
        Bytes::from(out)
    }

    fn broken(&mut self, message: &str) -> Bytes {
        self.failed("server_error", message)
    }

    fn before_end(&mut self) -> Option<futures_util::future::BoxFuture<'static, ()>> {
        let (keeper, response) = (self.keeper.take()?, self.last.take()?);
        Some(Box::pin(async move { keeper.keep(&response).await }))
    }

    /// What was sent stands; the reason follows as text, and the response ends incomplete
    /// (`content_filter`).
    fn blocked(&mut self, reason: &str, _model: &str, _guardrails: Value, usage: TokenUsage) -> Bytes {
        let mut out = String::new();
        self.start(None, &mut out);
        self.close(&mut out);
        self.text(reason, &mut out);
        self.close(&mut out);
        let mut response = self.response("incomplete", Some(&usage));
        crate::json::set(&mut response, &["incomplete_details"], json!({"reason": "content_filter"}));
        self.event("response.incomplete", json!({"response": response.clone()}), &mut out);
        self.last = Some(response);
        Bytes::from(out)
    }

    fn wants_usage_chunk(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn events(bytes: &[u8]) -> Vec<Value> {
        String::from_utf8_lossy(bytes)
            .split("\n\n")
            .filter(|e| !e.is_empty())
            .map(|e| serde_json::from_str(e.lines().nth(1).unwrap().trim_start_matches("data: ")).unwrap())
            .collect()
    }

    #[test]
    fn deltas_become_one_item_at_a_time_with_rising_sequence_numbers() {
        let mut wire = ResponsesWire::new("route", vec!["apply_patch".into()], "resp_abc".into(), None);
        let head = StreamHead { id: "abc", model: "gpt-x" };
        let usage = TokenUsage { input: 5, output: 3, ..TokenUsage::default() };
        let mut all = Vec::new();
        for deltas in [
            vec![Delta::Text("Hel".into())],
            vec![Delta::Text("lo".into())],
            vec![Delta::ToolCall { index: 0, id: "c1".into(), name: "search".into() }],
            vec![Delta::ToolArguments { index: 0, json: "{\"q\":1}".into() }],
            vec![Delta::ToolCall { index: 1, id: "c2".into(), name: "apply_patch".into() }],
            vec![Delta::ToolArguments { index: 1, json: "{\"input\":\"*** Begin Patch\"}".into() }],
            vec![Delta::Stop(Stop::ToolUse)],
        ] {
            if let Some(bytes) = wire.chunk(Chunk::of(deltas), &head, usage) {
                all.extend(events(&bytes));
            }
        }
        all.extend(events(&wire.done(usage)));
        let kinds: Vec<&str> = all.iter().map(|e| e["type"].as_str().unwrap()).collect();
        assert_eq!(
            kinds,
            [
                "response.created",
                "response.in_progress",
                "response.output_item.added",
                "response.content_part.added",
                "response.output_text.delta",
                "response.output_text.delta",
                "response.output_text.done",
                "response.content_part.done",
                "response.output_item.done",
                "response.output_item.added",
                "response.function_call_arguments.delta",
                "response.function_call_arguments.done",
                "response.output_item.done",
                "response.output_item.added",
                "response.custom_tool_call_input.delta",
                "response.custom_tool_call_input.done",
                "response.output_item.done",
                "response.completed",
            ]
        );
        let numbers: Vec<u64> = all.iter().map(|e| e["sequence_number"].as_u64().unwrap()).collect();
        assert!(numbers.windows(2).all(|w| w[1] == w[0] + 1), "{numbers:?}");
        let completed = &all.last().unwrap()["response"];
        assert_eq!(completed["id"], "resp_abc");
        assert_eq!(completed["output"][0]["content"][0]["text"], "Hello");
        assert_eq!(completed["output"][1]["arguments"], "{\"q\":1}");
        assert_eq!(completed["output"][2]["input"], "*** Begin Patch");
        assert_eq!(completed["usage"]["output_tokens"], 3);
    }

    #[test]
    fn reasoning_then_text_numbers_each_item_where_it_stands() {
        use base64::Engine;
        let key = base64::engine::general_purpose::STANDARD.encode([7u8; 32]);
        let keyring = std::sync::Arc::new(shield_core::vault::Keyring::from_base64(&key, 1).unwrap());
        let sealer = super::super::reasoning::Sealer::new(keyring, "acme");
        let mut wire = ResponsesWire::new("route", Vec::new(), "resp_r".into(), None);
        wire.reasoning(sealer.clone(), true);
        let head = StreamHead { id: "abc", model: "claude" };
        let usage = TokenUsage::default();
        let mut all = Vec::new();
        for deltas in [
            vec![Delta::ThinkingStart, Delta::Thinking("Let me ".into())],
            vec![Delta::Thinking("think.".into()), Delta::Signature("c2ln".into())],
            vec![Delta::Text("Hi".into())],
            vec![Delta::Text(" there".into())],
        ] {
            if let Some(bytes) = wire.chunk(Chunk::of(deltas), &head, usage) {
                all.extend(events(&bytes));
            }
        }
        all.extend(events(&wire.done(usage)));
        let of = |kind: &str| all.iter().filter(|e| e["type"] == kind).collect::<Vec<_>>();
        assert_eq!(of("response.output_item.added")[0]["output_index"], 0);
        assert_eq!(of("response.reasoning_summary_text.delta").len(), 2);
        assert_eq!(of("response.reasoning_summary_text.done")[0]["text"], "Let me think.");
        // The message after the reasoning item is item 1 in every event that names it.
        assert_eq!(of("response.output_item.added")[1]["output_index"], 1);
        assert_eq!(of("response.content_part.added")[0]["output_index"], 1);
        assert!(of("response.output_text.delta").iter().all(|e| e["output_index"] == 1));
        let completed = &all.last().unwrap()["response"];
        assert_eq!(completed["output"][0]["summary"][0]["text"], "Let me think.");
        let sealed = completed["output"][0]["encrypted_content"].as_str().unwrap();
        assert_eq!(
            sealer.open(sealed),
            Some(vec![shield_core::exchange::Part::Thinking {
                thinking: "Let me think.".into(),
                signature: "c2ln".into()
            }])
        );
        assert_eq!(completed["output"][1]["id"], "msg_resp_r_1");
        assert_eq!(completed["output"][1]["content"][0]["text"], "Hi there");
    }
}
