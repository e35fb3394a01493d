//! The portal in a real browser: headless Debian Chromium driven through chromedriver, against
//! the real `shield` binary (admin, proxy, mock LLM). Signs in, creates two targets with the
//! form (seeing the API's validation messages field by field first), creates a route in the
//! JSON editor, runs the simulator, sends calls through the proxy and reads the usage table.
//! A screenshot of each page is saved under `target/artifacts/portal/`.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::json;
use shield_e2e::stack::{Stack, StackOptions, chat_body};
use shield_e2e::{eventually, free_port, unique};

const XSS_NAME: &str = "<script>alert(1)</script>";

/// chromedriver in its own process group: the whole group (chromedriver and every Chromium
/// process it started) is killed when the test ends, passing or failing.
struct Driver {
    child: std::process::Child,
    profile: PathBuf,
}

impl Drop for Driver {
    fn drop(&mut self) {
        let group = format!("-{}", self.child.id());
        let _ = Command::new("kill").args(["-s", "KILL", "--", &group]).status();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.profile);
    }
}

async fn browser() -> (Driver, Client) {
    use std::os::unix::process::CommandExt;
    let port = free_port();
    let chromedriver = std::env::var("CHROMEDRIVER").unwrap_or_else(|_| "/usr/bin/chromedriver".into());
    let child = Command::new(&chromedriver)
        .arg(format!("--port={port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()
        .unwrap_or_else(|e| {
            panic!("cannot start {chromedriver}: {e}. Install Chromium: apt-get install -y chromium chromium-driver")
        });
    let profile = std::env::temp_dir().join(unique("shield-chromium-"));
    let driver = Driver { child, profile: profile.clone() };
    let url = format!("http://127.0.0.1:{port}");
    eventually(30, "chromedriver to answer", || async {
        reqwest::get(format!("{url}/status")).await.ok().filter(|r| r.status().is_success()).map(|_| ())
    })
    .await;
    let mut caps = serde_json::Map::new();
    caps.insert(
        "goog:chromeOptions".into(),
        json!({
            "binary": std::env::var("CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into()),
            "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                     "--disable-dev-shm-usage", "--window-size=1280,900", format!("--user-data-dir={}", profile.display())],
        }),
    );
    let client =
        ClientBuilder::rustls().expect("rustls").capabilities(caps).connect(&url).await.expect("a browser session");
    (driver, client)
}

fn artifacts() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/artifacts/portal");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The whole page: the window grows to the document's height for the shot, then shrinks back.
async fn screenshot(client: &Client, name: &str) {
    let (width, height) = client.get_window_size().await.expect("window size");
    let full = client.execute("return document.documentElement.scrollHeight", vec![]).await.expect("page height");
    let full = full.as_u64().unwrap_or(height).max(height);
    client.set_window_size(width as u32, full as u32 + 120).await.expect("resize");
    let png = client.screenshot().await.expect("screenshot");
    client.set_window_size(width as u32, height as u32).await.expect("resize back");
    std::fs::write(artifacts().join(format!("{name}.png")), png).unwrap();
}

async fn text(client: &Client, css: &str) -> String {
    client
        .wait()
        .at_most(Duration::from_secs(10))
        .for_element(Locator::Css(css))
        .await
        .unwrap_or_else(|e| panic!("no element {css}: {e}"));
    client.find(Locator::Css(css)).await.unwrap().text().await.unwrap()
}

async fn fill(client: &Client, css: &str, value: &str) {
    let field = client.find(Locator::Css(css)).await.unwrap_or_else(|e| panic!("no field {css}: {e}"));
    field.clear().await.unwrap();
    field.send_keys(value).await.unwrap();
}

async fn click(client: &Client, css: &str) {
    client.find(Locator::Css(css)).await.unwrap_or_else(|e| panic!("no element {css}: {e}")).click().await.unwrap();
}

/// Clicks a link or a submit button and waits for the next page: WebDriver may answer the
/// click while the old page is still shown, and reading it then reads the wrong page.
async fn click_through(client: &Client, css: &str) {
    let old = client.find(Locator::Css("html")).await.expect("a page is loaded");
    click(client, css).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    // The old page's root goes stale once the new page replaced it.
    while old.tag_name().await.is_ok() {
        assert!(std::time::Instant::now() < deadline, "{css} did not load a new page");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    loop {
        let state = client.execute("return document.readyState", vec![]).await;
        if state.is_ok_and(|s| s == "complete") {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the page after {css} did not finish loading");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

async fn body(client: &Client) -> String {
    text(client, "body").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_tenant_sets_up_routing_in_the_portal_and_reads_its_usage() {
    // WebDriver calls have no timeout of their own: a stuck browser fails the test, never hangs it.
    tokio::time::timeout(Duration::from_secs(240), walk_through())
        .await
        .expect("the walk-through finishes in 4 minutes");
}

async fn walk_through() {
    let stack = Stack::start_with(StackOptions { flush_s: 1, ..Default::default() }).await;
    let (_driver, client) = browser().await;
    let portal = format!("http://{}/portal", stack.admin);

    // Sign-in: a wrong password is refused in words, the right one lands on the targets tab.
    client.goto(&portal).await.unwrap();
    assert!(client.current_url().await.unwrap().path().ends_with("/portal/login"));
    screenshot(&client, "01-sign-in").await;
    fill(&client, "#email", &stack.owner_email).await;
    fill(&client, "#password", "not-the-password").await;
    click_through(&client, "#sign-in").await;
    assert_eq!(text(&client, "#login-error").await, "wrong e-mail or password");
    fill(&client, "#password", &stack.owner_password).await;
    click_through(&client, "#sign-in").await;
    assert!(body(&client).await.contains("No targets yet"), "the empty state tells a new tenant what to do");
    screenshot(&client, "02-targets-empty").await;

    // A target, first with mistakes: each message sits beside its field.
    click_through(&client, "#new-target").await;
    fill(&client, "#id", "mock-a").await;
    fill(&client, "#name", XSS_NAME).await;
    fill(&client, "#base_url", &format!("http://{}/mock/id:a;status:503/v1", stack.mock)).await;
    fill(&client, "#model", "mock-large").await;
    client.find(Locator::Css("#auth_mode")).await.unwrap().select_by_value("none").await.unwrap();
    fill(&client, "#input_price", "cheap").await;
    fill(&client, "#output_price", "10").await;
    click_through(&client, "#save-target").await;
    assert!(text(&client, "#error-price\\.input_per_mtok").await.contains("USD per million tokens"));
    fill(&client, "#input_price", "2.5").await;
    click_through(&client, "#save-target").await;
    let url_error = text(&client, "#error-base_url").await;
    assert!(
        url_error.contains("loopback") && url_error.contains("allow_private"),
        "the API's own message: {url_error}"
    );
    screenshot(&client, "03-target-form-errors").await;
    click(&client, "#allow_private").await;
    click_through(&client, "#save-target").await;
    assert!(body(&client).await.contains("Saved target mock-a"));

    click_through(&client, "#new-target").await;
    fill(&client, "#id", "mock-b").await;
    fill(&client, "#name", "Healthy mock").await;
    fill(&client, "#base_url", &format!("http://{}/mock/id:b;usage:1000-500/v1", stack.mock)).await;
    fill(&client, "#model", "mock-small").await;
    client.find(Locator::Css("#auth_mode")).await.unwrap().select_by_value("none").await.unwrap();
    client.find(Locator::Css("#location")).await.unwrap().select_by_value("on_prem").await.unwrap();
    fill(&client, "#input_price", "0.15").await;
    fill(&client, "#output_price", "0.6").await;
    click(&client, "#allow_private").await;
    click_through(&client, "#save-target").await;
    let table = text(&client, "#targets").await;
    assert!(table.contains(XSS_NAME), "the name renders as text: {table}");
    assert!(client.get_alert_text().await.is_err(), "no script ran");
    let source = client.source().await.unwrap();
    assert!(!source.contains(XSS_NAME) && source.contains("&lt;script&gt;alert(1)&lt;/script&gt;"));
    assert!(table.contains("$0.15 in / $0.60 out per 1M tokens") && table.contains("on-prem"));
    screenshot(&client, "04-targets").await;

    // A route in the JSON editor: an unknown target is named inline, then the real one saves.
    client.goto(&format!("{portal}/routes")).await.unwrap();
    click_through(&client, "#new-route").await;
    fill(&client, "#name", "smart").await;
    fill(&client, "#body", r#"{"targets": ["mock-a", "mock-zz"]}"#).await;
    click_through(&client, "#save-route").await;
    let errors = text(&client, "#form-errors").await;
    assert!(errors.contains("mock-zz"), "the unknown target is named: {errors}");
    screenshot(&client, "05-route-form-errors").await;
    let route = json!({
        "targets": ["mock-a", "mock-b"],
        "rules": [{"when": {"flagged": ["pii_detection"]}, "use": ["mock-b"]}],
        "budget": {"monthly": 1, "at_limit": "block"}
    });
    fill(&client, "#body", &route.to_string()).await;
    click_through(&client, "#save-route").await;
    let page = body(&client).await;
    assert!(page.contains("Saved route smart"), "{page}");
    assert!(page.contains("If the prompt is flagged by PII detection → only mock-b"), "{page}");
    assert!(page.contains("$0.00 of $1.00 this month"), "{page}");
    screenshot(&client, "06-routes").await;

    // The simulator: PII-flagged prompts stay on mock-b, and it says why mock-a is out.
    click_through(&client, "nav a[href='/portal/simulate']").await;
    client.find(Locator::Css("#route")).await.unwrap().select_by_value("smart").await.unwrap();
    fill(&client, "#sample", "my card is 4111 1111 1111 1111").await;
    click(&client, "#flag-pii_detection").await;
    click_through(&client, "#simulate").await;
    assert_eq!(text(&client, "#matched-rule").await, "If the prompt is flagged by PII detection → only mock-b");
    assert_eq!(text(&client, "#order").await, "mock-b");
    let candidates = text(&client, "#candidates").await;
    assert!(candidates.contains("excluded: not among the matched rule's targets"), "{candidates}");
    screenshot(&client, "07-simulator").await;

    // Calls through the proxy: mock-a answers 503 every time, mock-b answers.
    let (key, _) = stack.key(None).await;
    for _ in 0..3 {
        let (status, headers, _) = stack.chat(&key, chat_body("smart"), &[]).await;
        assert_eq!(status, 200);
        assert_eq!(headers["x-shield-failovers"], "1");
    }
    assert_eq!(stack.received("a").await.len(), 3);
    assert_eq!(stack.received("b").await.len(), 3);
    // 3 calls × (1000 in × $0.15 + 500 out × $0.60) per million = 3 × $0.00045.
    let usage = format!("{portal}/usage");
    eventually(20, "the usage table to show the flushed calls", || {
        let (client, usage) = (&client, &usage);
        async move {
            client.goto(usage).await.ok()?;
            let cost = client.find(Locator::Css("#total-cost")).await.ok()?.text().await.ok()?;
            (cost == "$0.00135").then_some(())
        }
    })
    .await;
    let table = text(&client, "#usage").await;
    let row = |target: &str| table.lines().find(|l| l.contains(target)).unwrap_or_default().to_string();
    assert!(row("mock-a").contains("smart mock-a 3 0 3 3"), "calls ok errors failovers for mock-a: {table}");
    assert!(row("mock-b").contains("smart mock-b 3 3 0 0 3000 1500 $0.00135"), "{table}");
    assert!(client.find(Locator::Css("#cost-chart rect")).await.is_ok(), "the chart has a bar");
    screenshot(&client, "08-usage").await;

    // A phone's width: nothing overflows the page (wide tables scroll inside their box).
    client.set_window_size(390, 844).await.unwrap();
    client.goto(&format!("{portal}/routes")).await.unwrap();
    let overflow = client
        .execute("return document.documentElement.scrollWidth - document.documentElement.clientWidth", vec![])
        .await
        .unwrap();
    assert!(overflow.as_i64().unwrap_or(1) <= 0, "the routes page is wider than a phone: {overflow}");
    screenshot(&client, "09-routes-phone").await;

    click_through(&client, "#sign-out").await;
    assert!(client.current_url().await.unwrap().path().ends_with("/portal/login"));
    client.goto(&format!("{portal}/targets")).await.unwrap();
    assert!(client.current_url().await.unwrap().path().ends_with("/portal/login"), "signed out for real");
    client.close().await.unwrap();
}

/// Issue 32 in the portal: create a key with an allow-list, a budget and metadata (a refused
/// pattern first, its message beside the form), see its secret once, spend with it through the
/// proxy and see the month's spend against the budget, then rotate it and see the new secret
/// work while the old one keeps working for its grace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_keys_page_creates_a_key_with_an_allow_list_and_budget_shows_spend_and_rotates() {
    tokio::time::timeout(Duration::from_secs(180), keys_walk_through())
        .await
        .expect("the keys walk-through finishes in 3 minutes");
}

async fn keys_walk_through() {
    let stack = Stack::start_with(StackOptions { flush_s: 1, ..Default::default() }).await;
    stack.mock_target("a", "usage:10-20", json!({"price": {"input_per_mtok": 2.5, "output_per_mtok": 10}})).await;
    stack.put_route("team-a", json!({"targets": ["a"]})).await;
    stack.put_route("other", json!({"targets": ["a"]})).await;
    let (_driver, client) = browser().await;
    client.goto(&format!("http://{}/portal/login", stack.admin)).await.unwrap();
    fill(&client, "#email", &stack.owner_email).await;
    fill(&client, "#password", &stack.owner_password).await;
    click_through(&client, "#sign-in").await;
    client.goto(&format!("http://{}/portal/keys", stack.admin)).await.unwrap();

    click(&client, "#create-key summary").await;
    fill(&client, "#new-name", "alice laptop").await;
    fill(&client, "#new-routes", "team-*, bad name").await;
    fill(&client, "#new-budget", "0.001").await;
    fill(&client, "#new-metadata", "owner=alice, team=ml").await;
    click_through(&client, "#create").await;
    let refused = text(&client, "#create-errors").await;
    assert!(refused.contains("routes[1]"), "the refused pattern is named: {refused}");
    assert_eq!(
        client.find(Locator::Css("#new-name")).await.unwrap().prop("value").await.unwrap().unwrap(),
        "alice laptop"
    );
    fill(&client, "#new-routes", "team-*").await;
    click_through(&client, "#create").await;
    let key = text(&client, "#secret").await;
    assert!(key.starts_with("sk-shield-"), "{key}");
    stack.evidence.secret(&key);
    screenshot(&client, "20-key-created").await;

    let (status, _, _) = stack.chat(&key, chat_body("team-a"), &[]).await;
    assert_eq!(status, reqwest::StatusCode::OK);
    let (status, _, _) = stack.chat(&key, chat_body("other"), &[]).await;
    assert_eq!(status, reqwest::StatusCode::FORBIDDEN, "the allow-list made in the portal holds");
    // 225 micro-USD of 1,000: the page shows the flushed spend against the budget.
    let row = eventually(15, "the spend on the keys page", || async {
        client.goto(&format!("http://{}/portal/keys", stack.admin)).await.ok()?;
        let row = text(&client, "#keys tbody tr").await;
        row.contains("0.000225 USD").then_some(row)
    })
    .await;
    for shown in ["alice laptop", "team-*", "0.001 USD, block", "owner=alice, team=ml", "never"] {
        assert!(row.contains(shown), "{shown:?} in {row}");
    }
    assert!(!row.contains(&key) && !body(&client).await.contains(&key), "the secret is shown once, not in the list");
    screenshot(&client, "21-key-spend").await;

    let rotate = client.find(Locator::Css("form.rotate button")).await.unwrap();
    let old = client.find(Locator::Css("html")).await.unwrap();
    rotate.click().await.unwrap();
    while old.tag_name().await.is_ok() {
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let fresh = text(&client, "#secret").await;
    stack.evidence.secret(&fresh);
    assert!(fresh.starts_with("sk-shield-") && fresh != key, "{fresh}");
    assert!(text(&client, "#keys tbody tr").await.contains("old secret works until"));
    screenshot(&client, "22-key-rotated").await;
    // A reload re-posts the rotate form as it was, with the secret the page showed before:
    // sent again here from the page (a browser's resubmit dialog is not WebDriver's to click),
    // it is refused and nothing rotates again.
    let old = client.find(Locator::Css("html")).await.unwrap();
    let stale = "const f = document.querySelector('form.rotate'); f.querySelector('input[name=prefix]').value = arguments[0]; f.submit();";
    client.execute(stale, vec![json!(&key[..14])]).await.unwrap();
    while old.tag_name().await.is_ok() {
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let refused = text(&client, "#form-errors").await;
    assert!(refused.contains("rotated since the page was shown"), "{refused}");
    assert!(client.find(Locator::Css("#secret")).await.is_err(), "no new secret");
    assert!(text(&client, "#keys tbody tr").await.contains(&fresh[..14]), "the key still has the secret rotated to");
    for secret in [&key, &fresh] {
        let (status, _, _) = stack.chat(secret, chat_body("team-a"), &[]).await;
        assert_eq!(status, reqwest::StatusCode::OK, "both secrets work during the hour of grace");
    }
}
