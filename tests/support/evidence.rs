//! Evidence for the whole-suite leak scan (`tests/leak_scan.rs`).
//!
//! With `SHIELD_EVIDENCE_DIR` set (scripts/test sets it), every [`crate::stack::Stack`] keeps
//! what it produced in a directory of its own under it: its children's logs, the responses its
//! helpers received, and — collected when the stack is dropped — its Redis values, every row
//! of every Postgres table, and each process's `/metrics`; `secrets.txt` lists every secret the
//! stack used (signing and vault keys, passwords, tokens, API keys, vault values, passthrough
//! keys). The scan then looks for every secret of every stack in every file of every stack.
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

/// One stack's evidence directory; removed at drop unless the suite keeps evidence.
pub struct Evidence {
    pub dir: PathBuf,
    kept: bool,
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
        Evidence { dir, kept }
    }

    /// The suite keeps this stack's evidence for the scan.
    pub fn kept(&self) -> bool {
        self.kept
    }

    pub fn secret(&self, value: &str) {
        if self.kept && !value.is_empty() {
            self.append(SECRETS, &format!("{}\n", value.replace('\n', " ")));
        }
    }

    pub fn response(&self, what: &str, status: StatusCode, headers: &HeaderMap, body: &str) {
        if !self.kept {
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
        if self.kept {
            let _ = std::fs::write(self.dir.join(name), content);
        }
    }

    fn append(&self, name: &str, text: &str) {
        let file = std::fs::OpenOptions::new().create(true).append(true).open(self.dir.join(name));
        if let Ok(mut file) = file {
            let _ = file.write_all(text.as_bytes());
        }
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }
}

impl Default for Evidence {
    fn default() -> Self {
        Evidence::new()
    }
}

impl Drop for Evidence {
    fn drop(&mut self) {
        if !self.kept {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
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

/// The files of an evidence root the scan reads, per stack directory.
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
