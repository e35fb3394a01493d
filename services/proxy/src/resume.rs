//! Resuming a stream that broke after its commit point (issue 17, route `stream_resume`).
//! The relay calls [`Resumer::resume`] instead of ending the client's stream with an error;
//! within the route's deadline it re-issues the request — first to the target that broke,
//! then to the next eligible ones of the run's plan — and hands back a new upstream stream
//! positioned after the text the client already has:
//!
//! * `regenerate`: the new answer is read but withheld until it has reproduced that text
//!   (whitespace-normalised, shield-core's [`Reproduction`]); then only the rest goes on. An
//!   answer that diverges, or ends first, is never shown: the next candidate is tried.
//! * `continue`: on a target declaring `capabilities.assistant_prefill`, the text already sent
//!   goes as a trailing assistant message and the continuation streams straight on. A target
//!   that refuses the prefill (a 400) is regenerated on instead; the caller never sees that
//!   refusal.
//!
//! Every resumed attempt is recorded (`resumed: true`), counted and paid; streams that carried
//! tool calls are not resumed (the relay decides).

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use serde_json::{Value, json};
use shield_core::breaker::{BreakerSettings, Permit};
use shield_core::outcome::Class;
use shield_core::resume::{Reproduction, Verdict};
use shield_core::route::StreamResume;
use shield_core::target::{Price, Target};
use shield_core::usage::TokenUsage;

use crate::body::ChatRequest;
use crate::dispatch::prepare_for;
use crate::egress::{Egress, Opened};
use crate::health::{Health, HeldPermit};
use crate::observe::{AttemptTrace, Observer};
use crate::provider::{Chunk, Decoded};
use crate::tenant::TenantConfig;
use crate::usage::Paid;
use shield_core::chat_request::Origin;
use shield_core::exchange::{Delta, Message, Part, Role};

/// What a relay needs to re-issue its request (kept only when the route resumes streams).
pub struct Resumer {
    pub mode: StreamResume,
    pub egress: Egress,
    pub tenant: Arc<TenantConfig>,
    pub request: ChatRequest,
    pub upstream_key: Option<String>,
    /// The request's id, sent with every resume attempt too.
    pub request_id: Option<http::HeaderValue>,
    pub next_hop: u32,
    pub deadline: Instant,
    /// The run's planned order; resuming starts at the target that broke.
    pub order: Vec<String>,
    /// The request's SERVER span and the metrics, for each resume attempt's observations.
    pub parent: Option<opentelemetry::Context>,
    pub metrics: Arc<crate::metrics::Metrics>,
    pub route: String,
}

/// The stream the relay goes on with.
pub struct Switch {
    pub target: String,
    pub model: String,
    pub opened: Opened,
    pub permit: Permit,
    pub started: Instant,
    pub price: Option<Price>,
    pub breaker: BreakerSettings,
    pub idle_timeout: Duration,
    /// Normalised chunks to pass on first (the remainder after what the client has).
    pub first: Vec<Chunk>,
    /// Characters the new answer produced so far, withheld ones included (for estimates).
    pub read_chars: usize,
    /// The resume attempt's span and metrics, finished when the stream ends.
    pub trace: AttemptTrace,
}

/// How one resume attempt went.
enum Tried {
    Resumed(Box<Switch>),
    Failed { class: Class, status: Option<u16>, read_chars: usize },
}

impl Resumer {
    /// Candidates: the target that broke, then the ones after it in the plan.
    fn candidates(&self, broke: &str) -> Vec<String> {
        let from = self.order.iter().position(|t| t == broke).unwrap_or(0);
        let mut out = vec![broke.to_string()];
        out.extend(self.order.iter().skip(from + 1).filter(|t| *t != broke).cloned());
        out
    }

    /// Tries the candidates in turn; `None` when none could continue the stream. Each attempt
    /// is appended to `run` and, when it failed after producing text, paid in `paid`.
    pub async fn resume(
        &self,
        broke: &str,
        sent: &str,
        prompt_chars: usize,
        health: &Health,
        run: &mut shield_core::run::Run,
        paid: &mut Vec<Paid>,
    ) -> Option<Switch> {
        let tenant_id = self.tenant.snapshot.tenant.clone();
        for id in self.candidates(broke) {
            if Instant::now() >= self.deadline {
                break;
            }
            let Some(target) = self.tenant.target(&id) else { continue };
            let prefill = self.mode == StreamResume::Continue
                && target.capabilities.as_ref().and_then(|c| c.assistant_prefill) == Some(true);
            let n = run.attempts.len() as u32 + 1;
            let mut tried = self.try_target(target, &tenant_id, sent, prefill, health, n).await;
            if let (true, Some(Tried::Failed { class: Class::ClientError, status, .. })) = (prefill, &tried) {
                // The target refused the prefill: not the caller's error; regenerate on it.
                run.record_resumed(&id, &target.model, Err(Class::ClientError), *status, 0);
                tried = self.try_target(target, &tenant_id, sent, false, health, n + 1).await;
            }
            match tried {
                None => continue,
                Some(Tried::Resumed(switch)) => {
                    run.record_resumed(&id, &target.model, Ok(()), None, 0);
                    return Some(*switch);
                }
                Some(Tried::Failed { class, status, read_chars }) => {
                    run.record_resumed(&id, &target.model, Err(class), status, 0);
                    if read_chars > 0 {
                        let usage = TokenUsage {
                            input: (prompt_chars as u64).div_ceil(4),
                            output: (read_chars as u64).div_ceil(4),
                            ..TokenUsage::default()
                        };
                        paid.push(Paid::new(&id, usage, target.price.as_ref(), true));
                    }
                }
            }
        }
        None
    }

    /// One resume attempt at `target`; `None` when its breaker does not admit a call.
    async fn try_target(
        &self,
        target: &Target,
        tenant_id: &str,
        sent: &str,
        prefill: bool,
        health: &Health,
        n: u32,
    ) -> Option<Tried> {
        let permit = health.acquire(tenant_id, &target.id);
        if permit == Permit::Refused {
            return None;
        }
        let observer =
            Observer { parent: self.parent.as_ref(), metrics: &self.metrics, tenant: tenant_id, route: &self.route };
        let endpoint = self.tenant.endpoint(&target.id).ok().map(|e| &e.url);
        let mut trace = Some(AttemptTrace::start(observer, target, n, false, true, &self.request, endpoint));
        let trace_context = trace.as_ref().and_then(|t| t.context().cloned());
        let mut held = HeldPermit::new(health, tenant_id, &target.id, permit);
        let started = Instant::now();
        let settings = target.breaker();
        let mut fail = |class, status, read_chars| {
            if let Some(trace) = trace.take() {
                trace.failed(class, status, false);
            }
            let permit = held.take();
            health.record(tenant_id, &target.id, &settings, permit, Err(class), started.elapsed().as_millis() as u64);
            Some(Tried::Failed { class, status, read_chars })
        };
        let request = if prefill { with_prefill(&self.request, sent) } else { self.request.clone() };
        let outgoing = crate::dispatch::Sent {
            upstream_key: self.upstream_key.as_deref(),
            next_hop: self.next_hop,
            request_id: self.request_id.as_ref(),
            trace: trace_context.as_ref(),
        };
        let prepared = prepare_for(&self.tenant, &self.egress, &request, outgoing, target, true).await;
        let (provider, url, headers, body) = match prepared {
            Ok(prepared) => prepared,
            Err(failure) => return fail(failure.class, failure.status, 0),
        };
        let remaining = self.deadline.saturating_duration_since(Instant::now());
        let first_byte = remaining.min(Duration::from_secs(u64::from(target.first_byte_timeout_s())));
        let mut opened =
            match self.egress.open_stream(provider, &url, target.allow_private, headers, body, first_byte).await {
                Ok(opened) => opened,
                Err(failure) => return fail(failure.class, failure.status, 0),
            };
        let idle = Duration::from_secs(u64::from(target.idle_timeout_s));
        let mut first = std::mem::take(&mut opened.first);
        let (first, read_chars) = if prefill {
            // The prefill went without the sent text's trailing whitespace, which the client
            // has: a continuation that starts with whitespace would double it.
            if sent.ends_with(char::is_whitespace) {
                trim_leading_whitespace(&mut first);
            }
            let chars = first.iter().map(text_len).sum();
            (first, chars)
        } else {
            match reproduce(&mut opened, first, sent, idle, self.deadline).await {
                Ok(pair) => pair,
                // A different answer is not the target's failure (sampling differs): the
                // permit goes back without counting against its breaker.
                Err(read_chars) => {
                    if let Some(trace) = trace.take() {
                        trace.failed(Class::BadResponse, None, false);
                    }
                    return Some(Tried::Failed { class: Class::BadResponse, status: None, read_chars });
                }
            }
        };
        let permit = held.take();
        // Always there: only a failure above takes it.
        let mut trace = trace.take()?;
        trace.first_chunk();
        Some(Tried::Resumed(Box::new(Switch {
            target: target.id.clone(),
            model: target.model.clone(),
            opened,
            permit,
            started,
            price: target.price.clone(),
            breaker: settings,
            idle_timeout: idle,
            first,
            read_chars,
            trace,
        })))
    }
}

/// Drops the whitespace a continuation starts with (in its first chunk with text). A chunk
/// Shield rewrites goes out rendered from its deltas, never as the provider sent it.
fn trim_leading_whitespace(chunks: &mut [Chunk]) {
    for chunk in chunks {
        let mut changed = false;
        for delta in &mut chunk.deltas {
            let Delta::Text(text) = delta else { continue };
            let trimmed = text.trim_start();
            if trimmed.len() != text.len() {
                *text = trimmed.to_string();
                changed = true;
            }
            if !text.is_empty() {
                if changed {
                    chunk.openai = None;
                }
                return;
            }
        }
        if changed {
            chunk.openai = None;
        }
    }
}

/// The assistant text a chunk adds.
fn text_of(chunk: &Chunk) -> String {
    chunk
        .deltas
        .iter()
        .filter_map(|d| match d {
            Delta::Text(text) => Some(text.as_str()),
            _ => None,
        })
        .collect()
}

fn text_len(chunk: &Chunk) -> usize {
    chunk.deltas.iter().map(|d| if let Delta::Text(text) = d { text.len() } else { 0 }).sum()
}

/// The chunk with its text replaced by `text` (none when empty), rendered from its deltas.
fn with_text(chunk: Chunk, text: String) -> Chunk {
    let mut deltas: Vec<Delta> = Vec::with_capacity(chunk.deltas.len() + 1);
    if !text.is_empty() {
        deltas.push(Delta::Text(text));
    }
    deltas.extend(chunk.deltas.into_iter().filter(|d| !matches!(d, Delta::Text(_))));
    Chunk { deltas, usage: chunk.usage, openai: None }
}

/// The request with the text already sent as a trailing assistant message (trailing
/// whitespace trimmed: providers refuse a prefill that ends in whitespace).
fn with_prefill(request: &ChatRequest, sent: &str) -> ChatRequest {
    let mut request = request.clone();
    let sent = sent.trim_end();
    let exchange = std::sync::Arc::make_mut(&mut request.exchange);
    exchange.messages.to_mut().push(Message { role: Role::Assistant, content: vec![Part::Text(sent.into())] });
    // The caller's body as sent goes to targets of its own shape: there too.
    let prefill = json!({"role": "assistant", "content": sent});
    let messages = match &mut request.origin {
        Origin::OpenAi(body) => std::sync::Arc::make_mut(body).fields_mut().get_mut("messages"),
        Origin::Anthropic(origin) => std::sync::Arc::make_mut(origin).original_mut().get_mut("messages"),
        // Not sent as such to any provider: the typed request carries it.
        Origin::Responses(_) => None,
    };
    if let Some(Value::Array(messages)) = messages {
        messages.push(prefill);
    }
    request
}

/// Reads the new answer until it has reproduced `sent`; returns the chunks to pass on (the
/// remainder) and the characters read, or `Err(characters read)` when it diverged or ended.
async fn reproduce(
    opened: &mut Opened,
    first: Vec<Chunk>,
    sent: &str,
    idle: Duration,
    deadline: Instant,
) -> Result<(Vec<Chunk>, usize), usize> {
    let mut reproduction = Reproduction::new(sent);
    let mut read = 0;
    let mut chunks = first;
    loop {
        let mut out = Vec::new();
        let mut iter = std::mem::take(&mut chunks).into_iter();
        for chunk in iter.by_ref() {
            if chunk.deltas.iter().any(|d| matches!(d, Delta::ToolCall { .. } | Delta::ToolArguments { .. })) {
                return Err(read);
            }
            let text = text_of(&chunk);
            read += text.len();
            match reproduction.feed(&text) {
                Verdict::Diverged => return Err(read),
                Verdict::Pending => {
                    // Withheld. A finish on it ends the answer here: a resume only if the
                    // answer said exactly what was sent (then the finish goes on, textless).
                    if chunk.deltas.iter().any(|d| matches!(d, Delta::Stop(_))) {
                        if reproduction.finish() != Verdict::Reproduced(String::new()) {
                            return Err(read);
                        }
                        out.push(with_text(chunk, String::new()));
                    }
                }
                Verdict::Reproduced(rest) => out.push(with_text(chunk, rest)),
            }
            if reproduction.is_reproduced() {
                out.extend(iter.by_ref());
                return Ok((out, read));
            }
        }
        let next =
            tokio::time::timeout(idle.min(deadline.saturating_duration_since(Instant::now())), opened.rest.next());
        match next.await {
            Ok(Some(Ok(event))) => match opened.decoder.decode(&event.event, &event.data, &mut chunks) {
                Decoded::Continue => {}
                Decoded::Malformed => opened.malformed += 1,
                Decoded::Done => {
                    // The answer ended: it is a resume only if it said exactly what was sent.
                    return match reproduction.finish() {
                        Verdict::Reproduced(_) => Ok((Vec::new(), read)),
                        _ => Err(read),
                    };
                }
                Decoded::Error(..) => return Err(read),
            },
            _ => return Err(read),
        }
    }
}
