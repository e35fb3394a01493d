//! The input guardrails' cost per turn over a coding agent's session (issue 33): every turn
//! resends the system prompt and the whole history and adds a user turn, a tool call and its
//! ~3 KB result. Prints, for each turn, the median time of the guardrail stage (PII and secrets
//! detectors on) over many independent sessions: `before` scans every text (the stage as it
//! was), `after` reads the tenant's memo of texts judged before and scans only the new ones.
//! The last two columns time what the proxy does with the turn's Chat Completions body: read
//! it and judge it, without the memo (`read before`: every message read and scanned) and with
//! it (`read after`: a message sent before is known by its bytes, not read, and not scanned).
//! `judged` is the guardrail stage alone on that request as the proxy read it with the memo:
//! the scanning cost of a turn where every resent message is known by its bytes (its unit's
//! hash remembered, so its text is neither hashed nor scanned again).
//!
//! `cargo run --release -p shield-core --example guardrail_turns [SESSIONS]` (default 40). A
//! benchmark, not a test: it times on whatever the machine is doing, so compare the two columns
//! of one run, and the curve's shape, not figures across machines. Each turn's figure is the
//! median over `GUARDRAIL_TURNS_ROUNDS` rounds (default 3) of SESSIONS sessions each, every
//! round with fresh memos (one round's median moved by ±15 % from run to run at turn 5). Each
//! way is timed over every session of a turn before the next way, so the stage with the memo
//! finds the caches as the same way left them, as in the proxy; and with the proxy's
//! allocator (mimalloc), not glibc's, whose free lists the growing memo made slower to walk.
//!
//! `guardrail_turns SESSIONS TURN` counts instead of timing: it reads and judges the sessions'
//! bodies with the memo up to turn `TURN` and nothing else, judging that turn's through
//! [`judged_at_the_turn_counted`], so that callgrind counts the guardrail stage of that one
//! turn, which no other load on the machine moves (`bench/README.md`, "The guardrail stage per
//! turn, in instructions").

use std::time::Instant;

use shield_core::chat_request::ChatRequest;
use shield_core::exchange::{Message, Part, Request, Role};
use shield_core::guardrails::{Detector, GuardrailPolicy, Mode, Verdict};
use shield_core::verdicts::{Memo, Verdicts};

const TURNS: usize = 50;

/// The proxy's allocator (`services/cli`), so the stage allocates as it does there.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// A small deterministic generator (xorshift), so every run judges the same texts.
struct Words(u64);

const VOCABULARY: [&str; 40] = [
    "the",
    "function",
    "returns",
    "a",
    "value",
    "when",
    "called",
    "with",
    "config",
    "path",
    "error",
    "handler",
    "request",
    "struct",
    "impl",
    "let",
    "match",
    "Some",
    "None",
    "Ok",
    "Err",
    "self",
    "async",
    "await",
    "fn",
    "pub",
    "use",
    "crate",
    "mod",
    "test",
    "assert_eq!",
    "vec![1, 2, 3]",
    "String::new()",
    "{",
    "}",
    "=>",
    "//",
    "if",
    "else",
    "return",
];

impl Words {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// About `bytes` of code-like text, lines of 8-12 words.
    fn text(&mut self, bytes: usize) -> String {
        let mut out = String::with_capacity(bytes + 64);
        while out.len() < bytes {
            for _ in 0..8 + self.next() % 5 {
                out.push_str(VOCABULARY[(self.next() % VOCABULARY.len() as u64) as usize]);
                out.push(' ');
            }
            out.push_str(&format!("// line {}\n", self.next() % 10_000));
        }
        out
    }
}

/// Session `seed` as it stands at `turn`: a 12 KB system prompt, then per turn a user message,
/// an assistant tool call, its ~3 KB result and the assistant's reply.
fn session(seed: u64, turns: usize) -> Request {
    let mut words = Words(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let mut request = Request { system: vec![words.text(12_000).into()].into(), ..Default::default() };
    for turn in 0..turns {
        let id = format!("toolu_{seed}_{turn}");
        request.messages.to_mut().push(Message { role: Role::User, content: vec![Part::Text(words.text(300).into())] });
        request.messages.to_mut().push(Message {
            role: Role::Assistant,
            content: vec![
                Part::Text(words.text(200).into()),
                Part::ToolUse {
                    id: id.clone(),
                    name: "Read".into(),
                    input: format!(r#"{{"file_path":"src/m{turn}.rs"}}"#),
                },
            ],
        });
        request.messages.to_mut().push(Message {
            role: Role::User,
            content: vec![Part::ToolResult { id, content: words.text(3_000).into(), is_error: false }],
        });
        request
            .messages
            .to_mut()
            .push(Message { role: Role::Assistant, content: vec![Part::Text(words.text(400).into())] });
    }
    request
}

/// The session's request as a Chat Completions body (the system prompt as a system message).
fn chat_body(request: &Request) -> bytes::Bytes {
    let mut messages = vec![serde_json::json!({"role": "system", "content": request.system.join("\n")})];
    for message in request.messages.iter() {
        for part in &message.content {
            messages.push(match (message.role, part) {
                (Role::Assistant, Part::ToolUse { id, name, input }) => serde_json::json!({"role": "assistant",
                    "tool_calls": [{"id": id, "type": "function", "function": {"name": name, "arguments": input}}]}),
                (_, Part::ToolResult { id, content, .. }) => {
                    serde_json::json!({"role": "tool", "tool_call_id": id, "content": content})
                }
                (Role::Assistant, Part::Text(text)) => serde_json::json!({"role": "assistant", "content": text}),
                (_, Part::Text(text)) => serde_json::json!({"role": "user", "content": text}),
                _ => continue,
            });
        }
    }
    bytes::Bytes::from(serde_json::json!({"model": "agent", "messages": messages}).to_string())
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// The guardrail stage on a body read with the memo, at the turn counted: a function of its own
/// that callgrind's `--toggle-collect` names.
#[inline(never)]
fn judged_at_the_turn_counted(policy: &GuardrailPolicy, request: &Request, memo: &Memo) -> Verdict {
    policy.check_request(request, Some(memo))
}

/// Reads and judges the sessions' bodies with the memo up to `counted`, that turn's judging
/// in [`judged_at_the_turn_counted`].
fn count(policy: &GuardrailPolicy, sessions: u64, counted: usize) {
    let memo = Verdicts::default().of("bodies");
    for turn in 1..=counted {
        for seed in 0..sessions {
            let body = chat_body(&session(seed, turn));
            let verdict = ChatRequest::parse_remembering(&body, Some(&memo)).map(|read| match turn == counted {
                true => judged_at_the_turn_counted(policy, &read.exchange, &memo),
                false => policy.check_request(&read.exchange, Some(&memo)),
            });
            assert!(verdict.is_ok(), "a chat body");
            let _ = std::hint::black_box(verdict);
        }
    }
    println!("judged turn {counted} of {sessions} sessions in judged_at_the_turn_counted");
}

fn main() {
    let sessions: u64 = std::env::args().nth(1).and_then(|n| n.parse().ok()).unwrap_or(40);
    let policy = GuardrailPolicy {
        pii_detection: Detector { mode: Mode::Monitor },
        secrets_detection: Detector { mode: Mode::Monitor },
        ..Default::default()
    };
    if let Some(counted) = std::env::args().nth(2).and_then(|n| n.parse().ok()) {
        return count(&policy, sessions, counted);
    }
    let rounds: u64 = std::env::var("GUARDRAIL_TURNS_ROUNDS").ok().and_then(|n| n.parse().ok()).unwrap_or(3).max(1);
    // Each column's samples per turn, pooled over the rounds: [before, after, read before,
    // read after, judged].
    let mut samples: Vec<[Vec<f64>; 5]> = (0..TURNS).map(|_| Default::default()).collect();
    let mut bytes = vec![0; TURNS];
    let mut remembered_texts = 0;
    for round in 0..rounds {
        // Fresh memos and sessions of their own each round: every round's tables grow as one
        // tenant's do over its sessions, and a turn's median is taken over all rounds'.
        let verdicts = Verdicts::default();
        let memo = verdicts.of("bench");
        // The bodies' memo: another tenant's, so that the typed requests above do not warm it.
        let bodies_memo = verdicts.of("bodies");
        let seeds = round * sessions..(round + 1) * sessions;
        for turn in 1..=TURNS {
            let requests: Vec<Request> = seeds.clone().map(|s| session(s, turn)).collect();
            let bodies: Vec<bytes::Bytes> = requests.iter().map(chat_body).collect();
            bytes[turn - 1] = requests[0].text().len();
            let [before, after, read_before, read_after, judged] = &mut samples[turn - 1];
            // Each way over every session in turn, so that what a measured stage finds in the
            // caches is what the same way left from the session before, as in a proxy serving
            // one way. (Scanning every text of a 200 KB history and building its tree just
            // before judging it with the memo evicted the memo's tables and the detectors'
            // state, which the proxy with its memo never does: that interleaving made the
            // `judged` column grow 1.11-1.31x by turn 50 for the same instructions.)
            let mut fresh = Vec::new();
            for (request, body) in requests.iter().zip(&bodies) {
                let started = Instant::now();
                fresh.push(policy.check_request(request, None));
                before.push(started.elapsed().as_secs_f64() * 1e6);
                let started = Instant::now();
                let read = ChatRequest::parse_shared(body).map(|read| policy.check_request(&read.exchange, None));
                read_before.push(started.elapsed().as_secs_f64() * 1e6);
                assert_eq!(read.as_ref().ok(), fresh.last(), "a chat body");
            }
            for (request, fresh) in requests.iter().zip(&fresh) {
                let started = Instant::now();
                let remembered = policy.check_request(request, Some(&memo));
                after.push(started.elapsed().as_secs_f64() * 1e6);
                assert_eq!(fresh, &remembered, "a remembered verdict is the fresh one");
            }
            for (body, fresh) in bodies.iter().zip(&fresh) {
                let started = Instant::now();
                let remembered = ChatRequest::parse_remembering(body, Some(&bodies_memo)).map(|read| {
                    let judging = Instant::now();
                    let verdict = policy.check_request(&read.exchange, Some(&bodies_memo));
                    judged.push(judging.elapsed().as_secs_f64() * 1e6);
                    verdict
                });
                read_after.push(started.elapsed().as_secs_f64() * 1e6);
                assert_eq!(remembered.as_ref().ok(), Some(fresh), "a body read with the memo is judged as without it");
            }
        }
        remembered_texts = memo.len();
    }
    let rows: Vec<(usize, usize, [f64; 5])> =
        samples.into_iter().enumerate().map(|(at, columns)| (at + 1, bytes[at], columns.map(median))).collect();
    println!("turn  text KB  before us  after us  read before us  read after us  judged us");
    for (turn, bytes, [before, after, read_before, read_after, judged]) in &rows {
        println!(
            "{turn:>4}{:>9.1}{before:>11.1}{after:>10.1}{read_before:>16.1}{read_after:>15.1}{judged:>11.1}",
            *bytes as f64 / 1024.0
        );
    }
    let ratio = |column: usize| rows[49].2[column] / rows[4].2[column];
    println!(
        "turn 50 / turn 5: before {:.2}x, after {:.2}x (target: after within 1.20x); read before {:.2}x, read after \
         {:.2}x, judged {:.2}x; memo holds {} texts (the last round's)",
        ratio(0),
        ratio(1),
        ratio(2),
        ratio(3),
        ratio(4),
        remembered_texts
    );
}
