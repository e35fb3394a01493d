//! Cloud credentials for tests of the Bedrock and Vertex AI targets (issue 30): made fresh per
//! test, trusted by the stack's mock (which checks every SigV4 signature and JWT assertion with
//! them), stored in the tenant's vault, and listed as secrets for the leak scan — AWS secret
//! keys and session tokens, Bedrock API keys, service-account private keys (each line of the
//! PEM and the key file whole) and the OAuth access tokens the mock issued.

use serde_json::{Value, json};

use crate::stack::Stack;
use crate::unique;

/// An AWS key pair with a session token, as the vault secret's JSON.
pub struct AwsKeys {
    pub access_key_id: String,
    pub secret_access_key: String,
    pub session_token: String,
}

impl AwsKeys {
    pub fn secret(&self) -> String {
        json!({"access_key_id": self.access_key_id, "secret_access_key": self.secret_access_key,
            "session_token": self.session_token})
        .to_string()
    }
}

async fn trust(stack: &Stack, body: Value) {
    let response = stack.client.post(format!("http://{}/_mock/trust", stack.mock)).json(&body).send().await.unwrap();
    assert!(response.status().is_success(), "the mock trusts {body}");
}

/// A key pair the mock trusts, in the vault as `name` (bound to 127.0.0.1).
pub async fn aws_keys(stack: &Stack, name: &str) -> AwsKeys {
    let keys = AwsKeys {
        access_key_id: format!("AKIA{}", &unique("").to_uppercase()[..16]),
        secret_access_key: format!("{}/{}", &unique("")[..20], &unique("")[..19]),
        session_token: unique("FwoGZXIvYXdzEsession"),
    };
    for secret in [&keys.secret_access_key, &keys.session_token] {
        stack.evidence.secret(secret);
    }
    trust(
        stack,
        json!({"aws": {"access_key_id": keys.access_key_id, "secret_access_key": keys.secret_access_key,
        "session_token": keys.session_token}}),
    )
    .await;
    stack.put_secret(name, &keys.secret(), &["127.0.0.1"]).await;
    keys
}

/// A Bedrock API key the mock trusts, in the vault as `name`.
pub async fn bedrock_api_key(stack: &Stack, name: &str) -> String {
    let key = unique("ABSKQmVkcm9ja0FQSUtleS");
    trust(stack, json!({"bedrock_api_key": key})).await;
    stack.put_secret(name, &key, &["127.0.0.1"]).await;
    key
}

/// An RSA key pair made by openssl: (private PKCS#8 PEM, public PEM).
pub fn rsa_pair() -> (String, String) {
    let private = std::process::Command::new("openssl")
        .args(["genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048"])
        .output()
        .expect("openssl makes test keys");
    assert!(private.status.success());
    let mut public = std::process::Command::new("openssl")
        .args(["pkey", "-pubout"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    public.stdin.take().unwrap().write_all(&private.stdout).unwrap();
    let public = public.wait_with_output().unwrap();
    (String::from_utf8(private.stdout).unwrap(), String::from_utf8(public.stdout).unwrap())
}

/// A service account's key file whose public key the mock trusts, in the vault as `name`;
/// `token_uri` as given (`None`: left out). Returns the key file.
pub async fn service_account(stack: &Stack, name: &str, token_uri: Option<&str>) -> String {
    let (private, public) = rsa_pair();
    for line in private.lines().filter(|l| !l.starts_with("-----")) {
        stack.evidence.secret(line);
    }
    trust(stack, json!({"google_public_key": public})).await;
    let mut file = json!({"type": "service_account", "project_id": "shield-test", "private_key_id": unique("k"),
        "private_key": private, "client_email": format!("{}@shield-test.iam.gserviceaccount.com", &unique("sa")[..12]),
        "client_id": "1"});
    if let Some(uri) = token_uri {
        file["token_uri"] = json!(uri);
    }
    let file = file.to_string();
    stack.put_secret(name, &file, &["127.0.0.1"]).await;
    file
}

/// The OAuth tokens the mock issued that reached it on requests tagged `id`, listed as
/// secrets (they must appear nowhere else).
pub async fn record_tokens(stack: &Stack, id: &str) -> Vec<String> {
    let mut tokens: Vec<String> = stack
        .received(id)
        .await
        .iter()
        .filter_map(|r| r["headers"]["authorization"].as_str()?.strip_prefix("Bearer ").map(str::to_string))
        .collect();
    tokens.sort();
    tokens.dedup();
    for token in &tokens {
        stack.evidence.secret(token);
    }
    tokens
}
