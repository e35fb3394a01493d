//! Private Postgres and Redis for `shield up` on a machine whose stores are installed but not
//! running (issue 27, item 8). When the user set neither `DATABASE_URL` nor `REDIS_URL` (each
//! on its own) and nothing answers at the default address, `up` starts the installed server
//! itself on that address, with its data in `.shield/postgres` or `.shield/redis` (logs next to
//! them), says so in one line, and stops it when `up` exits. A store the user named, or one
//! already running, is never touched.
//!
//! Postgres: `initdb` (once; trust authentication, the `postgres` superuser) and `pg_ctl`,
//! found on `PATH` or where Debian keeps them (`/usr/lib/postgresql/<version>/bin`). It listens
//! on 127.0.0.1 only, with its Unix socket inside its data directory, so it never meets the
//! system cluster's `/var/run/postgresql`. Postgres refuses to run as root: run by root, its
//! programs run as the `postgres` system user, which owns the data directory, and `.shield/`
//! becomes traversable by others (0711) so that user can reach it — the secrets in it stay
//! 0600. Redis: `redis-server` on 127.0.0.1, in its own process group (a Ctrl-C reaches `up`,
//! which then stops it with `SHUTDOWN`, saving its data).
//!
//! Missing programs are an error naming the Debian packages and the docker compose
//! alternative; nothing starts unless everything needed can.

use std::fs::OpenOptions;
use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow, bail};

use crate::settings::Settings;

/// The stores `up` has to start: each left to its default address by the user, with nothing
/// answering there. The value is the port to start it on.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Absent {
    pub postgres: Option<u16>,
    pub redis: Option<u16>,
}

impl Absent {
    pub fn probe(settings: &Settings) -> Absent {
        let silent = |port: Option<u16>| port.filter(|&port| !answers(port));
        Absent { postgres: silent(settings.default_postgres_port), redis: silent(settings.default_redis_port) }
    }
}

fn local(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// Whether anything accepts a connection on 127.0.0.1:`port`.
fn answers(port: u16) -> bool {
    TcpStream::connect_timeout(&local(port), Duration::from_secs(1)).is_ok()
}

/// The private stores `up` started; stopped by [`PrivateStores::stop`], or on drop.
#[derive(Default)]
pub struct PrivateStores {
    postgres: Option<PrivatePostgres>,
    redis: Option<PrivateRedis>,
}

impl PrivateStores {
    /// Starts what `absent` names, with data under `dir` (`.shield/`), and says so in one line
    /// on stderr. Either both needed stores run afterwards, or neither does.
    pub fn start(absent: Absent, dir: &Path) -> anyhow::Result<PrivateStores> {
        let mut stores = PrivateStores::default();
        if absent == Absent::default() {
            return Ok(stores);
        }
        let postgres_bin = absent.postgres.and_then(|_| postgres_bin_dir(&dir.join("postgres")));
        let redis_bin = absent.redis.and_then(|_| find_on_path("redis-server"));
        let no_postgres = absent.postgres.is_some() && postgres_bin.is_none();
        let no_redis = absent.redis.is_some() && redis_bin.is_none();
        if no_postgres || no_redis {
            bail!("{}", missing_programs(absent, no_postgres, no_redis));
        }
        if let (Some(port), Some(bin)) = (absent.postgres, &postgres_bin) {
            stores.postgres = Some(PrivatePostgres::start(bin, dir, port)?);
        }
        if let (Some(port), Some(bin)) = (absent.redis, &redis_bin) {
            // On an error here `stores` is dropped, which stops the Postgres just started.
            stores.redis = Some(PrivateRedis::start(bin, dir, port)?);
        }
        eprintln!("{}", stores.summary());
        Ok(stores)
    }

    fn summary(&self) -> String {
        summary(
            self.postgres.as_ref().map(|pg| (pg.port, pg.shown.as_path())),
            self.redis.as_ref().map(|redis| (redis.port, redis.shown.as_path())),
        )
    }

    /// Stops every store started here (Redis first: Postgres is the source of truth and goes
    /// last). Idempotent.
    pub fn stop(&mut self) -> anyhow::Result<()> {
        let mut failures = Vec::new();
        if let Some(mut redis) = self.redis.take()
            && let Err(err) = redis.stop()
        {
            failures.push(format!("{err:#}"));
        }
        if let Some(pg) = self.postgres.take()
            && let Err(err) = pg.stop()
        {
            failures.push(format!("{err:#}"));
        }
        match failures.is_empty() {
            true => Ok(()),
            false => Err(anyhow!("{}", failures.join("; "))),
        }
    }
}

impl Drop for PrivateStores {
    fn drop(&mut self) {
        if let Err(err) = self.stop() {
            eprintln!("error: {err:#}");
        }
    }
}

/// The one line `up` says about the stores it started (port, data directory).
fn summary(postgres: Option<(u16, &Path)>, redis: Option<(u16, &Path)>) -> String {
    let started: Vec<String> = [("Postgres", postgres), ("Redis", redis)]
        .into_iter()
        .filter_map(|(name, store)| {
            store.map(|(port, data)| format!("{name} at {} (data in {})", local(port), data.display()))
        })
        .collect();
    let (what, pronoun) = match started.as_slice() {
        [one] => (one.clone(), "it stops"),
        _ => (started.join(" and "), "they stop"),
    };
    format!("started a private {what}; {pronoun} when `up` exits")
}

/// One line: what is missing, what to install, and the alternatives.
fn missing_programs(absent: Absent, postgres: bool, redis: bool) -> String {
    let mut down = Vec::new();
    let mut programs = Vec::new();
    let mut packages = Vec::new();
    let mut variables = Vec::new();
    if let (true, Some(port)) = (postgres, absent.postgres) {
        down.push(format!("{} (Postgres)", local(port)));
        programs.push("initdb and pg_ctl (looked on PATH and in /usr/lib/postgresql/*/bin)");
        packages.push("postgresql");
        variables.push("DATABASE_URL");
    }
    if let (true, Some(port)) = (redis, absent.redis) {
        down.push(format!("{} (Redis)", local(port)));
        programs.push("redis-server (looked on PATH)");
        packages.push("redis-server");
        variables.push("REDIS_URL");
    }
    format!(
        "nothing answers at {} and `up` cannot start its own: {} not found; install {} (Debian/Ubuntu: `apt-get install {}`), or run everything in containers with `docker compose up -d` (docker-compose.yml at the repository's root), or set {}",
        down.join(" or "),
        programs.join(" and "),
        if packages.len() == 1 { "it" } else { "them" },
        packages.join(" "),
        variables.join(" and "),
    )
}

/// `name` as an executable file in a directory of `PATH`.
fn find_on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|dir| dir.join(name)).find(|candidate| is_executable(candidate))
}

fn is_executable(path: &Path) -> bool {
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// A directory holding both `initdb` and `pg_ctl`: the one of the version that made `data`
/// when there is one, else the one on `PATH`, else Debian's newest
/// (`/usr/lib/postgresql/<version>/bin`, not on `PATH`), else RPM's or the source build's.
fn postgres_bin_dir(data: &Path) -> Option<PathBuf> {
    let complete = |dir: &Path| is_executable(&dir.join("initdb")) && is_executable(&dir.join("pg_ctl"));
    let made_by = std::fs::read_to_string(data.join("PG_VERSION")).ok().map(|v| v.trim().to_string());
    if let Some(version) = made_by.filter(|v| !v.is_empty() && !v.contains('/')) {
        let dir = PathBuf::from(format!("/usr/lib/postgresql/{version}/bin"));
        if complete(&dir) {
            return Some(dir);
        }
    }
    if let Some(dir) = find_on_path("pg_ctl").and_then(|p| p.parent().map(Path::to_path_buf)).filter(|d| complete(d)) {
        return Some(dir);
    }
    let mut versioned: Vec<(u32, PathBuf)> = [("/usr/lib/postgresql", ""), ("/usr", "pgsql-")]
        .into_iter()
        .filter_map(|(root, prefix)| Some((std::fs::read_dir(root).ok()?, prefix)))
        .flat_map(|(entries, prefix)| entries.filter_map(|e| e.ok()).map(move |e| (e, prefix)))
        .filter_map(|(entry, prefix)| {
            let version = entry.file_name().to_str()?.strip_prefix(prefix)?.parse::<u32>().ok()?;
            Some((version, entry.path().join("bin")))
        })
        .filter(|(_, dir)| complete(dir))
        .collect();
    versioned.sort();
    versioned.pop().map(|(_, dir)| dir).or_else(|| Some(PathBuf::from("/usr/local/pgsql/bin")).filter(|d| complete(d)))
}

/// The last non-empty lines of a log or a program's output, on one line.
fn tail(text: &str, lines: usize) -> String {
    let kept: Vec<&str> = text.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
    kept[kept.len().saturating_sub(lines)..].join(" | ")
}

/// A store's log, readable by its owner only (a failed statement's text lands there).
fn open_log(path: &Path) -> anyhow::Result<std::fs::File> {
    OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("cannot open {}", path.display()))
}

fn log_tail(path: &Path) -> String {
    tail(&std::fs::read_to_string(path).unwrap_or_default(), 3)
}

/// Who runs the Postgres programs: this user, or the `postgres` system user when this is root.
#[derive(Clone, Copy)]
struct RunAs {
    ids: Option<(u32, u32)>,
}

impl RunAs {
    fn for_postgres() -> anyhow::Result<RunAs> {
        // /proc/self belongs to the effective user; without /proc (not Linux) assume not root.
        let root = std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0);
        if !root {
            return Ok(RunAs { ids: None });
        }
        let passwd = std::fs::read_to_string("/etc/passwd").unwrap_or_default();
        let ids = passwd.lines().find_map(|line| {
            let fields: Vec<&str> = line.split(':').collect();
            match fields.as_slice() {
                ["postgres", _, uid, gid, ..] => Some((uid.parse().ok()?, gid.parse().ok()?)),
                _ => None,
            }
        });
        match ids {
            Some(ids) => Ok(RunAs { ids: Some(ids) }),
            None => bail!(
                "Postgres refuses to run as root and there is no `postgres` system user to run a private one as; create it (`useradd --system postgres`) or set DATABASE_URL"
            ),
        }
    }

    fn own(&self, path: &Path) -> anyhow::Result<()> {
        if let Some((uid, gid)) = self.ids {
            std::os::unix::fs::chown(path, Some(uid), Some(gid))
                .with_context(|| format!("cannot hand {} to the postgres user", path.display()))?;
        }
        Ok(())
    }

    /// Every directory from `/` down to `dir` must let this user through.
    fn check_reaches(&self, dir: &Path) -> anyhow::Result<()> {
        let Some((uid, gid)) = self.ids else { return Ok(()) };
        for ancestor in dir.ancestors() {
            let Ok(meta) = std::fs::metadata(ancestor) else { continue };
            let mode = meta.mode();
            let through = mode & 0o001 != 0
                || (meta.uid() == uid && mode & 0o100 != 0)
                || (meta.gid() == gid && mode & 0o010 != 0);
            if !through {
                bail!(
                    "Postgres refuses to run as root, and the postgres user it would run as cannot reach {} (mode {:o}); run `shield up` from a directory that user can reach, or set DATABASE_URL",
                    ancestor.display(),
                    mode & 0o7777
                );
            }
        }
        Ok(())
    }

    fn command(&self, program: &Path, cwd: &Path) -> Command {
        let mut cmd = Command::new(program);
        if let Some((uid, gid)) = self.ids {
            cmd.uid(uid).gid(gid);
        }
        cmd.current_dir(cwd).stdin(Stdio::null());
        cmd
    }
}

struct PrivatePostgres {
    port: u16,
    bin: PathBuf,
    data: PathBuf,
    /// The data directory as the user gave it (relative), for messages.
    shown: PathBuf,
    dir: PathBuf,
    run_as: RunAs,
}

impl PrivatePostgres {
    fn start(bin: &Path, dir: &Path, port: u16) -> anyhow::Result<PrivatePostgres> {
        let shown = dir.join("postgres");
        let dir = std::path::absolute(dir).with_context(|| format!("cannot resolve {}", dir.display()))?;
        let run_as = RunAs::for_postgres()?;
        if run_as.ids.is_some() {
            // The postgres user goes through `.shield/` to its data; it cannot list or read it.
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o711))
                .with_context(|| format!("cannot open {} to the postgres user", dir.display()))?;
        }
        run_as.check_reaches(&dir)?;
        let pg = PrivatePostgres { port, bin: bin.to_path_buf(), data: dir.join("postgres"), shown, dir, run_as };
        if !pg.data.join("PG_VERSION").exists() {
            pg.initdb()?;
        }
        let log = pg.dir.join("postgres.log");
        open_log(&log)?;
        run_as.own(&log)?;
        let options = format!("-p {port} -c listen_addresses=127.0.0.1 -c unix_socket_directories=.");
        let out = pg
            .pg_ctl()
            .arg("-l")
            .arg(&log)
            .args(["-w", "-t", "60", "-o", &options, "start"])
            .output()
            .context("cannot run pg_ctl")?;
        if !out.status.success() {
            bail!(
                "the private Postgres did not start on {} ({}; {}: {})",
                local(port),
                tail(&String::from_utf8_lossy(&out.stderr), 2),
                pg.shown.with_extension("log").display(),
                log_tail(&log)
            );
        }
        Ok(pg)
    }

    fn initdb(&self) -> anyhow::Result<()> {
        std::fs::create_dir_all(&self.data).with_context(|| format!("cannot create {}", self.shown.display()))?;
        self.run_as.own(&self.data)?;
        let out = self
            .run_as
            .command(&self.bin.join("initdb"), &self.dir)
            .arg("-D")
            .arg(&self.data)
            .args(["-U", "postgres", "-A", "trust", "-E", "UTF8", "--locale=C"])
            .output()
            .context("cannot run initdb")?;
        if !out.status.success() {
            bail!(
                "initdb could not create a private Postgres in {}: {}",
                self.shown.display(),
                tail(&String::from_utf8_lossy(&out.stderr), 2)
            );
        }
        Ok(())
    }

    fn pg_ctl(&self) -> Command {
        let mut cmd = self.run_as.command(&self.bin.join("pg_ctl"), &self.dir);
        cmd.arg("-D").arg(&self.data);
        cmd
    }

    /// A fast shutdown: clients are disconnected, the data is consistent on disk.
    fn stop(self) -> anyhow::Result<()> {
        let out = self.pg_ctl().args(["-m", "fast", "-w", "-t", "60", "stop"]).output().context("cannot run pg_ctl")?;
        match out.status.success() {
            true => Ok(()),
            false => Err(anyhow!(
                "the private Postgres on {} did not stop: {}",
                local(self.port),
                tail(&String::from_utf8_lossy(&out.stderr), 1)
            )),
        }
    }
}

struct PrivateRedis {
    port: u16,
    shown: PathBuf,
    log: PathBuf,
    child: Child,
}

impl PrivateRedis {
    fn start(bin: &Path, dir: &Path, port: u16) -> anyhow::Result<PrivateRedis> {
        let shown = dir.join("redis");
        let data = std::path::absolute(&shown).with_context(|| format!("cannot resolve {}", shown.display()))?;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&data)
            .with_context(|| format!("cannot create {}", shown.display()))?;
        let log = dir.join("redis.log");
        let out = open_log(&log)?;
        let err = out.try_clone().with_context(|| format!("cannot open {}", log.display()))?;
        let child = Command::new(bin)
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--protected-mode", "yes"])
            .args(["--daemonize", "no", "--appendonly", "no", "--dir"])
            .arg(&data)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            // Its own process group: a Ctrl-C in the terminal reaches `up` alone, which then
            // stops Redis in order.
            .process_group(0)
            .spawn()
            .with_context(|| format!("cannot run {}", bin.display()))?;
        let mut redis = PrivateRedis { port, shown, log, child };
        let deadline = Instant::now() + Duration::from_secs(20);
        while !answers(port) {
            if matches!(redis.child.try_wait(), Ok(Some(_))) || Instant::now() > deadline {
                let why = log_tail(&redis.log);
                let _ = redis.stop();
                bail!("the private Redis did not start on {} ({}: {why})", local(port), redis.log.display());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(redis)
    }

    /// `SHUTDOWN` (Redis saves its data and exits); killed when it has not gone within 30 s.
    fn stop(&mut self) -> anyhow::Result<()> {
        if matches!(self.child.try_wait(), Ok(Some(_))) {
            return Ok(());
        }
        if let Ok(mut conn) = TcpStream::connect_timeout(&local(self.port), Duration::from_secs(1)) {
            let _ = conn.write_all(b"*1\r\n$8\r\nSHUTDOWN\r\n");
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        Err(anyhow!("the private Redis on {} did not shut down within 30 s and was killed", local(self.port)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_programs_name_the_packages_and_the_alternatives() {
        let both = Absent { postgres: Some(5432), redis: Some(6379) };
        let line = missing_programs(both, true, true);
        assert!(!line.contains('\n'), "{line}");
        for part in [
            "nothing answers at 127.0.0.1:5432 (Postgres) or 127.0.0.1:6379 (Redis)",
            "/usr/lib/postgresql/*/bin",
            "apt-get install postgresql redis-server",
            "docker compose up -d",
            "docker-compose.yml",
            "DATABASE_URL and REDIS_URL",
        ] {
            assert!(line.contains(part), "{part:?} in {line}");
        }
        let redis_only = missing_programs(both, false, true);
        assert!(redis_only.contains("apt-get install redis-server`"), "{redis_only}");
        assert!(!redis_only.contains("Postgres") && !redis_only.contains("DATABASE_URL"), "{redis_only}");
    }

    #[test]
    fn the_summary_is_one_line_naming_each_store_started() {
        let (pg, redis) = (Path::new(".shield/postgres"), Path::new(".shield/redis"));
        assert_eq!(
            summary(Some((5432, pg)), Some((6379, redis))),
            "started a private Postgres at 127.0.0.1:5432 (data in .shield/postgres) and Redis at 127.0.0.1:6379 (data in .shield/redis); they stop when `up` exits"
        );
        assert_eq!(
            summary(None, Some((6380, redis))),
            "started a private Redis at 127.0.0.1:6380 (data in .shield/redis); it stops when `up` exits"
        );
    }

    #[test]
    fn tails_keep_the_last_non_empty_lines() {
        assert_eq!(tail("a\n\nb\n  c  \n\n", 2), "b | c");
        assert_eq!(tail("", 3), "");
    }
}
