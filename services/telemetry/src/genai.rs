//! The OpenTelemetry GenAI semantic conventions Shield follows: **v1.41.0** (the last release
//! with them in core semantic conventions; they have since moved to
//! `semantic-conventions-genai`, unreleased). Names are ours to keep here because the
//! `opentelemetry-semantic-conventions` crate marks its gen_ai constants deprecated ("moved").
//! A rename in a later convention is one edit in this module.

pub const OPERATION_NAME: &str = "gen_ai.operation.name";
pub const PROVIDER_NAME: &str = "gen_ai.provider.name";
pub const REQUEST_MODEL: &str = "gen_ai.request.model";
pub const REQUEST_STREAM: &str = "gen_ai.request.stream";
pub const REQUEST_MAX_TOKENS: &str = "gen_ai.request.max_tokens";
pub const REQUEST_TEMPERATURE: &str = "gen_ai.request.temperature";
pub const REQUEST_TOP_P: &str = "gen_ai.request.top_p";
pub const RESPONSE_MODEL: &str = "gen_ai.response.model";
pub const RESPONSE_ID: &str = "gen_ai.response.id";
pub const RESPONSE_FINISH_REASONS: &str = "gen_ai.response.finish_reasons";
pub const RESPONSE_TIME_TO_FIRST_CHUNK: &str = "gen_ai.response.time_to_first_chunk";
/// Input tokens including cache reads and writes (the conventions' rule for Anthropic,
/// applied to every provider so one sum means one thing).
pub const USAGE_INPUT_TOKENS: &str = "gen_ai.usage.input_tokens";
pub const USAGE_OUTPUT_TOKENS: &str = "gen_ai.usage.output_tokens";
pub const USAGE_CACHE_READ_INPUT_TOKENS: &str = "gen_ai.usage.cache_read.input_tokens";
/// v1.41's name; later conventions call it `gen_ai.usage.cache_write.input_tokens`.
pub const USAGE_CACHE_CREATION_INPUT_TOKENS: &str = "gen_ai.usage.cache_creation.input_tokens";
/// Opt-in content (`SHIELD_TRACE_CONTENT`): JSON strings on the attempt span.
pub const INPUT_MESSAGES: &str = "gen_ai.input.messages";
pub const OUTPUT_MESSAGES: &str = "gen_ai.output.messages";

pub const SERVER_ADDRESS: &str = "server.address";
pub const SERVER_PORT: &str = "server.port";
pub const ERROR_TYPE: &str = "error.type";

/// The operation every routed call is: a chat-style inference, whatever the wire.
pub const CHAT: &str = "chat";
