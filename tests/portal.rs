//! The portal over HTTP (in-process admin, own database, unique Redis prefix): the session
//! cookie, CSRF, expiry, escaping of every user-supplied text, empty states, the API's
//! messages on forms, scopes, secrets never shown, and the health, budget and usage the
//! proxies flushed (seeded in Redis). The browser walk-through is tests/portal_browser.rs.

use std::collections::BTreeMap;

use reqwest::StatusCode;
use reqwest::header::HeaderMap;
use serde_json::json;
use shield_admin::auth::Scope;
use shield_core::usage::UsageRow;
use shield_e2e::admin::{Admin, public_target};

const CSRF: &str = "csrf-value-for-tests-0123456789";

/// A browser stand-in: cookies kept by hand so their attributes can be checked.
struct Browser {
    base: String,
    client: reqwest::Client,
    cookies: BTreeMap<String, String>,
    /// Every page is kept for the whole-suite leak scan.
    evidence: shield_e2e::evidence::Evidence,
}

struct Page {
    status: StatusCode,
    headers: HeaderMap,
    body: String,
}

impl Page {
    fn location(&self) -> &str {
        self.headers.get("location").and_then(|v| v.to_str().ok()).unwrap_or("")
    }

    fn set_cookie(&self, name: &str) -> Option<String> {
        self.headers
            .get_all("set-cookie")
            .iter()
            .filter_map(|v| v.to_str().ok())
            .find(|c| c.starts_with(&format!("{name}=")))
            .map(str::to_string)
    }
}

impl Browser {
    fn new(admin: &Admin) -> Browser {
        let client = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().unwrap();
        Browser { base: admin.url.clone(), client, cookies: BTreeMap::new(), evidence: admin.evidence.clone() }
    }

    /// Signed in with a session cookie holding `token`, and a known CSRF cookie.
    fn with_session(admin: &Admin, token: String) -> Browser {
        let mut browser = Browser::new(admin);
        browser.cookies.insert("shield_session".into(), token);
        browser.cookies.insert("shield_csrf".into(), CSRF.into());
        browser
    }

    fn cookie_header(&self) -> String {
        self.cookies.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join("; ")
    }

    async fn finish(&mut self, request: reqwest::RequestBuilder) -> Page {
        let response = request.header("cookie", self.cookie_header()).send().await.expect("admin answers");
        let (status, headers) = (response.status(), response.headers().clone());
        for cookie in headers.get_all("set-cookie").iter().filter_map(|v| v.to_str().ok()) {
            let (pair, attributes) = cookie.split_once(';').unwrap_or((cookie, ""));
            let (name, value) = pair.split_once('=').unwrap();
            if value.is_empty() || attributes.contains("Max-Age=0") {
                self.cookies.remove(name);
            } else {
                self.cookies.insert(name.into(), value.into());
            }
        }
        let body = response.text().await.unwrap_or_default();
        self.evidence.response("portal page", status, &headers, &body);
        Page { status, headers, body }
    }

    async fn get(&mut self, path: &str) -> Page {
        let request = self.client.get(format!("{}{path}", self.base));
        self.finish(request).await
    }

    async fn post(&mut self, path: &str, fields: &[(&str, &str)]) -> Page {
        let body = url::form_urlencoded::Serializer::new(String::new()).extend_pairs(fields).finish();
        let request = self
            .client
            .post(format!("{}{path}", self.base))
            .header("content-type", "application/x-www-form-urlencoded")
            .body(body);
        self.finish(request).await
    }

    async fn sign_in(&mut self, email: &str, password: &str) -> Page {
        self.get("/portal/login").await;
        let csrf = self.cookies.get("shield_csrf").cloned().expect("the login page sets a CSRF cookie");
        self.post("/portal/login", &[("email", email), ("password", password), ("csrf", &csrf)]).await
    }
}

fn target_fields<'a>(id: &'a str, base_url: &'a str, model: &'a str) -> Vec<(&'a str, &'a str)> {
    vec![
        ("csrf", CSRF),
        ("editing", "0"),
        ("id", id),
        ("name", ""),
        ("base_url", base_url),
        ("model", model),
        ("location", "cloud"),
        ("auth.mode", "none"),
        ("auth.secret_ref", ""),
        ("price.input_per_mtok", ""),
        ("price.output_per_mtok", ""),
        ("timeout_s", "60"),
        ("enabled", "1"),
    ]
}

#[actix_web::test]
async fn sign_in_sets_a_strict_http_only_session_and_sign_out_ends_it() {
    let admin = Admin::start().await;
    let (_, email, password) = admin.tenant().await;
    let mut browser = Browser::new(&admin);

    let home = browser.get("/portal").await;
    assert_eq!((home.status, home.location()), (StatusCode::SEE_OTHER, "/portal/login"));
    let login = browser.get("/portal/login").await;
    let csrf = login.set_cookie("shield_csrf").expect("a CSRF cookie");
    assert!(csrf.contains("HttpOnly") && csrf.contains("SameSite=Strict") && csrf.contains("Path=/portal"), "{csrf}");
    let csp = login.headers["content-security-policy"].to_str().unwrap();
    assert!(csp.contains("default-src 'none'") && csp.contains("frame-ancestors 'none'"), "{csp}");

    let wrong = browser.sign_in(&email, "wrong password").await;
    assert_eq!(wrong.status, StatusCode::UNAUTHORIZED);
    assert!(wrong.body.contains("wrong e-mail or password"));
    assert!(!browser.cookies.contains_key("shield_session"));

    let signed_in = browser.sign_in(&email, &password).await;
    assert_eq!((signed_in.status, signed_in.location()), (StatusCode::SEE_OTHER, "/portal/targets"));
    let session = signed_in.set_cookie("shield_session").expect("a session cookie");
    assert!(session.contains("HttpOnly") && session.contains("SameSite=Strict") && session.contains("Path=/portal"));
    assert!(session.contains("Max-Age=600"), "the session lasts as long as the token: {session}");
    assert!(!session.contains("Secure"), "plain HTTP here; behind TLS the cookie is Secure");
    let targets = browser.get("/portal/targets").await;
    assert_eq!(targets.status, StatusCode::OK);
    assert!(targets.body.contains("Sign out"));

    let behind_tls = browser
        .client
        .get(format!("{}/portal/login", browser.base))
        .header("x-forwarded-proto", "https")
        .send()
        .await
        .unwrap();
    let cookie = behind_tls.headers().get("set-cookie").and_then(|c| c.to_str().ok()).unwrap_or_default().to_string();
    assert!(cookie.contains("Secure"), "{cookie}");

    let csrf = browser.cookies["shield_csrf"].clone();
    let out = browser.post("/portal/logout", &[("csrf", &csrf)]).await;
    assert_eq!((out.status, out.location()), (StatusCode::SEE_OTHER, "/portal/login"));
    let after = browser.get("/portal/targets").await;
    assert_eq!((after.status, after.location()), (StatusCode::SEE_OTHER, "/portal/login"));
}

#[actix_web::test]
async fn a_form_without_the_csrf_value_changes_nothing() {
    let admin = Admin::start().await;
    let (tenant, email, password) = admin.tenant().await;
    let token = admin.owner(&tenant);
    let mut browser = Browser::with_session(&admin, token.clone());

    let mut forged = target_fields("forged", "https://api.example.com/v1", "m");
    forged[0] = ("csrf", "another-value-0123456789abcdef");
    for fields in [forged.clone(), forged[1..].to_vec()] {
        let page = browser.post("/portal/targets", &fields).await;
        assert_eq!(page.status, StatusCode::FORBIDDEN);
        assert!(page.body.contains("this form has expired"), "{}", page.body);
    }
    let route = [("csrf", "wrong-wrong-wrong-wrong"), ("name", "r"), ("body", r#"{"targets": []}"#)];
    assert_eq!(browser.post("/portal/routes", &route).await.status, StatusCode::FORBIDDEN);
    let (_, targets) = admin.get("/v1/tenant/me/gateway/targets", &token).await;
    assert_eq!(targets["targets"], json!([]), "nothing was written");

    // Sign-in and sign-out are forms too.
    let mut stranger = Browser::new(&admin);
    let page = stranger.post("/portal/login", &[("email", &email), ("password", &password), ("csrf", "x")]).await;
    assert_eq!(page.status, StatusCode::FORBIDDEN);
    assert!(!stranger.cookies.contains_key("shield_session"));
    assert_eq!(browser.post("/portal/logout", &[]).await.status, StatusCode::FORBIDDEN);
    assert_eq!(browser.get("/portal/targets").await.status, StatusCode::OK, "still signed in");
}

#[actix_web::test]
async fn an_expired_or_forged_session_returns_to_sign_in() {
    let admin = Admin::start().await;
    let (tenant, _, _) = admin.tenant().await;
    let expired = admin.expired(Some(&tenant), &[Scope::TenantRead, Scope::ConfigWrite]);
    let mut browser = Browser::with_session(&admin, expired);
    let page = browser.get("/portal/routes").await;
    assert_eq!((page.status, page.location()), (StatusCode::SEE_OTHER, "/portal/login?expired=1"));
    assert!(page.set_cookie("shield_session").is_some_and(|c| c.contains("Max-Age=0")), "the stale cookie is cleared");
    let login = browser.get("/portal/login?expired=1").await;
    assert!(login.body.contains("Your session has expired"));

    let mut forged = Browser::with_session(&admin, "eyJhbGciOiJub25lIn0.eyJzdWIiOiJ4In0.".into());
    let page = forged.get("/portal/targets").await;
    assert_eq!((page.status, page.location()), (StatusCode::SEE_OTHER, "/portal/login"));
}

#[actix_web::test]
async fn a_new_tenant_is_told_what_to_do_next_on_every_tab() {
    let admin = Admin::start().await;
    let (tenant, _, _) = admin.tenant().await;
    let mut browser = Browser::with_session(&admin, admin.owner(&tenant));
    let expectations = [
        ("/portal/targets", "No targets yet", "/portal/targets/new"),
        ("/portal/routes", "No routes yet", "/portal/targets/new"),
        ("/portal/simulate", "Nothing to simulate yet", "/portal/routes/new"),
        ("/portal/usage", "No usage in this period", "/v1/chat/completions"),
        ("/portal/keys", "No keys yet", "/v1/tenant/me/keys"),
    ];
    for (path, headline, next) in expectations {
        let page = browser.get(path).await;
        assert_eq!(page.status, StatusCode::OK, "{path}");
        assert!(page.body.contains(headline) && page.body.contains(next), "{path}: {}", page.body);
    }
    admin.put("/v1/tenant/me/gateway/targets/a", &admin.owner(&tenant), public_target("m")).await;
    let routes = browser.get("/portal/routes").await;
    assert!(routes.body.contains("Create your first route"), "with a target, the next step is a route");
}

#[actix_web::test]
async fn every_user_supplied_text_renders_as_text() {
    let admin = Admin::start().await;
    let (tenant, _, _) = admin.tenant().await;
    let token = admin.owner(&tenant);
    let xss = "<script>alert(1)</script>";
    let mut target = public_target("m\"><img src=x onerror=alert(2)>");
    target["name"] = json!(xss);
    let (status, _) = admin.put("/v1/tenant/me/gateway/targets/evil", &token, target).await;
    assert_eq!(status, StatusCode::CREATED);
    let route = json!({"targets": ["evil"], "rules": [{"when": {"role": ["<b>r</b>"]}, "deny": "<img src=y onerror=alert(3)>"}]});
    let (status, body) = admin.put("/v1/tenant/me/gateway/routes/smart", &token, route).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let key = json!({"name": xss, "agent": "<img src=x>", "role": "<b>r</b>"});
    assert_eq!(admin.post("/v1/tenant/me/keys", &token, key).await.0, StatusCode::CREATED);

    let mut browser = Browser::with_session(&admin, token);
    let mut pages = Vec::new();
    for path in ["/portal/targets", "/portal/targets/evil/edit", "/portal/routes", "/portal/routes/edit?name=smart"] {
        pages.push((path.to_string(), browser.get(path).await));
    }
    let sample = "</textarea><script>alert(4)</script>";
    let simulated = browser
        .post("/portal/simulate", &[("csrf", CSRF), ("route", "smart"), ("sample", sample), ("role", "<b>r</b>")])
        .await;
    pages.push(("simulate".into(), simulated));
    pages.push(("/portal/keys".into(), browser.get("/portal/keys").await));
    for (path, page) in &pages {
        assert_eq!(page.status, StatusCode::OK, "{path}");
        for raw in ["<script>alert", "<img src=x", "<img src=y", "<b>r</b>", "</textarea><script>"] {
            assert!(!page.body.contains(raw), "{path} contains raw {raw:?}");
        }
    }
    assert!(pages[0].1.body.contains(&html_escape(xss)), "shown, escaped: {}", pages[0].1.body);
    let refusal = html_escape("refuse: \"<img src=y onerror=alert(3)>\"");
    assert!(pages[2].1.body.contains(&refusal), "{}", pages[2].1.body);
    assert!(pages[4].1.body.contains("Refused:"), "the deny rule matched the role in the simulator");
}

#[actix_web::test]
async fn the_target_form_shows_the_apis_messages_beside_their_fields() {
    let admin = Admin::start().await;
    let (tenant, _, _) = admin.tenant().await;
    let token = admin.owner(&tenant);
    let mut browser = Browser::with_session(&admin, token.clone());

    let page = browser.post("/portal/targets", &target_fields("bad", "ftp://example.com/v1", "m")).await;
    assert_eq!(page.status, StatusCode::UNPROCESSABLE_ENTITY);
    let (status, api) = admin
        .put(
            "/v1/tenant/me/gateway/targets/bad",
            &token,
            json!({"base_url": "ftp://example.com/v1", "model": "m", "auth": {"mode": "none"}}),
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    let message = api["error"]["errors"][0]["message"].as_str().unwrap();
    let expected = format!("<p class=\"field-error\" id=\"error-base_url\">{}</p>", html_escape(message));
    assert!(page.body.contains(&expected), "the API's message {message:?} beside base_url:\n{}", page.body);

    let fields: Vec<(&str, &str)> = target_fields("", "https://api.example.com/v1", "m")
        .into_iter()
        .map(|(k, v)| if k == "price.input_per_mtok" { (k, "cheap") } else { (k, v) })
        .collect();
    let page = browser.post("/portal/targets", &fields).await;
    assert!(page.body.contains("id=\"error-id\"") && page.body.contains("id=\"error-price.input_per_mtok\""));
    assert!(page.body.contains("value=\"cheap\""), "what the user typed stays in the form");

    let page = browser.post("/portal/targets", &target_fields("good", "https://api.example.com/v1", "m")).await;
    assert_eq!((page.status, page.location()), (StatusCode::SEE_OTHER, "/portal/targets?saved=good"));
    let (_, stored) = admin.get("/v1/tenant/me/gateway/targets/good", &token).await;
    assert_eq!(stored["updated_by"], "tester@example.com", "written as the signed-in user, audited by the API path");
    let (_, audit) = admin.get("/v1/tenant/me/audit", &token).await;
    assert!(audit.to_string().contains("gateway_target_set"), "{audit}");
}

fn html_escape(text: &str) -> String {
    // askama's escaping
    text.replace('&', "&#38;").replace('<', "&#60;").replace('>', "&#62;").replace('"', "&#34;").replace('\'', "&#39;")
}

#[actix_web::test]
async fn the_route_editor_names_json_and_validation_problems_inline() {
    let admin = Admin::start().await;
    let (tenant, _, _) = admin.tenant().await;
    let token = admin.owner(&tenant);
    admin.put("/v1/tenant/me/gateway/targets/a", &token, public_target("m")).await;
    let mut browser = Browser::with_session(&admin, token.clone());

    let broken = "{\"targets\": [\"a\",]}";
    let page =
        browser.post("/portal/routes", &[("csrf", CSRF), ("name", "r"), ("editing", "0"), ("body", broken)]).await;
    assert_eq!(page.status, StatusCode::BAD_REQUEST);
    assert!(page.body.contains("malformed JSON") && page.body.contains("line 1"), "{}", page.body);
    assert!(page.body.contains("{&#34;targets&#34;: [&#34;a&#34;,]}"), "the text is kept for fixing");

    let unknown = r#"{"targets": ["a"], "strategy": "fastest"}"#;
    let page =
        browser.post("/portal/routes", &[("csrf", CSRF), ("name", "r"), ("editing", "0"), ("body", unknown)]).await;
    assert_eq!(page.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert!(page.body.contains("strategy"), "{}", page.body);

    let good = r#"{"targets": ["a"]}"#;
    let page = browser
        .post("/portal/routes", &[("csrf", CSRF), ("name", "shield/cheap"), ("editing", "0"), ("body", good)])
        .await;
    assert_eq!((page.status, page.location()), (StatusCode::SEE_OTHER, "/portal/routes?saved=shield%2Fcheap"));
    let edit = browser.get("/portal/routes/edit?name=shield%2Fcheap").await;
    assert_eq!(edit.status, StatusCode::OK);
    assert!(edit.body.contains("&#34;targets&#34;"), "{}", edit.body);
}

#[actix_web::test]
async fn a_reader_sees_the_pages_but_cannot_change_anything() {
    let admin = Admin::start().await;
    let (tenant, _, _) = admin.tenant().await;
    let mut browser = Browser::with_session(&admin, admin.token(Some(&tenant), &[Scope::TenantRead]));
    assert_eq!(browser.get("/portal/targets").await.status, StatusCode::OK);
    let page = browser.post("/portal/targets", &target_fields("x", "https://api.example.com/v1", "m")).await;
    assert_eq!(page.status, StatusCode::FORBIDDEN);
    assert!(page.body.contains("this needs the config:write scope"), "{}", page.body);
    let (_, targets) = admin.get("/v1/tenant/me/gateway/targets", &admin.owner(&tenant)).await;
    assert_eq!(targets["targets"], json!([]));

    let mut operator = Browser::with_session(&admin, admin.token(None, &[Scope::Operator]));
    let page = operator.get("/portal/targets").await;
    assert_eq!(page.status, StatusCode::FORBIDDEN);
    assert!(page.body.contains("the portal is for tenant users"));
}

#[actix_web::test]
async fn no_page_shows_a_secret_value() {
    let admin = Admin::start().await;
    let (tenant, _, _) = admin.tenant().await;
    let token = admin.owner(&tenant);
    let secret = "sk-live-PORTALSECRET-0123456789abcdef";
    let (status, _) = admin
        .put("/v1/tenant/me/secrets/openai_prod", &token, json!({"value": secret, "bindings": ["api.example.com"]}))
        .await;
    assert!(status.is_success(), "{status}");
    let mut target = public_target("m");
    target["auth"] = json!({"mode": "vault", "secret_ref": "shield://openai_prod"});
    let (status, body) = admin.put("/v1/tenant/me/gateway/targets/vaulted", &token, target).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    admin.put("/v1/tenant/me/gateway/routes/r", &token, json!({"targets": ["vaulted"]})).await;

    let mut browser = Browser::with_session(&admin, token);
    let mut bodies = Vec::new();
    for path in
        ["/portal/targets", "/portal/targets/vaulted/edit", "/portal/targets/new", "/portal/routes", "/portal/usage"]
    {
        bodies.push(browser.get(path).await.body);
    }
    let (_, key) = admin.post("/v1/tenant/me/keys", &admin.owner(&tenant), json!({"name": "k"})).await;
    let key = key["key"].as_str().unwrap().to_string();
    let keys = browser.get("/portal/keys").await.body;
    assert!(keys.contains(&key[..14]) && !keys.contains(&key), "the prefix, never the key: {keys}");
    bodies.push(browser.post("/portal/simulate", &[("csrf", CSRF), ("route", "r"), ("sample", "hi")]).await.body);
    bodies.push(keys);
    assert!(bodies[0].contains("vault (openai_prod)"), "the reference is shown: {}", bodies[0]);
    assert!(bodies[5].contains("tried 1st"), "{}", bodies[5]);
    for body in bodies {
        assert!(!body.contains(secret) && !body.contains("PORTALSECRET"), "a page shows the secret");
    }
}

/// Health, spend and usage as the proxies flush them (ARCHITECTURE.md keys), seeded directly.
async fn seed(admin: &Admin, tenant: &str, write: &[(&str, &str, &str)]) {
    let client = redis::Client::open(admin.redis.as_str()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    for (key, field, value) in write {
        let key = match *key {
            "health" => admin.keys.health(tenant),
            "spend" => admin.keys.spend(tenant, &chrono_month()),
            day => admin.keys.usage(tenant, day),
        };
        let _: () = redis::cmd("HSET").arg(key).arg(*field).arg(*value).query_async(&mut conn).await.unwrap();
    }
}

fn chrono_month() -> String {
    today().replace('-', "")[..6].to_string()
}

fn today() -> String {
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64;
    let days = secs.div_euclid(86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm), to avoid a chrono dependency here.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}")
}

fn health(state: &str) -> String {
    json!({"state": state, "failures": 0, "last_error": null, "last_ok_at": null, "at": 1, "process": "p1"}).to_string()
}

#[actix_web::test]
async fn health_budget_and_usage_show_what_the_proxies_flushed() {
    let admin = Admin::start().await;
    let (tenant, _, _) = admin.tenant().await;
    let token = admin.owner(&tenant);
    for (id, priced) in [("up", true), ("down", true), ("wobbly", true), ("free", false)] {
        let mut target = public_target("m");
        if priced {
            target["price"] = json!({"input_per_mtok": 1, "output_per_mtok": 2});
        }
        admin.put(&format!("/v1/tenant/me/gateway/targets/{id}"), &token, target).await;
    }
    admin
        .put(
            "/v1/tenant/me/gateway/routes/paid",
            &token,
            json!({"targets": ["up", "down", "wobbly"], "budget": {"monthly": 10}}),
        )
        .await;
    admin
        .put(
            "/v1/tenant/me/gateway/routes/mixed",
            &token,
            json!({"targets": ["up", "free"], "budget": {"monthly": 1, "at_limit": "block"}}),
        )
        .await;
    let day = today().replace('-', "");
    let row = UsageRow {
        calls: 4,
        ok: 3,
        errors: 1,
        failovers_from: 1,
        input_tokens: 1200,
        output_tokens: 300,
        cost_micros: 1_234_567,
        latency_ms_sum: 400,
        ..Default::default()
    };
    seed(
        &admin,
        &tenant,
        &[
            ("health", "up|p1", &health("closed")),
            ("health", "down|p1", &health("open")),
            ("health", "wobbly|p1", &health("half_open")),
            ("health", "wobbly|p2", &health("closed")),
            ("spend", "paid", "8500000"),
            ("spend", "mixed", "1000000"),
            (&day, "paid|up", &serde_json::to_string(&row).unwrap()),
        ],
    )
    .await;

    let mut browser = Browser::with_session(&admin, token);
    let targets = browser.get("/portal/targets").await.body;
    for (id, dot) in [("up", "closed"), ("down", "open"), ("wobbly", "half_open"), ("free", "unknown")] {
        let cell = targets.split(&format!("<b>{id}</b>")).nth(1).unwrap_or_default();
        let dot_class = cell.split("class=\"dot ").nth(1).unwrap_or_default();
        assert!(
            dot_class.starts_with(dot),
            "{id}: expected a {dot} dot, got {}",
            &dot_class[..dot_class.len().min(30)]
        );
    }
    assert!(targets.contains("not priced"));

    let routes = browser.get("/portal/routes").await.body;
    let card = |name: &str| {
        routes
            .split(&format!("id=\"route-{name}\""))
            .nth(1)
            .unwrap_or_default()
            .split("</article>")
            .next()
            .unwrap_or_default()
            .to_string()
    };
    let paid = card("paid");
    assert!(
        paid.contains("class=\"budget warn\"")
            && paid.contains("$8.50 of $10.00 this month (85.0 %)")
            && paid.contains("nearing the limit"),
        "{paid}"
    );
    assert!(!paid.contains("Spend incomplete"));
    let mixed = card("mixed");
    assert!(mixed.contains("class=\"budget at_limit\"") && mixed.contains("requests are refused"), "{mixed}");
    assert!(mixed.contains("Spend incomplete"), "an unpriced target flags the route: {mixed}");
    assert!(mixed.contains("width=\"100\""), "the bar is full at the limit");

    let usage = browser.get("/portal/usage").await.body;
    assert!(usage.contains("<td>paid</td><td>up</td><td>4</td><td>3</td><td>1</td>"), "{usage}");
    assert!(usage.contains("<td>1</td><td>1200</td><td>300</td><td>$1.234567</td><td>100</td>"), "{usage}");
    assert!(usage.contains("id=\"cost-chart\"") && usage.contains("paid on "), "a bar with its title");
    let bad = browser.get("/portal/usage?from=2026-01-02&to=2026-01-01").await;
    assert_eq!(bad.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert!(bad.body.contains("to: must be on or after"), "{}", bad.body);
}

#[actix_web::test]
async fn unknown_pages_and_assets() {
    let admin = Admin::start().await;
    let mut browser = Browser::new(&admin);
    let css = browser.get("/portal/static/portal.css").await;
    assert_eq!(css.status, StatusCode::OK);
    assert!(css.headers["content-type"].to_str().unwrap().starts_with("text/css"));
    let missing = browser.get("/portal/nope").await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND);
    assert!(missing.body.contains("no such page"));
}

/// Issue 15: the form knows the flavor; an Anthropic target made in the portal sends its key
/// in `x-api-key`, and switching a target's flavor takes the flavor's defaults along.
#[actix_web::test]
async fn the_target_form_knows_the_flavor() {
    let admin = Admin::start().await;
    let (tenant, ..) = admin.tenant().await;
    let token = admin.owner(&tenant);
    let mut browser = Browser::with_session(&admin, token.clone());
    let form = browser.get("/portal/targets/new").await;
    assert!(form.body.contains(r#"<option value="anthropic""#), "the flavor is offered");
    let mut fields = target_fields("claude", "https://api.anthropic.com/v1", "claude-sonnet-4-5");
    fields.push(("flavor", "anthropic"));
    let page = browser.post("/portal/targets", &fields).await;
    assert_eq!(page.status, StatusCode::SEE_OTHER, "{}", page.body);
    let (_, target) = admin.get("/v1/tenant/me/gateway/targets/claude", &token).await;
    assert_eq!((target["flavor"].clone(), target["auth"]["header"].clone()), (json!("anthropic"), json!("x-api-key")));
    let edit = browser.get("/portal/targets/claude/edit").await;
    assert!(edit.body.contains(r#"<option value="anthropic" selected>"#), "the edit form shows it");
    let mut fields = target_fields("claude", "https://api.openai.com/v1", "gpt-4o");
    fields[1] = ("editing", "1");
    fields.push(("flavor", "openai"));
    assert_eq!(browser.post("/portal/targets", &fields).await.status, StatusCode::SEE_OTHER);
    let (_, target) = admin.get("/v1/tenant/me/gateway/targets/claude", &token).await;
    assert_eq!((target["flavor"].clone(), target["auth"]["header"].clone()), (json!("openai"), json!("Authorization")));
    assert!(target.get("anthropic").is_none(), "Anthropic's options went with the flavor: {target}");

    // Issue 30: the cloud flavors, their base URLs made from region and project when left empty.
    for option in [r#"<option value="vertex""#, r#"<option value="bedrock""#, r#"id="credential-kinds""#] {
        assert!(form.body.contains(option), "{option}");
    }
    let mut fields = target_fields("claude-vertex", "", "claude-sonnet-4@20250514");
    fields.extend([
        ("flavor", "vertex"),
        ("region", "europe-west1"),
        ("project", "acme-prod"),
        ("vertex.publisher", "anthropic"),
    ]);
    let page = browser.post("/portal/targets", &fields).await;
    assert_eq!(page.status, StatusCode::SEE_OTHER, "{}", page.body);
    let (_, target) = admin.get("/v1/tenant/me/gateway/targets/claude-vertex", &token).await;
    assert_eq!(
        (target["base_url"].as_str(), target["vertex"]["publisher"].as_str()),
        (
            Some("https://europe-west1-aiplatform.googleapis.com/v1/projects/acme-prod/locations/europe-west1"),
            Some("anthropic")
        )
    );
    let edit = browser.get("/portal/targets/claude-vertex/edit").await;
    assert!(edit.body.contains(r#"value="acme-prod""#) && edit.body.contains(r#"<option value="anthropic" selected>"#));
    let mut fields = target_fields("bedrock", "", "anthropic.claude-sonnet-4-20250514-v1:0");
    fields.extend([("flavor", "bedrock"), ("region", "us-west-2")]);
    assert_eq!(browser.post("/portal/targets", &fields).await.status, StatusCode::SEE_OTHER);
    let (_, target) = admin.get("/v1/tenant/me/gateway/targets/bedrock", &token).await;
    assert_eq!(
        (target["base_url"].as_str(), target["bedrock"]["region"].as_str(), target["auth"]["header"].as_str()),
        (Some("https://bedrock-runtime.us-west-2.amazonaws.com"), Some("us-west-2"), Some("Authorization"))
    );
    // A Bedrock target on a host that names no region, without one: the API's message beside
    // the region field.
    let mut fields = target_fields("bedrock-local", "https://llm.internal.example.com", "m");
    fields.push(("flavor", "bedrock"));
    let page = browser.post("/portal/targets", &fields).await;
    assert_eq!(page.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", page.body);
    assert!(page.body.contains(r#"id="error-bedrock.region""#), "{}", page.body);
}

/// The `<p class="field-error">` the API's message for `body` at `path` renders as.
async fn api_message(
    admin: &Admin,
    token: &str,
    method: reqwest::Method,
    path: &str,
    body: serde_json::Value,
) -> String {
    let (status, api) = admin.call(method, path, Some(token), Some(body)).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{api}");
    html_escape(api["error"]["message"].as_str().unwrap().split_once(": ").map_or("", |(_, m)| m))
}

/// One key's limits form on the keys page.
fn key_form<'a>(id: &'a str, rpm: &'a str, tpm: &'a str) -> [(&'a str, &'a str); 4] {
    [("csrf", CSRF), ("id", id), ("limits.rpm", rpm), ("limits.tpm", tpm)]
}

/// Issue 18: the keys page lists every key (never the key itself) with its limits and a form
/// per live key; the form saves through the API (audited, published) and shows its messages.
#[actix_web::test]
async fn the_keys_page_edits_each_keys_limits() {
    let admin = Admin::start().await;
    let (tenant, _, _) = admin.tenant().await;
    let token = admin.owner(&tenant);
    let (_, ci) = admin
        .post("/v1/tenant/me/keys", &token, json!({"name": "ci", "agent": "builder", "limits": {"rpm": 600}}))
        .await;
    let (_, bot) = admin.post("/v1/tenant/me/keys", &token, json!({"name": "bot", "role": "contractor"})).await;
    let (_, old) = admin.post("/v1/tenant/me/keys", &token, json!({"name": "old", "limits": {"tpm": 9}})).await;
    let id = |k: &serde_json::Value| k["id"].as_str().unwrap().to_string();
    let (ci_id, bot_id, old_id) = (id(&ci), id(&bot), id(&old));
    admin.delete(&format!("/v1/tenant/me/keys/{old_id}"), &token).await;

    let mut browser = Browser::with_session(&admin, token.clone());
    let page = browser.get("/portal/keys").await;
    assert_eq!(page.status, StatusCode::OK);
    assert!(page.body.contains(r#"<a href="/portal/keys" aria-current="page">Keys</a>"#), "in the nav");
    let row = |body: &str, id: &str| {
        body.split(&format!("id=\"key-{id}\""))
            .nth(1)
            .unwrap_or_default()
            .split("</tr>")
            .next()
            .unwrap_or_default()
            .to_string()
    };
    let ci_row = row(&page.body, &ci_id);
    assert!(ci_row.contains("<b>ci</b>") && ci_row.contains("builder"), "{ci_row}");
    assert!(
        ci_row.contains(r#"name="limits.rpm" value="600""#) && ci_row.contains(r#"name="limits.tpm" value="""#),
        "{ci_row}"
    );
    assert!(row(&page.body, &bot_id).contains("contractor"));
    let old_row = row(&page.body, &old_id);
    assert!(old_row.contains("revoked") && old_row.contains(">9<") && !old_row.contains("<form"), "{old_row}");
    for key in [&ci, &bot, &old] {
        assert!(!page.body.contains(key["key"].as_str().unwrap()), "never a key itself");
    }

    let saved = browser.post("/portal/keys/limits", &key_form(&bot_id, "120", "100 000")).await;
    assert_eq!((saved.status, saved.location()), (StatusCode::SEE_OTHER, "/portal/keys?saved=bot"), "{}", saved.body);
    let (_, list) = admin.get("/v1/tenant/me/keys", &token).await;
    assert_eq!(list["keys"][1]["limits"], json!({"rpm": 120, "tpm": 100_000}));
    let record =
        shield_e2e::redis_dump(&admin.keys.api_key(&shield_core::snapshot::key_hash(bot["key"].as_str().unwrap())))
            .await;
    assert!(record[0].1.contains(r#""limits":{"rpm":120,"tpm":100000}"#), "published: {}", record[0].1);
    let (_, audit) = admin.get("/v1/tenant/me/audit", &token).await;
    assert_eq!(
        (audit["entries"][0]["action"].as_str(), audit["entries"][0]["object"].as_str()),
        (Some("key_limits_set"), Some(bot_id.as_str()))
    );
    assert!(browser.get("/portal/keys?saved=bot").await.body.contains("Saved the limits of key <b>bot</b>"));

    let expected = api_message(
        &admin,
        &token,
        reqwest::Method::PATCH,
        &format!("/v1/tenant/me/keys/{ci_id}"),
        json!({"limits": {"rpm": 0}}),
    )
    .await;
    for (rpm, tpm, field, message) in [
        ("0", "", "limits.rpm", expected.as_str()),
        ("lots", "", "limits.rpm", "a whole number above 0"),
        ("", "-5", "limits.tpm", "a whole number above 0"),
    ] {
        let page = browser.post("/portal/keys/limits", &key_form(&ci_id, rpm, tpm)).await;
        assert_eq!(page.status, StatusCode::UNPROCESSABLE_ENTITY, "{rpm} {tpm}");
        let ci_row = row(&page.body, &ci_id);
        let error = format!("<p class=\"field-error\" id=\"error-{field}-{ci_id}\">{message}");
        assert!(ci_row.contains(&error), "{error} in {ci_row}");
        assert!(ci_row.contains(&format!(r#"name="limits.rpm" value="{}""#, html_escape(rpm))), "what was typed stays");
        assert!(!row(&page.body, &bot_id).contains("field-error"), "only on the key it was for");
    }
    assert_eq!(admin.get("/v1/tenant/me/keys", &token).await.1["keys"][0]["limits"], json!({"rpm": 600}), "unchanged");

    assert_eq!(browser.post("/portal/keys/limits", &key_form(&ci_id, "", "")).await.status, StatusCode::SEE_OTHER);
    assert_eq!(
        admin.get("/v1/tenant/me/keys", &token).await.1["keys"][0]["limits"],
        json!({}),
        "empty inputs: no limit"
    );

    let page = browser
        .post(
            "/portal/keys/limits",
            &[("csrf", CSRF), ("id", "00000000-0000-0000-0000-000000000000"), ("limits.rpm", "5")],
        )
        .await;
    assert_eq!(page.status, StatusCode::NOT_FOUND);
    assert!(page.body.contains("id=\"form-errors\"") && page.body.contains("does not exist"), "{}", page.body);
    let forged = browser
        .post("/portal/keys/limits", &[("csrf", "another-value-0123456789abcdef"), ("id", &ci_id), ("limits.rpm", "5")])
        .await;
    assert_eq!(forged.status, StatusCode::FORBIDDEN);

    let mut reader = Browser::with_session(&admin, admin.token(Some(&tenant), &[Scope::TenantRead]));
    let page = reader.get("/portal/keys").await;
    assert_eq!(page.status, StatusCode::FORBIDDEN, "listing keys needs config:write, as in the API");
    assert!(page.body.contains("config:write"), "{}", page.body);
    assert_eq!(admin.get("/v1/tenant/me/keys", &token).await.1["keys"][0]["limits"], json!({}));
}

/// Issue 18: the tenant's limits form saves through the API into the snapshot, shows the API's
/// messages beside the fields, and a reader sees the limits but cannot change them.
#[actix_web::test]
async fn the_tenant_limits_form_saves_through_the_api() {
    let admin = Admin::start().await;
    let (tenant, _, _) = admin.tenant().await;
    let token = admin.owner(&tenant);
    let mut browser = Browser::with_session(&admin, token.clone());
    let page = browser.get("/portal/limits").await;
    assert_eq!(page.status, StatusCode::OK);
    assert!(page.body.contains(r#"name="rpm" value="""#) && page.body.contains(r#"aria-current="page">Limits</a>"#));

    let saved = browser.post("/portal/limits", &[("csrf", CSRF), ("rpm", "1000"), ("tpm", "50,000")]).await;
    assert_eq!((saved.status, saved.location()), (StatusCode::SEE_OTHER, "/portal/limits?saved=1"), "{}", saved.body);
    assert_eq!(admin.get("/v1/tenant/me/limits", &token).await.1, json!({"rpm": 1000, "tpm": 50_000}));
    assert_eq!(admin.snapshot(&tenant).await.unwrap()["limits"], json!({"rpm": 1000, "tpm": 50_000}), "published");
    let page = browser.get("/portal/limits?saved=1").await;
    assert!(
        page.body.contains("Saved the tenant") && page.body.contains(r#"name="tpm" value="50000""#),
        "{}",
        page.body
    );

    let expected = api_message(&admin, &token, reqwest::Method::PUT, "/v1/tenant/me/limits", json!({"rpm": 0})).await;
    let page = browser.post("/portal/limits", &[("csrf", CSRF), ("rpm", "0"), ("tpm", "")]).await;
    assert_eq!(page.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert!(page.body.contains(&format!("<p class=\"field-error\" id=\"error-rpm\">{expected}")), "{}", page.body);
    let page = browser.post("/portal/limits", &[("csrf", CSRF), ("rpm", ""), ("tpm", "x")]).await;
    assert_eq!(page.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert!(page.body.contains("id=\"error-tpm\"") && page.body.contains(r#"name="tpm" value="x""#), "{}", page.body);
    assert_eq!(admin.get("/v1/tenant/me/limits", &token).await.1, json!({"rpm": 1000, "tpm": 50_000}), "unchanged");
    assert_eq!(browser.post("/portal/limits", &[("rpm", "1")]).await.status, StatusCode::FORBIDDEN, "no CSRF value");

    let mut reader = Browser::with_session(&admin, admin.token(Some(&tenant), &[Scope::TenantRead]));
    let page = reader.get("/portal/limits").await;
    assert!(page.status == StatusCode::OK && page.body.contains(r#"value="1000""#), "a reader sees them");
    let page = reader.post("/portal/limits", &[("csrf", CSRF), ("rpm", ""), ("tpm", "")]).await;
    assert_eq!(page.status, StatusCode::FORBIDDEN);
    assert!(page.body.contains("config:write"), "{}", page.body);

    assert_eq!(
        browser.post("/portal/limits", &[("csrf", CSRF), ("rpm", ""), ("tpm", "")]).await.status,
        StatusCode::SEE_OTHER
    );
    assert_eq!(admin.get("/v1/tenant/me/limits", &token).await.1, json!({}), "empty inputs clear them");
    let (_, audit) = admin.get("/v1/tenant/me/audit", &token).await;
    assert_eq!(audit["entries"].as_array().unwrap().iter().filter(|e| e["action"] == "tenant_limits_set").count(), 2);
}

/// Issue 18: the route editor has inputs for the route's limits; they round-trip through the
/// API, show on the routes page and carry the API's messages.
#[actix_web::test]
async fn the_route_editor_sets_rate_limits() {
    let admin = Admin::start().await;
    let (tenant, _, _) = admin.tenant().await;
    let token = admin.owner(&tenant);
    admin.put("/v1/tenant/me/gateway/targets/a", &token, public_target("m")).await;
    let mut browser = Browser::with_session(&admin, token.clone());
    let new = browser.get("/portal/routes/new").await;
    assert!(new.body.contains(r#"name="limits.rpm""#) && new.body.contains(r#"name="limits.tpm""#));

    let body = r#"{"targets": ["a"]}"#;
    let fields = [
        ("csrf", CSRF),
        ("name", "smart"),
        ("editing", "0"),
        ("body", body),
        ("limits.rpm", "100"),
        ("limits.tpm", "2000"),
    ];
    let page = browser.post("/portal/routes", &fields).await;
    assert_eq!(page.status, StatusCode::SEE_OTHER, "{}", page.body);
    let (_, route) = admin.get("/v1/tenant/me/gateway/routes/smart", &token).await;
    assert_eq!(route["limits"], json!({"rpm": 100, "tpm": 2000}));
    let routes = browser.get("/portal/routes").await.body;
    assert!(routes.contains("Rate limits: 100 requests/min · 2000 tokens/min"), "{routes}");
    let edit = browser.get("/portal/routes/edit?name=smart").await.body;
    assert!(
        edit.contains(r#"name="limits.rpm" value="100""#) && edit.contains(r#"name="limits.tpm" value="2000""#),
        "{edit}"
    );
    let json_part = edit.split("<textarea").nth(1).unwrap().split("</textarea>").next().unwrap();
    assert!(!json_part.contains("limits"), "the limits are in their inputs, not the JSON: {json_part}");

    let expected = api_message(
        &admin,
        &token,
        reqwest::Method::PUT,
        "/v1/tenant/me/gateway/routes/smart",
        json!({"targets": ["a"], "limits": {"rpm": 0}}),
    )
    .await;
    let fields =
        [("csrf", CSRF), ("name", "smart"), ("editing", "1"), ("body", body), ("limits.rpm", "0"), ("limits.tpm", "")];
    let page = browser.post("/portal/routes", &fields).await;
    assert_eq!(page.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert!(
        page.body.contains(&format!("<p class=\"field-error\" id=\"error-limits.rpm\">{expected}")),
        "{}",
        page.body
    );
    let fields = [
        ("csrf", CSRF),
        ("name", "smart"),
        ("editing", "1"),
        ("body", body),
        ("limits.rpm", ""),
        ("limits.tpm", "many"),
    ];
    let page = browser.post("/portal/routes", &fields).await;
    assert!(
        page.status == StatusCode::UNPROCESSABLE_ENTITY && page.body.contains("id=\"error-limits.tpm\""),
        "{}",
        page.body
    );
    assert_eq!(
        admin.get("/v1/tenant/me/gateway/routes/smart", &token).await.1["limits"],
        json!({"rpm": 100, "tpm": 2000})
    );

    let fields =
        [("csrf", CSRF), ("name", "smart"), ("editing", "1"), ("body", body), ("limits.rpm", ""), ("limits.tpm", "")];
    assert_eq!(browser.post("/portal/routes", &fields).await.status, StatusCode::SEE_OTHER);
    let (_, route) = admin.get("/v1/tenant/me/gateway/routes/smart", &token).await;
    assert!(route.get("limits").is_none(), "both inputs emptied: no limits: {route}");
}
