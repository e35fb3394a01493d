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

use std::sync::Arc;

use bytes::Bytes;
use serde_json::{Map, Value};

use crate::exchange::{Heads, History, Lazy, Message, Spans, SystemPrompt, Text, Told, Tool, ToolList};
use crate::json_scan::{self, Field, Item};
use crate::verbatim::Keys;
use crate::verdicts::{Known, Memo, SentPrefix, TAIL};

/// What one API shape reads of its body's parts; [`read`] does the rest alike for every shape.
pub trait ShapeReader {
    const SHAPE: Shape;

    /// One message, from its span (`None`: give up).
    fn message(span: &[u8]) -> Option<Message>;

    /// One message [`ShapeReader::message`] read before, in this request or an earlier one of
    /// the tenant's (the history is typed from its spans when something asks, and every span
    /// was read so first): a shape may type it without checking it again. By default it is
    /// read again.
    fn message_read_before(span: &[u8]) -> Option<Message> {
        Self::message(span)
    }

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
    fn system_text(_span: &[u8]) -> Option<Option<Text>> {
        None
    }

    /// One block of a system prompt sent as an array, from its span: its text (`Some(None)`:
    /// none, as a block of another type), `None` to give up.
    fn system_block(_span: &[u8]) -> Option<Option<Text>> {
        None
    }

    /// One block [`ShapeReader::system_block`] read before (as
    /// [`ShapeReader::message_read_before`]); by default read again.
    fn system_block_read_before(span: &[u8]) -> Option<Option<Text>> {
        Self::system_block(span)
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
    let (mut system, mut tools) = (SystemPrompt::default(), ToolList::default());
    let (mut known_tools, mut known_prefix) = (None, None);
    // The spans of the body the memo knows by their bytes (`tools`, the history's prefix):
    // checked as UTF-8 when first sent. Empty where nothing is known.
    let mut known_spans = [0..0, 0..0];
    let found = fields(body, |key, at| match key {
        "tools" => {
            let (end, count) = tools_known_at(R::SHAPE, body, memo, at)?;
            known_tools = Some(count);
            known_spans[0] = at..end;
            Some((end, None))
        }
        "messages" => {
            let (prefix, after, end) = prefix_known_at(R::SHAPE, body, memo, at)?;
            known_spans[1] = at..at + prefix.segments.last()?;
            known_prefix = Some(prefix);
            Some((end, Some(after)))
        }
        _ => None,
    })?;
    // Before anything below remembers a part of this body: what the memo holds was checked.
    utf8_but(body, &mut known_spans)?;
    for field in found {
        keys.found(field.key, field.key_at);
        let text = body.get(field.value.clone())?;
        match field.key {
            "messages" => {
                let (at, items, prefix) = (field.value.start, field.items.as_deref()?, known_prefix.take());
                let readers = (R::message as ReadMessage, R::message_read_before as ReadMessage);
                messages = Some(history(R::SHAPE, body, at, prefix, items, memo, readers)?);
            }
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
    /// A segment of a `messages` array remembered as a prefix ([`SentPrefix`]).
    MessagesPrefix,
}

/// How many [`Part`]s there are: each shape has this many domains of its own.
const PARTS: u8 = 5;

impl Part {
    /// Its domain within a shape's, below [`PARTS`] (raise it with a new part: the match is
    /// exhaustive so that a new part is counted here).
    const fn index(self) -> u8 {
        match self {
            Part::Message => 0,
            Part::Tools => 1,
            Part::SystemText => 2,
            Part::SystemBlock => 3,
            Part::MessagesPrefix => 4,
        }
    }
}

impl Shape {
    /// The key of `bytes` as sent in this shape, as `part`: the memo's keyed hash of the bytes,
    /// its top byte changed by the domain (two keys of different domains are equal only if
    /// their hashes differ by exactly that: a chance of 2^-128).
    fn key(self, memo: &Memo, part: Part, bytes: &[u8]) -> u128 {
        let domain = 1 + PARTS * self as u8 + part.index();
        memo.bytes_hash(bytes) ^ (u128::from(domain) << 120)
    }
}

/// Spans read alone nest less deeply than in the body (the body and `messages` or `tools`
/// enclose them), so serde_json's recursion limit (128) would not refuse there what it refuses
/// in the body: a body nested past this is read whole.
pub const DEEPEST: usize = 100;

/// The top-level fields of `body`, `messages`, `tools` and `system` with their items; a value
/// `known` tells the end of is not scanned ([`json_scan::fields_knowing`]).
fn fields(
    body: &Bytes,
    known: impl FnMut(&str, usize) -> Option<(usize, Option<Vec<Item>>)>,
) -> Option<Vec<Field<'_>>> {
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
    Some(fields)
}

/// Whether `body` is UTF-8 but for the spans `known` (sorted here), the body's `tools` and its
/// history's prefix that the tenant sent before: each was checked, whole, in the body that first
/// sent it (every remembered span comes from a body checked here: [`read`] checks before
/// [`history`], [`tools`] and [`system`] remember anything), and is known by a keyed hash
/// of 128 bits of its bytes. So a resent 150 KB history is not checked again, only what is new
/// (issue 33). Every span starts and ends at a JSON structural byte, where no UTF-8 sequence
/// spans: the body is UTF-8 exactly when the parts between them are. `None`: it is not (read it
/// whole, which refuses it in serde_json's words).
fn utf8_but(body: &[u8], known: &mut [std::ops::Range<usize>]) -> Option<()> {
    known.sort_unstable_by_key(|span| span.start);
    let mut from = 0;
    for span in known.iter() {
        simdutf8::basic::from_utf8(body.get(from..span.start.max(from))?).ok()?;
        from = from.max(span.end);
    }
    simdutf8::basic::from_utf8(body.get(from..)?).ok().map(drop)
}

/// A shape's reader of one message from its span.
type ReadMessage = fn(&[u8]) -> Option<Message>;

/// The history a `messages` array at `at` holds: the items of a `prefix` the tenant sent before
/// as they were then, then each of `items` the memo knows by its bytes taken as known, each
/// other read with `read.0` (the shape's reader of one message; `None`: give up) and
/// remembered. The whole array is remembered as the prefix of the next turn's; typed, its
/// messages are read with `read.1` (each was read with `read.0` before).
fn history(
    shape: Shape,
    body: &Bytes,
    at: usize,
    prefix: Option<Arc<SentPrefix>>,
    items: &[Item],
    memo: &Memo,
    (read, read_before): (ReadMessage, ReadMessage),
) -> Option<History> {
    // At most as many messages as any request may hold: a longer one is refused, after a
    // reading of the whole body (as before the memo), not remembered message by message.
    let before = prefix.as_ref().map_or(0, |prefix| prefix.spans.len());
    (before + items.len() <= crate::chat_request::MAX_MESSAGES).then_some(())?;
    let added = told(shape, Part::Message, body, items, memo, |span| read(span).map(|message| memo.know(&message)))?;
    let (mut spans, mut all) = match &prefix {
        Some(prefix) => (prefix.spans.iter().map(|span| span.start + at..span.end + at).collect(), prefix.told.clone()),
        None => (Vec::with_capacity(items.len()), Told::default()),
    };
    spans.extend(items.iter().map(|item| item.span.clone()));
    all.units.extend(added.units);
    all.chars += added.chars;
    all.turns.extend(added.turns);
    let matched = prefix.as_ref().map(|prefix| (prefix.spans.len(), prefix.key));
    let whole = match items.last() {
        Some(last) => remember_prefix(shape, body, at, prefix.as_ref(), last.span.end, &spans, &all, memo),
        None => matched.map(|(_, key)| key),
    };
    all.heads = Some(Heads { matched, whole });
    let len = spans.len();
    Some(Lazy::of_sent(Spans::new(body.clone(), spans, len, all, read_before)))
}

/// The `messages` array at `at` of `body` as far as one of the tenant's last ones
/// ([`SentPrefix`]): that prefix, the items after it and where the array ends. `None`: scan it.
fn prefix_known_at(shape: Shape, body: &Bytes, memo: &Memo, at: usize) -> Option<(Arc<SentPrefix>, Vec<Item>, usize)> {
    // Cheap tests under the lock: the prefix fits, ends with its last bytes, and is followed by
    // another item or the array's end.
    let ends_as = |prefix: &SentPrefix| {
        let end = prefix.segments.last().and_then(|len| at.checked_add(*len));
        let Some(end) = end.filter(|end| body.get(at..*end).is_some_and(|bytes| tail(memo, bytes) == prefix.tail))
        else {
            return false;
        };
        matches!(body.get(json_scan::skip_space(body, end)), Some(b',' | b']'))
    };
    // Candidates that pass those and still differ (a tenant can send many histories of one
    // length and one ending) are hashed up to twice the body's length in all: a body's reading
    // costs at most that more than it did without prefixes.
    let mut budget = body.len().saturating_mul(2);
    // Longest first: it leaves the fewest items to read, and two sessions that began alike
    // (the same first message) each find their own, not the shorter one of the other.
    let mut candidates = memo.candidates(ends_as);
    candidates.sort_by_key(|prefix| std::cmp::Reverse(prefix.segments.last().copied().unwrap_or(0)));
    let prefix = candidates.into_iter().find(|prefix| {
        let len = prefix.segments.last().copied().unwrap_or(0);
        let Some(left) = budget.checked_sub(len) else { return false };
        budget = left;
        chain(shape, memo, body, at, &prefix.segments) == Some(prefix.key)
    })?;
    let (after, end) = json_scan::items_after(body, at + prefix.segments.last()?)?;
    Some((prefix, after, end))
}

/// The keyed hash of the last [`TAIL`] bytes of `bytes` ([`SentPrefix::tail`]).
fn tail(memo: &Memo, bytes: &[u8]) -> u128 {
    memo.bytes_hash(bytes.get(bytes.len().saturating_sub(TAIL)..).unwrap_or_default())
}

/// The chain of keyed hashes of the segments of `body` from `at` that `segments` end
/// ([`SentPrefix::key`]).
fn chain(shape: Shape, memo: &Memo, body: &[u8], at: usize, segments: &[usize]) -> Option<u128> {
    let mut key = 0u128;
    let mut from = at;
    for end in segments {
        let to = at.checked_add(*end)?;
        key = link(shape, memo, key, body.get(from..to)?);
        from = to;
    }
    Some(key)
}

/// The chain `key` continued by the bytes of one more segment.
fn link(shape: Shape, memo: &Memo, key: u128, segment: &[u8]) -> u128 {
    let mut linked = [0u8; 32];
    let (before, added) = linked.split_at_mut(16);
    before.copy_from_slice(&key.to_le_bytes());
    added.copy_from_slice(&shape.key(memo, Part::MessagesPrefix, segment).to_le_bytes());
    memo.bytes_hash(&linked)
}

/// Remembers the `messages` array at `at`, up to `end` (where its last item ends), as a prefix
/// of its session's next turn: `extended` and one segment more. Its key (`None`: an empty
/// segment, not remembered).
#[allow(clippy::too_many_arguments)] // one call, the parts of the history just read
fn remember_prefix(
    shape: Shape,
    body: &Bytes,
    at: usize,
    extended: Option<&Arc<SentPrefix>>,
    end: usize,
    spans: &[std::ops::Range<usize>],
    told: &Told,
    memo: &Memo,
) -> Option<u128> {
    let (key, mut segments, from) = match extended {
        Some(prefix) => (prefix.key, prefix.segments.clone(), at + prefix.segments.last().copied().unwrap_or(0)),
        None => (0, Vec::new(), at),
    };
    let segment = body.get(from..end).filter(|segment| !segment.is_empty())?;
    segments.push(end.saturating_sub(at));
    let bytes = body.get(at..end).unwrap_or_default();
    let prefix = SentPrefix {
        key: link(shape, memo, key, segment),
        segments,
        tail: tail(memo, bytes),
        spans: spans.iter().map(|span| span.start.saturating_sub(at)..span.end.saturating_sub(at)).collect(),
        told: Told { heads: None, ..told.clone() },
    };
    let key = prefix.key;
    memo.remember_prefix(prefix, extended);
    Some(key)
}

/// A shape's reader of a system prompt's string or one of its blocks ([`ShapeReader`]).
type SystemReader = fn(&[u8]) -> Option<Option<Text>>;

/// The system prompt a `system` field holds, part by part as [`history`] reads messages: a
/// string (one part), an array of blocks (a part each), or `null` (none). Parts with no text
/// are no parts, as the whole reading drops them. `None`: give up (another type, a part that
/// does not read).
fn system<R: ShapeReader>(body: &Bytes, field: &Field<'_>, memo: &Memo) -> Option<SystemPrompt> {
    // Non-capturing, so a plain `fn` the lazy list keeps: the shape's readers, empty texts dropped.
    let text: fn(&[u8]) -> Option<Text> = |span| R::system_text(span).flatten().filter(|text| !text.is_empty());
    let block: fn(&[u8]) -> Option<Text> =
        |span| R::system_block_read_before(span).flatten().filter(|text| !text.is_empty());
    // The string as its one item, or the array's items (borrowed: a block holds its own span).
    let whole;
    let (part, read_fresh, read, items): (_, SystemReader, _, &[Item]) =
        match (body.get(field.value.start)?, &field.items) {
            (b'"', _) => {
                whole = [Item { span: field.value.clone(), depth: field.depth }];
                (Part::SystemText, R::system_text, text, &whole)
            }
            (b'[', Some(items)) => (Part::SystemBlock, R::system_block, block, items),
            _ if body.get(field.value.clone())? == b"null" => return Some(SystemPrompt::default()),
            _ => return None,
        };
    let know = |span: &[u8]| {
        let said = read_fresh(span)?.filter(|text| !text.is_empty());
        Some(memo.know_system_part(said.as_deref()))
    };
    let told = told(R::SHAPE, part, body, items, memo, know)?;
    let len = told.units.iter().flatten().count();
    let spans = items.iter().map(|item| item.span.clone()).collect();
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
    let mut told =
        Told { units: Vec::with_capacity(items.len()), chars: 0, turns: Vec::with_capacity(items.len()), heads: None };
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
    // An array only: its length is where a body's next `tools` may end (`null` has none).
    if read.remember && field.items.is_some() {
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

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use serde_json::{Value, json};

    use crate::chat_request::ChatRequest;
    use crate::verdicts::Verdicts;

    /// One message of a session: small, so that many fit a test body, and now and then a
    /// secret, so that the guardrails' units tell one message from another.
    fn message(i: usize, variant: u8) -> Value {
        match i % 3 {
            0 => json!({"role": "user", "content": format!("turn {i} v{variant}: fix the build")}),
            1 => json!({"role": "assistant", "content": null,
                "tool_calls": [{"id": format!("c{i}"), "type": "function", "function": {"name": "Bash", "arguments": "{\"c\":\"ls\"}"}}]}),
            _ => json!({"role": "tool", "tool_call_id": format!("c{}", i - 1),
                "content": if variant % 4 == 3 { format!("key sk-proj-abcdefghijklmnopqrstuvwxyz0{i:05}") } else { format!("out {i} v{variant}") }}),
        }
    }

    /// The body of a turn: `lead` bytes of another field before `messages` (so that it starts
    /// at another offset from turn to turn), its items written tight or with white space
    /// around their separators.
    fn body(messages: &[Value], spaced: bool, lead: usize) -> bytes::Bytes {
        let pad = "p".repeat(crate::verbatim::WORTH_IT);
        let items: Vec<String> = messages.iter().map(Value::to_string).collect();
        let (open, separator, close) = if spaced { ("[ ", " ,\n  ", " ]") } else { ("[", ",", "]") };
        let lead = "l".repeat(lead);
        let messages = format!("{open}{}{close}", items.join(separator));
        bytes::Bytes::from(format!(r#"{{"model":"m","lead":"{lead}","messages":{messages},"pad":"{pad}"}}"#))
    }

    /// A step of a tenant's traffic: a session's next turn (its history and `added` messages), or
    /// that turn with message `edit` changed (a compacted or edited history), in one of a few
    /// sessions at once.
    #[derive(Debug, Clone)]
    enum Step {
        Turn { session: usize, added: usize },
        Edit { session: usize, edit: usize },
    }

    /// Sessions of the tenant at once in the property test: few, so that each has many turns.
    const SESSIONS: usize = 4;

    fn steps() -> impl Strategy<Value = Vec<Step>> {
        let step = prop_oneof![
            6 => (0..SESSIONS, 0..4usize).prop_map(|(session, added)| Step::Turn { session, added }),
            1 => (0..SESSIONS, any::<usize>()).prop_map(|(session, edit)| Step::Edit { session, edit }),
        ];
        prop::collection::vec(step, 1..40)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// Whatever a tenant's sessions send, turn after turn, read with its memo (a remembered
        /// prefix of the history, messages known by their bytes, or read) each body reads as
        /// it does alone, with the same characters, turns and guardrail units before anything
        /// types the history, and is judged as a fresh scan judges it (the detectors changing
        /// now and then), without typing it.
        #[test]
        fn every_turn_reads_as_it_does_alone(steps in steps(), spaced in any::<bool>(), detectors in prop::collection::vec(0..4usize, 40)) {
            use crate::guardrails::{Detector, GuardrailPolicy, Mode};
            let policies = [(Mode::Monitor, Mode::Monitor), (Mode::Off, Mode::Block), (Mode::Block, Mode::Off), (Mode::Warn, Mode::Monitor)]
                .map(|(pii, secrets)| GuardrailPolicy {
                    pii_detection: Detector { mode: pii },
                    secrets_detection: Detector { mode: secrets },
                    ..Default::default()
                });
            let memo = Verdicts::default().of("tenant");
            let mut sessions: Vec<Vec<Value>> = vec![Vec::new(); SESSIONS];
            for (n, step) in steps.iter().enumerate() {
                match step {
                    Step::Turn { session, added } => {
                        let history = &mut sessions[*session];
                        for _ in 0..=*added {
                            let i = history.len();
                            history.push(message(i, (n % 7) as u8));
                        }
                    }
                    Step::Edit { session, edit } => {
                        let history = &mut sessions[*session];
                        if !history.is_empty() {
                            let at = edit % history.len();
                            history[at] = message(at, 100 + (n % 50) as u8);
                        }
                    }
                }
                let session = match step { Step::Turn { session, .. } | Step::Edit { session, .. } => *session };
                let Some(history) = sessions.get(session).filter(|history| !history.is_empty()) else { continue };
                let sent = body(history, spaced, n % 5 * 7);
                let alone = ChatRequest::parse(&sent).unwrap();
                let known = ChatRequest::parse_remembering(&sent, Some(&memo)).unwrap();
                let (known, alone) = (known.exchange.as_ref(), alone.exchange.as_ref());
                prop_assert!(known.messages.sent().is_some(), "read by its spans");
                prop_assert_eq!(known.prompt_chars(), alone.prompt_chars());
                prop_assert_eq!(known.messages.turns(), alone.messages.turns());
                let hashes = |request| crate::verdicts::units(request).iter().map(|unit| memo.text_hash(unit)).collect::<Vec<_>>();
                prop_assert_eq!(hashes(known), hashes(alone));
                prop_assert!(!known.messages.is_typed());
                let policy = &policies[detectors[n % detectors.len()]];
                prop_assert_eq!(policy.check_request(known, Some(&memo)), policy.check_request(alone, None), "step {}", n);
                prop_assert!(!known.messages.is_typed(), "judged without typing the history");
                prop_assert_eq!(known, alone);
            }
        }
    }

    proptest! {
        /// The body is UTF-8 but for its known spans exactly when it is UTF-8: a known span's
        /// bytes are (they were checked when first sent), and a span starts and ends at a JSON
        /// structural byte (here the `,` between parts).
        #[test]
        fn utf8_but_the_known_spans_is_utf8(parts in prop::collection::vec((".{0,12}", any::<bool>(), prop::option::of((0..16usize, 0x80u8..=0xff))), 0..12)) {
            let (mut body, mut known) = (Vec::new(), Vec::new());
            for (text, is_known, bad) in parts {
                let mut bytes = text.into_bytes();
                if let Some((at, byte)) = bad {
                    bytes.insert(at.min(bytes.len()), byte);
                }
                if is_known && std::str::from_utf8(&bytes).is_ok() {
                    known.push(body.len()..body.len() + bytes.len());
                }
                body.extend_from_slice(&bytes);
                body.push(b',');
            }
            known.reverse();
            prop_assert_eq!(super::utf8_but(&body, &mut known).is_some(), std::str::from_utf8(&body).is_ok());
        }
    }

    /// A turn whose new message or other field is not UTF-8 is refused as the body alone is, in
    /// serde_json's words, though its history and tools are known by their bytes and not
    /// checked again.
    #[test]
    fn what_is_new_is_checked_as_utf8() {
        let memo = Verdicts::default().of("tenant");
        let tools = r#"[{"type":"function","function":{"name":"Bash","parameters":{"type":"object","properties":{"c":{"type":"string"}}}}}]"#;
        let with_tools = |sent: bytes::Bytes| {
            let text = String::from_utf8(sent.to_vec()).unwrap();
            bytes::Bytes::from(text.replacen(r#""messages""#, &format!(r#""tools":{tools},"messages""#), 1))
        };
        let history: Vec<Value> = (0..9).map(|i| message(i, 0)).collect();
        for upto in [3, 6] {
            ChatRequest::parse_remembering(&with_tools(body(&history[..upto], false, 0)), Some(&memo)).unwrap();
        }
        let sent = with_tools(body(&history, false, 0));
        let known = ChatRequest::parse_remembering(&sent, Some(&memo)).unwrap();
        assert!(known.exchange.messages.sent().is_some(), "read by its spans, its prefix and tools known");
        assert_eq!(memo.prefixes()[0].spans.len(), 9, "the prefix of six extended");
        // A bad byte in the newest message's text, in the field after the history, or in the
        // first message (the prefix then is not the one remembered: the body is checked whole).
        let text = String::from_utf8(sent.to_vec()).unwrap();
        let places =
            [(text.rfind("fix the build"), 4), (text.rfind(r#""pad":"p"#), 7), (text.find("fix the build"), 4)];
        for (at, after) in places {
            let at = at.unwrap() + after;
            let mut bad = sent.to_vec();
            bad.insert(at, 0xff);
            let bad = bytes::Bytes::from(bad);
            let refused = |read: Result<ChatRequest, _>| read.err().expect("refused");
            let alone = refused(ChatRequest::parse(&bad));
            let known = refused(ChatRequest::parse_remembering(&bad, Some(&memo)));
            assert_eq!(known.to_string(), alone.to_string());
            assert!(known.to_string().contains("unicode") || known.to_string().contains("UTF-8"), "{known}");
        }
    }

    /// A session's next turn finds its history as the prefix its last turn left, extends it by
    /// one segment, and keeps the one it extended behind the latest ones; an edited history
    /// finds the longest one that ends before its edit.
    #[test]
    fn a_turn_extends_the_prefix_its_last_turn_left() {
        let memo = Verdicts::default().of("tenant");
        let lengths =
            || memo.prefixes().iter().map(|prefix| (prefix.spans.len(), prefix.segments.len())).collect::<Vec<_>>();
        let history: Vec<Value> = (0..9).map(|i| message(i, 0)).collect();
        for (turn, upto) in [3, 6, 9].into_iter().enumerate() {
            let sent = body(&history[..upto], false, turn);
            ChatRequest::parse_remembering(&sent, Some(&memo)).unwrap();
            let prefixes = memo.prefixes();
            assert_eq!(prefixes.len(), turn + 1, "the prefixes it extended are kept behind it");
            assert_eq!(prefixes[0].segments.len(), turn + 1);
            assert_eq!(prefixes[0].spans.len(), upto);
        }
        assert_eq!(lengths(), [(9, 3), (6, 2), (3, 1)]);
        // Another session that began with the same message: its prefix is kept beside the
        // first's, and each finds its own, the longest that matches.
        ChatRequest::parse_remembering(&body(&history[..1], false, 0), Some(&memo)).unwrap();
        let more: Vec<Value> = (0..10).map(|i| message(i, 0)).collect();
        ChatRequest::parse_remembering(&body(&more, false, 0), Some(&memo)).unwrap();
        assert_eq!(lengths(), [(10, 4), (1, 1), (9, 3), (6, 2), (3, 1)], "the first session's, extended");
        // Edited after its third message: it extends the prefix of its first three.
        let mut edited = history.clone();
        edited[3] = message(3, 9);
        ChatRequest::parse_remembering(&body(&edited, false, 0), Some(&memo)).unwrap();
        assert_eq!(lengths(), [(9, 2), (10, 4), (1, 1), (3, 1), (9, 3), (6, 2)]);
        // Edited in its first: no known history starts so; it starts a prefix of its own.
        edited[0] = message(0, 9);
        ChatRequest::parse_remembering(&body(&edited, false, 0), Some(&memo)).unwrap();
        let prefixes = memo.prefixes();
        assert_eq!(prefixes.len(), 7, "a history that does not start as a known one starts a prefix of its own");
        assert_eq!((prefixes[0].spans.len(), prefixes[0].segments.len()), (9, 1));
    }
}
