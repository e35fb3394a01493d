//! The real coding agents the suite runs (Claude Code, Codex): installed from npm at a pinned
//! version under `target/<dir>/<version>` (an environment variable names another version, or
//! `latest`), and scratch directories for their HOMEs and work trees.

use std::path::{Path, PathBuf};

use tokio::process::Command;

/// An agent's npm package and where the suite keeps it.
pub struct Agent {
    /// The npm package, e.g. `@openai/codex`.
    pub package: &'static str,
    /// The executable under `node_modules/.bin`.
    pub bin: &'static str,
    /// The directory under `target/`.
    pub dir: &'static str,
    pub pinned: &'static str,
    /// The variable that names another version (`latest` reinstalls the newest).
    pub version_env: &'static str,
}

impl Agent {
    /// The executable, installed if needed; `None` (the test is skipped, saying so) when the
    /// npm registry cannot be reached. Any other install failure fails the test.
    pub async fn install(&self) -> Option<PathBuf> {
        let version = std::env::var(self.version_env).unwrap_or_else(|_| self.pinned.into());
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target").join(self.dir).join(&version);
        let bin = root.join("node_modules/.bin").join(self.bin);
        if version != "latest" && bin.exists() {
            return Some(bin);
        }
        let reachable = Command::new("npm")
            .args(["view", self.package, "version"])
            .output()
            .await
            .is_ok_and(|o| o.status.success());
        if !reachable {
            eprintln!("SKIPPED: the npm registry is unreachable, so {} cannot be installed", self.package);
            return None;
        }
        std::fs::create_dir_all(&root).unwrap();
        let out = Command::new("npm")
            .args(["install", "--no-audit", "--no-fund", "--prefix"])
            .arg(&root)
            .arg(format!("{}@{version}", self.package))
            .output()
            .await
            .expect("npm runs");
        assert!(out.status.success(), "npm install failed: {}", String::from_utf8_lossy(&out.stderr));
        assert!(bin.exists(), "npm installed no `{}` at {}", self.bin, bin.display());
        Some(bin)
    }
}

/// A directory of its own under the system's temporary one, removed when dropped.
pub struct Scratch(pub PathBuf);

impl Scratch {
    pub fn new(what: &str) -> Scratch {
        let dir = std::env::temp_dir().join(crate::unique(&format!("shield-agent-{what}-")));
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
