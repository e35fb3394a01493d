//! Output guardrails and tool RBAC on answers and streams: shield-core's (pure, fuzzed by the
//! `sse_stream` target), re-exported where the proxy has always used them.

pub use shield_core::output_guard::*;
