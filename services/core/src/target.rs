//! Targets (seed §3.1 plus ROUTING.md): a provider endpoint, a model and a credential.
//! A target body carries at most a *reference* to a secret, never a secret.

use serde::{Deserialize, Serialize};

use crate::money::Usd;
use crate::profile::Profile;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Target {
    /// Taken from the path on write; when present in the body it must match.
    #[serde(default)]
    pub id: String,
    #[serde(default)]
    pub name: String,
    pub base_url: String,
    #[serde(default)]
    pub flavor: Flavor,
    pub model: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub azure: Option<Azure>,
    /// Flavor `anthropic` only; omitted: the defaults.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub anthropic: Option<Anthropic>,
    /// Flavor `bedrock` only: the AWS region requests are signed for, when the base URL's
    /// host does not name it (`bedrock-runtime.{region}.amazonaws.com` does).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bedrock: Option<Bedrock>,
    /// Flavor `vertex` only: which publisher's models the target serves; omitted: Google's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vertex: Option<Vertex>,
    #[serde(default)]
    pub auth: Auth,
    #[serde(default)]
    pub location: Location,
    #[serde(default)]
    pub allow_private: bool,
    #[serde(default = "defaults::timeout_s")]
    pub timeout_s: u32,
    /// Omitted: min(20, `timeout_s`), filled in when the target is stored, so a read shows the
    /// effective value and a default never contradicts a `timeout_s` the user set (issue 14).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_byte_timeout_s: Option<u32>,
    #[serde(default = "defaults::idle_timeout_s")]
    pub idle_timeout_s: u32,
    /// This target's circuit breaker; omitted: the seed's 5 failures / 60 s window / 30 s open
    /// / 10 s probe interval.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub breaker: Option<crate::breaker::BreakerSettings>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub price: Option<Price>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capabilities: Option<Capabilities>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile: Option<Profile>,
    /// Merged into the upstream body (e.g. OpenRouter `provider` preferences).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub extra_body: Option<serde_json::Map<String, serde_json::Value>>,
    #[serde(default = "defaults::yes")]
    pub enabled: bool,
    /// Set by the server (unix seconds); ignored on input.
    #[serde(default)]
    pub updated_at: i64,
    /// Set by the server; ignored on input.
    #[serde(default)]
    pub updated_by: String,
}

impl Target {
    /// The publisher of a Vertex target's model (Google's when unset).
    pub fn vertex_publisher(&self) -> Publisher {
        self.vertex.as_ref().map(|v| v.publisher).unwrap_or_default()
    }

    /// The region of a Bedrock target: as configured, else the one its host names
    /// (`bedrock-runtime.{region}.amazonaws.com`, also `bedrock-runtime-fips.…`).
    pub fn bedrock_region(&self) -> Option<String> {
        if let Some(region) = self.bedrock.as_ref().and_then(|b| b.region.clone()) {
            return Some(region);
        }
        let host = url::Url::parse(&self.base_url).ok()?.host_str()?.to_ascii_lowercase();
        let mut labels = host.split('.');
        let service = labels.next()?;
        let region = labels.next()?;
        let rest: Vec<&str> = labels.collect();
        let aws = rest.first() == Some(&"amazonaws") || rest.get(1) == Some(&"amazonaws");
        (service.starts_with("bedrock-runtime") && aws && !region.is_empty()).then(|| region.to_string())
    }

    /// Whether the target takes `flavor`'s request body as its own: its flavor's, and Claude on
    /// Vertex AI takes Anthropic's Messages body (so Anthropic-only fields reach it too).
    pub fn speaks(&self, flavor: Flavor) -> bool {
        self.flavor == flavor
            || (flavor == Flavor::Anthropic
                && self.flavor == Flavor::Vertex
                && self.vertex_publisher() == Publisher::Anthropic)
    }

    /// The breaker settings in force for this target.
    pub fn breaker(&self) -> crate::breaker::BreakerSettings {
        self.breaker.unwrap_or_default()
    }

    /// How long a streamed attempt may wait for its first event (ROUTING.md streaming).
    pub fn first_byte_timeout_s(&self) -> u32 {
        self.first_byte_timeout_s.unwrap_or_else(|| defaults::first_byte_timeout_s(self.timeout_s))
    }

    /// Whether `first_byte_timeout_s` is what its default would be: an editor that changes
    /// `timeout_s` without showing it lets it follow (omits it) rather than contradict.
    pub fn first_byte_follows_timeout(&self) -> bool {
        self.first_byte_timeout_s() == defaults::first_byte_timeout_s(self.timeout_s)
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Flavor {
    #[default]
    Openai,
    Azure,
    /// Anthropic's Messages API (`POST {base_url}/messages`).
    Anthropic,
    /// Google's Gemini API (`POST {base_url}/models/{model}:generateContent`, base URL
    /// `https://generativelanguage.googleapis.com/v1beta`).
    Gemini,
    /// Amazon Bedrock's Converse API (`POST {base_url}/model/{model}/converse`, base URL
    /// `https://bedrock-runtime.{region}.amazonaws.com`), signed with SigV4 or a Bedrock API key.
    Bedrock,
    /// Google Cloud's Vertex AI (`{base_url}/publishers/{publisher}/models/{model}:…`, base URL
    /// `https://{region}-aiplatform.googleapis.com/v1/projects/{project}/locations/{region}`),
    /// with OAuth tokens the gateway gets for a service account.
    Vertex,
}

impl Flavor {
    /// The credential header when the target's `auth` names none: Anthropic takes the key
    /// bare in `x-api-key` (and no `Authorization` header then); the others `Authorization:
    /// Bearer`.
    pub fn default_auth(self) -> (&'static str, &'static str) {
        match self {
            Flavor::Anthropic => ("x-api-key", ""),
            Flavor::Gemini => ("x-goog-api-key", ""),
            Flavor::Openai | Flavor::Azure | Flavor::Bedrock | Flavor::Vertex => ("Authorization", "Bearer"),
        }
    }
}

/// Options of an Anthropic-flavoured target.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Anthropic {
    /// Sent as `anthropic-version` when the caller sent none (a caller in Anthropic's shape
    /// has its own forwarded).
    #[serde(default = "defaults::anthropic_version")]
    pub version: String,
    /// `anthropic-beta` flags never forwarded to this target (e.g. ones its platform refuses);
    /// every other flag the caller sends reaches it verbatim.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub strip_beta: Vec<String>,
}

impl Default for Anthropic {
    fn default() -> Self {
        Anthropic { version: defaults::anthropic_version(), strip_beta: Vec::new() }
    }
}

/// Options of a Bedrock target.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Bedrock {
    /// The AWS region (e.g. `us-east-1`); required when the base URL's host does not name it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,
}

/// Options of a Vertex AI target.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Vertex {
    #[serde(default)]
    pub publisher: Publisher,
}

/// Whose models a Vertex AI target calls: Google's (Gemini, `:generateContent`) or
/// Anthropic's (Claude, `:rawPredict` with the Messages body).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Publisher {
    #[default]
    Google,
    Anthropic,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Azure {
    #[serde(default)]
    pub deployment: String,
    #[serde(default)]
    pub api_version: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Auth {
    pub mode: AuthMode,
    /// Omitted: the flavor's ([`Flavor::default_auth`]), filled in when the target is stored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub header: Option<String>,
    /// Omitted: the flavor's; empty sends the key bare.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheme: Option<String>,
    /// `shield://<secret name>`; vault mode only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_ref: Option<String>,
}

impl Default for Auth {
    fn default() -> Self {
        Auth { mode: AuthMode::None, header: None, scheme: None, secret_ref: None }
    }
}

impl Auth {
    /// The header and scheme a credential goes in for a target of `flavor`.
    pub fn header_and_scheme(&self, flavor: Flavor) -> (&str, &str) {
        let (header, scheme) = flavor.default_auth();
        (self.header.as_deref().unwrap_or(header), self.scheme.as_deref().unwrap_or(scheme))
    }

    /// The secret name a vault reference points at (`shield://openai_prod` → `openai_prod`).
    pub fn secret_name(&self) -> Option<&str> {
        self.secret_ref.as_deref().and_then(|r| r.strip_prefix(SECRET_REF_SCHEME))
    }
}

pub const SECRET_REF_SCHEME: &str = "shield://";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum AuthMode {
    Vault,
    Passthrough,
    None,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Location {
    #[default]
    Cloud,
    OnPrem,
}

/// USD per million tokens.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Price {
    pub input_per_mtok: Usd,
    pub output_per_mtok: Usd,
    /// Prompt tokens read from the provider's cache; omitted: `input_per_mtok`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<f64>)]
    pub cache_read_per_mtok: Option<Usd>,
    /// Prompt tokens written to the provider's cache; omitted: `input_per_mtok`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<f64>)]
    pub cache_write_per_mtok: Option<Usd>,
    #[serde(default = "defaults::currency")]
    pub currency: String,
}

/// What a target can take. Unset means "not declared", which admits.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Capabilities {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context_window: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_output_tokens: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<bool>,
    /// It continues a trailing assistant message (`stream_resume: "continue"`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub assistant_prefill: Option<bool>,
    /// It has a reasoning control (OpenAI's `reasoning_effort` for `openai`/`azure` targets): a
    /// caller's `thinking` or `output_config.effort` maps to it rather than being dropped.
    /// Anthropic targets take the caller's own fields.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning: Option<bool>,
    /// An `anthropic` target's model takes `role: "system"` messages inside `messages` where
    /// they stand (Anthropic accepts them on some models only); otherwise each is folded into
    /// the user turn before it. Other flavors always take them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system_messages: Option<bool>,
}

pub(crate) mod defaults {
    pub fn timeout_s() -> u32 {
        60
    }
    /// 20 s, but never more than the whole call may take (and at least 1 s).
    pub fn first_byte_timeout_s(timeout_s: u32) -> u32 {
        timeout_s.clamp(1, 20)
    }
    pub fn idle_timeout_s() -> u32 {
        15
    }
    pub fn yes() -> bool {
        true
    }
    pub fn anthropic_version() -> String {
        "2023-06-01".into()
    }
    pub fn currency() -> String {
        "USD".into()
    }
}
