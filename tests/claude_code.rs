//! The real Claude Code CLI through Shield (issue 28): `claude -p … --output-format
//! stream-json` run headless against the proxy, with a Shield key in `ANTHROPIC_AUTH_TOKEN`,
//! on routes named like a Claude model and not, over Anthropic-only, OpenAI-only and mixed
//! targets with a failover between flavors. Each run is a two-turn session with a tool call:
//! the mock model (`agent`) asks for `Read` on a file, Claude Code reads it and sends the
//! result back, and the model answers with the file's text. The test checks Claude Code's own
//! result and what the mock received on each turn.
//!
//! Claude Code comes from npm, pinned ([`PINNED`]; `SHIELD_CLAUDE_CODE_VERSION=latest` runs
//! the newest), installed once under `target/claude-code/<version>`. When the npm registry
//! cannot be reached the test is skipped with a message saying so; any other install failure
//! fails it.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Value, json};
use shield_e2e::agents::{Agent, Scratch};
use shield_e2e::stack::Stack;
use tokio::process::Command;

/// The Claude Code release the suite runs (checked 2026-12-02).
const PINNED: &str = "2.1.332";

/// The `claude` executable, installed if needed; `None` when npm's registry is unreachable.
async fn claude_code() -> Option<PathBuf> {
    Agent {
        package: "@anthropic-ai/claude-code",
        bin: "claude",
        dir: "claude-code",
        pinned: PINNED,
        version_env: "SHIELD_CLAUDE_CODE_VERSION",
    }
    .install()
    .await
}

/// What one headless run printed: its events, its final `result` event, its stderr.
struct Run {
    events: Vec<Value>,
    stderr: String,
    ok: bool,
}

impl Run {
    fn result(&self) -> &Value {
        self.events.iter().rev().find(|e| e["type"] == "result").unwrap_or(&Value::Null)
    }
}

/// Claude Code, headless, in a fresh HOME and a work directory holding `note.txt`: asked to
/// read the note and say what it says.
async fn run_claude(bin: &Path, proxy: &str, key: &str, model: &str, secret: &str) -> Run {
    let home = Scratch::new("home");
    let work = Scratch::new("work");
    let work_dir = work.0.canonicalize().unwrap();
    std::fs::write(work_dir.join("note.txt"), format!("The secret word is {secret}.\n")).unwrap();
    let state = json!({"hasCompletedOnboarding": true,
        "projects": {work_dir.to_string_lossy(): {"hasTrustDialogAccepted": true}}});
    std::fs::write(home.0.join(".claude.json"), state.to_string()).unwrap();
    let prompt = format!("Read the file {} and tell me what it says", work_dir.join("note.txt").display());
    let child = Command::new(bin)
        .args(["-p", &prompt, "--output-format", "stream-json", "--verbose", "--model", model])
        .args(["--allowedTools", "Read"])
        .current_dir(&work_dir)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("HOME", &home.0)
        .env("ANTHROPIC_BASE_URL", format!("http://{proxy}"))
        .env("ANTHROPIC_AUTH_TOKEN", key)
        // Nothing but the gateway: no telemetry, update checks or error reports.
        .env("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1")
        .env("DISABLE_AUTOUPDATER", "1")
        .env("DISABLE_TELEMETRY", "1")
        .env("DISABLE_ERROR_REPORTING", "1")
        // A failure must show, not be retried away.
        .env("CLAUDE_CODE_MAX_RETRIES", "0")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("claude starts");
    let out = tokio::time::timeout(Duration::from_secs(120), child.wait_with_output())
        .await
        .expect("claude finishes within 120 s")
        .unwrap();
    let events =
        String::from_utf8_lossy(&out.stdout).lines().filter_map(|line| serde_json::from_str(line).ok()).collect();
    Run { events, stderr: String::from_utf8_lossy(&out.stderr).into_owned(), ok: out.status.success() }
}

fn body_of(received: &Value) -> Value {
    serde_json::from_str(received["body"].as_str().unwrap_or("null")).unwrap_or(Value::Null)
}

/// The run answered with the note's text, after one `Read`.
fn check_answered(run: &Run, route: &str, secret: &str) {
    let result = run.result();
    assert!(run.ok, "claude on `{route}` failed: {result}\nstderr: {}", run.stderr);
    assert_eq!(result["subtype"], "success", "`{route}`: {result}");
    assert_eq!(result["is_error"], false, "`{route}`: {result}");
    let text = result["result"].as_str().unwrap_or_default();
    assert!(text.starts_with("the file says: ") && text.contains(secret), "`{route}` answered: {text}");
    let tool_uses: Vec<&Value> = run
        .events
        .iter()
        .filter(|e| e["type"] == "assistant")
        .flat_map(|e| e["message"]["content"].as_array().into_iter().flatten())
        .filter(|b| b["type"] == "tool_use")
        .collect();
    assert_eq!(tool_uses.len(), 1, "`{route}`: one Read call: {:?}", run.events);
    assert_eq!(tool_uses[0]["name"], "Read");
}

/// The two turns an OpenAI-flavour target received: Claude Code's request converted (its
/// mid-conversation system message where it stands, thinking as `reasoning_effort`), then
/// the tool result as a `tool` message.
fn check_openai_turns(received: &[Value], secret: &str) {
    assert_eq!(received.len(), 2, "two turns: {received:?}");
    let first = body_of(&received[0]);
    assert!(received[0]["path"].as_str().unwrap().ends_with("/chat/completions"));
    let roles: Vec<&str> = first["messages"].as_array().unwrap().iter().map(|m| m["role"].as_str().unwrap()).collect();
    assert_eq!(roles.first(), Some(&"system"), "the system prompt first: {roles:?}");
    assert!(
        roles.iter().skip(1).any(|r| *r == "system"),
        "Claude Code's mid-conversation system message stays where it stands: {roles:?}"
    );
    assert!(first["tools"].as_array().unwrap().iter().any(|t| t["function"]["name"] == "Read"));
    assert_eq!(first["reasoning_effort"], "high", "output_config.effort → reasoning_effort");
    for absent in ["thinking", "output_config", "context_management", "system"] {
        assert!(first.get(absent).is_none(), "`{absent}` is not sent to an OpenAI-flavour target");
    }
    let second = body_of(&received[1]);
    let last = second["messages"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(last["role"], "tool", "{last}");
    assert!(last["content"].as_str().unwrap().contains(secret), "{last}");
}

/// The two turns an Anthropic target received: Claude Code's own body and headers, as sent.
fn check_anthropic_turns(received: &[Value], secret: &str, folded: bool) {
    assert_eq!(received.len(), 2, "two turns: {received:?}");
    let beta = received[0]["headers"]["anthropic-beta"].as_str().unwrap_or_default();
    assert!(beta.contains("claude-code-20250219"), "anthropic-beta is forwarded as sent: {beta}");
    assert_eq!(received[0]["headers"]["anthropic-version"], "2023-06-01");
    let first = body_of(&received[0]);
    assert!(first["thinking"].is_object(), "thinking reaches an Anthropic target: {}", first["thinking"]);
    assert!(first["context_management"].is_object());
    let messages = first["messages"].as_array().unwrap();
    let system_messages = messages.iter().filter(|m| m["role"] == "system").count();
    if folded {
        assert_eq!(system_messages, 0, "folded for a model that does not take them");
        assert!(
            messages
                .iter()
                .any(|m| m["content"][0]["text"].as_str().is_some_and(|t| t.starts_with("<system-reminder>\n"))),
            "folded into a user turn as a reminder"
        );
    }
    let second = body_of(&received[1]);
    let last = second["messages"].as_array().unwrap().last().unwrap().clone();
    let result = last["content"].as_array().unwrap().iter().find(|b| b["type"] == "tool_result").cloned().unwrap();
    assert!(result.to_string().contains(secret), "{result}");
}

#[tokio::test]
async fn claude_code_works_on_any_route_over_any_flavor() {
    let Some(bin) = claude_code().await else { return };
    let stack = Stack::start().await;
    let anthropic = json!({"flavor": "anthropic"});
    stack.mock_target("cc-claude", "agent", anthropic.clone()).await;
    stack.mock_target("cc-claude-team", "agent", anthropic.clone()).await;
    stack.mock_target("cc-gpt", "agent", json!({"capabilities": {"reasoning": true}})).await;
    stack.mock_target("cc-claude-down", "status:529", anthropic).await;
    stack.mock_target("cc-gpt-backup", "agent", json!({"capabilities": {"reasoning": true}})).await;
    // Named like a model, Anthropic only; not named like one, Anthropic only; OpenAI only;
    // and mixed: the Anthropic target is overloaded and the OpenAI one answers.
    stack.put_route("claude-sonnet-4-5", json!({"targets": ["cc-claude"]})).await;
    stack.put_route("team-claude", json!({"targets": ["cc-claude-team"]})).await;
    stack.put_route("team-coder", json!({"targets": ["cc-gpt"]})).await;
    stack.put_route("team-mixed", json!({"targets": ["cc-claude-down", "cc-gpt-backup"]})).await;
    let (key, _) = stack.key(None).await;

    let cases = ["claude-sonnet-4-5", "team-claude", "team-coder", "team-mixed"];
    let runs = futures_util::future::join_all(cases.iter().enumerate().map(|(i, route)| {
        let secret = format!("PERIWINKLE{i}");
        let (bin, proxy, key) = (bin.clone(), stack.proxy.clone(), key.clone());
        async move { (route, secret.clone(), run_claude(&bin, &proxy, &key, route, &secret).await) }
    }))
    .await;
    for (route, secret, run) in &runs {
        check_answered(run, route, secret);
    }
    let secret = |i: usize| runs[i].1.clone();
    check_anthropic_turns(&stack.received("cc-claude").await, &secret(0), false);
    check_anthropic_turns(&stack.received("cc-claude-team").await, &secret(1), true);
    check_openai_turns(&stack.received("cc-gpt").await, &secret(2));
    // Mixed: each turn tried the Anthropic target first, then failed over.
    assert_eq!(stack.received("cc-claude-down").await.len(), 2);
    check_openai_turns(&stack.received("cc-gpt-backup").await, &secret(3));
}
