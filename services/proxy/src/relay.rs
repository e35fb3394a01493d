//! Relaying a committed stream to the client as SSE, without buffering the answer.
//!
//! After the commit point there is no failover and no replay (ROUTING.md): a break, an error
//! event or silence longer than the target's `idle_timeout_s` ends the stream with an
//! `upstream_error` chunk and `data: [DONE]` (halt `visible_output`, counted `stream_broken`).
//! A malformed upstream event is dropped and counted, never forwarded. An upstream that ends
//! without `[DONE]` gets one. The usage chunk Shield asked for is stripped unless the client
//! asked for it too; without reported usage the answer is estimated at 4 characters a token.
//! When the client goes away, the body stream is dropped, which drops the upstream call
//! (halt `cancelled`): nothing keeps generating for nobody.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use shield_core::outcome::Class;
use shield_core::run::Halt;
use shield_core::usage::TokenUsage;

use crate::client_wire::ClientWire;
use crate::client_wire::StreamHead;
use crate::context::{Ending, RequestContext};
use crate::dispatch::Committed;
use crate::guard::StreamGuard;
use crate::health::Health;
use crate::provider::{Chunk, Decoded};
use crate::resume::Resumer;
use crate::usage::Paid;
use shield_core::exchange::Delta;

/// How a relayed stream ended, for the logs (and, with the budgets work, for usage).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamEnd {
    pub halt: Halt,
    pub usage: TokenUsage,
    /// Usage was not reported by the upstream and was estimated.
    pub estimated: bool,
    pub malformed_events: u32,
    pub broken: bool,
}

struct Relay {
    committed: Committed,
    health: Arc<Health>,
    /// The request's one end, taken when the stream ends (or is dropped).
    context: Option<RequestContext>,
    /// Time spent upstream before the commit point (failed attempts and the committed one's
    /// wait for its first event): what Shield added to the first byte is the rest.
    upstream_before_commit: Duration,
    /// Output guardrails and tool RBAC on the text as it flows.
    output: StreamGuard,
    /// The caller's stream format.
    wire: Box<dyn ClientWire>,
    pending: Option<Bytes>,
    first_flushed: bool,
    /// Normalised chunks of the event being relayed (reused across events).
    chunks: Vec<Chunk>,
    prompt_chars: usize,
    output_chars: usize,
    malformed: u32,
    ended: Option<StreamEnd>,
    /// `stream_resume` on: how to re-issue the request after a break.
    resumer: Option<Resumer>,
    /// The text the client has (kept only when resuming is possible).
    sent_text: String,
    /// Tool-call streams are not resumed.
    saw_tool_calls: bool,
    /// Attempts before the current one that produced (and paid for) tokens.
    paid: Vec<Paid>,
    /// The stop reason the answer gave (for its attempt's span).
    stop: Option<shield_core::exchange::Stop>,
    /// The current attempt's text, kept only for `SHIELD_TRACE_CONTENT`.
    captured: Option<String>,
    /// Between a break and the resumed stream: the broken attempt is recorded, paid and its
    /// permit spent; nothing of it is left to settle if the client goes away now.
    between_attempts: bool,
}

/// The SSE body for a committed stream.
pub fn relay(
    committed: Committed,
    health: Arc<Health>,
    context: RequestContext,
    output: StreamGuard,
    wire: Box<dyn ClientWire>,
    prompt_chars: usize,
    resumer: Option<Resumer>,
) -> impl futures_util::Stream<Item = Result<Bytes, std::io::Error>> {
    let malformed = committed.opened.malformed;
    let upstream_before_commit =
        committed.failed_upstream + committed.committed_at.saturating_duration_since(committed.started);
    let mut relay = Relay {
        committed,
        health,
        context: Some(context),
        upstream_before_commit,
        output,
        wire,
        pending: None,
        first_flushed: false,
        chunks: Vec::new(),
        prompt_chars,
        output_chars: 0,
        malformed,
        ended: None,
        resumer,
        sent_text: String::new(),
        saw_tool_calls: false,
        paid: Vec::new(),
        between_attempts: false,
        stop: None,
        captured: crate::observe::capture_content().then(String::new),
    };
    relay.chunks = std::mem::take(&mut relay.committed.opened.first);
    relay.pending = relay.forward_all();
    futures_util::stream::unfold(relay, |mut relay| async move {
        if relay.pending.is_none() && !std::mem::replace(&mut relay.first_flushed, true) {
            // The server writes when the body stream pends: pending once right after the first
            // chunk puts it on the wire at once, even when the upstream's next events are
            // already waiting (time to first token).
            tokio::task::yield_now().await;
        }
        loop {
            if let Some(bytes) = relay.pending.take() {
                if relay.ended.is_some()
                    && let Some(work) = relay.wire.before_end()
                {
                    work.await;
                }
                return Some((Ok(bytes), relay));
            }
            if relay.ended.is_some() {
                // After a clean end, read the upstream to its end (normally just the chunked
                // terminator after `[DONE]`) so its keep-alive connection goes back to the pool;
                // bounded, and the client already has `[DONE]`.
                if relay.ended.as_ref().is_some_and(|end| !end.broken) {
                    let drain = async { while relay.committed.opened.rest.next().await.is_some() {} };
                    let _ = tokio::time::timeout(std::time::Duration::from_millis(100), drain).await;
                }
                return None;
            }
            let next = tokio::time::timeout(relay.committed.idle_timeout, relay.committed.opened.rest.next()).await;
            relay.pending = match next {
                Err(_) => relay.broken(Class::Timeout, "the upstream went silent").await,
                Ok(None) => relay.finish(),
                Ok(Some(Err(_))) => relay.broken(Class::Connect, "the upstream connection broke").await,
                Ok(Some(Ok(event))) => {
                    let decoded = relay.committed.opened.decoder.decode(&event.event, &event.data, &mut relay.chunks);
                    match decoded {
                        Decoded::Continue => relay.forward_all(),
                        // What the last event carried still goes out, then `[DONE]`.
                        Decoded::Done => match (relay.forward_all(), relay.finish()) {
                            (Some(chunks), Some(done)) => Some(Bytes::from([&chunks[..], &done[..]].concat())),
                            (chunks, done) => chunks.or(done),
                        },
                        Decoded::Malformed => {
                            relay.malformed += 1;
                            None
                        }
                        Decoded::Error(..) => relay.broken(Class::ServerError, "the upstream sent an error").await,
                    }
                }
            };
        }
    })
}

impl Relay {
    /// The decoded chunks of one event to the client, in one write.
    fn forward_all(&mut self) -> Option<Bytes> {
        let mut chunks = std::mem::take(&mut self.chunks);
        let out = match chunks.len() {
            0 => None,
            1 => chunks.pop().and_then(|chunk| self.forward(chunk)),
            _ => {
                let mut bytes = Vec::new();
                for chunk in chunks.drain(..) {
                    if self.ended.is_some() {
                        break;
                    }
                    if let Some(event) = self.forward(chunk) {
                        bytes.extend_from_slice(&event);
                    }
                }
                (!bytes.is_empty()).then(|| Bytes::from(bytes))
            }
        };
        self.chunks = chunks;
        out
    }

    /// One normalised chunk to the client: the model set to the target's, and the usage-only
    /// chunk Shield asked for kept back unless the client asked too.
    fn forward(&mut self, chunk: Chunk) -> Option<Bytes> {
        if let Err(reason) = self.output.check(&chunk.deltas) {
            return self.block(&reason);
        }
        for delta in &chunk.deltas {
            match delta {
                Delta::Text(text) => {
                    self.output_chars += text.len();
                    if let Some(captured) = &mut self.captured {
                        captured.push_str(text);
                    }
                    if self.resumer.is_some() {
                        self.sent_text.push_str(text);
                    }
                }
                Delta::Thinking(text) => self.output_chars += text.len(),
                Delta::ToolCall { .. } | Delta::ToolArguments { .. } => self.saw_tool_calls = true,
                Delta::Stop(stop) => self.stop = Some(*stop),
                _ => {}
            }
        }
        // A chunk that only reports usage reaches the client only when it asked for it.
        if chunk.deltas.is_empty() && chunk.usage && !self.wire.wants_usage_chunk() {
            return None;
        }
        let usage = self.usage_so_far();
        let c = &self.committed;
        let head = StreamHead { id: c.opened.decoder.message_id(), model: &c.model };
        self.wire.chunk(chunk, &head, usage)
    }

    fn finish(&mut self) -> Option<Bytes> {
        self.end(Ok(()));
        let usage = self.usage_so_far();
        Some(self.wire.done(usage))
    }

    /// What the upstream reported so far, or the estimate.
    fn usage_so_far(&self) -> TokenUsage {
        self.committed.opened.decoder.usage().unwrap_or_else(|| self.estimate())
    }

    /// An output guardrail or tool RBAC refused this chunk: it is not sent; the stream ends with
    /// a content-filter chunk carrying the reason, then `[DONE]`. Not a failure of the target.
    fn block(&mut self, reason: &str) -> Option<Bytes> {
        if let Some(context) = &self.context {
            context.ending("guardrail_blocked");
        }
        self.end(Ok(()));
        let guardrails = crate::guard::results_json("output", &self.output.results);
        let usage = self.usage_so_far();
        Some(self.wire.blocked(reason, &self.committed.model, serde_json::json!(guardrails), usage))
    }

    /// A failure after the commit point. With `stream_resume`, the request is re-issued and
    /// the stream goes on from a new upstream ([`crate::resume`]); otherwise, or when no
    /// candidate can continue it, the caller's error event naming this break ends it.
    async fn broken(&mut self, class: Class, why: &str) -> Option<Bytes> {
        let Some(resumer) = self.resumer.take() else { return self.break_off(class, why) };
        if self.saw_tool_calls || std::time::Instant::now() >= resumer.deadline {
            return self.break_off(class, why);
        }
        // The broken attempt ends here: failed after visible output, paid for what it made.
        let ms = self.committed.started.elapsed().as_millis() as u64;
        let c = &mut self.committed;
        if let Some(trace) = c.trace.take() {
            trace.failed(class, None, true);
        }
        c.run.record_break(class, ms);
        self.health.record(&c.tenant, &c.target, &c.breaker, c.permit, Err(class), ms);
        let (usage, estimated) = self.attempt_usage();
        self.paid.push(Paid::new(&self.committed.target, usage, self.committed.price.as_ref(), estimated));
        self.between_attempts = true;
        let c = &mut self.committed;
        let switch = resumer
            .resume(&c.target, &self.sent_text, self.prompt_chars, &self.health, &mut c.run, &mut self.paid)
            .await;
        self.resumer = Some(resumer);
        let Some(switch) = switch else {
            // Nothing could continue it: the error names the original break.
            self.resumer = None;
            return self.end_broken(class, why);
        };
        tracing::debug!(tenant = %c.tenant, from = %c.target, to = %switch.target, "stream resumed");
        c.target = switch.target;
        c.model = switch.model;
        c.opened = switch.opened;
        c.permit = switch.permit;
        c.started = switch.started;
        c.price = switch.price;
        c.breaker = switch.breaker;
        c.trace = Some(switch.trace);
        if let Some(captured) = &mut self.captured {
            // The span of the new attempt carries what the new attempt produced.
            captured.clear();
        }
        c.idle_timeout = switch.idle_timeout;
        self.between_attempts = false;
        self.output_chars = switch.read_chars;
        self.chunks = switch.first;
        self.forward_all()
    }

    /// The stream ends broken after a failed resume (the broken attempt is already recorded).
    fn end_broken(&mut self, class: Class, why: &str) -> Option<Bytes> {
        let message = format!("the stream from target `{}` broke: {why}", self.committed.target);
        self.finish_end(Err(class), false);
        Some(self.wire.broken(&message))
    }

    /// A failure after the commit point: the caller's error event, then its end.
    fn break_off(&mut self, class: Class, why: &str) -> Option<Bytes> {
        self.end(Err(class));
        let message = format!("the stream from target `{}` broke: {why}", self.committed.target);
        Some(self.wire.broken(&message))
    }

    fn end(&mut self, result: Result<(), Class>) {
        self.finish_end(result, true);
    }

    /// The stream's end. `current`: the attempt now streaming ends it (recorded and paid
    /// here); otherwise a resume failed and every attempt is already recorded and paid.
    fn finish_end(&mut self, result: Result<(), Class>, current: bool) {
        let ms = self.committed.started.elapsed().as_millis() as u64;
        let (usage, estimated) = self.attempt_usage();
        let c = &mut self.committed;
        if current {
            c.run.record_committed(result, ms);
            self.health.record(&c.tenant, &c.target, &c.breaker, c.permit, result, ms);
            match (c.trace.take(), result) {
                (Some(trace), Ok(())) => trace.answered(crate::observe::Answered {
                    model: &c.model,
                    id: c.opened.decoder.message_id(),
                    stop: self.stop,
                    usage: Some(usage),
                    text: self.captured.as_deref(),
                }),
                (Some(trace), Err(class)) => trace.failed(class, None, true),
                (None, _) => {}
            }
        } else {
            c.run.end_broken();
        }
        let halt = if result.is_ok() { Halt::Succeeded } else { Halt::VisibleOutput };
        let end = StreamEnd { halt, usage, estimated, malformed_events: self.malformed, broken: result.is_err() };
        if current {
            let c = &self.committed;
            self.paid.push(Paid::new(&c.target, end.usage, c.price.as_ref(), end.estimated));
        }
        self.finish_request(&end);
        self.ended = Some(end);
    }

    /// The request's one end ([`RequestContext::end`]): usage and cost of every attempt that
    /// produced an answer, metrics, provenance.
    fn finish_request(&mut self, end: &StreamEnd) {
        let Some(context) = self.context.take() else { return };
        let c = &self.committed;
        let last = self.paid.len().saturating_sub(1);
        let answered = self.paid.iter().enumerate().map(|(i, paid)| paid.answered(end.broken && i == last)).collect();
        context.end(Ending {
            target: Some(&c.target),
            answered,
            answered_at: Some(c.committed_at),
            malformed_events: end.malformed_events,
            ..Ending::of(end.halt, &c.run.attempts, &c.excluded, self.upstream_before_commit)
        });
    }
}

impl Relay {
    /// The current attempt's usage: the provider's final figure, or — reported only in part
    /// (a break before the end) or not at all — at least the estimate from what was relayed.
    fn attempt_usage(&self) -> (TokenUsage, bool) {
        let decoder = &self.committed.opened.decoder;
        match decoder.usage() {
            Some(usage) if decoder.usage_final() => (usage, false),
            Some(usage) => {
                let estimate = self.estimate();
                (TokenUsage { output: usage.output.max(estimate.output), ..usage }, true)
            }
            None => (self.estimate(), true),
        }
    }

    /// Usage estimated at 4 characters a token from the prompt and what was relayed.
    fn estimate(&self) -> TokenUsage {
        TokenUsage {
            input: (self.prompt_chars as u64).div_ceil(4),
            output: (self.output_chars as u64).div_ceil(4),
            ..TokenUsage::default()
        }
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        if self.ended.is_none() {
            // The client went away mid-stream: the upstream call is dropped with this relay.
            let c = &mut self.committed;
            c.run.cancel();
            if self.between_attempts {
                // Gone during a resume: the broken attempt is settled already.
                let end = StreamEnd {
                    halt: Halt::Cancelled,
                    usage: TokenUsage::default(),
                    estimated: true,
                    malformed_events: self.malformed,
                    broken: false,
                };
                self.finish_request(&end);
                return;
            }
            self.health.release(&c.tenant, &c.target, c.permit);
            let end = StreamEnd {
                halt: Halt::Cancelled,
                usage: self.estimate(),
                estimated: true,
                malformed_events: self.malformed,
                broken: false,
            };
            let c = &self.committed;
            self.paid.push(Paid::new(&c.target, end.usage, c.price.as_ref(), true));
            self.finish_request(&end);
        }
    }
}
