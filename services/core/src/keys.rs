//! Redis key names (ARCHITECTURE.md). Tenant-scoped keys carry the tenant in literal braces, a
//! Redis Cluster hash tag, so one tenant's keys share a slot and per-tenant scripts stay
//! cluster-safe. `SHIELD_REDIS_PREFIX` is prepended to every key and channel.

#[derive(Debug, Clone, Default)]
pub struct RedisKeys {
    prefix: String,
}

impl RedisKeys {
    pub fn new(prefix: impl Into<String>) -> Self {
        RedisKeys { prefix: prefix.into() }
    }

    pub fn snapshot(&self, tenant: &str) -> String {
        format!("{}gw_snapshot:{{{tenant}}}", self.prefix)
    }

    /// Not tenant-scoped: the proxy resolves the tenant from it.
    pub fn api_key(&self, key_sha256_hex: &str) -> String {
        format!("{}gw_key:{key_sha256_hex}", self.prefix)
    }

    pub fn config_channel(&self) -> String {
        format!("{}gw_config", self.prefix)
    }

    /// `yyyymmdd` in UTC.
    pub fn usage(&self, tenant: &str, day: &str) -> String {
        format!("{}gw_usage:{{{tenant}}}:{day}", self.prefix)
    }

    /// `yyyymm` in UTC.
    pub fn spend(&self, tenant: &str, month: &str) -> String {
        format!("{}gw_spend:{{{tenant}}}:{month}", self.prefix)
    }

    /// Per API key (issue 32), fields `key id|route`, `yyyymmdd` in UTC.
    pub fn key_usage(&self, tenant: &str, day: &str) -> String {
        format!("{}gw_key_usage:{{{tenant}}}:{day}", self.prefix)
    }

    /// Per API key id, `yyyymm` in UTC.
    pub fn key_spend(&self, tenant: &str, month: &str) -> String {
        format!("{}gw_key_spend:{{{tenant}}}:{month}", self.prefix)
    }

    /// The tenant's month total over all routes, `yyyymm` in UTC.
    pub fn tenant_spend(&self, tenant: &str, month: &str) -> String {
        format!("{}gw_tenant_spend:{{{tenant}}}:{month}", self.prefix)
    }

    pub fn health(&self, tenant: &str) -> String {
        format!("{}gw_health:{{{tenant}}}", self.prefix)
    }

    pub fn budget_alerted(&self, tenant: &str, month: &str) -> String {
        format!("{}gw_budget_alerted:{{{tenant}}}:{month}", self.prefix)
    }

    /// One limit's window (issue 18): `scope` is `key:<key id>`, `tenant` or `route:<name>`,
    /// `per_minute` `rpm` or `tpm`. The lease script also uses `…:units` and `…:sum`.
    pub fn rate_window(&self, tenant: &str, scope: &str, per_minute: &str) -> String {
        let mut out = String::new();
        self.write_rate_window(&mut out, tenant, (scope, None), per_minute);
        out
    }

    /// [`RedisKeys::rate_window`] written into `out` (cleared first), the scope given as
    /// `("key", Some(id))`, `("tenant", None)`, `("route", Some(name))`: the request path
    /// looks buckets up with it without allocating.
    pub fn write_rate_window(&self, out: &mut String, tenant: &str, scope: (&str, Option<&str>), per_minute: &str) {
        out.clear();
        for part in [self.prefix.as_str(), "gw_rl:{", tenant, "}:", scope.0] {
            out.push_str(part);
        }
        if let Some(name) = scope.1 {
            out.push(':');
            out.push_str(name);
        }
        out.push(':');
        out.push_str(per_minute);
    }

    /// The processes that leased quota for the tenant in the last minute (their share when
    /// Redis is unreachable).
    pub fn rate_processes(&self, tenant: &str) -> String {
        format!("{}gw_rl_procs:{{{tenant}}}", self.prefix)
    }

    /// A stored Responses-API response (issue 29): its response object and input items.
    pub fn response(&self, tenant: &str, id: &str) -> String {
        format!("{}gw_resp:{{{tenant}}}:{id}", self.prefix)
    }

    /// One item of a stored response, for `item_reference`.
    pub fn response_item(&self, tenant: &str, id: &str) -> String {
        format!("{}gw_resp_item:{{{tenant}}}:{id}", self.prefix)
    }

    pub fn events(&self) -> String {
        format!("{}gw_events", self.prefix)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_match_the_architecture_table() {
        let k = RedisKeys::new("");
        assert_eq!(k.snapshot("acme"), "gw_snapshot:{acme}");
        assert_eq!(k.usage("acme", "20261129"), "gw_usage:{acme}:20261129");
        assert_eq!(k.api_key("ab12"), "gw_key:ab12");
        let k = RedisKeys::new("t1:");
        assert_eq!(k.spend("acme", "202611"), "t1:gw_spend:{acme}:202611");
        assert_eq!(k.config_channel(), "t1:gw_config");
        assert_eq!(k.rate_window("acme", "key:7", "rpm"), "t1:gw_rl:{acme}:key:7:rpm");
        assert_eq!(k.rate_processes("acme"), "t1:gw_rl_procs:{acme}");
    }
}
