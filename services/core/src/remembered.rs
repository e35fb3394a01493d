//! A large request body read with its tenant's memo (issue 33), whatever its shape: the parts
//! each shape's direct reader shares (Chat Completions' in [`crate::chat_request`], Messages'
//! in the proxy). An agent resends its whole history and its two dozen tools on every turn;
//! reading them (every byte of every string, eight at a time, each copied) was most of such a
//! request's instructions, and on the same-shape path nothing but the guardrails and the token
//! estimate reads them.
//!
//! So the body's top-level fields are found by a scan ([`crate::json_scan`]); `messages` is
//! kept as the spans of its items. A message whose bytes the tenant sent before is not read: what
//! the pipeline reads of it is remembered ([`Known`]: its guardrail unit's hash, its characters,
//! its [`crate::exchange::Turn`]), and serde_json read the same bytes whole then, so they read.
//! Each other message is read from its span by the shape's reader and remembered. `tools` is
//! known by its bytes (how many tools it reads to) or read and remembered. The history and the
//! tools are typed from their spans only when something reads them ([`Lazy`]).
//!
//! Every function answers `None` where the shape's reading of the whole body might not answer
//! alike (a key written with escapes or twice, serde_json's raw-value token, nesting near its
//! recursion limit, a span that does not read): the caller then reads the body whole, which
//! accepts or refuses it in serde_json's words.

use bytes::Bytes;
use serde_json::{Map, Value};

use crate::exchange::{History, Lazy, Message, Spans, SystemPrompt, Told, Tool, ToolList};
use crate::json_scan::{self, Field, Item};
use crate::verbatim::Keys;
use crate::verdicts::{Known, Memo};

/// What one API shape reads of its body's parts; [`read`] does the rest alike for every shape.
pub trait ShapeReader {
    const SHAPE: Shape;

    /// One message, from its span (`None`: give up).
    fn message(span: &[u8]) -> Option<Message>;

    /// One tool of a `tools` array read before (its schemas passed then), from its span.
    fn tool(span: &[u8]) -> Option<Tool>;

    /// A `tools` array read whole, its schemas checked with the tenant's (`None`: give up).
    fn tools(&mut self, text: &[u8], memo: &Memo) -> Option<Read<Tool>>;

    /// A top-level field only this shape reads otherwise than as a value: `Some(true)` when it
    /// took it, `Some(false)` to have it read as a value, `None` to give up.
    fn field(&mut self, _key: &str, _text: &[u8]) -> Option<bool> {
        Some(false)
    }

    /// Whether the shape has a top-level `system` prompt (Messages'), a string or an array of
    /// blocks, read part by part ([`ShapeReader::system_text`], [`ShapeReader::system_block`]);
    /// a shape without one reads a `system` field as any other.
    const HAS_SYSTEM: bool = false;

    /// A system prompt sent as a string, from its span: its text (`Some(None)`: none), `None`
    /// to give up.
    fn system_text(_span: &[u8]) -> Option<Option<String>> {
        None
    }

    /// One block of a system prompt sent as an array, from its span: its text (`Some(None)`:
    /// none, as a block of another type), `None` to give up.
    fn system_block(_span: &[u8]) -> Option<Option<String>> {
        None
    }
}

/// A body read by its spans: its other top-level fields as values, where its keys stand, its
/// history and its tools.
pub struct Body {
    pub fields: Map<String, Value>,
    pub keys: Keys,
    pub system: SystemPrompt,
    pub messages: History,
    pub tools: ToolList,
}

/// `body`, read by its spans with the tenant's memo: `messages` ([`history`]), `tools`
/// ([`tools`]) and a shape's `system` ([`system`]) as known or read and remembered, the shape's
/// own fields by `reader`, every other field read from its span as a value. `None`: read the
/// body whole (no `messages` too).
pub fn read<R: ShapeReader>(body: &Bytes, memo: &Memo, reader: &mut R) -> Option<Body> {
    let (mut values, mut keys, mut messages) = (Map::new(), Keys::default(), None);
    let (mut system, mut tools, mut known_tools) = (SystemPrompt::default(), ToolList::default(), None);
    let found = fields(body, |key, at| {
        let (end, count) = (key == "tools").then(|| tools_known_at(R::SHAPE, body, memo, at))??;
        known_tools = Some(count);
        Some(end)
    })?;
    for field in found {
        keys.found(field.key, field.key_at);
        let text = body.get(field.value.clone())?;
        match field.key {
            "messages" => messages = Some(history(R::SHAPE, body, field.items.as_deref()?, memo, R::message)?),
            "tools" => {
                let read_all = |text: &[u8]| reader.tools(text, memo);
                tools = self::tools(R::SHAPE, body, &field, known_tools, memo, read_all, R::tool)?;
            }
            "system" if R::HAS_SYSTEM => system = self::system::<R>(body, &field, memo)?,
            key if reader.field(key, text)? => {}
            key => {
                values.insert(key.to_string(), serde_json::from_slice(text).ok()?);
            }
        }
    }
    Some(Body { fields: values, keys, system, messages: messages?, tools })
}

/// The API shape a body came in. The same bytes read in another shape are another message (a
/// `tool` role, a `tool_result` block): each shape's messages and tools are remembered under keys
/// of their own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    ChatCompletions,
    Messages,
}

/// What a key stands for. The same bytes are another thing as another part: `"abc"` is a
/// system prompt's text as the whole `system`, and a block with no text in its array.
#[derive(Clone, Copy)]
enum Part {
    Message,
    Tools,
    SystemText,
    SystemBlock,
}

impl Shape {
    /// The key of `bytes` as sent in this shape, as `part`: the memo's keyed hash of the bytes,
    /// its top byte changed by the domain (two keys of different domains are equal only if
    /// their hashes differ by exactly that: a chance of 2^-128).
    fn key(self, memo: &Memo, part: Part, bytes: &[u8]) -> u128 {
        let domain = 1 + 4 * self as u8 + part as u8;
        memo.bytes_hash(bytes) ^ (u128::from(domain) << 120)
    }
}

/// Spans read alone nest less deeply than in the body (the body and `messages` or `tools`
/// enclose them), so serde_json's recursion limit (128) would not refuse there what it refuses
/// in the body: a body nested past this is read whole.
pub const DEEPEST: usize = 100;

/// The top-level fields of `body`, `messages`, `tools` and `system` with their items; a value
/// `known` tells the end of is not scanned ([`json_scan::fields_knowing`]).
fn fields(body: &Bytes, known: impl FnMut(&str, usize) -> Option<usize>) -> Option<Vec<Field<'_>>> {
    simdutf8::basic::from_utf8(body).ok()?;
    let fields = json_scan::fields_knowing(body, &["messages", "tools", "system"], known)?;
    // A few fields: each compared with those before it costs less than a set, and a body of
    // thousands of keys (read whole, then) cannot make it quadratic.
    (fields.len() <= crate::verbatim::MOST_KEYS).then_some(())?;
    for (i, field) in fields.iter().enumerate() {
        let repeated = fields.get(..i).unwrap_or_default().iter().any(|earlier| earlier.key == field.key);
        if repeated || field.depth > DEEPEST || field.key == crate::chat_request::RAW_VALUE_TOKEN {
            return None;
        }
    }
    // At most as many messages as any request may hold: a longer one is refused, after a
    // reading of the whole body (as before the memo), not remembered message by message.
    let messages = fields.iter().find(|field| field.key == "messages").and_then(|field| field.items.as_ref());
    messages.is_none_or(|items| items.len() <= crate::chat_request::MAX_MESSAGES).then_some(fields)
}

/// The history the `items` of `messages` hold: each message the memo knows by its bytes taken
/// as known, each other read with `read` (the shape's reader of one message; `None`: give up)
/// and remembered.
fn history(
    shape: Shape,
    body: &Bytes,
    items: &[Item],
    memo: &Memo,
    read: fn(&[u8]) -> Option<Message>,
) -> Option<History> {
    let told = told(shape, Part::Message, body, items, memo, |span| read(span).map(|message| memo.know(&message)))?;
    let spans = items.iter().map(|item| item.span.clone()).collect();
    Some(Lazy::of_sent(Spans::new(body.clone(), spans, items.len(), told, read)))
}

/// The system prompt a `system` field holds, part by part as [`history`] reads messages: a
/// string (one part), an array of blocks (a part each), or `null` (none). Parts with no text
/// are no parts, as the whole reading drops them. `None`: give up (another type, a part that
/// does not read).
fn system<R: ShapeReader>(body: &Bytes, field: &Field<'_>, memo: &Memo) -> Option<SystemPrompt> {
    // Non-capturing, so a plain `fn` the lazy list keeps: the shape's readers, empty texts dropped.
    let text: fn(&[u8]) -> Option<String> = |span| R::system_text(span).flatten().filter(|text| !text.is_empty());
    let block: fn(&[u8]) -> Option<String> = |span| R::system_block(span).flatten().filter(|text| !text.is_empty());
    let (part, read_fresh, read, items) = match (body.get(field.value.start)?, &field.items) {
        (b'"', _) => {
            let whole = Item { span: field.value.clone(), depth: field.depth };
            (Part::SystemText, R::system_text as fn(&[u8]) -> Option<Option<String>>, text, vec![whole])
        }
        (b'[', Some(items)) => (Part::SystemBlock, R::system_block as fn(&[u8]) -> _, block, items.clone()),
        _ if body.get(field.value.clone())? == b"null" => return Some(SystemPrompt::default()),
        _ => return None,
    };
    let know = |span: &[u8]| {
        let said = read_fresh(span)?.filter(|text| !text.is_empty());
        Some(memo.know_system_part(said.as_deref()))
    };
    let told = told(R::SHAPE, part, body, &items, memo, know)?;
    let len = told.units.iter().flatten().count();
    let spans = items.into_iter().map(|item| item.span).collect();
    Some(Lazy::of_sent(Spans::new(body.clone(), spans, len, told, read)))
}

/// What is known of the spans `items` of a body, sent as `part`: each the memo knows by its
/// bytes taken as known, each other read and told of by `know` (`None`: give up) and
/// remembered.
fn told(
    shape: Shape,
    part: Part,
    body: &Bytes,
    items: &[Item],
    memo: &Memo,
    know: impl Fn(&[u8]) -> Option<Known>,
) -> Option<Told> {
    let span = |item: &Item| body.get(item.span.clone()).unwrap_or_default();
    let keys: Vec<u128> = items.iter().map(|item| shape.key(memo, part, span(item))).collect();
    let mut fresh = Vec::new();
    let mut told = Told { units: Vec::with_capacity(items.len()), chars: 0, turns: Vec::with_capacity(items.len()) };
    for ((item, key), known) in items.iter().zip(&keys).zip(memo.known(&keys)) {
        let Known { unit, chars, turn } = match known {
            Some(known) => known,
            None => {
                (item.depth <= DEEPEST).then_some(())?;
                let known = know(body.get(item.span.clone())?)?;
                fresh.push((*key, known));
                known
            }
        };
        told.units.push(unit);
        told.chars += chars;
        if matches!(part, Part::Message) {
            told.turns.push(turn);
        }
    }
    memo.remember(fresh);
    Some(told)
}

/// The tools a `tools` field holds: known by its bytes, or read whole with `read_all` (the
/// shape's reader, the tenant's checked schemas at hand; `None`: give up), and remembered when
/// it says so. Typed again with `read_one`, one item at a time, if something reads them.
fn tools(
    shape: Shape,
    body: &Bytes,
    field: &Field<'_>,
    known: Option<usize>,
    memo: &Memo,
    read_all: impl FnOnce(&[u8]) -> Option<Read<Tool>>,
    read_one: fn(&[u8]) -> Option<Tool>,
) -> Option<ToolList> {
    if let Some(count) = known {
        return Some(Lazy::of_sent(Spans::whole(body.clone(), field.value.clone(), count, (), read_one)));
    }
    let text = body.get(field.value.clone())?;
    let key = shape.key(memo, Part::Tools, text);
    if let (Some(count), Some(items)) = (memo.known_tools(key), &field.items) {
        // Known, though not among the lengths looked for: among them from now on.
        memo.remember_tools(key, text.len(), count);
        let spans = items.iter().map(|item| item.span.clone()).collect();
        return Some(Lazy::of_sent(Spans::new(body.clone(), spans, count, (), read_one)));
    }
    let read = read_all(text)?;
    if read.remember {
        memo.remember_tools(key, text.len(), read.typed.len());
    }
    Some(read.typed.into())
}

/// A `tools` array at `at` of `body` that the tenant sent before, found by the lengths of the
/// arrays it sent last ([`Memo::tools_lengths`]): that many bytes hashed, not scanned (an
/// agent's two dozen tool schemas, dense with short strings, were most of the scan of its
/// turn). Where it ends and how many tools it reads to; `None`: scan it.
fn tools_known_at(shape: Shape, body: &Bytes, memo: &Memo, at: usize) -> Option<(usize, usize)> {
    memo.tools_lengths().into_iter().filter(|len| *len > 0).find_map(|len| {
        let end = at.checked_add(len)?;
        let bytes = body.get(at..end)?;
        (bytes.first() == Some(&b'[') && bytes.last() == Some(&b']')).then_some(())?;
        memo.known_tools(shape.key(memo, Part::Tools, bytes)).map(|count| (end, count))
    })
}

/// What a shape's reader made of a whole list: its items, and whether the same bytes may be
/// taken as known next time (a list that holds what only a tree reading keeps may not).
pub struct Read<T> {
    pub typed: Vec<T>,
    pub remember: bool,
}
