//! The whole-suite leak scan. `scripts/test` runs the suite with `SHIELD_EVIDENCE_DIR` set, so
//! every deployment a test starts (a stack of real processes or the in-process admin) keeps its
//! logs, the responses it got (API answers and portal pages), its Redis values, every Postgres
//! row and each process's `/metrics`, and lists the secrets it used (`support/evidence.rs`);
//! then it runs the ignored test below, which looks for every secret of every deployment in
//! every kept file of every deployment (one tenant's secret in another's files is a leak too).
//!
//! Run by hand: `SHIELD_EVIDENCE_DIR=/tmp/ev cargo test -p shield-e2e`, then
//! `SHIELD_EVIDENCE_DIR=/tmp/ev cargo test -p shield-e2e --test leak_scan -- --ignored`.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use aho_corasick::AhoCorasick;
use shield_e2e::evidence::{self, RESPONSES, SECRETS, UPSTREAM_LOG};

/// Shorter values are not searched: they would match by chance (no secret here is this short).
const MIN_SECRET_LEN: usize = 12;

#[derive(Debug, PartialEq)]
struct Finding {
    file: PathBuf,
    line: usize,
    /// The secret's first four characters: the report must not leak it again.
    secret_prefix: String,
}

struct Scan {
    secrets: usize,
    /// The secrets searched for.
    listed: Vec<String>,
    files: Vec<PathBuf>,
    findings: Vec<Finding>,
}

fn scan(root: &Path) -> Scan {
    let mut secrets = BTreeSet::new();
    for stack in std::fs::read_dir(root).into_iter().flatten().flatten() {
        let listed = std::fs::read_to_string(stack.path().join(SECRETS)).unwrap_or_default();
        secrets.extend(listed.lines().map(str::trim).filter(|s| s.len() >= MIN_SECRET_LEN).map(str::to_string));
    }
    let secrets: Vec<String> = secrets.into_iter().collect();
    let matcher = AhoCorasick::new(&secrets).expect("secrets make a matcher");
    let files = evidence::scanned_files(root);
    let mut findings = Vec::new();
    for file in &files {
        let text = String::from_utf8_lossy(&std::fs::read(file).unwrap_or_default()).into_owned();
        for hit in matcher.find_iter(&text) {
            findings.push(Finding {
                file: file.clone(),
                line: text[..hit.start()].matches('\n').count() + 1,
                secret_prefix: secrets[hit.pattern().as_usize()].chars().take(4).collect(),
            });
        }
    }
    Scan { secrets: secrets.len(), listed: secrets, files, findings }
}

#[test]
fn a_planted_secret_is_found_in_any_stack_and_only_where_it_leaked() {
    let root = std::env::temp_dir().join(format!("leak-scan-{}", uuid::Uuid::new_v4().simple()));
    let (a, b) = (root.join("proxy_routing-a"), root.join("portal-b"));
    std::fs::create_dir_all(&a).unwrap();
    std::fs::create_dir_all(&b).unwrap();
    std::fs::write(a.join(SECRETS), "sk-shield-canary-0123456789\nshort\n").unwrap();
    std::fs::write(a.join("proxy.log"), "INFO proxy listening\nINFO calls take the default path\n").unwrap();
    // Stack B leaks stack A's secret (a cross-tenant leak) in its Redis values.
    std::fs::write(b.join("redis.txt"), "st:gw_usage:{t}\nfield=1\nleak sk-shield-canary-0123456789 here\n").unwrap();
    // The upstream's own log holds credentials by design; a short value matches nothing.
    std::fs::write(a.join(UPSTREAM_LOG), "authorization: Bearer sk-shield-canary-0123456789\n").unwrap();
    std::fs::write(b.join(RESPONSES), "== GET admin /x -> 200 OK\nshort\n").unwrap();

    let scan = scan(&root);
    assert_eq!(scan.secrets, 1, "the short value is not searched");
    assert_eq!(scan.files.len(), 3, "secrets.txt and the upstream's log are not read: {:?}", scan.files);
    assert_eq!(
        scan.findings,
        vec![Finding { file: b.join("redis.txt"), line: 3, secret_prefix: "sk-s".into() }],
        "exactly the planted leak"
    );
    std::fs::remove_dir_all(&root).unwrap();
}

#[test]
#[ignore = "reads the evidence of a whole-suite run (scripts/test runs it after the suite)"]
fn the_whole_suite_leaked_no_secret() {
    let root = evidence::root().expect("set SHIELD_EVIDENCE_DIR to the directory the suite ran with");
    let stacks = std::fs::read_dir(&root).map(|d| d.count()).unwrap_or(0);
    let scan = scan(&root);
    let kept = |name: &str| scan.files.iter().filter(|f| f.file_name().is_some_and(|n| n == name)).count();
    let metrics = scan.files.iter().filter(|f| f.to_string_lossy().contains("metrics-proxy")).count();
    let (logs, redis, postgres, responses) =
        (kept("proxy.log"), kept("redis.txt"), kept("postgres.txt"), kept(RESPONSES));
    let bytes: u64 = scan.files.iter().filter_map(|f| f.metadata().ok()).map(|m| m.len()).sum();
    println!(
        "leak scan: {stacks} stacks, {} secrets, {} files ({bytes} bytes): {logs} proxy logs, {redis} Redis dumps, \
         {postgres} Postgres dumps, {metrics} proxy metrics, {responses} response logs",
        scan.secrets,
        scan.files.len()
    );
    // A scan over nothing proves nothing: the suite must have left evidence of every kind.
    assert!(stacks >= 20, "only {stacks} stacks left evidence in {}", root.display());
    assert!(scan.secrets >= 100, "only {} secrets were listed", scan.secrets);
    for (what, count) in [("proxy logs", logs), ("Redis dumps", redis), ("Postgres dumps", postgres)] {
        assert!(count >= 20, "only {count} {what}");
    }
    assert!(metrics >= 20 && responses >= 20, "metrics {metrics}, response logs {responses}");
    // Issue 31: the spans the OTLP receiver decoded and the JSON logs are read too.
    let json_logs = scan
        .files
        .iter()
        .filter(|f| f.file_name().is_some_and(|n| n == "proxy.log"))
        .filter(|f| std::fs::read_to_string(f).is_ok_and(|log| log.contains("\"target\":\"shield::access\"")))
        .count();
    assert!(kept("spans.json") >= 2 && json_logs >= 2, "spans {}, JSON logs {json_logs}", kept("spans.json"));
    // Every kind of credential the cloud targets use was among them (issue 30): AWS key pairs
    // (the vault value and each secret key), session tokens, Bedrock API keys, service-account
    // key files (and each line of their private keys), and the OAuth tokens issued for them.
    for (kind, listed) in [
        ("AWS key pairs", scan.listed.iter().any(|s| s.contains("\"secret_access_key\""))),
        ("AWS session tokens", scan.listed.iter().any(|s| s.starts_with("FwoGZXIvYXdzE"))),
        ("Bedrock API keys", scan.listed.iter().any(|s| s.starts_with("ABSK"))),
        ("service-account key files", scan.listed.iter().any(|s| s.contains("\"type\":\"service_account\""))),
        ("OAuth access tokens", scan.listed.iter().any(|s| s.starts_with("ya29."))),
    ] {
        assert!(listed, "no {kind} among the secrets scanned for");
    }
    assert!(scan.findings.is_empty(), "secrets leaked:\n{:#?}", scan.findings);
}
