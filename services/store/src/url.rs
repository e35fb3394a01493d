//! `REDIS_URL`: `redis://[user:pass@]host:port[/db]` names one server (as the `redis` crate reads
//! it), `redis+cluster://[user:pass@]host:port,host:port,...` the seed nodes of a Redis Cluster
//! (any reachable one is enough; the client learns the rest from the cluster). Never logs a URL:
//! [`redacted`] is what a log line may show.

/// What `REDIS_URL` names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// One server: the URL exactly as given.
    Single(String),
    /// A cluster: one `redis://` URL per seed node, each with the credentials and options given.
    Cluster(Vec<String>),
}

const CLUSTER_SCHEMES: [(&str, &str); 2] = [("redis+cluster://", "redis://"), ("rediss+cluster://", "rediss://")];

/// Reads `REDIS_URL`. A cluster URL must name at least one `host:port`.
pub fn parse(url: &str) -> Result<Target, String> {
    let Some((rest, scheme)) =
        CLUSTER_SCHEMES.iter().find_map(|(cluster, node)| url.strip_prefix(cluster).map(|r| (r, *node)))
    else {
        return Ok(Target::Single(url.to_string()));
    };
    let (authority, tail) = match rest.find(['/', '?']) {
        Some(at) => rest.split_at(at),
        None => (rest, ""),
    };
    let (userinfo, hosts) = match authority.rfind('@') {
        Some(at) => (&authority[..=at], &authority[at + 1..]),
        None => ("", authority),
    };
    let nodes: Vec<String> = hosts
        .split(',')
        .map(str::trim)
        .filter(|h| !h.is_empty())
        .map(|host| format!("{scheme}{userinfo}{host}{tail}"))
        .collect();
    if nodes.is_empty() {
        return Err("a redis+cluster:// URL names its nodes: redis+cluster://host:port,host:port".into());
    }
    for (node, host) in nodes.iter().zip(hosts.split(',').map(str::trim).filter(|h| !h.is_empty())) {
        let parsed = url::Url::parse(node).map_err(|e| format!("cluster node {host:?}: {e}"))?;
        if parsed.port().is_none() {
            return Err(format!("cluster node {host:?} has no port (host:port)"));
        }
    }
    Ok(Target::Cluster(nodes))
}

/// `redis://user:pass@host:port/db` → `host:port`; a cluster → `cluster host:port,host:port`.
/// Never the credentials.
pub fn redacted(url: &str) -> String {
    match parse(url) {
        Ok(Target::Cluster(nodes)) => {
            format!("cluster {}", nodes.iter().map(|n| host_port(n)).collect::<Vec<_>>().join(","))
        }
        _ => host_port(url),
    }
}

fn host_port(url: &str) -> String {
    url::Url::parse(url)
        .ok()
        .map(|u| format!("{}:{}", u.host_str().unwrap_or("?"), u.port().unwrap_or(6379)))
        .unwrap_or_else(|| "?".into())
}

/// `url` with its host and port replaced by `addr` (`host:port`), keeping credentials and
/// options: how a node the cluster announced is reached with the seed's settings.
pub fn with_address(url: &str, addr: &str) -> Option<String> {
    let (host, port) = addr.rsplit_once(':')?;
    let port: u16 = port.parse().ok()?;
    let mut parsed = url::Url::parse(url).ok()?;
    parsed.set_host(Some(host.trim_start_matches('[').trim_end_matches(']'))).ok()?;
    parsed.set_port(Some(port)).ok()?;
    Some(parsed.to_string())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests")]
mod tests {
    use super::*;

    #[test]
    fn single_urls_are_kept_as_given() {
        assert_eq!(parse("redis://127.0.0.1:6379/0").unwrap(), Target::Single("redis://127.0.0.1:6379/0".into()));
        assert_eq!(parse("unix:///tmp/redis.sock").unwrap(), Target::Single("unix:///tmp/redis.sock".into()));
    }

    #[test]
    fn cluster_urls_name_every_seed_with_the_same_credentials() {
        assert_eq!(
            parse("redis+cluster://u:p%40ss@10.0.0.1:7000, 10.0.0.2:7001,redis-2:7002").unwrap(),
            Target::Cluster(vec![
                "redis://u:p%40ss@10.0.0.1:7000".into(),
                "redis://u:p%40ss@10.0.0.2:7001".into(),
                "redis://u:p%40ss@redis-2:7002".into(),
            ])
        );
        assert_eq!(
            parse("redis+cluster://a:1,b:2/0?protocol=resp3").unwrap(),
            Target::Cluster(vec!["redis://a:1/0?protocol=resp3".into(), "redis://b:2/0?protocol=resp3".into()])
        );
        assert_eq!(parse("rediss+cluster://a:1").unwrap(), Target::Cluster(vec!["rediss://a:1".into()]));
    }

    #[test]
    fn cluster_urls_without_nodes_or_ports_are_refused() {
        assert!(parse("redis+cluster://").is_err());
        assert!(parse("redis+cluster://,").is_err());
        assert!(parse("redis+cluster://a:1,b").unwrap_err().contains("\"b\""));
        assert!(parse("redis+cluster://a:notaport").is_err());
    }

    #[test]
    fn redaction_never_shows_credentials() {
        assert_eq!(redacted("redis://user:secret@db.internal:6380/2"), "db.internal:6380");
        assert_eq!(redacted("redis://127.0.0.1/0"), "127.0.0.1:6379");
        assert_eq!(redacted("redis+cluster://user:secret@a:7000,b:7001"), "cluster a:7000,b:7001");
        assert_eq!(redacted("redis+cluster://:secret@a:7000/0?x=1"), "cluster a:7000");
        assert_eq!(redacted("not a url secret"), "?");
        assert!(!redacted("redis+cluster://user:secret@a:b:c").contains("secret"));
    }

    #[test]
    fn announced_nodes_keep_the_seed_settings() {
        assert_eq!(with_address("redis://u:p@a:7000/0", "10.1.2.3:7005").unwrap(), "redis://u:p@10.1.2.3:7005/0");
        assert_eq!(with_address("redis://a:7000", "nonsense"), None);
    }
}
