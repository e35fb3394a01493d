//! How a committed stream reaches the client: the relay hands each typed chunk (and the
//! stream's end, break or block) to the caller's endpoint's [`ClientWire`], which writes it
//! in the caller's own API shape. No endpoint reaches into another's renderer.

use bytes::Bytes;
use serde_json::Value;
use shield_core::usage::TokenUsage;

use crate::provider::Chunk;

/// What every event of a stream names: the provider's message id and the answering model.
pub struct StreamHead<'a> {
    pub id: &'a str,
    pub model: &'a str,
}

/// A caller's stream format.
pub trait ClientWire: Send {
    /// One upstream event's chunk; `usage` is what the upstream reported so far (or an
    /// estimate). `None`: nothing to send for it.
    fn chunk(&mut self, chunk: Chunk, head: &StreamHead<'_>, usage: TokenUsage) -> Option<Bytes>;
    /// The answer is complete.
    fn done(&mut self, usage: TokenUsage) -> Bytes;
    /// The upstream failed after the commit point; `message` says how (names the target).
    fn broken(&mut self, message: &str) -> Bytes;
    /// Shield refused the rest of the answer (output guardrail, tool RBAC).
    fn blocked(&mut self, reason: &str, model: &str, guardrails: Value, usage: TokenUsage) -> Bytes;
    /// Whether a chunk that only reports usage (Shield asked the upstream for it) reaches
    /// [`Self::chunk`].
    fn wants_usage_chunk(&self) -> bool;
    /// Work to finish before the stream's last bytes go out (the Responses shape keeps a
    /// stored response here, so the caller's next turn finds it on any proxy).
    fn before_end(&mut self) -> Option<futures_util::future::BoxFuture<'static, ()>> {
        None
    }
}
