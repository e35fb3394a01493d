//! The typed exchange: what a request and its answer are, whichever API shape they came in or
//! go out in.
//!
//! Each caller shape parses its requests into a [`Request`]; each provider adapter renders a
//! [`Request`] in its own wire format and parses its answers into an [`Answer`] (each stream
//! event into [`Delta`]s), which each caller shape renders into its own. The pipeline — output guardrails, tool RBAC, the stream's commit point, resume and
//! accounting — reads only these, so it holds for every shape. What one shape has that
//! another lacks is a variant here (thinking and its signature, for instance) or dropped by
//! the renderer that has no place for it, by a rule stated in that renderer.

pub use crate::text::Text;

/// A request, typed. The caller's body as sent travels beside it (an adapter of the caller's
/// own shape sends that, so nothing the caller asked for is lost on the same-shape path);
/// every other adapter renders this.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Request {
    /// The top-level system prompt, in parts, none empty (Anthropic's `system`; OpenAI's shape
    /// has none: its system messages stay in [`Request::messages`] where they stand). Typed
    /// when first read if it came in a large body ([`SystemPrompt`]).
    pub system: SystemPrompt,
    /// The conversation; typed when first read if it came in a large body ([`History`]).
    pub messages: History,
    /// Typed when first read if they came in a large body ([`Lazy`]).
    pub tools: ToolList,
    pub tool_choice: Option<ToolChoice>,
    /// `false`: at most one tool call per turn.
    pub parallel_tool_calls: Option<bool>,
    pub max_tokens: Option<u64>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub stop: Vec<String>,
    pub reasoning: Option<Reasoning>,
    /// The shape the answer must take (structured output).
    pub format: Option<Format>,
    pub stream: bool,
    /// An end-user id for the provider's abuse monitoring.
    pub user: Option<String>,
}

/// Structured output: OpenAI's `response_format` / the Responses API's `text.format`,
/// Anthropic's `output_config.format`.
#[derive(Debug, Clone, PartialEq)]
pub enum Format {
    /// Any JSON object (OpenAI's JSON mode; Anthropic has no such mode).
    JsonObject,
    /// JSON that matches `schema`.
    JsonSchema { name: String, schema: serde_json::Value, strict: Option<bool> },
}

impl Format {
    /// OpenAI's `json_schema` object or `json_object`, in either of its two spellings: Chat
    /// Completions nests the schema (`{type, json_schema: {name, schema, strict}}`), the
    /// Responses API does not (`{type, name, schema, strict}`). `None` for `text` or
    /// anything else.
    pub fn of_openai(format: &serde_json::Value) -> Option<Format> {
        match format.get("type").and_then(serde_json::Value::as_str)? {
            "json_object" => Some(Format::JsonObject),
            "json_schema" => {
                let spec = format.get("json_schema").unwrap_or(format);
                Some(Format::JsonSchema {
                    name: spec.get("name").and_then(serde_json::Value::as_str).unwrap_or("output").to_string(),
                    schema: spec.get("schema").cloned().unwrap_or_else(|| serde_json::json!({"type": "object"})),
                    strict: spec.get("strict").and_then(serde_json::Value::as_bool),
                })
            }
            _ => None,
        }
    }
}

impl Request {
    /// Every text the request carries, for the input guardrails: the system prompt, message
    /// text, tool results and thinking, and the text of parts other shapes cannot carry.
    pub fn text(&self) -> String {
        let mut text = String::new();
        for part in self.system.iter() {
            text.push_str(part);
            text.push('\n');
        }
        for message in self.messages.iter() {
            for part in &message.content {
                if let Some(said) = part.guarded_text() {
                    text.push_str(said);
                }
            }
            text.push('\n');
        }
        text
    }

    /// Characters of the prompt's text (system, message text and tool results): the basis of
    /// token estimates at 4 characters a token.
    pub fn prompt_chars(&self) -> usize {
        let system = match self.system.sent() {
            Some(sent) => sent.known.chars,
            None => self.system.iter().map(Text::len).sum(),
        };
        let messages = match self.messages.sent() {
            Some(sent) => sent.known.chars,
            None => self.messages.iter().map(Message::prompt_chars).sum(),
        };
        system + messages
    }
}

/// A list read from a large body only when something reads it (issue 33): typed, or the spans
/// of the body's text it was sent as, with what the pipeline reads on every request (`K`)
/// known without reading them (remembered from the tenant's earlier turns,
/// [`crate::verdicts::Memo`]). An agent resends its whole history and its two dozen tools on
/// every turn, and typing them was most of a large request's instructions; on the same-shape
/// path only the guardrails and the token estimate read them, and those read what is known.
///
/// Reads as the typed `Vec<T>` (`Deref`), typing it then; [`Lazy::to_mut`] changes it (and
/// drops what was sent). [`Lazy::len`] and [`Lazy::is_empty`] answer without typing.
pub struct Lazy<T, K> {
    typed: Vec<T>,
    sent: Option<Box<Spans<T, K>>>,
}

/// A request's messages ([`Told`]: their guardrail units and characters known).
pub type History = Lazy<Message, Told>;

/// A request's tools (their number known).
pub type ToolList = Lazy<Tool, ()>;

/// A request's system prompt parts ([`Told`]: their guardrail units and characters known;
/// no turns). Claude Code's is 14 KB, the same on every turn.
pub type SystemPrompt = Lazy<Text, Told>;

/// What is known of each message (or system prompt part) as sent, one entry a span.
#[derive(Debug, Clone, Default)]
pub struct Told {
    /// Each span's guardrail unit: the keyed hash of its text, `None` for one with no text
    /// ([`crate::verdicts::units`]; a system prompt part with none is no part).
    pub units: Vec<Option<u128>>,
    /// [`Message::prompt_chars`] summed over the messages (a system prompt's: its length).
    pub chars: usize,
    /// Each message's [`Turn`] (none for a system prompt).
    pub turns: Vec<Turn>,
    /// The history as a remembered body prefix and as the next one, while it is as sent: set by
    /// the reading of this request ([`crate::remembered`]), never kept with a prefix.
    pub heads: Option<Heads>,
}

/// A history's messages known as one (issue 33), each set by the keyed hash of its bytes
/// ([`crate::verdicts::SentPrefix::key`]), so the same key is the same messages: the guardrail
/// stage reads the units of the prefix this tenant sent before as one remembered sum, and
/// remembers the whole history's sum for the next turn, which sends it as its prefix
/// ([`crate::verdicts::Memo::scan_all`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Heads {
    /// The first `.0` messages are a prefix the tenant sent before, known by `.1`.
    pub matched: Option<(usize, u128)>,
    /// All the messages, as the prefix remembered for the next turn (`None`: none was).
    pub whole: Option<u128>,
}

/// What an adapter reads of a message's form on every request, known without typing it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Turn {
    pub role: Role,
    /// It calls a tool.
    pub calls_tools: bool,
    /// Its first part is thinking (or redacted thinking).
    pub starts_thinking: bool,
}

impl Turn {
    pub fn of(message: &Message) -> Turn {
        Turn {
            role: message.role,
            calls_tools: message.content.iter().any(|part| matches!(part, Part::ToolUse { .. })),
            starts_thinking: matches!(message.content.first(), Some(Part::Thinking { .. } | Part::RedactedThinking(_))),
        }
    }
}

impl History {
    /// Each message's [`Turn`], from what is known of them while they are as sent.
    pub fn turns(&self) -> Vec<Turn> {
        match self.sent() {
            Some(sent) => sent.known.turns.clone(),
            None => self.iter().map(Turn::of).collect(),
        }
    }

    /// Message `index`, typed alone from its span while the history is not typed (a guardrail
    /// reading the text of a message new on this turn types that message, not the history).
    pub fn one(&self, index: usize) -> Option<std::borrow::Cow<'_, Message>> {
        match self.sent() {
            Some(sent) if sent.typed.get().is_none() && !sent.whole => {
                let span = sent.text.get(sent.spans.get(index)?.clone())?;
                (sent.read)(span).map(std::borrow::Cow::Owned)
            }
            _ => self.get(index).map(std::borrow::Cow::Borrowed),
        }
    }

    /// The last message's [`Turn`] of those in `role`, without typing the history.
    pub fn last_turn(&self, role: Role) -> Option<Turn> {
        match self.sent() {
            Some(sent) => sent.known.turns.iter().rev().find(|turn| turn.role == role).copied(),
            None => self.iter().rev().find(|message| message.role == role).map(Turn::of),
        }
    }
}

/// A list as sent: the body's text, the spans it reads from, and what is known of it.
pub struct Spans<T, K> {
    pub text: bytes::Bytes,
    pub spans: Vec<std::ops::Range<usize>>,
    /// How many items the spans read to.
    pub len: usize,
    pub known: K,
    /// Reads one span: the reader of the shape it was sent in, which read the same bytes
    /// before. `None`: a span that holds no item (a tool without a name).
    pub read: fn(&[u8]) -> Option<T>,
    /// The one span is the whole array, its items found only when it is typed
    /// ([`Spans::whole`]).
    whole: bool,
    typed: std::sync::OnceLock<Vec<T>>,
}

impl<T, K> Spans<T, K> {
    pub fn new(
        text: bytes::Bytes,
        spans: Vec<std::ops::Range<usize>>,
        len: usize,
        known: K,
        read: fn(&[u8]) -> Option<T>,
    ) -> Spans<T, K> {
        Spans { text, spans, len, known, read, whole: false, typed: std::sync::OnceLock::new() }
    }

    /// A list sent as the array at `span` of `text`, known by its bytes without its items being
    /// found ([`crate::json_scan::fields_knowing`]): they are found if it is typed.
    pub fn whole(
        text: bytes::Bytes,
        span: std::ops::Range<usize>,
        len: usize,
        known: K,
        read: fn(&[u8]) -> Option<T>,
    ) -> Spans<T, K> {
        Spans { whole: true, ..Spans::new(text, vec![span], len, known, read) }
    }

    fn typed(&self) -> &Vec<T> {
        self.typed.get_or_init(|| {
            let read = |span: &std::ops::Range<usize>| self.text.get(span.clone()).and_then(self.read);
            match (self.whole, self.spans.first()) {
                (true, Some(array)) => {
                    let items = crate::json_scan::items(&self.text, array.clone()).unwrap_or_default();
                    items.iter().filter_map(|item| read(&item.span)).collect()
                }
                _ => self.spans.iter().filter_map(read).collect(),
            }
        })
    }
}

impl<T, K> Lazy<T, K> {
    /// A list known by its spans, typed when first read.
    pub fn of_sent(sent: Spans<T, K>) -> Lazy<T, K> {
        Lazy { typed: Vec::new(), sent: Some(Box::new(sent)) }
    }

    /// The list as sent, while it is (nothing has changed it).
    pub fn sent(&self) -> Option<&Spans<T, K>> {
        self.sent.as_deref()
    }

    pub fn len(&self) -> usize {
        self.sent.as_ref().map_or(self.typed.len(), |sent| sent.len)
    }

    /// Whether it is typed (read from its spans, or never anything else).
    pub fn is_typed(&self) -> bool {
        self.sent.as_ref().is_none_or(|sent| sent.typed.get().is_some())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The typed list, to change.
    pub fn to_mut(&mut self) -> &mut Vec<T> {
        if let Some(sent) = self.sent.take() {
            sent.typed();
            self.typed = sent.typed.into_inner().unwrap_or_default();
        }
        &mut self.typed
    }
}

impl<T, K> Default for Lazy<T, K> {
    fn default() -> Self {
        Lazy { typed: Vec::new(), sent: None }
    }
}

impl<T, K> std::ops::Deref for Lazy<T, K> {
    type Target = Vec<T>;

    fn deref(&self) -> &Vec<T> {
        match &self.sent {
            Some(sent) => sent.typed(),
            None => &self.typed,
        }
    }
}

impl<'l, T, K> IntoIterator for &'l Lazy<T, K> {
    type Item = &'l T;
    type IntoIter = std::slice::Iter<'l, T>;

    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

impl<T, K> From<Vec<T>> for Lazy<T, K> {
    fn from(typed: Vec<T>) -> Lazy<T, K> {
        Lazy { typed, sent: None }
    }
}

impl<T, K> FromIterator<T> for Lazy<T, K> {
    fn from_iter<I: IntoIterator<Item = T>>(items: I) -> Lazy<T, K> {
        Lazy::from(items.into_iter().collect::<Vec<_>>())
    }
}

impl<T: Clone, K: Clone> Clone for Lazy<T, K> {
    fn clone(&self) -> Lazy<T, K> {
        Lazy {
            typed: self.typed.clone(),
            sent: self.sent.as_ref().map(|sent| {
                Box::new(Spans {
                    text: sent.text.clone(),
                    spans: sent.spans.clone(),
                    len: sent.len,
                    known: sent.known.clone(),
                    read: sent.read,
                    whole: sent.whole,
                    typed: sent.typed.clone(),
                })
            }),
        }
    }
}

impl<T: PartialEq, K> PartialEq for Lazy<T, K> {
    fn eq(&self, other: &Lazy<T, K>) -> bool {
        **self == **other
    }
}

impl<T: std::fmt::Debug, K> std::fmt::Debug for Lazy<T, K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        (**self).fmt(f)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// A system message inside the conversation (OpenAI's system and developer messages,
    /// Anthropic's mid-conversation system messages).
    System,
    User,
    Assistant,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Message {
    pub role: Role,
    pub content: Vec<Part>,
}

impl Message {
    /// Characters of its text and tool results: its share of [`Request::prompt_chars`].
    pub fn prompt_chars(&self) -> usize {
        self.content
            .iter()
            .map(|part| match part {
                Part::Text(text) => text.len(),
                Part::ToolResult { content, .. } => content.len(),
                _ => 0,
            })
            .sum()
    }
}

/// Texts one per line, as `join("\n")` writes them, keeping the first one's buffer: a tool's
/// result is most often one text, the largest of an agent's history, and is not copied again
/// (issue 33).
pub fn lines(texts: impl IntoIterator<Item = String>) -> String {
    let mut texts = texts.into_iter();
    let first = texts.next().unwrap_or_default();
    texts.fold(first, |mut all, text| {
        all.push('\n');
        all.push_str(&text);
        all
    })
}

/// One part of a message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Part {
    /// Text (read from a large body: as sent, [`Text`]).
    Text(Text),
    Image(Image),
    /// A tool call the assistant made; `input` is the arguments as JSON text.
    ToolUse {
        id: String,
        name: String,
        input: String,
    },
    /// A tool's result, as text.
    ToolResult {
        id: String,
        content: Text,
        is_error: bool,
    },
    Thinking {
        thinking: String,
        signature: String,
    },
    RedactedThinking(String),
    /// Content only its own shape can carry (an Anthropic document, search results,
    /// server-tool history): its kind, and the text it carries (which the guardrails read).
    Opaque {
        kind: String,
        text: String,
    },
}

impl Part {
    /// The text the input guardrails read in this part: message text, thinking, a tool's
    /// result, the text of a part only its own shape carries; none for images, tool calls and
    /// redacted thinking.
    pub fn guarded_text(&self) -> Option<&str> {
        match self {
            Part::Text(said) | Part::ToolResult { content: said, .. } => Some(said),
            Part::Thinking { thinking: said, .. } => Some(said),
            Part::Opaque { text, .. } => Some(text),
            Part::Image(_) | Part::ToolUse { .. } | Part::RedactedThinking(_) => None,
        }
    }

    /// [`Part::guarded_text`], taken out of the part rather than borrowed.
    pub fn into_guarded_text(self) -> Option<String> {
        match self {
            Part::Text(said) | Part::ToolResult { content: said, .. } => Some(said.into_string()),
            Part::Thinking { thinking: said, .. } => Some(said),
            Part::Opaque { text, .. } => Some(text),
            Part::Image(_) | Part::ToolUse { .. } | Part::RedactedThinking(_) => None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Image {
    Url(String),
    Base64 { media_type: String, data: String },
}

#[derive(Debug, Clone, PartialEq)]
pub struct Tool {
    pub name: String,
    /// Read from a large body: as sent ([`Text`]; Claude Code's two dozen are 18 KB).
    pub description: Text,
    /// The JSON Schema of its input.
    pub schema: Schema,
}

/// A tool's input schema, kept as the JSON text it came in (issue 33). On the same-shape path
/// nothing reads a schema (the body goes upstream from its own text), yet as a tree the 24
/// schemas of an agent request were a fifth of its instructions: map nodes and key strings
/// for every property of every schema, built and freed unread. An adapter that renders a tool
/// in another shape reads it as a tree then ([`Schema::value`]), once.
#[derive(Debug, Clone)]
pub struct Schema(Box<str>);

impl Schema {
    /// A schema read from a body's text (any JSON value, as sent).
    pub fn of_raw(raw: Box<serde_json::value::RawValue>) -> Schema {
        Schema(raw.into())
    }

    /// A schema as sent in a tool the tenant sent before, whose text serde_json read then as
    /// [`Schema::of_raw`] reads it: not checked again (only such text may come here, since a
    /// writer copies it as it is).
    pub fn of_text_read_before(text: &str) -> Schema {
        Schema(text.into())
    }

    /// A schema given as a tree (a tree reading, or Shield's own).
    pub fn of_value(value: &serde_json::Value) -> Schema {
        match serde_json::value::to_raw_value(value) {
            Ok(raw) => Schema::of_raw(raw),
            // Not reached: a tree always writes (its keys are strings).
            Err(_) => Schema::of_value(&serde_json::Value::Null),
        }
    }

    /// The schema as a tree, for a renderer. The text was valid JSON when read (serde_json
    /// checked it to capture it); a schema that reads as no tree (nested past serde_json's
    /// recursion limit, which capturing does not count) is rendered as `null`, as an upstream
    /// would refuse it anyway.
    pub fn value(&self) -> serde_json::Value {
        serde_json::from_str(&self.0).unwrap_or(serde_json::Value::Null)
    }

    /// The schema's JSON text, as sent.
    pub fn text(&self) -> &str {
        &self.0
    }
}

/// Two schemas are one when they are the same JSON value (key order and spacing aside): a
/// tree reading and a text reading of one body give one request.
impl PartialEq for Schema {
    fn eq(&self, other: &Schema) -> bool {
        self.0 == other.0 || self.value() == other.value()
    }
}

impl From<serde_json::Value> for Schema {
    fn from(value: serde_json::Value) -> Schema {
        Schema::of_value(&value)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolChoice {
    Auto,
    /// It must call some tool.
    Any,
    None,
    /// It must call this one.
    Tool(String),
}

/// How hard the caller asked the model to think, on the scale every reasoning control shares
/// (OpenAI's `reasoning_effort`, Anthropic's `output_config.effort`; Anthropic's `xhigh` and
/// `max` are `High`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Effort {
    Low,
    Medium,
    High,
}

impl Effort {
    pub fn as_str(self) -> &'static str {
        match self {
            Effort::Low => "low",
            Effort::Medium => "medium",
            Effort::High => "high",
        }
    }

    /// A thinking budget's effort: up to 4,096 tokens is low, up to 16,384 medium, beyond high.
    pub fn of_budget(budget_tokens: u64) -> Effort {
        match budget_tokens {
            0..=4096 => Effort::Low,
            4097..=16384 => Effort::Medium,
            _ => Effort::High,
        }
    }

    /// The thinking budget an effort asks of a model that takes one (the top of its range in
    /// [`Effort::of_budget`], so the two agree).
    pub fn budget_tokens(self) -> u64 {
        match self {
            Effort::Low => 4096,
            Effort::Medium => 16384,
            Effort::High => 32768,
        }
    }
}

/// The caller asked the model to reason: with an effort, or leaving it to the model
/// (Anthropic's adaptive thinking).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reasoning {
    pub effort: Option<Effort>,
    /// The caller's fields that asked for it (`thinking`, `output_config.effort`,
    /// `reasoning_effort`): named as dropped when the answering target has no reasoning
    /// control.
    pub fields: Vec<&'static str>,
}

/// Why the model stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// It finished its turn (or met a stop sequence).
    EndTurn,
    /// It ran out of output tokens.
    MaxTokens,
    /// It asks for tool calls.
    ToolUse,
    /// It (or a filter at the provider) refused.
    Refusal,
}

/// One content block of an answer, in the order the model produced it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Block {
    Text(String),
    /// Visible reasoning, with the signature a provider needs to accept it back next turn.
    Thinking {
        thinking: String,
        signature: String,
    },
    /// Reasoning the provider returns encrypted, whole.
    RedactedThinking(String),
    /// A tool call; `input` is the arguments as JSON text.
    ToolUse {
        id: String,
        name: String,
        input: String,
    },
}

/// A whole answer.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Answer {
    /// The provider's id for it (empty when it gave none).
    pub id: String,
    pub blocks: Vec<Block>,
    /// `None` when the provider did not say.
    pub stop: Option<Stop>,
}

impl Answer {
    /// What the output guardrails read: the text and the thinking (both reach some caller).
    pub fn text(&self) -> String {
        let mut text = String::new();
        for block in &self.blocks {
            let part = match block {
                Block::Text(part) => part,
                Block::Thinking { thinking, .. } => thinking,
                _ => continue,
            };
            if !text.is_empty() {
                text.push('\n');
            }
            text.push_str(part);
        }
        text
    }

    /// The tools the answer asks to call (what tool RBAC reads).
    pub fn tool_names(&self) -> Vec<String> {
        self.blocks
            .iter()
            .filter_map(|block| match block {
                Block::ToolUse { name, .. } => Some(name.clone()),
                _ => None,
            })
            .collect()
    }

    /// The text blocks joined (the answer's visible text).
    pub fn visible_text(&self) -> String {
        self.blocks
            .iter()
            .filter_map(|block| match block {
                Block::Text(text) => Some(text.as_str()),
                _ => None,
            })
            .collect()
    }
}

/// One piece of a streamed answer. A stream is a sequence of these in the order the model
/// produced them; a renderer opens and closes its shape's blocks as the kind changes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Delta {
    /// More assistant text.
    Text(String),
    /// A thinking block opens; its text and signature follow.
    ThinkingStart,
    Thinking(String),
    Signature(String),
    /// A redacted thinking block, whole.
    RedactedThinking(String),
    /// A tool call opens: `index` numbers the answer's calls from 0.
    ToolCall {
        index: u32,
        id: String,
        name: String,
    },
    /// More of call `index`'s arguments (JSON text, in pieces).
    ToolArguments {
        index: u32,
        json: String,
    },
    /// The model stopped, and why.
    Stop(Stop),
}

impl Delta {
    /// The text this delta adds that a reader sees (assistant text or thinking).
    pub fn text(&self) -> Option<&str> {
        match self {
            Delta::Text(text) | Delta::Thinking(text) => Some(text),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn formats_read_in_both_openai_spellings() {
        let schema = serde_json::json!({"type": "object", "properties": {"a": {"type": "string"}}});
        let nested =
            serde_json::json!({"type": "json_schema", "json_schema": {"name": "x", "schema": schema, "strict": true}});
        let flat = serde_json::json!({"type": "json_schema", "name": "x", "schema": schema, "strict": true});
        let expected = Format::JsonSchema { name: "x".into(), schema: schema.clone(), strict: Some(true) };
        assert_eq!(Format::of_openai(&nested), Some(expected.clone()));
        assert_eq!(Format::of_openai(&flat), Some(expected));
        assert_eq!(Format::of_openai(&serde_json::json!({"type": "json_object"})), Some(Format::JsonObject));
        assert_eq!(Format::of_openai(&serde_json::json!({"type": "text"})), None);
        assert_eq!(Format::of_openai(&serde_json::json!("json_object")), None);
    }
    use super::*;

    #[test]
    fn an_answer_reads_its_text_thinking_and_tools() {
        let answer = Answer {
            id: "m1".into(),
            blocks: vec![
                Block::Thinking { thinking: "hm".into(), signature: "s".into() },
                Block::Text("42".into()),
                Block::ToolUse { id: "t".into(), name: "search".into(), input: "{}".into() },
            ],
            stop: Some(Stop::ToolUse),
        };
        assert_eq!(answer.text(), "hm\n42");
        assert_eq!(answer.visible_text(), "42");
        assert_eq!(answer.tool_names(), ["search"]);
    }
}
