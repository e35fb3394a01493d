//! The provider seam: one adapter per target `flavor` owns everything about a provider's wire
//! format, and nothing else in the request path knows it.
//!
//! An adapter builds the request (URL, headers, body) from the caller's chat request,
//! authenticates it (a hook that sees the final body, so a signing provider fits), parses a
//! 2xx answer into the typed answer ([`shield_core::exchange::Answer`]), decodes the upstream's
//! stream events into typed deltas ([`StreamDecoder`], [`Chunk`]), and turns an error answer
//! (status, headers, body) into a failure class with its reset hint. Planning, the attempt
//! loop, breakers, guardrails, the relay and accounting see only the typed answer and deltas,
//! with usage as [`TokenUsage`].
//!
//! The one exception is the same shape on both sides: a target's answer is kept as sent
//! beside the typed one (an OpenAI-flavour target's stream chunks too), and a caller of that
//! shape gets it with only `model` set, so fields the typed answer does not model (several
//! choices, `logprobs`, `system_fingerprint`; Anthropic's server-tool blocks and citations)
//! are not lost there and no answer is rebuilt.
//!
//! Adding a provider: one module implementing [`Provider`], one arm in [`for_target`], its
//! tests. Adapters never log a header value or a body.

mod anthropic;
pub mod as_sent;
mod bedrock;
mod gemini;
mod openai;
#[cfg(test)]
mod texts_strategy;
mod vertex;

pub use anthropic::AnthropicAnswer;
pub use openai::{NativeChunk, OpenAiAnswer};

use http::header::{HeaderMap, HeaderName, HeaderValue};
use shield_core::exchange::{self, Delta};
use shield_core::outcome::Class;
use shield_core::spliced::Spliced;
use shield_core::target::{Flavor, Publisher, Target};
use shield_core::usage::TokenUsage;
use url::Url;

use crate::body::ChatRequest;
use crate::egress::{Egress, Failure};

/// A 2xx answer, parsed.
#[derive(Debug)]
pub struct Answer {
    pub body: Completion,
    /// What the provider reported; `None` when it reported nothing usable (then estimated).
    pub usage: Option<TokenUsage>,
}

/// An answer, typed, and as the upstream sent it (for a caller of the upstream's own shape).
#[derive(Debug)]
pub struct Completion {
    pub answer: exchange::Answer,
    pub native: Option<Native>,
}

/// An answer as its upstream sent it.
#[derive(Debug)]
pub enum Native {
    /// An OpenAI-flavour target's `chat.completion`.
    OpenAi(OpenAiAnswer),
    /// An Anthropic target's `message` (server-tool blocks and citations the typed answer
    /// does not model included).
    Anthropic(AnthropicAnswer),
}

/// What one upstream stream event came to: typed deltas, whether it reported usage, and (from
/// an OpenAI-flavour target) the chunk as sent.
#[derive(Debug, Default, Clone)]
pub struct Chunk {
    pub deltas: Vec<Delta>,
    /// The event carried a usage report (read into the decoder's [`StreamDecoder::usage`]).
    pub usage: bool,
    /// The `chat.completion.chunk` as an OpenAI-flavour target sent it.
    pub openai: Option<NativeChunk>,
}

impl Chunk {
    pub fn of(deltas: Vec<Delta>) -> Chunk {
        Chunk { deltas, ..Chunk::default() }
    }
}

/// A target's credential, prepared once per snapshot version by its adapter's
/// [`Provider::credential`] and applied per request by its [`Provider::authenticate`]. Never
/// formatted: `Debug` hides the value.
#[derive(Clone)]
pub struct Credential(Secret);

/// What a credential is: a header (an API key, a bearer token), an AWS key pair that signs
/// each request, or a Google service account exchanged for short-lived tokens.
#[derive(Clone)]
enum Secret {
    Header { header: HeaderName, value: HeaderValue },
    Aws(std::sync::Arc<bedrock::AwsKeys>),
    Google(std::sync::Arc<vertex::TokenSource>),
}

impl std::fmt::Debug for Credential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match &self.0 {
            Secret::Header { header, .. } => header.as_str(),
            Secret::Aws(_) => "aws-sigv4",
            Secret::Google(_) => "google-service-account",
        };
        f.debug_struct("Credential").field("kind", &kind).finish_non_exhaustive()
    }
}

impl Credential {
    /// `{header}: {scheme} {key}` (the bare key when the scheme is empty), marked sensitive so
    /// no HTTP layer logs it. `None` when the key cannot be a header value.
    pub fn new(header: &str, scheme: &str, key: &str) -> Option<Credential> {
        let header = HeaderName::from_bytes(header.as_bytes()).ok()?;
        let text = if scheme.is_empty() { key.to_string() } else { format!("{scheme} {key}") };
        let mut value = HeaderValue::from_str(&text).ok()?;
        value.set_sensitive(true);
        Some(Credential(Secret::Header { header, value }))
    }

    /// The credential of a target of this flavor, in the header its `auth` names (or the
    /// flavor's default).
    pub fn for_target(target: &Target, key: &str) -> Option<Credential> {
        let (header, scheme) = target.auth.header_and_scheme(target.flavor);
        Credential::new(header, scheme, key)
    }

    /// The credential as it goes on a request now: itself, or (a service account) the access
    /// token it is exchanged for, fetched or refreshed first when the cached one is near its
    /// end. The exchange goes through `egress`, under the target's `allow_private`.
    pub async fn current(
        &self,
        egress: &Egress,
        allow_private: bool,
    ) -> Result<std::borrow::Cow<'_, Credential>, Failure> {
        match &self.0 {
            Secret::Google(source) => {
                let value = source.token(egress, allow_private).await?;
                Ok(std::borrow::Cow::Owned(Credential(Secret::Header { header: http::header::AUTHORIZATION, value })))
            }
            _ => Ok(std::borrow::Cow::Borrowed(self)),
        }
    }

    /// Puts a header credential on a request; other kinds are their adapter's to apply.
    fn insert_header(&self, headers: &mut HeaderMap) {
        if let Secret::Header { header, value } = &self.0 {
            headers.insert(header.clone(), value.clone());
        }
    }
}

/// What one upstream SSE event came to.
#[derive(Debug, PartialEq)]
pub enum Decoded {
    /// Go on; any chunks were appended to the caller's buffer.
    Continue,
    /// The provider said the answer is complete (`[DONE]`, `message_stop`).
    Done,
    /// Not an event this provider sends (not JSON, or not its shape): dropped and counted.
    Malformed,
    /// The provider reported an error inside the stream.
    Error(Class, Vec<u8>),
}

/// Turns one provider's stream events into typed chunks, keeping what it needs across events
/// (the message id, tool-call indices, usage).
pub trait StreamDecoder: Send {
    /// Decodes one event (`event` is the SSE `event:` name, empty when absent), appending the
    /// chunks it yields to `out`.
    fn decode(&mut self, event: &str, data: &str, out: &mut Vec<Chunk>) -> Decoded;
    /// The provider's id for the message, once an event said it (empty until then).
    fn message_id(&self) -> &str;
    /// The usage reported so far.
    fn usage(&self) -> Option<TokenUsage>;
    /// Whether [`Self::usage`] is the provider's final figure (a stream that broke before it
    /// is billed at least what was estimated from the text relayed).
    fn usage_final(&self) -> bool;
}

/// One event of an upstream stream, however the provider frames it (SSE's `event:` name, or
/// a binary frame's event type; empty when absent), with its payload as text.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Frame {
    pub event: String,
    pub data: String,
}

/// An upstream stream's frames, in order.
pub type Frames = std::pin::Pin<Box<dyn futures_util::Stream<Item = Result<Frame, String>> + Send>>;

/// An upstream stream's body, as its bytes arrive.
pub type BodyBytes = std::pin::Pin<Box<dyn futures_util::Stream<Item = Result<bytes::Bytes, String>> + Send>>;

/// Server-sent events: what OpenAI and Anthropic stream in.
pub fn sse_frames(body: BodyBytes) -> Frames {
    use eventsource_stream::Eventsource;
    use futures_util::StreamExt;
    Box::pin(body.eventsource().map(|event| match event {
        Ok(event) => Ok(Frame { event: event.event, data: event.data }),
        Err(err) => Err(err.to_string()),
    }))
}

/// One provider's wire format. Implementations are stateless; per-stream state lives in the
/// [`StreamDecoder`] they make.
///
/// What a provider may need beyond the common case is a hook here with a default: its URL per
/// call ([`Self::call_url`], for a model or a method in the path), signing over the final
/// request ([`Self::authenticate`] sees the URL, headers and body), its stream framing
/// ([`Self::frames`], SSE by default), its error dialect ([`Self::failure`]).
pub trait Provider: Sync {
    /// The chat endpoint of `target` (built once per snapshot version).
    fn endpoint(&self, target: &Target) -> Result<Url, &'static str>;

    /// The URL of one call: the endpoint, unless the provider's path depends on the call (a
    /// streaming method of its own, say).
    fn call_url<'u>(&self, endpoint: &'u Url, _stream: bool) -> std::borrow::Cow<'u, Url> {
        std::borrow::Cow::Borrowed(endpoint)
    }

    /// A streamed answer's body as frames: server-sent events unless the provider frames its
    /// streams otherwise (a binary event stream, say).
    fn frames(&self, body: BodyBytes) -> Frames {
        sse_frames(body)
    }

    /// The request body for `target`. `stream` asks for a stream (and the provider's usage in
    /// it). A body relayed as sent keeps slices of the caller's own bytes ([`Spliced`]).
    fn body(&self, request: &ChatRequest, target: &Target, stream: bool) -> Spliced;

    /// Headers a request to `target` carries besides the credential and the hop (e.g.
    /// Anthropic's `anthropic-version` and the caller's `anthropic-beta` flags).
    fn headers(&self, _target: &Target, _request: &ChatRequest, _headers: &mut HeaderMap) {}

    /// The caller's fields that [`Self::body`] had no place for on `target` (named to the
    /// caller in `X-Shield-Dropped-Fields` when this target answers).
    fn dropped(&self, _request: &ChatRequest, _target: &Target) -> Vec<String> {
        Vec::new()
    }

    /// The credential a target's vault secret makes (decrypted, bound to the target's host):
    /// by default the secret is a key sent in the target's `auth` header. A provider whose
    /// secret is structured (an AWS key pair, a service account) reads it here, once per
    /// snapshot version; `Err` says why it cannot be used (logged; the target is excluded).
    fn credential(&self, target: &Target, secret: &str) -> Result<Credential, &'static str> {
        Credential::for_target(target, secret).ok_or("secret is not a valid header value")
    }

    /// Puts the credential on the request. Sees the final URL, headers and body, so a provider
    /// that signs requests (Bedrock SigV4) signs them here, on every attempt.
    fn authenticate(&self, credential: &Credential, _url: &Url, _body: &Spliced, headers: &mut HeaderMap) {
        credential.insert_header(headers);
    }

    /// A 2xx body as a typed answer; `None` when it is not an answer (bad response).
    fn answer(&self, body: Vec<u8>) -> Option<Answer>;

    /// A decoder for one streamed answer.
    fn decoder(&self) -> Box<dyn StreamDecoder>;

    /// An error answer as a failure class with its reset hint.
    fn failure(&self, status: u16, headers: &HeaderMap, body: Vec<u8>) -> Failure;
}

/// What a Gemini thought signature carries in the typed answer, so that a signature goes back
/// only to the provider that made it: Gemini refuses another provider's ("corrupted thought
/// signature"), and Anthropic refuses Gemini's.
pub(crate) const GEMINI_SIGNATURE: &str = "gemini:";

/// The adapter of a target: its flavor's, and for Vertex AI its model publisher's (Google's
/// models speak Gemini's body, Anthropic's the Messages body).
pub fn for_target(target: &Target) -> &'static dyn Provider {
    match target.flavor {
        Flavor::Openai => &openai::OPENAI,
        Flavor::Azure => &openai::AZURE,
        Flavor::Anthropic => &anthropic::ANTHROPIC,
        Flavor::Gemini => &gemini::GEMINI,
        Flavor::Bedrock => &bedrock::BEDROCK,
        Flavor::Vertex => match target.vertex_publisher() {
            Publisher::Google => &vertex::VERTEX_GEMINI,
            Publisher::Anthropic => &vertex::VERTEX_CLAUDE,
        },
    }
}

/// The adapter of an OpenAI-flavour target (the default path's, and tests').
pub const OPENAI: &dyn Provider = &openai::OPENAI;

/// `{base_url}{path}`: the target's base URL (already validated) with the provider's path.
fn join(target: &Target, path: &str) -> Result<Url, &'static str> {
    let base = shield_core::url_safety::parse_outbound_url(&target.base_url).map_err(|_| "invalid base_url")?;
    Url::parse(&format!("{}{path}", base.as_str().trim_end_matches('/'))).map_err(|_| "invalid base_url")
}

/// `{endpoint}{method}`: the URL of one call when the method follows the model in the path
/// (`:generateContent`, `/converse`); the endpoint itself if that is not a URL.
fn with_method<'u>(endpoint: &'u Url, method: &str) -> std::borrow::Cow<'u, Url> {
    match Url::parse(&format!("{}{method}", endpoint.as_str())) {
        Ok(url) => std::borrow::Cow::Owned(url),
        Err(_) => std::borrow::Cow::Borrowed(endpoint),
    }
}

/// A reset hint (`Retry-After`, `x-ratelimit-reset-*`) from a rate-limit or exhaustion
/// answer's headers, in milliseconds.
fn reset_hint(headers: &HeaderMap) -> Option<u64> {
    let pairs: Vec<(String, String)> =
        headers.iter().filter_map(|(k, v)| Some((k.as_str().to_string(), v.to_str().ok()?.to_string()))).collect();
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    shield_core::breaker::reset_hint_ms(&pairs, now)
}

/// About the length of the request's messages written in any shape: their text, their tool
/// calls, and room for their fields and a few escapes (a newline or a quote is two bytes written). A tool
/// call's arguments are JSON in a string, a quote escaped every few bytes (Claude Code's
/// `Write` and `Edit` carry whole files there): an eighth more.
pub(crate) fn history_size(request: &exchange::Request) -> usize {
    let calls: usize = (&request.messages)
        .into_iter()
        .flat_map(|message| &message.content)
        .map(|part| match part {
            exchange::Part::ToolUse { id, name, input } => id.len() + name.len() + input.len() + input.len() / 8 + 64,
            _ => 0,
        })
        .sum();
    let size = request.prompt_chars() + calls + 96 * (request.messages.len() + 1);
    size + size / 16
}
