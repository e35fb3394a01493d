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
