//! shield-core: the domain of Shield Gateway as plain data and pure functions.
//!
//! Everything worth testing exhaustively lives here: the configuration model (targets, routes,
//! rules, budgets, profiles), its validation, the snapshot the admin publishes and the proxy
//! reads, Redis key names and the vault's crypto. This crate never performs I/O, never reads a
//! clock and holds no global state: time, randomness and nonces are passed in.

// Issue 27: no byte-offset slicing of strings and no indexing that can panic on the request
// path (a slice inside a multi-byte character once crashed a guardrail). Each exception is an
// `#[allow]` with its reason.
#![cfg_attr(not(test), deny(clippy::string_slice, clippy::indexing_slicing))]

pub mod breaker;
pub mod chat_request;
pub mod detect;
pub mod error;
pub mod exchange;
pub mod guardrails;
pub mod json_read;
pub mod json_scan;
pub mod json_write;
pub mod key_access;
pub mod keyed_hash;
pub mod keys;
pub mod limits;
pub mod money;
pub mod names;
pub mod outcome;
pub mod output_guard;
pub mod parse;
pub mod plan;
pub mod profile;
pub mod read_before;
pub mod records;
pub mod remembered;
pub mod resume;
pub mod route;
pub mod run;
pub mod snapshot;
pub mod spliced;
pub mod target;
pub mod text;
pub mod url_safety;
pub mod usage;
pub mod validate;
pub mod vault;
pub mod verbatim;
pub mod verdicts;

pub use error::FieldError;

/// Seed §3.1: at most 50 targets per tenant.
pub const MAX_TARGETS_PER_TENANT: usize = 50;
/// Seed §3.2: at most 100 routes per tenant.
pub const MAX_ROUTES_PER_TENANT: usize = 100;
