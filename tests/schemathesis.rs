//! Property-based API testing of the admin against its own published contract
//! (`openapi/openapi.json`) with schemathesis (PyPI; `scripts/test` installs it): generated
//! requests of every shape, valid and not, against the real binary. The check: no 5xx, ever.

use std::process::Command;

use shield_e2e::stack::Stack;

fn schemathesis() -> String {
    let found = Command::new("st").arg("--version").output().is_ok_and(|o| o.status.success());
    assert!(found, "schemathesis is missing: python3 -m pip install schemathesis (scripts/test does it)");
    "st".into()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn generated_requests_never_get_a_server_error() {
    let st = schemathesis();
    let stack = Stack::start().await;
    let spec = concat!(env!("CARGO_MANIFEST_DIR"), "/../openapi/openapi.json");
    let examples = std::env::var("SHIELD_SCHEMATHESIS_EXAMPLES").unwrap_or_else(|_| "30".into());
    let out = tokio::process::Command::new(st)
        .args(["run", spec, "--url", &format!("http://{}", stack.admin)])
        .args(["--header", &format!("Authorization: Bearer {}", stack.token())])
        .args(["--checks", "not_a_server_error", "--max-examples", &examples, "--generation-deterministic"])
        .args(["--request-timeout", "10", "--no-color"])
        // Its example database (.hypothesis/) goes to the temporary directory, not the repository.
        .current_dir(std::env::temp_dir())
        .kill_on_drop(true)
        .output()
        .await
        .expect("schemathesis runs");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    let summary: Vec<&str> = text.lines().rev().take(25).collect::<Vec<_>>().into_iter().rev().collect();
    eprintln!("{}", summary.join("\n"));
    assert!(out.status.success(), "schemathesis found a server error:\n{text}");
    assert!(!stack.all_logs().contains("panicked"), "the admin never panicked");
}
