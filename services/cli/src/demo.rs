//! `shield up [--demo]`: everything in one process for a laptop. Development secrets are kept
//! in `.shield/` (created 0700, files 0600) when the environment does not provide them. The
//! demo tenant is seeded through the admin HTTP API itself, so it passes the same validation,
//! audit and publishing as any operator's change; re-running is idempotent.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, anyhow};
use base64::Engine;
use serde_json::{Value, json};
use shield_admin::auth::{Scope, Tokens};
use shield_admin::error::ApiError;
use shield_admin::provision;
use shield_admin::repo::{keys, tenants, users};
use tokio::signal::unix::{Signal, SignalKind, signal};

use crate::private_stores::{Absent, PrivateStores};
use crate::settings::Settings;
use crate::stores;

const DIR: &str = ".shield";
const DEMO_TENANT: &str = "demo";
const DEMO_EMAIL: &str = "admin@demo.shield.local";

fn dir() -> anyhow::Result<PathBuf> {
    let dir = PathBuf::from(DIR);
    if !dir.exists() {
        std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {DIR}/"))?;
        restrict(&dir, 0o700);
    }
    Ok(dir)
}

fn restrict(path: &std::path::Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    let _ = std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode));
}

fn write_private(path: &std::path::Path, contents: &str) -> anyhow::Result<()> {
    std::fs::write(path, contents).with_context(|| format!("cannot write {}", path.display()))?;
    restrict(path, 0o600);
    Ok(())
}

/// Reads `.shield/<name>`, creating it with fresh random bytes the first time.
pub fn dev_secret(name: &str) -> anyhow::Result<String> {
    let path = dir()?.join(name);
    if let Ok(existing) = std::fs::read_to_string(&path) {
        return Ok(existing.trim().to_string());
    }
    let bytes: [u8; 32] = rand::random();
    let value = base64::engine::general_purpose::STANDARD.encode(if name == "jwt_secret" {
        [bytes, rand::random()].concat()
    } else {
        bytes.to_vec()
    });
    write_private(&path, &value)?;
    eprintln!("generated a development {name} in {}", path.display());
    Ok(value)
}

pub async fn up(demo: bool) -> anyhow::Result<()> {
    // Registered first, so that Ctrl-C, SIGTERM or a hang-up at any point ends `up` through
    // here and the private stores stop with it.
    let mut stop = StopSignals::listen()?;
    let settings = Settings::from_env_without_secrets()?;
    let absent = Absent::probe(&settings);
    // The user's database first: when that Postgres is down, that is the one line to print.
    let db = match absent.postgres {
        Some(_) => None,
        None => match stop.unless(open_database(&settings.database_url)).await {
            Ok(db) => Some(db?),
            Err(Stopped { .. }) => return Ok(()),
        },
    };
    let mut stores = PrivateStores::start(absent, &dir()?)?;
    let served = serve(demo, db, &settings.database_url, &mut stop).await;
    let stopped = stores.stop();
    served.and(stopped)
}

/// Creates the database if missing, connects and migrates.
async fn open_database(url: &str) -> anyhow::Result<sqlx::PgPool> {
    stores::create_database_if_missing(url).await?;
    let db = stores::postgres(url).await?;
    stores::migrate(&db).await?;
    Ok(db)
}

/// Runs admin, proxy and (with `demo`) the mock LLM until one of them fails or a signal
/// arrives; `Ok` after a signal.
async fn serve(demo: bool, db: Option<sqlx::PgPool>, database_url: &str, stop: &mut StopSignals) -> anyhow::Result<()> {
    let db = match db {
        Some(db) => db,
        None => match stop.unless(open_database(database_url)).await {
            Ok(db) => db?,
            Err(Stopped { .. }) => return Ok(()),
        },
    };
    let settings = Settings::from_env(true)?;
    let config = settings.admin_config()?;
    let mut roles = tokio::task::JoinSet::new();
    let (admin_config, admin_db) = (config.clone(), db.clone());
    roles.spawn_local(async move { shield_admin::serve(admin_config, admin_db).await.context("admin") });
    let proxy_config = settings.proxy_config()?;
    roles.spawn_local(async move { shield_proxy::serve(proxy_config).await.context("proxy") });
    if demo {
        let addr = mock_addr();
        roles.spawn_local(async move { shield_mock_llm::serve(&addr).await.context("mock LLM") });
        let seeding = async {
            wait_until_up(&settings.admin_addr).await?;
            seed(&settings, &db, &config.jwt_secret).await
        };
        match stop.unless(seeding).await {
            Ok(seeded) => print_welcome(&settings, &seeded?),
            Err(Stopped { .. }) => return Ok(()),
        }
    }
    match stop.unless(roles.join_next()).await {
        // A role ended by itself: an error (its address is taken, say).
        Ok(Some(Ok(Err(err)))) => Err(err),
        Ok(Some(Err(err))) => Err(anyhow!("a role stopped: {err}")),
        Ok(Some(Ok(Ok(())))) | Ok(None) => Ok(()),
        Err(Stopped { hangup }) => {
            // Ctrl-C and SIGTERM reach the roles' servers too, which stop gracefully (the proxy
            // then flushes buffered usage to Redis): give them a moment before the stores go.
            if !hangup {
                let all_ended = async { while roles.join_next().await.is_some() {} };
                let _ = tokio::time::timeout(Duration::from_secs(10), all_ended).await;
            }
            Ok(())
        }
    }
}

/// A stop signal arrived; `hangup` for SIGHUP, which the roles' servers do not act on.
struct Stopped {
    hangup: bool,
}

/// Ctrl-C (SIGINT), SIGTERM and SIGHUP, caught for the whole of `up`.
struct StopSignals {
    interrupt: Signal,
    terminate: Signal,
    hangup: Signal,
}

impl StopSignals {
    fn listen() -> anyhow::Result<StopSignals> {
        let listen = |kind| signal(kind).context("cannot listen for signals");
        Ok(StopSignals {
            interrupt: listen(SignalKind::interrupt())?,
            terminate: listen(SignalKind::terminate())?,
            hangup: listen(SignalKind::hangup())?,
        })
    }

    /// `work`'s output, or `Stopped` when a signal comes first.
    async fn unless<T>(&mut self, work: impl std::future::Future<Output = T>) -> Result<T, Stopped> {
        tokio::select! {
            output = work => Ok(output),
            _ = self.interrupt.recv() => Err(Stopped { hangup: false }),
            _ = self.terminate.recv() => Err(Stopped { hangup: false }),
            _ = self.hangup.recv() => Err(Stopped { hangup: true }),
        }
    }
}

/// The demo mock's address: 127.0.0.1:9100 unless `SHIELD_MOCK_ADDR` says otherwise (tests).
fn mock_addr() -> String {
    std::env::var("SHIELD_MOCK_ADDR").ok().filter(|v| !v.is_empty()).unwrap_or_else(|| "127.0.0.1:9100".into())
}

async fn wait_until_up(addr: &str) -> anyhow::Result<()> {
    let client = reqwest::Client::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        if client.get(format!("http://{addr}/healthz")).send().await.is_ok_and(|r| r.status().is_success()) {
            return Ok(());
        }
        if tokio::time::Instant::now() > deadline {
            anyhow::bail!("the admin service did not come up on {addr} within 30 s");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

struct Seeded {
    password: String,
    key: String,
}

/// Creates (or finds) tenant `demo`, its admin, two mock targets, route `smart` and a key.
async fn seed(settings: &Settings, db: &sqlx::PgPool, jwt_secret: &str) -> anyhow::Result<Seeded> {
    let state_path = dir()?.join("demo.json");
    let saved: Value =
        std::fs::read_to_string(&state_path).ok().and_then(|s| serde_json::from_str(&s).ok()).unwrap_or(json!({}));

    let password = match provision::create_tenant(db, DEMO_TENANT, "Demo", DEMO_EMAIL, "shield up --demo").await {
        Ok(created) => created.password,
        Err(ApiError::Conflict { .. }) => match saved["password"].as_str() {
            Some(p) if users::by_email(db, DEMO_EMAIL).await?.is_some() => p.to_string(),
            _ => {
                let fresh = shield_admin::random::b64url(18);
                users::set_password(db, DEMO_EMAIL, &shield_admin::auth::hash_password(&fresh)).await?;
                fresh
            }
        },
        Err(other) => return Err(anyhow!("cannot create the demo tenant: {other}")),
    };
    let tenant = tenants::by_slug(db, DEMO_TENANT).await?.ok_or_else(|| anyhow!("demo tenant vanished"))?;

    let tokens = Tokens::new(jwt_secret).map_err(anyhow::Error::msg)?;
    let scopes = vec![Scope::TenantRead, Scope::ConfigWrite, Scope::RegistryWrite];
    let now =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs() as i64).unwrap_or(0);
    let (token, _) = tokens.issue("shield up --demo", Some(DEMO_TENANT), scopes, Duration::from_secs(300), now);
    let base = format!("http://{}/v1/tenant/me/gateway", settings.admin_addr);
    let mock = mock_addr();
    let client = reqwest::Client::new();
    let puts = [
        (
            format!("{base}/targets/mock-primary"),
            json!({"name": "Mock (always failing: 503)", "base_url": format!("http://{mock}/mock/status:503/v1"),
            "model": "mock-large", "auth": {"mode": "none"}, "location": "cloud", "allow_private": true,
            "price": {"input_per_mtok": 2.5, "output_per_mtok": 10.0}}),
        ),
        (
            format!("{base}/targets/mock-secondary"),
            json!({"name": "Mock (healthy)", "base_url": format!("http://{mock}/v1"),
            "model": "mock-small", "auth": {"mode": "none"}, "location": "on_prem", "allow_private": true,
            "price": {"input_per_mtok": 0.15, "output_per_mtok": 0.6}}),
        ),
        (
            format!("{base}/routes/smart"),
            json!({"targets": ["mock-primary", "mock-secondary"], "strategy": "priority",
            "failover": {"max_attempts": 2, "deadline_s": 30}, "budget": {"monthly": 50.0, "at_limit": "warn"}}),
        ),
    ];
    for (url, body) in puts {
        let response =
            client.put(&url).bearer_auth(&token).json(&body).send().await.with_context(|| format!("PUT {url}"))?;
        if !response.status().is_success() {
            let status = response.status();
            anyhow::bail!("seeding {url} failed with {status}: {}", response.text().await.unwrap_or_default());
        }
    }

    let key = match saved["key"].as_str() {
        Some(k) if key_is_live(db, tenant.id, k).await? => k.to_string(),
        _ => {
            let publisher = shield_admin::publish::Publisher::new(
                db.clone(),
                stores::redis(&settings.redis_url)?,
                settings.redis_keys(),
            );
            let spec = provision::KeySpec { name: "demo", ..Default::default() };
            provision::create_key(db, &publisher, &tenant, spec, "shield up --demo").await?.key
        }
    };
    write_private(&state_path, &json!({"password": password, "key": key}).to_string())?;
    Ok(Seeded { password, key })
}

async fn key_is_live(db: &sqlx::PgPool, tenant_id: i64, key: &str) -> anyhow::Result<bool> {
    let hash = shield_core::snapshot::key_hash(key);
    Ok(keys::list(db, tenant_id).await?.iter().any(|k| k.key_hash == hash && k.revoked_at.is_none()))
}

fn print_welcome(settings: &Settings, seeded: &Seeded) {
    let admin = &settings.admin_addr;
    let proxy = &settings.proxy_addr;
    eprintln!(
        r#"
Shield is up (demo).
  portal      http://{admin}/portal  (sign in with the login below)
  admin API   http://{admin}  (docs: http://{admin}/docs)
  proxy       http://{proxy}
  mock LLM    http://{mock}
  login       {DEMO_EMAIL} / {password}
  API key     {key}

Try:
  TOKEN=$(curl -s http://{admin}/v1/auth/login -H 'content-type: application/json' \
    -d '{{"email":"{DEMO_EMAIL}","password":"{password}"}}' | sed 's/.*"token":"\([^"]*\)".*/\1/')
  curl -s http://{admin}/v1/tenant/me/gateway/routes -H "authorization: Bearer $TOKEN"
  # model "smart": its first target answers 503, the second answers (X-Shield-Failovers: 1)
  curl -si http://{proxy}/v1/chat/completions -H 'authorization: Bearer {key}' \
    -H 'content-type: application/json' -d '{{"model":"smart","messages":[{{"role":"user","content":"hi"}}]}}'
"#,
        mock = mock_addr(),
        password = seeded.password,
        key = seeded.key,
    );
}
