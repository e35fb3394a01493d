//! `shield`: one binary, one subcommand per role (API.md "Command line"). Scriptable output
//! goes to stdout; everything else (logs, hints) to stderr. A store that is down ends the
//! command with one clear line and exit code 1, never a panic.

mod demo;
mod private_stores;
mod settings;
mod stores;

use std::io::IsTerminal;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use shield_admin::auth::{Scope, Tokens};
use shield_admin::provision;

use settings::Settings;

#[derive(Parser)]
#[command(name = "shield", version, about = "Shield Gateway: a multi-tenant LLM gateway")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Everything in one process: create the database if missing, migrate, run admin + proxy.
    Up {
        /// Also start the mock LLM on 127.0.0.1:9100 and seed tenant `demo`.
        #[arg(long)]
        demo: bool,
    },
    /// The control plane (admin API).
    Admin,
    /// The data plane (OpenAI-compatible proxy).
    Proxy,
    /// Run database migrations and exit.
    Migrate,
    /// The fault-injecting OpenAI-compatible mock upstream.
    MockLlm {
        #[arg(long, default_value = "127.0.0.1:9100")]
        addr: String,
    },
    /// Tenants.
    Tenant {
        #[command(subcommand)]
        command: TenantCommand,
    },
    /// Admin tokens.
    Token {
        #[command(subcommand)]
        command: TokenCommand,
    },
    /// Tenant API keys.
    Key {
        #[command(subcommand)]
        command: KeyCommand,
    },
}

#[derive(Subcommand)]
enum TenantCommand {
    /// Create a tenant and its owner admin; prints {"tenant", "admin_email", "password"}.
    Create {
        slug: String,
        #[arg(long)]
        admin_email: String,
        #[arg(long, default_value = "")]
        name: String,
    },
}

#[derive(Subcommand)]
enum TokenCommand {
    /// Mint an admin JWT; prints only the token.
    Issue {
        #[arg(long)]
        tenant: Option<String>,
        /// Comma-separated: tenant:read, config:write, registry:write, operator.
        #[arg(long, value_delimiter = ',', default_value = "")]
        scopes: Vec<String>,
        /// Lifetime, e.g. 30m, 1h, 7d.
        #[arg(long, default_value = "1h")]
        ttl: String,
        /// Add the platform `operator` scope.
        #[arg(long)]
        operator: bool,
    },
}

#[derive(Subcommand)]
enum KeyCommand {
    /// Create a tenant API key; prints only the key.
    Create {
        #[arg(long)]
        tenant: String,
        #[arg(long)]
        name: String,
        #[arg(long)]
        agent: Option<String>,
        #[arg(long)]
        role: Option<String>,
        /// A route name or pattern (`team-*`) the key may use; repeat for more. None: every route.
        #[arg(long = "route")]
        routes: Vec<String>,
        /// When the key stops working (RFC 3339, e.g. 2027-01-31T00:00:00Z).
        #[arg(long)]
        expires_at: Option<String>,
        /// A monthly spend budget in USD (e.g. 25 or 0.5).
        #[arg(long)]
        budget: Option<String>,
        /// What the budget does at 100 %: block (refuse calls) or warn.
        #[arg(long, default_value = "block")]
        budget_action: String,
        /// Metadata `key=value` (owner, team, purpose); repeat for more.
        #[arg(long = "meta")]
        metadata: Vec<String>,
    },
}

/// mimalloc instead of glibc's malloc: the proxy's hot path is many small, short-lived
/// allocations across worker threads (JSON values, header maps, buffers), where glibc's arenas
/// showed up as ~10 % of the proxy's CPU in a profile under load.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[actix_web::main]
async fn main() -> ExitCode {
    init_logging();
    no_huge_pages();
    match run(Cli::parse()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::FAILURE
        }
    }
}

/// Transparent huge pages off for this process (issue 33). mimalloc advises the kernel to back
/// its arena with 2 MB pages (its `allow_thp` option, on by default), so resident memory grew
/// 2 MB at a time, mostly untouched: a proxy holding 1,000 idle streams read 85–89 KB resident
/// per stream with them and 63 KB without (`bench/agent.py`, `SHIELD_BENCH_PARTS=idle`). The
/// prctl covers mappings already made (mimalloc reserves its arena at the first allocation,
/// before `main`), and costs the hot path nothing measurable (README, Performance).
/// `SHIELD_HUGE_PAGES=on` leaves the kernel's and mimalloc's defaults. Where the call is refused
/// (a seccomp filter, a kernel without it), the process runs as before and says so.
fn no_huge_pages() {
    if std::env::var("SHIELD_HUGE_PAGES").is_ok_and(|v| v.eq_ignore_ascii_case("on")) {
        return;
    }
    if let Err(err) = nix::sys::prctl::set_thp_disable(true) {
        tracing::warn!(error = %err, "transparent huge pages could not be turned off; resident memory may read high");
    }
}

fn init_logging() {
    let mut filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,sqlx=warn,actix_server=warn"));
    // The redis crate's cluster client logs every reconnect attempt while a lost master is
    // being replaced (hundreds of lines a second per process); Shield says once that Redis is
    // away. Its errors stay, and RUST_LOG naming `redis` shows everything it says.
    if !std::env::var("RUST_LOG").is_ok_and(|v| v.contains("redis"))
        && let Ok(quiet) = "redis=error".parse()
    {
        filter = filter.add_directive(quiet);
    }
    // `SHIELD_LOG_FORMAT=json`: one JSON object per line — `timestamp`, `level`, `target` (the
    // module), `fields` (the message and the event's fields; not flattened, since events have
    // fields named `target` too), and the request's fields (its id) under `span`.
    if std::env::var("SHIELD_LOG_FORMAT").is_ok_and(|f| f.eq_ignore_ascii_case("json")) {
        tracing_subscriber::fmt()
            .json()
            .with_current_span(true)
            .with_span_list(false)
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            .init();
        return;
    }
    let colour = log_colour(std::io::stderr().is_terminal(), std::env::var_os("NO_COLOR").as_deref());
    tracing_subscriber::fmt().with_env_filter(filter).with_ansi(colour).with_writer(std::io::stderr).init();
}

/// Logs are coloured only on a terminal: sent to a file or a pipe they are plain text (no
/// ANSI escapes), and `NO_COLOR` set to anything but the empty string turns colour off
/// everywhere (no-color.org).
fn log_colour(stderr_is_terminal: bool, no_color: Option<&std::ffi::OsStr>) -> bool {
    stderr_is_terminal && no_color.is_none_or(|value| value.is_empty())
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    // Traces (issue 31) for the services this process runs, when an OTLP endpoint is set; the
    // guard flushes what is queued when the service stops.
    let service = match &cli.command {
        Command::Up { .. } => Some("shield"),
        Command::Admin => Some("shield-admin"),
        Command::Proxy => Some("shield-proxy"),
        _ => None,
    };
    let _telemetry = match service {
        Some(service) => shield_telemetry::init(service).map_err(anyhow::Error::msg)?,
        None => None,
    };
    match cli.command {
        Command::Up { demo } => demo::up(demo).await,
        Command::Admin => {
            let config = Settings::from_env(false)?.admin_config()?;
            let db = stores::postgres(&config.database_url).await?;
            stores::migrate(&db).await?;
            shield_admin::serve(config, db).await?;
            Ok(())
        }
        Command::Proxy => {
            let config = Settings::from_env(false)?.proxy_config()?;
            shield_proxy::serve(config).await?;
            Ok(())
        }
        Command::Migrate => {
            let settings = Settings::from_env_without_secrets()?;
            stores::create_database_if_missing(&settings.database_url).await?;
            let db = stores::postgres(&settings.database_url).await?;
            stores::migrate(&db).await?;
            eprintln!("migrations applied");
            Ok(())
        }
        Command::MockLlm { addr } => Ok(shield_mock_llm::serve(&addr).await?),
        Command::Tenant { command: TenantCommand::Create { slug, admin_email, name } } => {
            let settings = Settings::from_env_without_secrets()?;
            let db = stores::postgres(&settings.database_url).await?;
            stores::migrate(&db).await?;
            let created = provision::create_tenant(&db, &slug, &name, &admin_email, "cli").await?;
            let out = serde_json::json!({"tenant": created.tenant.slug, "admin_email": created.admin_email, "password": created.password});
            println!("{out}");
            Ok(())
        }
        Command::Token { command: TokenCommand::Issue { tenant, scopes, ttl, operator } } => {
            let settings = Settings::from_env(false)?;
            let mut parsed: Vec<Scope> = scopes
                .iter()
                .filter(|s| !s.is_empty())
                .map(|s| Scope::parse(s.trim()))
                .collect::<Result<_, _>>()
                .map_err(anyhow::Error::msg)?;
            if operator && !parsed.contains(&Scope::Operator) {
                parsed.push(Scope::Operator);
            }
            if parsed.is_empty() {
                anyhow::bail!("give --scopes (e.g. tenant:read,config:write) or --operator");
            }
            if tenant.is_none() && parsed.iter().any(|s| *s != Scope::Operator) {
                anyhow::bail!("tenant scopes need --tenant <slug>");
            }
            let ttl: Duration = humantime::parse_duration(&ttl).map_err(|e| anyhow::anyhow!("--ttl {ttl:?}: {e}"))?;
            let tokens = Tokens::new(&settings.jwt_secret()?).map_err(anyhow::Error::msg)?;
            let (token, _) = tokens.issue("cli", tenant.as_deref(), parsed, ttl, chrono_now());
            println!("{token}");
            Ok(())
        }
        Command::Key {
            command:
                KeyCommand::Create { tenant, name, agent, role, routes, expires_at, budget, budget_action, metadata },
        } => {
            // Parsed as the API parses them; `create_key` validates them as it does for the API.
            let key = key_settings(routes, expires_at, budget, &budget_action, metadata)?;
            let settings = Settings::from_env_without_secrets()?;
            let db = stores::postgres(&settings.database_url).await?;
            stores::migrate(&db).await?;
            let tenant_row = shield_admin::repo::tenants::by_slug(&db, &tenant).await?.ok_or_else(|| {
                anyhow::anyhow!("tenant {tenant:?} does not exist; create it with `shield tenant create`")
            })?;
            let publisher = shield_admin::publish::Publisher::new(
                db.clone(),
                stores::redis(&settings.redis_url)?,
                settings.redis_keys(),
            );
            let spec =
                provision::KeySpec { name: &name, agent: agent.as_deref(), role: role.as_deref(), settings: key };
            let created = provision::create_key(&db, &publisher, &tenant_row, spec, "cli").await?;
            println!("{}", created.key);
            Ok(())
        }
    }
}

/// `shield key create`'s settings flags as the key's settings (issue 32).
fn key_settings(
    routes: Vec<String>,
    expires_at: Option<String>,
    budget: Option<String>,
    budget_action: &str,
    metadata: Vec<String>,
) -> anyhow::Result<shield_admin::repo::keys::KeySettings> {
    let expires_at = expires_at
        .map(|at| at.parse::<chrono::DateTime<chrono::Utc>>().map_err(|e| anyhow::anyhow!("--expires-at {at:?}: {e}")))
        .transpose()?;
    let budget = budget
        .map(|monthly| {
            let body = format!(r#"{{"monthly": {monthly}, "action": {budget_action:?}}}"#);
            serde_json::from_str(&body)
                .map_err(|e| anyhow::anyhow!("--budget {monthly:?} --budget-action {budget_action:?}: {e}"))
        })
        .transpose()?;
    let metadata = metadata
        .into_iter()
        .map(|pair| match pair.split_once('=') {
            Some((k, v)) => Ok((k.to_string(), v.to_string())),
            None => Err(anyhow::anyhow!("--meta {pair:?}: expected key=value")),
        })
        .collect::<anyhow::Result<_>>()?;
    Ok(shield_admin::repo::keys::KeySettings {
        limits: Default::default(),
        routes: (!routes.is_empty()).then_some(routes),
        expires_at,
        budget,
        metadata,
    })
}

fn chrono_now() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs() as i64).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use std::ffi::OsStr;

    use super::log_colour;

    #[test]
    fn logs_are_coloured_only_on_a_terminal_without_no_color() {
        assert!(log_colour(true, None));
        assert!(log_colour(true, Some(OsStr::new(""))), "an empty NO_COLOR is not set");
        assert!(!log_colour(true, Some(OsStr::new("1"))));
        assert!(!log_colour(true, Some(OsStr::new("false"))), "any value turns colour off");
        assert!(!log_colour(false, None), "a file or a pipe gets plain text");
        assert!(!log_colour(false, Some(OsStr::new(""))));
    }
}
