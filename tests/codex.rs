//! The real Codex CLI through Shield (issue 29): `codex exec --json` run headless against the
//! proxy's `/v1/responses`, with a custom model provider (`wire_api = "responses"`) whose key
//! is a Shield key, over an OpenAI-flavour target, an Anthropic-flavour target, and a route
//! that fails over from one flavor to the other on every turn. Each run is a two-turn session
//! with a tool call: the mock model (`agent`) asks for `exec_command` with `cat <file>`, Codex
//! runs the shell command and sends its output back, and the model answers with the file's
//! text. The test checks Codex's own events and what the mock received on each turn.
//!
//! Codex comes from npm, pinned ([`PINNED`]; `SHIELD_CODEX_VERSION=latest` runs the newest),
//! installed once under `target/codex/<version>`. When the npm registry cannot be reached the
//! test is skipped with a message saying so; any other install failure fails it.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Value, json};
use shield_e2e::agents::{Agent, Scratch};
use shield_e2e::stack::Stack;
use tokio::process::Command;

/// The Codex release the suite runs (checked 2026-12-02).
const PINNED: &str = "0.171.0";

/// The `codex` executable, installed if needed; `None` when npm's registry is unreachable.
async fn codex() -> Option<PathBuf> {
    Agent { package: "@openai/codex", bin: "codex", dir: "codex", pinned: PINNED, version_env: "SHIELD_CODEX_VERSION" }
        .install()
        .await
}

/// What one headless run printed.
struct Run {
    events: Vec<Value>,
    stderr: String,
    ok: bool,
}

impl Run {
    fn items(&self, kind: &str) -> Vec<&Value> {
        self.events
            .iter()
            .filter(|e| e["type"] == "item.completed" && e["item"]["type"] == kind)
            .map(|e| &e["item"])
            .collect()
    }
}

/// The `config.toml` the README tells users to paste, pointed at `proxy`.
fn config_toml(proxy: &str) -> String {
    format!(
        "model_provider = \"shield\"\n\n[model_providers.shield]\nname = \"Shield\"\nbase_url = \"http://{proxy}/v1\"\n\
         env_key = \"SHIELD_API_KEY\"\nwire_api = \"responses\"\n"
    )
}

/// Codex, headless, in a fresh CODEX_HOME and HOME and a work directory holding `note.txt`:
/// asked to read the note and say what it says.
async fn run_codex(bin: &Path, proxy: &str, key: &str, model: &str, secret: &str) -> Run {
    let home = Scratch::new("home");
    let codex_home = Scratch::new("codex-home");
    let work = Scratch::new("work");
    let work_dir = work.0.canonicalize().unwrap();
    std::fs::write(work_dir.join("note.txt"), format!("The secret word is {secret}.\n")).unwrap();
    std::fs::write(codex_home.0.join("config.toml"), config_toml(proxy)).unwrap();
    let prompt = format!("Read the file {} and tell me what it says", work_dir.join("note.txt").display());
    let child = Command::new(bin)
        .args(["exec", "--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox", "--ephemeral", "--json"])
        .args(["-m", model, &prompt])
        .current_dir(&work_dir)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("HOME", &home.0)
        .env("CODEX_HOME", &codex_home.0)
        .env("SHIELD_API_KEY", key)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("codex starts");
    let out = tokio::time::timeout(Duration::from_secs(120), child.wait_with_output())
        .await
        .expect("codex finishes within 120 s")
        .unwrap();
    let events =
        String::from_utf8_lossy(&out.stdout).lines().filter_map(|line| serde_json::from_str(line).ok()).collect();
    Run { events, stderr: String::from_utf8_lossy(&out.stderr).into_owned(), ok: out.status.success() }
}

fn body_of(received: &Value) -> Value {
    serde_json::from_str(received["body"].as_str().unwrap_or("null")).unwrap_or(Value::Null)
}

/// The run ran `cat` on the note and answered with its text.
fn check_answered(run: &Run, route: &str, secret: &str) {
    let dump = || format!("events: {:?}\nstderr: {}", run.events, run.stderr);
    assert!(run.ok, "codex on `{route}` failed\n{}", dump());
    assert!(run.events.iter().any(|e| e["type"] == "turn.completed"), "`{route}`: no turn.completed\n{}", dump());
    assert!(!run.events.iter().any(|e| e["type"] == "turn.failed" || e["type"] == "error"), "`{route}`\n{}", dump());
    let commands = run.items("command_execution");
    assert_eq!(commands.len(), 1, "`{route}`: one shell command\n{}", dump());
    assert!(commands[0]["command"].as_str().unwrap_or_default().contains("note.txt"), "{}", commands[0]);
    assert!(commands[0]["aggregated_output"].as_str().unwrap_or_default().contains(secret), "{}", commands[0]);
    let said: Vec<&str> = run.items("agent_message").iter().filter_map(|m| m["text"].as_str()).collect();
    assert!(
        said.iter().any(|t| t.starts_with("the file says: ") && t.contains(secret)),
        "`{route}` answered: {said:?}\n{}",
        dump()
    );
}

/// The two turns an OpenAI-flavour target received: Codex's request as Chat Completions
/// (developer messages as system, `exec_command` among the tools, the namespace and
/// web-search tools dropped), then the shell's output as a `tool` message.
fn check_openai_turns(received: &[Value], secret: &str) {
    assert_eq!(received.len(), 2, "two turns: {received:?}");
    assert!(received[0]["path"].as_str().unwrap().ends_with("/chat/completions"));
    let first = body_of(&received[0]);
    assert_eq!(first["messages"][0]["role"], "system", "Codex's developer instructions first");
    let tools: Vec<&str> =
        first["tools"].as_array().unwrap().iter().filter_map(|t| t["function"]["name"].as_str()).collect();
    assert!(tools.contains(&"exec_command"), "{tools:?}");
    assert_eq!(first["stream"], true);
    let second = body_of(&received[1]);
    let messages = second["messages"].as_array().unwrap();
    let call = messages.iter().find(|m| m["tool_calls"].is_array()).expect("the call is in the history");
    assert_eq!(call["tool_calls"][0]["function"]["name"], "exec_command");
    let last = messages.last().unwrap();
    assert_eq!(last["role"], "tool", "{last}");
    assert_eq!(last["tool_call_id"], call["tool_calls"][0]["id"]);
    assert!(last["content"].as_str().unwrap().contains(secret), "{last}");
}

/// The two turns an Anthropic target received: Codex's developer instructions as `system`,
/// its function tools as Anthropic tools, then the shell's output as a `tool_result`.
fn check_anthropic_turns(received: &[Value], secret: &str) {
    assert_eq!(received.len(), 2, "two turns: {received:?}");
    assert!(received[0]["path"].as_str().unwrap().ends_with("/messages"));
    let first = body_of(&received[0]);
    assert!(first["system"].to_string().contains("Codex"), "the developer instructions are the system prompt");
    assert!(first["tools"].as_array().unwrap().iter().any(|t| t["name"] == "exec_command"));
    assert!(first["max_tokens"].as_u64().unwrap() > 0, "Anthropic needs max_tokens: Shield sets it");
    let second = body_of(&received[1]);
    let messages = second["messages"].as_array().unwrap();
    let call = messages
        .iter()
        .flat_map(|m| m["content"].as_array().into_iter().flatten())
        .find(|b| b["type"] == "tool_use")
        .expect("the call is in the history");
    let last = messages.last().unwrap();
    let result = last["content"].as_array().unwrap().iter().find(|b| b["type"] == "tool_result").cloned().unwrap();
    assert_eq!(result["tool_use_id"], call["id"]);
    assert!(result.to_string().contains(secret), "{result}");
}

#[tokio::test]
async fn codex_works_through_shield_over_either_flavor_and_across_them() {
    let Some(bin) = codex().await else { return };
    let stack = Stack::start().await;
    let anthropic = json!({"flavor": "anthropic"});
    stack.mock_target("cx-gpt", "agent", json!({})).await;
    stack.mock_target("cx-claude", "agent", anthropic.clone()).await;
    stack.mock_target("cx-claude-down", "status:529", anthropic).await;
    stack.mock_target("cx-gpt-backup", "agent", json!({})).await;
    stack.put_route("team-codex", json!({"targets": ["cx-gpt"]})).await;
    stack.put_route("team-claude", json!({"targets": ["cx-claude"]})).await;
    // Mixed: the Anthropic target is overloaded on every turn and the OpenAI one answers.
    stack.put_route("team-mixed", json!({"targets": ["cx-claude-down", "cx-gpt-backup"]})).await;
    let (key, _) = stack.key(None).await;

    let cases = ["team-codex", "team-claude", "team-mixed"];
    let runs = futures_util::future::join_all(cases.iter().enumerate().map(|(i, route)| {
        let secret = format!("MARIGOLD{i}");
        let (bin, proxy, key) = (bin.clone(), stack.proxy.clone(), key.clone());
        async move { (route, secret.clone(), run_codex(&bin, &proxy, &key, route, &secret).await) }
    }))
    .await;
    for (route, secret, run) in &runs {
        check_answered(run, route, secret);
    }
    let secret = |i: usize| runs[i].1.clone();
    check_openai_turns(&stack.received("cx-gpt").await, &secret(0));
    check_anthropic_turns(&stack.received("cx-claude").await, &secret(1));
    assert_eq!(stack.received("cx-claude-down").await.len(), 2, "each turn tried the Anthropic target first");
    check_openai_turns(&stack.received("cx-gpt-backup").await, &secret(2));
}
