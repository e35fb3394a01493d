//! Connecting to Postgres and Redis with errors a person can act on: which store, at which
//! address (never with its password), and how to start it.

use anyhow::anyhow;
use sqlx::postgres::PgConnectOptions;
use sqlx::{ConnectOptions, PgPool};

/// `host:port` of a URL with any credentials left out.
pub fn address(url: &str) -> String {
    reqwest::Url::parse(url)
        .ok()
        .map(|u| {
            format!(
                "{}:{}",
                u.host_str().unwrap_or("?"),
                u.port().map(|p| p.to_string()).unwrap_or_else(|| "default port".into())
            )
        })
        .unwrap_or_else(|| "an unparsable URL".into())
}

fn database_name(url: &str) -> String {
    reqwest::Url::parse(url).ok().map(|u| u.path().trim_start_matches('/').to_string()).unwrap_or_default()
}

fn explain(url: &str, err: &sqlx::Error) -> anyhow::Error {
    let at = address(url);
    match err {
        sqlx::Error::Database(db) if db.code().as_deref() == Some("3D000") => anyhow!(
            "Postgres at {at} has no database {:?}; run `shield migrate` (it creates it) or set DATABASE_URL",
            database_name(url)
        ),
        sqlx::Error::Database(db) if matches!(db.code().as_deref(), Some("28P01" | "28000")) => {
            anyhow!("Postgres at {at} refused the credentials in DATABASE_URL")
        }
        sqlx::Error::Configuration(_) => anyhow!("DATABASE_URL is not a valid Postgres URL"),
        _ => anyhow!(
            "Postgres is not reachable at {at} ({}); start it (`pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start` or `docker compose up -d postgres`) or set DATABASE_URL",
            short(err)
        ),
    }
}

fn short(err: &sqlx::Error) -> String {
    match err {
        sqlx::Error::Io(io) => io.kind().to_string(),
        sqlx::Error::PoolTimedOut => "timed out".into(),
        other => other.to_string().lines().next().unwrap_or("").to_string(),
    }
}

pub async fn postgres(url: &str) -> anyhow::Result<PgPool> {
    shield_admin::connect_db(url).await.map_err(|e| explain(url, &e))
}

/// Creates the database named in `url` when Postgres is up but the database is not there.
pub async fn create_database_if_missing(url: &str) -> anyhow::Result<()> {
    let options: PgConnectOptions = url.parse().map_err(|_| anyhow!("DATABASE_URL is not a valid Postgres URL"))?;
    let name = database_name(url);
    if name.is_empty() || name == "postgres" {
        return Ok(());
    }
    let mut conn = match options.clone().database("postgres").connect().await {
        Ok(conn) => conn,
        Err(err) => return Err(explain(url, &err)),
    };
    let exists: bool = sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)")
        .bind(&name)
        .fetch_one(&mut conn)
        .await
        .map_err(|e| explain(url, &e))?;
    if !exists {
        let quoted = name.replace('"', "\"\"");
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE DATABASE \"{quoted}\"")))
            .execute(&mut conn)
            .await
            .map_err(|e| explain(url, &e))?;
        eprintln!("created database {name:?}");
    }
    Ok(())
}

pub async fn migrate(db: &PgPool) -> anyhow::Result<()> {
    shield_admin::MIGRATOR.run(db).await.map_err(|e| anyhow!("migrations failed: {e}"))
}

pub fn redis(url: &str) -> anyhow::Result<shield_store::Pool> {
    shield_admin::redis_pool(url).map_err(anyhow::Error::msg)
}
