//! Evidence for the whole-suite leak scan (`tests/leak_scan.rs`).
//!
//! With `SHIELD_EVIDENCE_DIR` set (scripts/test sets it), every deployment a test starts — a
//! [`crate::stack::Stack`] of real processes, or the in-process [`crate::admin::Admin`] — keeps
//! what it produced in a directory of its own under it: the children's logs, the responses the
//! helpers received, and — collected when it is dropped — its Redis values, every row of every
//! Postgres table, and each process's `/metrics`; `secrets.txt` lists every secret it used
//! (signing and vault keys, passwords, tokens, API keys, vault values, webhook secrets,
//! passthrough keys). The scan then looks for every secret in every file of every deployment.
//! Without the variable a stack keeps its logs in a temporary directory removed at drop.

use std::io::Write;
use std::path::{Path, PathBuf};

use reqwest::StatusCode;
use reqwest::header::HeaderMap;

use crate::unique;

/// The secrets a stack used, one per line.
pub const SECRETS: &str = "secrets.txt";
/// Every response the stack's helpers received: a head line, the headers, the body.
pub const RESPONSES: &str = "responses.txt";
/// The mock plays the provider, which is where credentials are meant to go: its log is not a
/// leak, and the scan does not read it.
pub const UPSTREAM_LOG: &str = "mock-llm.log";

/// Where the suite's evidence goes, when it is kept.
pub fn root() -> Option<PathBuf> {
    std::env::var_os("SHIELD_EVIDENCE_DIR").filter(|v| !v.is_empty()).map(PathBuf::from)
}

/// One deployment's evidence directory; removed when the last clone is dropped, unless the
/// suite keeps evidence. Clones write to the same directory (a test's own HTTP helpers record
/// through one).
#[derive(Clone)]
pub struct Evidence(std::sync::Arc<Directory>);

struct Directory {
    dir: PathBuf,
    kept: bool,
}

impl Drop for Directory {
    fn drop(&mut self) {
        if !self.kept {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

impl Evidence {
    pub fn new() -> Evidence {
        // Named after the test binary, so a finding says which test file produced it.
        let binary = std::env::current_exe()
            .ok()
            .and_then(|p| p.file_stem().map(|s| s.to_string_lossy().into_owned()))
            .unwrap_or_else(|| "test".into());
        let (dir, kept) = match root() {
            Some(root) => (root.join(unique(&format!("{binary}-"))), true),
            None => (std::env::temp_dir().join(unique("shield-stack-")), false),
        };
        std::fs::create_dir_all(&dir).expect("evidence directory");
        Evidence(std::sync::Arc::new(Directory { dir, kept }))
    }

    /// The suite keeps this stack's evidence for the scan.
    pub fn kept(&self) -> bool {
        self.0.kept
    }

    pub fn secret(&self, value: &str) {
        if self.kept() && !value.is_empty() {
            self.append(SECRETS, &format!("{}\n", value.replace('\n', " ")));
        }
    }

    pub fn response(&self, what: &str, status: StatusCode, headers: &HeaderMap, body: &str) {
        if !self.kept() {
            return;
        }
        let mut text = format!("== {what} -> {status}\n");
        for (name, value) in headers {
            text.push_str(&format!("{name}: {}\n", String::from_utf8_lossy(value.as_bytes())));
        }
        text.push_str(body);
        text.push('\n');
        self.append(RESPONSES, &text);
    }

    pub fn write(&self, name: &str, content: &str) {
        if self.kept() {
            let _ = std::fs::write(self.path(name), content);
        }
    }

    fn append(&self, name: &str, text: &str) {
        let file = std::fs::OpenOptions::new().create(true).append(true).open(self.path(name));
        if let Ok(mut file) = file {
            let _ = file.write_all(text.as_bytes());
        }
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.0.dir.join(name)
    }
}

impl Default for Evidence {
    fn default() -> Self {
        Evidence::new()
    }
}

/// Every row of every table of the database at `url`, one JSON object per line, under a
/// `-- table` header.
pub async fn postgres_dump(url: &str) -> Result<String, sqlx::Error> {
    use sqlx::Connection;
    let mut conn = sqlx::PgConnection::connect(url).await?;
    let tables: Vec<String> = sqlx::query_scalar(
        "SELECT table_name::text FROM information_schema.tables WHERE table_schema = 'public' ORDER BY 1",
    )
    .fetch_all(&mut conn)
    .await?;
    let mut out = String::new();
    for table in tables {
        let query = format!("SELECT to_jsonb(t)::text FROM \"{table}\" t");
        let rows: Vec<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(query)).fetch_all(&mut conn).await?;
        out.push_str(&format!("-- {table}\n"));
        for row in rows {
            out.push_str(&row);
            out.push('\n');
        }
    }
    Ok(out)
}

/// What a deployment holds when it is dropped: Redis values under `prefix`, every Postgres row
/// of `db`, and `/metrics` of each `(name, address)`; each bounded, so a stopped service costs
/// seconds, not a hang. Runs on a thread of its own: drop runs inside the test's runtime,
/// which cannot be blocked on.
pub fn collect(evidence: &Evidence, redis: String, prefix: String, db: String, metrics: Vec<(String, String)>) {
    if !evidence.kept() {
        return;
    }
    let bound = std::time::Duration::from_secs(5);
    let collected = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        runtime.block_on(async move {
            let mut files = Vec::new();
            if let Ok(Ok(values)) = tokio::time::timeout(bound, crate::redis_dump_from(&redis, &prefix)).await {
                files.push(("redis.txt".to_string(), values.iter().map(|(k, v)| format!("{k}\n{v}\n")).collect()));
            }
            if let Ok(Ok(rows)) = tokio::time::timeout(bound, postgres_dump(&db)).await {
                files.push(("postgres.txt".to_string(), rows));
            }
            let client = reqwest::Client::builder().timeout(bound).build().expect("client");
            for (name, addr) in metrics {
                if let Ok(response) = client.get(format!("http://{addr}/metrics")).send().await
                    && let Ok(text) = response.text().await
                {
                    files.push((format!("metrics-{name}.txt"), text));
                }
            }
            files
        })
    })
    .join()
    .unwrap_or_default();
    for (name, content) in collected {
        evidence.write(&name, &content);
    }
}

/// The files of an evidence root the scan reads, per deployment directory.
pub fn scanned_files(root: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for stack in std::fs::read_dir(root).into_iter().flatten().flatten() {
        for file in std::fs::read_dir(stack.path()).into_iter().flatten().flatten() {
            let name = file.file_name();
            if name != SECRETS && name != UPSTREAM_LOG && file.path().is_file() {
                files.push(file.path());
            }
        }
    }
    files.sort();
    files
}
