//! The real `shield` binary, as a user runs it: scriptable output, env defaults, a store that
//! is down, `shield up --demo` twice in a row, and logs without colour codes off a terminal.

use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::time::Duration;

use serde_json::{Value, json};
use shield_e2e::admin::{JWT_SECRET, vault_key};
use shield_e2e::process::shield_bin;
use shield_e2e::{DbName, eventually, free_port, redis_url, unique};
use tokio::process::Command;

/// A scratch working directory, removed at the end.
struct Scratch(PathBuf);

impl Scratch {
    fn new() -> Scratch {
        let dir = std::env::temp_dir().join(unique("shield-cli-"));
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `shield` with a clean environment: only what the test sets.
fn shield(cwd: &Path, env: &[(&str, String)]) -> Command {
    let mut cmd = Command::new(shield_bin());
    cmd.current_dir(cwd)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("RUST_LOG", "warn")
        .kill_on_drop(true);
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd
}

async fn run(cmd: &mut Command) -> Output {
    tokio::time::timeout(Duration::from_secs(60), cmd.stdin(Stdio::null()).output())
        .await
        .expect("command finishes")
        .expect("command runs")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).to_string()
}

#[tokio::test]
async fn a_store_that_is_down_is_one_clear_line_and_exit_1() {
    let scratch = Scratch::new();
    let port = free_port();
    let env = [
        ("DATABASE_URL", format!("postgres://postgres:hunter2@127.0.0.1:{port}/shield")),
        ("SHIELD_JWT_SECRET", JWT_SECRET.to_string()),
        ("SHIELD_VAULT_KEY", vault_key()),
    ];
    let commands: [&[&str]; 5] = [
        &["migrate"],
        &["admin"],
        &["up"],
        &["tenant", "create", "acme", "--admin-email", "a@acme.example.com"],
        &["key", "create", "--tenant", "acme", "--name", "ci"],
    ];
    for args in commands {
        let out = run(shield(&scratch.0, &env).args(args)).await;
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "shield {args:?}: {stderr}");
        assert_eq!(stderr.trim().lines().count(), 1, "shield {args:?} prints one line: {stderr}");
        assert!(
            stderr.contains("Postgres") && stderr.contains(&format!("127.0.0.1:{port}")),
            "names the store and address: {stderr}"
        );
        assert!(stderr.contains("start it"), "says how to start it: {stderr}");
        assert!(!stderr.contains("hunter2"), "never prints the password: {stderr}");
        assert!(!stderr.contains("panicked") && !stderr.contains("backtrace"));
        assert!(out.stdout.is_empty());
    }
}

#[tokio::test]
async fn secrets_are_required_outside_up() {
    let scratch = Scratch::new();
    let out =
        run(shield(&scratch.0, &[]).args(["token", "issue", "--tenant", "acme", "--scopes", "tenant:read"])).await;
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("SHIELD_JWT_SECRET is not set"), "{}", text(&out.stderr));
    let env = [("SHIELD_JWT_SECRET", JWT_SECRET.to_string())];
    let out =
        run(shield(&scratch.0, &env).args(["token", "issue", "--tenant", "acme", "--scopes", "tenant:read,admin"]))
            .await;
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("unknown scope \"admin\""), "{}", text(&out.stderr));
    let db = DbName::reserve();
    let env = [("DATABASE_URL", db.url.clone()), ("SHIELD_VAULT_KEY", vault_key())];
    let out = run(shield(&scratch.0, &env).args(["admin"])).await;
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("SHIELD_JWT_SECRET"), "{}", text(&out.stderr));
}

/// Starts a long-running `shield` role with stderr going to a file the test can read.
fn spawn_role(cwd: &Path, env: &[(&str, String)], args: &[&str], log: &Path) -> tokio::process::Child {
    let file = std::fs::File::create(log).unwrap();
    shield(cwd, env).args(args).stdin(Stdio::null()).stdout(Stdio::null()).stderr(file).spawn().expect("spawn shield")
}

async fn http_ok(url: &str) -> bool {
    reqwest::get(url).await.is_ok_and(|r| r.status().is_success())
}

#[tokio::test]
async fn tenant_token_and_key_commands_are_scriptable_and_work_with_the_admin() {
    let scratch = Scratch::new();
    let db = DbName::reserve();
    let prefix = unique("cli") + ":";
    let admin_addr = format!("127.0.0.1:{}", free_port());
    let env = [
        ("DATABASE_URL", db.url.clone()),
        ("REDIS_URL", redis_url()),
        ("SHIELD_REDIS_PREFIX", prefix.clone()),
        ("SHIELD_ADMIN_ADDR", admin_addr.clone()),
        ("SHIELD_JWT_SECRET", JWT_SECRET.to_string()),
        ("SHIELD_VAULT_KEY", vault_key()),
    ];
    let out = run(shield(&scratch.0, &env).arg("migrate")).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("created database"), "migrate creates a missing database");
    let out = run(shield(&scratch.0, &env).arg("migrate")).await;
    assert!(out.status.success(), "migrate is idempotent: {}", text(&out.stderr));

    let slug = unique("acme-")[..16].to_string();
    let out =
        run(shield(&scratch.0, &env).args(["tenant", "create", &slug, "--admin-email", "Owner@Acme.example.com"]))
            .await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let created: Value = serde_json::from_str(text(&out.stdout).trim()).expect("stdout is one JSON object");
    assert_eq!(created["tenant"], slug);
    assert_eq!(created["admin_email"], "owner@acme.example.com");
    let password = created["password"].as_str().unwrap().to_string();
    let out =
        run(shield(&scratch.0, &env).args(["tenant", "create", &slug, "--admin-email", "x@acme.example.com"])).await;
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("already exists"));

    let out = run(shield(&scratch.0, &env).args([
        "token",
        "issue",
        "--tenant",
        &slug,
        "--scopes",
        "tenant:read,config:write",
        "--ttl",
        "10m",
    ]))
    .await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let token = text(&out.stdout);
    assert!(token.ends_with('\n') && token.trim().split('.').count() == 3, "only the token: {token:?}");
    let token = token.trim().to_string();

    let out = run(shield(&scratch.0, &env).args([
        "key",
        "create",
        "--tenant",
        &slug,
        "--name",
        "ci",
        "--role",
        "contractor",
        "--route",
        "team-*",
        "--route",
        "smart",
        "--budget",
        "2.5",
        "--budget-action",
        "warn",
        "--expires-at",
        "2099-01-01T00:00:00Z",
        "--meta",
        "owner=ci-bot",
    ]))
    .await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let key = text(&out.stdout);
    assert!(key.starts_with("sk-shield-") && key.trim().lines().count() == 1, "only the key: {key:?}");
    let key = key.trim().to_string();

    let log = scratch.0.join("admin.log");
    let _admin = spawn_role(&scratch.0, &env, &["admin"], &log);
    let base = format!("http://{admin_addr}");
    eventually(30, "the admin to answer /healthz", || async {
        http_ok(&format!("{base}/healthz")).await.then_some(())
    })
    .await;
    let client = reqwest::Client::new();
    let login = client
        .post(format!("{base}/v1/auth/login"))
        .json(&json!({"email": "owner@acme.example.com", "password": password}))
        .send()
        .await
        .unwrap();
    assert_eq!(login.status(), 200);
    let keys: Value =
        client.get(format!("{base}/v1/tenant/me/keys")).bearer_auth(&token).send().await.unwrap().json().await.unwrap();
    assert_eq!(keys["keys"][0]["prefix"].as_str().unwrap(), &key[..14]);
    assert_eq!(keys["keys"][0]["role"], "contractor");
    assert_eq!(keys["keys"][0]["routes"], serde_json::json!(["team-*", "smart"]));
    assert_eq!(keys["keys"][0]["budget"], serde_json::json!({"monthly": 2.5, "action": "warn"}));
    assert_eq!(keys["keys"][0]["expires_at"], "2099-01-01T00:00:00Z");
    assert_eq!(keys["keys"][0]["metadata"], serde_json::json!({"owner": "ci-bot"}));
    // The key created by the CLI is published for the proxy, under the prefix.
    let dump = shield_e2e::redis_dump(&format!("{prefix}gw_key:{}", shield_core::snapshot::key_hash(&key))).await;
    assert_eq!(dump.len(), 1, "gw_key published");
    // The admin republishes the tenant at start.
    let snapshot = eventually(10, "the snapshot", || async {
        shield_e2e::redis_dump(&format!("{prefix}gw_snapshot:{{{slug}}}")).await.pop()
    })
    .await;
    assert!(snapshot.1.contains(&format!("\"tenant\":\"{slug}\"")));
    let logs = std::fs::read_to_string(&log).unwrap();
    assert!(!logs.contains(&key) && !logs.contains(&password), "no secret in the admin's log");
}

/// Reads `label   value` from the demo banner.
fn banner_value(log: &str, label: &str) -> Option<String> {
    log.lines().find_map(|l| l.trim().strip_prefix(label)).map(|v| v.trim().to_string())
}

/// Every address the banner prints answers (issue 14: `/docs` and the bare roots were 404).
async fn printed_addresses_answer(banner: &str) {
    let printed: Vec<String> = banner
        .split(|c: char| c.is_whitespace() || c == '(' || c == ')' || c == '\'')
        .filter(|w| w.starts_with("http://") && !w.contains("/v1/"))
        .map(str::to_string)
        .collect();
    assert!(printed.len() >= 5, "portal, admin, docs, proxy and mock are printed: {printed:?}");
    for url in &printed {
        let response = reqwest::get(url).await.unwrap();
        assert!(response.status().is_success(), "{url} answers {}", response.status());
    }
}

#[tokio::test]
async fn up_demo_seeds_a_working_tenant_and_is_idempotent() {
    let scratch = Scratch::new();
    let db = DbName::reserve();
    let admin_addr = format!("127.0.0.1:{}", free_port());
    let env = [
        ("DATABASE_URL", db.url.clone()),
        ("REDIS_URL", redis_url()),
        ("SHIELD_REDIS_PREFIX", unique("up") + ":"),
        ("SHIELD_ADMIN_ADDR", admin_addr.clone()),
        ("SHIELD_PROXY_ADDR", format!("127.0.0.1:{}", free_port())),
        ("SHIELD_MOCK_ADDR", format!("127.0.0.1:{}", free_port())),
    ];
    let mut seen = Vec::new();
    for round in 0..2 {
        let log = scratch.0.join(format!("up-{round}.log"));
        let mut up = spawn_role(&scratch.0, &env, &["up", "--demo"], &log);
        let banner = eventually(60, "the demo banner", || async {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            text.contains("API key").then_some(text)
        })
        .await;
        printed_addresses_answer(&banner).await;
        let key = banner_value(&banner, "API key").unwrap();
        let login = banner_value(&banner, "login").unwrap();
        let (email, password) = login.split_once(" / ").unwrap();
        let base = format!("http://{admin_addr}");
        let client = reqwest::Client::new();
        let response = client
            .post(format!("{base}/v1/auth/login"))
            .json(&json!({"email": email, "password": password}))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200, "the printed login works");
        let token = response.json::<Value>().await.unwrap()["token"].as_str().unwrap().to_string();
        let route: Value = client
            .get(format!("{base}/v1/tenant/me/gateway/routes/smart"))
            .bearer_auth(&token)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(route["targets"], json!(["mock-primary", "mock-secondary"]));
        // The printed curl call: model `smart` fails over from the failing primary.
        let proxy = &env.iter().find(|(k, _)| *k == "SHIELD_PROXY_ADDR").unwrap().1;
        let body = json!({"model": "smart", "messages": [{"role": "user", "content": "hi"}]});
        let answer = eventually(10, "the proxy to answer", || async {
            let response = client
                .post(format!("http://{proxy}/v1/chat/completions"))
                .bearer_auth(&key)
                .json(&body)
                .send()
                .await
                .ok()?;
            response.status().is_success().then_some(response)
        })
        .await;
        assert_eq!(answer.headers()["x-shield-failovers"], "1");
        assert_eq!(answer.headers()["x-shield-target"], "mock-secondary");
        seen.push((key, password.to_string()));
        up.kill().await.unwrap();
    }
    assert_eq!(seen[0], seen[1], "a restart keeps the same demo key and login");
    assert!(scratch.0.join(".shield/jwt_secret").exists() && scratch.0.join(".shield/vault_key").exists());
}

/// Reads `child`'s stderr line by line until a line contains `until` (or 30 s pass); returns
/// everything read.
async fn stderr_until(child: &mut tokio::process::Child, until: &str) -> String {
    use tokio::io::AsyncBufReadExt;
    let mut lines = tokio::io::BufReader::new(child.stderr.take().expect("stderr is piped")).lines();
    let mut seen = String::new();
    let read = async {
        while let Ok(Some(line)) = lines.next_line().await {
            seen.push_str(&line);
            seen.push('\n');
            if line.contains(until) {
                return;
            }
        }
    };
    let _ = tokio::time::timeout(Duration::from_secs(30), read).await;
    seen
}

/// Issue 27, item 7: logs that go to a pipe or a file are plain text, without the terminal's
/// colour codes.
#[tokio::test]
async fn logs_to_a_pipe_are_plain_text() {
    let scratch = Scratch::new();
    let addr = format!("127.0.0.1:{}", free_port());
    let mut mock = shield(&scratch.0, &[("RUST_LOG", "info".to_string())])
        .args(["mock-llm", "--addr", &addr])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn shield mock-llm");
    let logs = stderr_until(&mut mock, "mock LLM listening").await;
    mock.kill().await.unwrap();
    assert!(logs.contains("mock LLM listening"), "the mock logs at info: {logs:?}");
    assert!(!logs.contains('\x1b'), "no ANSI escape in piped logs: {logs:?}");
}

/// On a terminal the logs keep their colours, unless `NO_COLOR` is set to anything but the
/// empty string (no-color.org). `script` gives the binary a pseudo-terminal as its stderr.
#[tokio::test]
async fn logs_on_a_terminal_are_coloured_unless_no_color_is_set() {
    let cases = [(None, true), (Some("1"), false), (Some(""), true)];
    let runs = cases.map(|(no_color, coloured)| async move {
        let scratch = Scratch::new();
        let addr = format!("127.0.0.1:{}", free_port());
        let inner = format!("timeout -s INT 2 {} mock-llm --addr {addr}", shield_bin().display());
        let mut script = Command::new("script");
        script
            .args(["-qec", &inner, "/dev/null"])
            .current_dir(&scratch.0)
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("RUST_LOG", "info")
            .kill_on_drop(true);
        if let Some(value) = no_color {
            script.env("NO_COLOR", value);
        }
        let out = run(&mut script).await;
        let terminal = text(&out.stdout);
        assert!(terminal.contains("mock LLM listening"), "NO_COLOR={no_color:?}: {terminal:?}");
        assert_eq!(terminal.contains("\x1b["), coloured, "NO_COLOR={no_color:?}: {terminal:?}");
    });
    futures_util::future::join_all(runs).await;
}

/// Whether anything accepts a connection on 127.0.0.1:`port`.
fn listening(port: u16) -> bool {
    std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
}

/// The environment of an `up` that finds no store at its default addresses: DATABASE_URL and
/// REDIS_URL unset, the defaults moved to free ports where nothing listens (the real stores
/// on 5432 and 6379 are never touched), every role on a free port.
fn private_stores_env(postgres: u16, redis: u16) -> Vec<(&'static str, String)> {
    vec![
        ("SHIELD_DEFAULT_POSTGRES_PORT", postgres.to_string()),
        ("SHIELD_DEFAULT_REDIS_PORT", redis.to_string()),
        ("SHIELD_ADMIN_ADDR", format!("127.0.0.1:{}", free_port())),
        ("SHIELD_PROXY_ADDR", format!("127.0.0.1:{}", free_port())),
        ("SHIELD_MOCK_ADDR", format!("127.0.0.1:{}", free_port())),
    ]
}

fn env_value(env: &[(&str, String)], name: &str) -> String {
    env.iter().find(|(k, _)| *k == name).map(|(_, v)| v.clone()).unwrap()
}

fn signal(pid: u32, signal: &str) {
    let status = std::process::Command::new("kill").args([signal, &pid.to_string()]).status().unwrap();
    assert!(status.success(), "kill {signal} {pid}");
}

/// When a test fails while `up` runs, SIGTERM it (the child's own drop would SIGKILL it, and
/// its private stores would outlive the test) and wait for its stores to go.
struct StopUpOnDrop {
    pid: Option<u32>,
    ports: [u16; 2],
}

impl Drop for StopUpOnDrop {
    fn drop(&mut self) {
        if let Some(pid) = self.pid.take() {
            let _ = std::process::Command::new("kill").args(["-TERM", &pid.to_string()]).status();
            let deadline = std::time::Instant::now() + Duration::from_secs(30);
            while self.ports.iter().any(|&p| listening(p)) && std::time::Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
}

/// Issue 27, item 8: Postgres and Redis installed but not running, and the user set neither
/// DATABASE_URL nor REDIS_URL: `up --demo` starts private ones with their data in `.shield/`,
/// says so in one line, works end to end on them, and stops them when it exits — on SIGTERM
/// and on Ctrl-C (SIGINT). A restart reuses their data: the same demo key.
#[tokio::test]
async fn up_starts_private_stores_when_none_run_and_stops_them_on_exit() {
    let scratch = Scratch::new();
    let (pg_port, redis_port) = (free_port(), free_port());
    let env = private_stores_env(pg_port, redis_port);
    let (admin, proxy) = (env_value(&env, "SHIELD_ADMIN_ADDR"), env_value(&env, "SHIELD_PROXY_ADDR"));
    let mut keys = Vec::new();
    for (round, stop_with) in ["-TERM", "-INT"].into_iter().enumerate() {
        assert!(!listening(pg_port) && !listening(redis_port), "nothing listens at the defaults");
        let log = scratch.0.join(format!("up-{round}.log"));
        let mut up = spawn_role(&scratch.0, &env, &["up", "--demo"], &log);
        let mut guard = StopUpOnDrop { pid: up.id(), ports: [pg_port, redis_port] };
        // initdb takes a few seconds the first time.
        let banner = eventually(120, "the demo banner", || async {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            text.contains("API key").then_some(text)
        })
        .await;
        let said: Vec<&str> = banner.lines().filter(|l| l.contains("private")).collect();
        assert_eq!(
            said,
            [format!(
                "started a private Postgres at 127.0.0.1:{pg_port} (data in .shield/postgres) and Redis at 127.0.0.1:{redis_port} (data in .shield/redis); they stop when `up` exits"
            )],
            "one line says what started: {banner}"
        );
        assert!(listening(pg_port) && listening(redis_port));
        assert!(scratch.0.join(".shield/postgres/PG_VERSION").exists(), "Postgres's data is in .shield/postgres");
        assert!(scratch.0.join(".shield/redis").is_dir());
        printed_addresses_answer(&banner).await;
        let client = reqwest::Client::new();
        assert!(http_ok(&format!("http://{admin}/healthz")).await, "the admin answers");
        // The proxy knows the printed key: the admin published it to the private Redis.
        let key = banner_value(&banner, "API key").unwrap();
        let models = eventually(20, "the proxy to list models for the printed key", || async {
            let response = client.get(format!("http://{proxy}/v1/models")).bearer_auth(&key).send().await.ok()?;
            response.status().is_success().then_some(response)
        })
        .await;
        let models: Value = models.json().await.unwrap();
        assert!(models.to_string().contains("smart"), "route smart is listed: {models}");
        let body = json!({"model": "smart", "messages": [{"role": "user", "content": "hi"}]});
        let answer = client
            .post(format!("http://{proxy}/v1/chat/completions"))
            .bearer_auth(&key)
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(answer.status(), 200);
        assert_eq!(answer.headers()["x-shield-target"], "mock-secondary");
        keys.push(key);

        signal(up.id().unwrap(), stop_with);
        let status = tokio::time::timeout(Duration::from_secs(60), up.wait())
            .await
            .unwrap_or_else(|_| panic!("up exits after kill {stop_with}"))
            .unwrap();
        guard.pid = None;
        let logs = std::fs::read_to_string(&log).unwrap();
        assert!(status.success(), "up exits 0 after kill {stop_with}: {status:?} {logs}");
        assert!(!listening(pg_port), "the private Postgres stopped with up ({stop_with})");
        assert!(!listening(redis_port), "the private Redis stopped with up ({stop_with})");
        assert!(!scratch.0.join(".shield/postgres/postmaster.pid").exists(), "a clean Postgres shutdown");
        assert!(scratch.0.join(".shield/redis/dump.rdb").exists(), "Redis saved its data in .shield/redis");
    }
    assert_eq!(keys[0], keys[1], "a restart reuses the private Postgres's data: the same demo key");
}

/// `up` that fails after starting its private stores (here: its admin address is taken) stops
/// them before exiting 1.
#[tokio::test]
async fn up_stops_its_private_stores_when_it_fails() {
    let scratch = Scratch::new();
    let (pg_port, redis_port) = (free_port(), free_port());
    let env = private_stores_env(pg_port, redis_port);
    let taken = std::net::TcpListener::bind(env_value(&env, "SHIELD_ADMIN_ADDR")).unwrap();
    let mut up = shield(&scratch.0, &env).arg("up").stdin(Stdio::null()).stderr(Stdio::piped()).spawn().unwrap();
    let mut guard = StopUpOnDrop { pid: up.id(), ports: [pg_port, redis_port] };
    let out = tokio::time::timeout(Duration::from_secs(120), async {
        let mut stderr = String::new();
        tokio::io::AsyncReadExt::read_to_string(&mut up.stderr.take().unwrap(), &mut stderr).await.unwrap();
        (up.wait().await.unwrap(), stderr)
    })
    .await
    .expect("up exits");
    guard.pid = None;
    let (status, stderr) = out;
    drop(taken);
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("started a private Postgres"), "{stderr}");
    assert!(stderr.lines().last().is_some_and(|l| l.starts_with("error: admin")), "{stderr}");
    assert!(!listening(pg_port) && !listening(redis_port), "the private stores stopped with up: {stderr}");
}
