//! A real local Redis Cluster: three masters and three replicas, six `redis-server
//! --cluster-enabled yes` on free ports joined by `redis-cli --cluster create`. One is shared
//! per test binary ([`shared`]); tests that kill nodes start their own ([`Cluster::start`]).
//! Tests share the cluster safely because each stack has its own `SHIELD_REDIS_PREFIX`.
//!
//! Every node is killed when the test binary exits, even when a test failed: the nodes are
//! started by a keeper thread that lives as long as the process, with `PR_SET_PDEATHSIG`
//! (the kernel kills them when that thread, i.e. the process, goes, however it goes), and an
//! `atexit` handler kills them on a normal exit as well.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, OnceLock, mpsc};
use std::time::{Duration, Instant};

use crate::{free_port, unique};

/// How long a master may be unreachable before its replica takes over (`cluster-node-timeout`).
pub const NODE_TIMEOUT_MS: u64 = 3000;

pub struct Cluster {
    /// Client ports, in the order given to `redis-cli --cluster create`.
    pub ports: Vec<u16>,
    dir: PathBuf,
    /// Bus port of each client port.
    bus: BTreeMap<u16, u16>,
    nodes: Mutex<BTreeMap<u16, Child>>,
}

/// The cluster this test binary shares, started on first use.
pub fn shared() -> &'static Cluster {
    static SHARED: OnceLock<Cluster> = OnceLock::new();
    SHARED.get_or_init(Cluster::start)
}

/// Pids of every node started by this process and the clusters' directories, for the exit
/// handler.
static PIDS: Mutex<Vec<u32>> = Mutex::new(Vec::new());
static DIRS: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

extern "C" fn kill_nodes_at_exit() {
    if let Ok(pids) = PIDS.lock() {
        for pid in pids.iter() {
            // SAFETY: kill(2) on a pid this process started; no memory is touched.
            unsafe {
                libc::kill(*pid as libc::pid_t, libc::SIGKILL);
            }
        }
    }
    if let Ok(dirs) = DIRS.lock() {
        for dir in dirs.iter() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// A free port no cluster of this process was given yet (clusters may start concurrently).
fn draw_port() -> u16 {
    static GIVEN: Mutex<std::collections::BTreeSet<u16>> = Mutex::new(std::collections::BTreeSet::new());
    loop {
        let port = free_port();
        if GIVEN.lock().unwrap().insert(port) {
            return port;
        }
    }
}

type SpawnRequest = (Command, mpsc::Sender<std::io::Result<Child>>);

/// Starts `command` from the keeper thread (see the module doc).
fn spawn_kept(mut command: Command) -> Child {
    static KEEPER: OnceLock<Mutex<mpsc::Sender<SpawnRequest>>> = OnceLock::new();
    let keeper = KEEPER.get_or_init(|| {
        // SAFETY: registers a plain extern "C" function.
        unsafe {
            libc::atexit(kill_nodes_at_exit);
        }
        let (tx, rx) = mpsc::channel::<SpawnRequest>();
        std::thread::spawn(move || {
            // Ends only with the process: the sender lives in a static.
            while let Ok((mut command, reply)) = rx.recv() {
                use std::os::unix::process::CommandExt;
                // SAFETY: prctl in the child before exec, async-signal-safe.
                unsafe {
                    command.pre_exec(|| {
                        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                        Ok(())
                    });
                }
                let _ = reply.send(command.spawn());
            }
        });
        Mutex::new(tx)
    });
    let (reply, answer) = mpsc::channel();
    command.stdin(Stdio::null());
    keeper.lock().unwrap().send((command, reply)).expect("the keeper thread runs");
    let child = answer.recv().expect("the keeper answers").expect("redis-server starts");
    PIDS.lock().unwrap().push(child.id());
    child
}

fn cli(port: u16, args: &[&str]) -> String {
    let out = Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(args)
        .output()
        .expect("redis-cli runs");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The pid a Redis server on `port` reports; `None` for no server (or not Redis) there.
fn server_pid(port: u16) -> Option<u32> {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}")).ok()?;
    let mut conn = client.get_connection_with_timeout(Duration::from_millis(500)).ok()?;
    conn.set_read_timeout(Some(Duration::from_millis(500))).ok()?;
    let info: String = redis::cmd("INFO").arg("server").query(&mut conn).ok()?;
    field(&info, "process_id")?.parse().ok()
}

fn field<'a>(info: &'a str, name: &str) -> Option<&'a str> {
    info.lines().find_map(|l| l.strip_prefix(name).and_then(|r| r.strip_prefix(':'))).map(str::trim)
}

impl Cluster {
    /// Six nodes on free ports, joined as three masters with one replica each; returns once
    /// every node reports `cluster_state:ok` and every replica is in sync.
    pub fn start() -> Cluster {
        let dir = std::env::temp_dir().join(unique("shield-cluster-"));
        std::fs::create_dir_all(&dir).unwrap();
        DIRS.lock().unwrap().push(dir.clone());
        let mut cluster = Cluster { ports: Vec::new(), dir, bus: BTreeMap::new(), nodes: Mutex::new(BTreeMap::new()) };
        while cluster.ports.len() < 6 {
            let (port, bus) = (draw_port(), draw_port());
            cluster.bus.insert(port, bus);
            // A port taken since it was drawn (by another process) fails the start: draw again.
            if cluster.try_start_node(port) {
                cluster.ports.push(port);
            }
        }
        let started = Instant::now();
        let mut nodes: Vec<String> = cluster.ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
        let mut args = vec!["--cluster".to_string(), "create".to_string()];
        args.append(&mut nodes);
        args.extend(["--cluster-replicas", "1", "--cluster-yes"].map(String::from));
        let out = Command::new("redis-cli").args(&args).output().expect("redis-cli runs");
        assert!(out.status.success(), "redis-cli --cluster create: {}", String::from_utf8_lossy(&out.stdout));
        cluster.wait_healthy(Duration::from_secs(60));
        eprintln!("redis cluster up on {:?} in {:?}", cluster.ports, started.elapsed());
        cluster
    }

    fn start_node(&self, port: u16) {
        assert!(self.try_start_node(port), "redis-server on {port} did not start");
    }

    /// Starts the node on `port`; false when it exited instead (its port or bus port taken).
    fn try_start_node(&self, port: u16) -> bool {
        let mut cmd = Command::new("redis-server");
        cmd.args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--cluster-enabled", "yes"])
            .args(["--cluster-port", &self.bus[&port].to_string()])
            .args(["--cluster-config-file", &self.dir.join(format!("nodes-{port}.conf")).to_string_lossy()])
            .args(["--cluster-node-timeout", &NODE_TIMEOUT_MS.to_string()])
            .args(["--save", "", "--appendonly", "no", "--dir", &self.dir.to_string_lossy()])
            .args(["--logfile", &self.dir.join(format!("{port}.log")).to_string_lossy()])
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let mut child = spawn_kept(cmd);
        let deadline = Instant::now() + Duration::from_secs(10);
        // Ours answers with our child's pid (another server may hold the port).
        while server_pid(port) != Some(child.id()) {
            if child.try_wait().ok().flatten().is_some() || Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                return false;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.nodes.lock().unwrap().insert(port, child);
        true
    }

    /// Waits until every running node sees the whole cluster healthy and replicas are in sync.
    pub fn wait_healthy(&self, within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            let running: Vec<u16> = self.nodes.lock().unwrap().keys().copied().collect();
            let healthy = running.iter().all(|&port| {
                let info = cli(port, &["cluster", "info"]);
                let replication = cli(port, &["info", "replication"]);
                field(&info, "cluster_state") == Some("ok")
                    && field(&info, "cluster_slots_ok") == Some("16384")
                    && field(&info, "cluster_known_nodes").and_then(|n| n.parse::<usize>().ok()) >= Some(running.len())
                    && (field(&replication, "role") == Some("master")
                        || field(&replication, "master_link_status") == Some("up"))
            });
            if healthy {
                return;
            }
            assert!(Instant::now() < deadline, "the cluster on {:?} did not become healthy", self.ports);
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// `REDIS_URL` for the cluster: every node as a seed.
    pub fn url(&self) -> String {
        let nodes: Vec<String> = self.ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
        format!("redis+cluster://{}", nodes.join(","))
    }

    /// The port of the master that serves `key`'s slot now, asked of a running node.
    pub fn master_of(&self, key: &str) -> u16 {
        let slot: u16 = cli(self.any_running(), &["cluster", "keyslot", key]).trim().parse().expect("a slot");
        self.master_of_slot(slot).expect("the slot has a master")
    }

    /// The port of the master serving `slot`, as a running node sees it (`None`: uncovered).
    pub fn master_of_slot(&self, slot: u16) -> Option<u16> {
        let nodes = cli(self.any_running(), &["cluster", "nodes"]);
        nodes.lines().find_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let flags = fields.get(2)?;
            if !flags.contains("master") || flags.contains("fail") {
                return None;
            }
            let serves = fields.iter().skip(8).any(|range| match range.split_once('-') {
                Some((a, b)) => a.parse::<u16>().is_ok_and(|a| a <= slot) && b.parse::<u16>().is_ok_and(|b| slot <= b),
                None => range.parse::<u16>().ok() == Some(slot),
            });
            serves.then(|| fields[1].split('@').next()?.rsplit_once(':')?.1.parse().ok()).flatten()
        })
    }

    fn any_running(&self) -> u16 {
        *self.nodes.lock().unwrap().keys().next().expect("a node runs")
    }

    /// The ports of the running nodes.
    pub fn running(&self) -> Vec<u16> {
        self.nodes.lock().unwrap().keys().copied().collect()
    }

    /// SIGKILL the node on `port` (it keeps its place in the cluster's configuration).
    pub fn kill(&self, port: u16) {
        if let Some(mut child) = self.nodes.lock().unwrap().remove(&port) {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the node on `port` again from its cluster configuration (it rejoins; a master
    /// that was replaced comes back as a replica of its successor).
    pub fn restart(&self, port: u16) {
        self.start_node(port);
    }

    /// `CLUSTER INFO` and `INFO replication` fields of the node on `port`.
    pub fn info(&self, port: u16, name: &str) -> Option<String> {
        let text = cli(port, &["cluster", "info"]) + &cli(port, &["info", "replication"]);
        field(&text, name).map(str::to_string)
    }

    /// `PUBSUB NUMSUB channel` on the node on `port`: its subscribers to `channel`.
    pub fn subscribers(&self, port: u16, channel: &str) -> u64 {
        let out = cli(port, &["pubsub", "numsub", channel]);
        out.lines().nth(1).and_then(|n| n.trim().parse().ok()).unwrap_or(0)
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if let Ok(mut nodes) = self.nodes.lock() {
            for (_, mut child) in std::mem::take(&mut *nodes) {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
