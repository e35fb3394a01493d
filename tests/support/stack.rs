//! A whole Shield deployment from the real binary: `shield mock-llm`, `shield admin` and
//! `shield proxy` as child processes on free ports, with their own database and Redis prefix.
//! Children are killed when the stack is dropped, even when the test fails. What the stack
//! produced is kept for the whole-suite leak scan when the suite asks ([`crate::evidence`]).

use std::process::Stdio;
use std::time::Duration;

use reqwest::StatusCode;
use reqwest::header::HeaderMap;
use serde_json::{Value, json};
use shield_admin::auth::{Scope, Tokens};
use tokio::process::{Child, Command};

use crate::admin::{JWT_SECRET, vault_key};
use crate::evidence::{self, Evidence};
use crate::process::shield_bin;
use crate::{DbName, eventually, free_port, redis_url, unique};

pub struct StackOptions {
    pub redis_url: String,
    pub default_upstream: bool,
    pub routing: bool,
    pub start_admin: bool,
    pub flush_s: u64,
    /// `SHIELD_LLM_ROUTING_CACHE_S`: 1 s here, so a test sees a change within a second; a
    /// long one leaves `gw_config` as the only fast path.
    pub cache_s: u64,
    /// A Postgres server other than the shared one (e.g. a private one the test stops).
    pub postgres_base: Option<String>,
}

impl Default for StackOptions {
    fn default() -> Self {
        StackOptions {
            redis_url: redis_url(),
            default_upstream: false,
            routing: true,
            start_admin: true,
            flush_s: 1,
            cache_s: 1,
            postgres_base: None,
        }
    }
}

impl StackOptions {
    /// The defaults, against this test binary's shared Redis Cluster ([`crate::cluster`]).
    pub fn on_cluster() -> StackOptions {
        StackOptions { redis_url: crate::cluster::shared().url(), ..Default::default() }
    }
}

pub struct Stack {
    pub mock: String,
    pub admin: String,
    pub proxy: String,
    pub prefix: String,
    pub db: DbName,
    pub tenant: String,
    /// The tenant owner's sign-in, as `shield tenant create` printed it.
    pub owner_email: String,
    pub owner_password: String,
    /// The children's logs and, when the suite keeps it, the leak scan's evidence.
    pub evidence: Evidence,
    pub client: reqwest::Client,
    env: Vec<(&'static str, String)>,
    token: String,
    /// Named children (`mock-llm`, `admin`, `proxy`, `proxy-<addr>`), killed on drop.
    children: Vec<(String, Child)>,
}

impl Stack {
    pub async fn start() -> Stack {
        Stack::start_with(StackOptions::default()).await
    }

    pub async fn start_with(options: StackOptions) -> Stack {
        let evidence = Evidence::new();
        let mock = format!("127.0.0.1:{}", free_port());
        let admin = format!("127.0.0.1:{}", free_port());
        let proxy = format!("127.0.0.1:{}", free_port());
        let prefix = unique("st") + ":";
        let db = match &options.postgres_base {
            Some(base) => DbName::reserve_on(base),
            None => DbName::reserve(),
        };
        let mut env = vec![
            ("DATABASE_URL", db.url.clone()),
            ("REDIS_URL", options.redis_url.clone()),
            ("SHIELD_REDIS_PREFIX", prefix.clone()),
            ("SHIELD_ADMIN_ADDR", admin.clone()),
            ("SHIELD_PROXY_ADDR", proxy.clone()),
            ("SHIELD_JWT_SECRET", JWT_SECRET.to_string()),
            ("SHIELD_VAULT_KEY", vault_key()),
            ("SHIELD_LLM_ROUTING_CACHE_S", options.cache_s.to_string()),
            ("SHIELD_LLM_ROUTING_FLUSH_S", options.flush_s.to_string()),
            ("SHIELD_LLM_ROUTING", if options.routing { "1" } else { "0" }.into()),
            ("RUST_LOG", "info".into()),
            // Vertex AI targets get their tokens from the mock's endpoint (tests/support/clouds.rs).
            ("SHIELD_GCP_TOKEN_URL", format!("http://{mock}/mock/id:gcp-token/token")),
        ];
        if options.default_upstream {
            env.push(("SHIELD_DEFAULT_UPSTREAM_URL", format!("http://{mock}/mock/id:default/v1")));
        }
        let mut stack = Stack {
            mock,
            admin,
            proxy,
            prefix,
            db,
            tenant: String::new(),
            owner_email: String::new(),
            owner_password: String::new(),
            evidence,
            client: reqwest::Client::builder().timeout(Duration::from_secs(60)).build().unwrap(),
            env,
            token: String::new(),
            children: Vec::new(),
        };
        let mock_addr = stack.mock.clone();
        stack.spawn("mock-llm", &["mock-llm", "--addr", &mock_addr]);
        // Migrate and create the tenant before the admin and proxy start.
        let out = stack.command(&["migrate"]).output().await.unwrap();
        assert!(out.status.success(), "migrate: {}", String::from_utf8_lossy(&out.stderr));
        let slug = unique("t-")[..14].to_string();
        let out = stack
            .command(&["tenant", "create", &slug, "--admin-email", &format!("owner@{slug}.example.com")])
            .output()
            .await
            .unwrap();
        assert!(out.status.success(), "tenant create: {}", String::from_utf8_lossy(&out.stderr));
        let created: Value = serde_json::from_slice(&out.stdout).expect("tenant create prints JSON");
        stack.owner_email = created["admin_email"].as_str().unwrap_or_default().to_string();
        stack.owner_password = created["password"].as_str().unwrap_or_default().to_string();
        stack.tenant = slug;
        for secret in [JWT_SECRET.to_string(), vault_key(), stack.owner_password.clone()] {
            stack.evidence.secret(&secret);
        }
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64;
        stack.token = Tokens::new(JWT_SECRET)
            .unwrap()
            .issue(
                "stack-test",
                Some(&stack.tenant),
                vec![Scope::TenantRead, Scope::ConfigWrite, Scope::RegistryWrite],
                Duration::from_secs(3600),
                now,
            )
            .0;
        stack.evidence.secret(&stack.token);
        if options.start_admin {
            stack.spawn("admin", &["admin"]);
        }
        stack.spawn("proxy", &["proxy"]);
        let mock = stack.mock.clone();
        eventually(30, "the mock to answer", || async {
            http_ok(&format!("http://{mock}/healthz")).await.then_some(())
        })
        .await;
        if options.start_admin {
            let admin = stack.admin.clone();
            eventually(30, "the admin to answer", || async {
                http_ok(&format!("http://{admin}/healthz")).await.then_some(())
            })
            .await;
        }
        let proxy = stack.proxy.clone();
        eventually(30, "the proxy to answer", || async {
            http_ok(&format!("http://{proxy}/healthz")).await.then_some(())
        })
        .await;
        stack
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(shield_bin());
        cmd.args(args)
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .kill_on_drop(true)
            .stdin(Stdio::null());
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        cmd
    }

    /// A child's log file, appended to: a restarted child keeps its predecessor's lines.
    fn log_file(&self, name: &str) -> std::fs::File {
        std::fs::OpenOptions::new().create(true).append(true).open(self.evidence.path(&format!("{name}.log"))).unwrap()
    }

    fn spawn(&mut self, name: &str, args: &[&str]) {
        let log = self.log_file(name);
        let child = self
            .command(args)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("start {name}: {e}"));
        self.children.push((name.to_string(), child));
    }

    /// Everything the children logged so far.
    pub fn all_logs(&self) -> String {
        ["mock-llm", "admin", "proxy"]
            .iter()
            .map(|n| std::fs::read_to_string(self.evidence.path(&format!("{n}.log"))).unwrap_or_default())
            .collect()
    }

    /// Starts another proxy process of the same deployment; returns its address.
    pub async fn extra_proxy(&mut self) -> String {
        let addr = format!("127.0.0.1:{}", free_port());
        let log = self.log_file(&format!("proxy-{addr}"));
        let child = self
            .command(&["proxy"])
            .env("SHIELD_PROXY_ADDR", &addr)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start proxy");
        self.children.push((format!("proxy-{addr}"), child));
        let url = format!("http://{addr}/healthz");
        eventually(30, "the extra proxy to answer", || async { http_ok(&url).await.then_some(()) }).await;
        addr
    }

    /// Kills the proxy (the last child) with SIGKILL: no chance to flush.
    pub async fn kill_proxy(&mut self) {
        let mut proxy = self.take("proxy");
        proxy.kill().await.expect("SIGKILL");
    }

    /// Stops the proxy (the last child) with SIGTERM and waits for it to exit.
    pub async fn terminate_proxy(&mut self) {
        let mut proxy = self.take("proxy");
        let pid = proxy.id().expect("proxy pid");
        let status = std::process::Command::new("kill").args(["-TERM", &pid.to_string()]).status().expect("kill runs");
        assert!(status.success());
        let exited =
            tokio::time::timeout(Duration::from_secs(20), proxy.wait()).await.expect("the proxy stops within 20 s");
        assert!(exited.is_ok());
    }

    /// Kills the proxy (the last child) and starts it again with `extra` environment.
    pub async fn restart_proxy(&mut self, extra: &[(&'static str, String)]) {
        let mut old = self.take("proxy");
        let _ = old.kill().await;
        self.env.extend(extra.iter().cloned());
        self.spawn("proxy", &["proxy"]);
        let proxy = self.proxy.clone();
        eventually(30, "the proxy to answer", || async {
            http_ok(&format!("http://{proxy}/healthz")).await.then_some(())
        })
        .await;
    }

    /// `name{labels} value` lines (and an unlabelled `name value`) of the proxy's `/metrics`.
    pub async fn metric(&self, metric: &str) -> Vec<(String, f64)> {
        let url = format!("http://{}/metrics", self.proxy);
        let text = self.client.get(url).send().await.unwrap().text().await.unwrap();
        text.lines()
            .filter(|l| l.starts_with(&format!("{metric}{{")) || l.starts_with(&format!("{metric} ")))
            .filter_map(|l| {
                let (labels, value) = l.rsplit_once(' ')?;
                Some((labels.to_string(), value.parse().ok()?))
            })
            .collect()
    }

    /// The tenant owner's admin token.
    pub fn token(&self) -> &str {
        &self.token
    }

    fn take(&mut self, name: &str) -> Child {
        let i = self.children.iter().position(|(n, _)| n == name).unwrap_or_else(|| panic!("{name} is not running"));
        self.children.remove(i).1
    }

    /// The process id of a running child (`admin`, `proxy`, `proxy-<addr>`).
    pub fn pid(&self, name: &str) -> u32 {
        self.children.iter().find(|(n, _)| n == name).and_then(|(_, c)| c.id()).expect("running")
    }

    /// Kills the admin (SIGKILL, mid-write if one is in flight) and starts it again.
    pub async fn restart_admin(&mut self) {
        let mut old = self.take("admin");
        let _ = old.kill().await;
        let _ = old.wait().await;
        self.spawn("admin", &["admin"]);
        let admin = self.admin.clone();
        eventually(30, "the admin to answer", || async {
            http_ok(&format!("http://{admin}/healthz")).await.then_some(())
        })
        .await;
    }

    pub async fn admin_call(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> (StatusCode, Value) {
        self.admin_request(method, path, body, true).await
    }

    /// An admin API call; `scanned` is false only for the one answer that shows a secret by
    /// design (a new API key), which the leak scan must not read.
    async fn admin_request(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
        scanned: bool,
    ) -> (StatusCode, Value) {
        let what = format!("{method} admin {path}");
        let mut request = self.client.request(method, format!("http://{}{path}", self.admin)).bearer_auth(&self.token);
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await.expect("admin answers");
        let (status, headers) = (response.status(), response.headers().clone());
        let text = response.text().await.unwrap_or_default();
        if scanned {
            self.evidence.response(&what, status, &headers, &text);
        }
        (status, serde_json::from_str(&text).unwrap_or(Value::Null))
    }

    pub async fn put_target(&self, id: &str, body: Value) {
        let (status, response) =
            self.admin_call(reqwest::Method::PUT, &format!("/v1/tenant/me/gateway/targets/{id}"), Some(body)).await;
        assert!(status.is_success(), "PUT target {id}: {status} {response}");
    }

    /// A target on the mock with `scenario` directives (e.g. `status:503`); `id` tags its log.
    pub async fn mock_target(&self, id: &str, scenario: &str, extra: Value) {
        let mut body = json!({"base_url": format!("http://{}/mock/id:{id};{scenario}/v1", self.mock), "model": format!("model-{id}"),
            "allow_private": true, "auth": {"mode": "none"}});
        for (k, v) in extra.as_object().into_iter().flatten() {
            body[k] = v.clone();
        }
        self.put_target(id, body).await;
    }

    pub async fn put_route(&self, name: &str, body: Value) {
        let (status, response) = self
            .admin_call(
                reqwest::Method::PUT,
                &format!("/v1/tenant/me/gateway/routes/{}", name.replace('/', "%2F")),
                Some(body),
            )
            .await;
        assert!(status.is_success(), "PUT route {name}: {status} {response}");
    }

    pub async fn put_secret(&self, name: &str, value: &str, bindings: &[&str]) {
        self.evidence.secret(value);
        let (status, response) = self
            .admin_call(
                reqwest::Method::PUT,
                &format!("/v1/tenant/me/secrets/{name}"),
                Some(json!({"value": value, "bindings": bindings})),
            )
            .await;
        assert!(status.is_success(), "PUT secret: {status} {response}");
    }

    /// A new API key for the tenant: (key, id).
    pub async fn key(&self, role: Option<&str>) -> (String, String) {
        self.key_with(json!({"name": "test", "role": role})).await
    }

    /// A new API key made from `body` (`{name, agent?, role?, limits?}`): (key, id). The one
    /// answer that shows the key is kept out of the leak scan's evidence; the key is listed
    /// as a secret instead.
    pub async fn key_with(&self, body: Value) -> (String, String) {
        let (status, body) = self.admin_request(reqwest::Method::POST, "/v1/tenant/me/keys", Some(body), false).await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
        let key = body["key"].as_str().unwrap().to_string();
        self.evidence.secret(&key);
        (key, body["id"].as_str().unwrap().to_string())
    }

    /// `POST /v1/tenant/me/keys/{id}/rotate`: the key's new secret (kept out of the leak
    /// scan's evidence and listed as a secret, as at creation), and the answer.
    pub async fn rotate_key(&self, id: &str, grace_s: i64) -> (String, Value) {
        let path = format!("/v1/tenant/me/keys/{id}/rotate");
        let (status, body) =
            self.admin_request(reqwest::Method::POST, &path, Some(json!({"grace_s": grace_s})), false).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        let key = body["key"].as_str().unwrap().to_string();
        self.evidence.secret(&key);
        (key, body)
    }

    /// `POST /v1/tenant/me/webhooks`: the answer shows the signing secret once, by design, so
    /// it is kept out of the leak scan's evidence and the secret is listed as one instead.
    pub async fn create_webhook(&self, body: Value) -> Value {
        let (status, hook) =
            self.admin_request(reqwest::Method::POST, "/v1/tenant/me/webhooks", Some(body), false).await;
        assert_eq!(status, StatusCode::CREATED, "{hook}");
        self.evidence.secret(hook["secret"].as_str().unwrap());
        hook
    }

    /// An admin call with the platform operator's token (scope `operator`).
    pub async fn operator_call(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> (StatusCode, Value) {
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64;
        let token = Tokens::new(JWT_SECRET)
            .unwrap()
            .issue("operator-test", None, vec![Scope::Operator], Duration::from_secs(3600), now)
            .0;
        let mut request =
            self.client.request(method.clone(), format!("http://{}{path}", self.admin)).bearer_auth(token);
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await.expect("admin answers");
        let (status, headers) = (response.status(), response.headers().clone());
        let text = response.text().await.unwrap_or_default();
        self.evidence.response(&format!("{method} admin {path} (operator)"), status, &headers, &text);
        (status, serde_json::from_str(&text).unwrap_or(Value::Null))
    }

    /// An API key of a second tenant, made with the CLI.
    pub async fn other_tenant_key(&self) -> String {
        let slug = unique("o-")[..14].to_string();
        let out = self
            .command(&["tenant", "create", &slug, "--admin-email", &format!("owner@{slug}.example.com")])
            .output()
            .await
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let out = self.command(&["key", "create", "--tenant", &slug, "--name", "other"]).output().await.unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let key = String::from_utf8(out.stdout).unwrap().trim().to_string();
        self.evidence.secret(&key);
        key
    }

    /// POST /v1/chat/completions with `key`; returns status, headers and the JSON body.
    /// `POST {path}` on the proxy with `key` (and `anthropic-version` on `/v1/messages`), plus
    /// `headers`: the status, headers and body as text, kept as evidence.
    pub async fn post(
        &self,
        key: &str,
        path: &str,
        body: Value,
        headers: &[(&str, &str)],
    ) -> (StatusCode, HeaderMap, String) {
        let mut request = self.client.post(format!("http://{}{path}", self.proxy)).bearer_auth(key).json(&body);
        if path == "/v1/messages" {
            request = request.header("anthropic-version", "2023-06-01");
        }
        for (k, v) in headers {
            request = request.header(*k, *v);
        }
        let response = request.send().await.expect("proxy answers");
        let (status, headers) = (response.status(), response.headers().clone());
        let text = response.text().await.unwrap_or_default();
        self.evidence.response(&format!("POST proxy {path}"), status, &headers, &text);
        (status, headers, text)
    }

    pub async fn chat(&self, key: &str, body: Value, headers: &[(&str, &str)]) -> (StatusCode, HeaderMap, Value) {
        let mut request =
            self.client.post(format!("http://{}/v1/chat/completions", self.proxy)).bearer_auth(key).json(&body);
        for (k, v) in headers {
            if k.eq_ignore_ascii_case(UPSTREAM_KEY_HEADER) {
                self.evidence.secret(v);
            }
            request = request.header(*k, *v);
        }
        let response = request.send().await.expect("proxy answers");
        let status = response.status();
        let headers = response.headers().clone();
        let text = response.text().await.unwrap_or_default();
        self.evidence.response("POST proxy /v1/chat/completions", status, &headers, &text);
        (status, headers, serde_json::from_str(&text).unwrap_or(Value::String(text)))
    }

    /// A streamed POST /v1/chat/completions: status, headers and the SSE `data:` payloads.
    pub async fn chat_stream(&self, key: &str, body: Value) -> (StatusCode, HeaderMap, Vec<String>) {
        let url = format!("http://{}/v1/chat/completions", self.proxy);
        let response = self.client.post(url).bearer_auth(key).json(&body).send().await.expect("proxy answers");
        let (status, headers) = (response.status(), response.headers().clone());
        let text = response.text().await.unwrap_or_default();
        self.evidence.response("POST proxy /v1/chat/completions (stream)", status, &headers, &text);
        let data = text.lines().filter_map(|l| l.strip_prefix("data: ")).map(str::to_string).collect();
        (status, headers, data)
    }

    /// What the mock received for targets tagged `id`.
    pub async fn received(&self, id: &str) -> Vec<Value> {
        let url = format!("http://{}/_mock/requests?id={id}", self.mock);
        self.client.get(url).send().await.unwrap().json().await.unwrap()
    }

    /// Every request the mock received.
    pub async fn received_all(&self) -> Vec<Value> {
        self.client.get(format!("http://{}/_mock/requests", self.mock)).send().await.unwrap().json().await.unwrap()
    }
}

/// The header a caller's own provider key arrives in (API.md).
const UPSTREAM_KEY_HEADER: &str = "x-shield-upstream-key";

impl Stack {
    /// Redis values under the stack's prefix, every Postgres row and each process's
    /// `/metrics`, into the evidence directory.
    fn collect_evidence(&self) {
        let redis = self.env.iter().find(|(k, _)| *k == "REDIS_URL").map(|(_, v)| v.clone()).unwrap_or_else(redis_url);
        let mut metrics = vec![("admin".to_string(), self.admin.clone())];
        for (name, _) in &self.children {
            match name.as_str() {
                "proxy" => metrics.push((name.clone(), self.proxy.clone())),
                other => {
                    if let Some(addr) = other.strip_prefix("proxy-") {
                        metrics.push((name.clone(), addr.to_string()));
                    }
                }
            }
        }
        evidence::collect(&self.evidence, redis, self.prefix.clone(), self.db.url.clone(), metrics);
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        self.collect_evidence();
        for (_, child) in &mut self.children {
            let _ = child.start_kill();
        }
    }
}

pub async fn http_ok(url: &str) -> bool {
    reqwest::get(url).await.is_ok_and(|r| r.status().is_success())
}

/// The text of a stream's chunks (`choices[0].delta.content`), concatenated.
pub fn stream_content(data: &[String]) -> String {
    data.iter()
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .filter_map(|v| v.pointer("/choices/0/delta/content").and_then(Value::as_str).map(str::to_string))
        .collect()
}

/// A minimal chat body for `model`.
pub fn chat_body(model: &str) -> Value {
    json!({"model": model, "messages": [{"role": "user", "content": "hello"}]})
}

/// The sum of the [`Stack::metric`] rows whose labels contain every one of `parts`.
pub fn labelled(rows: &[(String, f64)], parts: &[&str]) -> f64 {
    rows.iter().filter(|(labels, _)| parts.iter().all(|p| labels.contains(p))).map(|(_, v)| v).sum()
}
