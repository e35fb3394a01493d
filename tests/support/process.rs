//! Child processes that are killed when the test ends, passing or failing.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

/// The `shield` binary next to the test executable (target/<profile>/shield).
pub fn shield_bin() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    let dir = exe.parent().and_then(|deps| deps.parent()).expect("target dir");
    let bin = dir.join("shield");
    assert!(bin.exists(), "{} is missing: build it first with `cargo build -p shield`", bin.display());
    bin
}

/// A running child; killed and reaped on drop.
pub struct Running {
    pub child: Child,
    pub name: String,
}

impl Running {
    pub fn spawn(name: &str, command: &mut Command) -> Running {
        let child = command.stdin(Stdio::null()).spawn().unwrap_or_else(|e| panic!("cannot start {name}: {e}"));
        Running { child, name: name.to_string() }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A private redis-server on a free port, for tests that stop and start Redis.
pub struct PrivateRedis {
    pub port: u16,
    server: Option<Running>,
}

impl PrivateRedis {
    pub fn start() -> PrivateRedis {
        let mut redis = PrivateRedis { port: super::free_port(), server: None };
        redis.restart();
        redis
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }

    pub fn stop(&mut self) {
        self.server = None;
    }

    /// SIGSTOP: the server keeps its data and its connections but answers nothing (a hung
    /// server, or a network partition, as clients see it) until [`PrivateRedis::thaw`].
    pub fn freeze(&self) {
        self.signal("-STOP");
    }

    pub fn thaw(&self) {
        self.signal("-CONT");
    }

    fn signal(&self, signal: &str) {
        let pid = self.server.as_ref().expect("redis is running").pid().to_string();
        let status = std::process::Command::new("kill").args([signal, &pid]).status().expect("kill runs");
        assert!(status.success(), "kill {signal} {pid}");
    }

    pub fn restart(&mut self) {
        let mut cmd = Command::new("redis-server");
        cmd.args(["--port", &self.port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        self.server = Some(Running::spawn("redis-server", &mut cmd));
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(std::time::Instant::now() < deadline, "private redis did not start");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
}

/// A private Postgres cluster (initdb in a temporary directory, run as the `postgres` user on a
/// free port), for tests that stop and start the database. Removed on drop.
pub struct PrivatePostgres {
    pub port: u16,
    dir: PathBuf,
    server: Option<std::process::Child>,
}

impl PrivatePostgres {
    pub fn start() -> PrivatePostgres {
        use std::os::unix::process::CommandExt;
        let dir = std::env::temp_dir().join(super::unique("shield-pg-"));
        std::fs::create_dir_all(&dir).unwrap();
        let (uid, gid) = postgres_ids();
        std::os::unix::fs::chown(&dir, Some(uid), Some(gid)).expect("chown the cluster directory");
        let status = Command::new(postgres_bin("initdb"))
            .args([
                "-D",
                &dir.join("data").to_string_lossy(),
                "-A",
                "trust",
                "-U",
                "postgres",
                "--no-sync",
                "-E",
                "UTF8",
            ])
            .uid(uid)
            .gid(gid)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("initdb runs");
        assert!(status.success(), "initdb failed");
        let mut pg = PrivatePostgres { port: super::free_port(), dir, server: None };
        pg.restart();
        pg
    }

    /// `postgres://postgres@127.0.0.1:<port>` (no database).
    pub fn base(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}", self.port)
    }

    /// A fast shutdown (what `pg_ctl stop -m fast` does): clients are disconnected.
    pub fn stop(&mut self) {
        if let Some(mut server) = self.server.take() {
            let _ = Command::new("kill").args(["-INT", &server.id().to_string()]).status();
            let _ = server.wait();
        }
    }

    pub fn restart(&mut self) {
        use std::os::unix::process::CommandExt;
        let (uid, gid) = postgres_ids();
        let child = Command::new(postgres_bin("postgres"))
            .args(["-D", &self.dir.join("data").to_string_lossy(), "-p", &self.port.to_string()])
            .args(["-k", &self.dir.to_string_lossy(), "-c", "listen_addresses=127.0.0.1", "-c", "fsync=off"])
            .uid(uid)
            .gid(gid)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("postgres starts");
        self.server = Some(child);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while Command::new(postgres_bin("pg_isready"))
            .args(["-q", "-h", "127.0.0.1", "-p", &self.port.to_string()])
            .status()
            .map_or(true, |s| !s.success())
        {
            assert!(std::time::Instant::now() < deadline, "private postgres did not start");
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }
}

impl Drop for PrivatePostgres {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn postgres_ids() -> (u32, u32) {
    let id = |flag: &str| {
        let out = Command::new("id").args([flag, "postgres"]).output().expect("id runs");
        String::from_utf8_lossy(&out.stdout).trim().parse::<u32>().expect("a postgres user exists")
    };
    (id("-u"), id("-g"))
}

/// Debian keeps the server binaries under /usr/lib/postgresql/<version>/bin.
fn postgres_bin(name: &str) -> PathBuf {
    let versions = std::fs::read_dir("/usr/lib/postgresql").expect("PostgreSQL server binaries are installed");
    let mut dirs: Vec<PathBuf> = versions.filter_map(|e| e.ok()).map(|e| e.path().join("bin").join(name)).collect();
    dirs.sort();
    dirs.into_iter().rfind(|p| p.exists()).unwrap_or_else(|| PathBuf::from(name))
}
