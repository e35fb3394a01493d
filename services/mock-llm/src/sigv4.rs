//! Checks AWS Signature Version 4 on requests to the mock's Bedrock wire. Written here from
//! the published algorithm (docs.aws.amazon.com/IAM/latest/UserGuide/create-signed-request.html),
//! independently of the gateway's signer (the AWS SDK's `aws-sigv4`), so a gateway passes only
//! with a correct signature; `tests/bedrock_signing.rs` proves this checker against botocore's
//! signer and the published AWS example.

use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

/// What a request must be signed with.
#[derive(Clone)]
pub(crate) struct KeyPair {
    pub secret_access_key: String,
    pub session_token: Option<String>,
}

/// Why a signature was refused (the mock answers 403 with it, as AWS does).
#[derive(Debug, PartialEq)]
pub(crate) enum Refusal {
    /// No key pair with this id is trusted (`UnrecognizedClientException`).
    UnknownKey,
    /// The signature is not the request's (`SignatureDoesNotMatch`…, here `InvalidSignatureException`).
    Mismatch(&'static str),
}

/// The parts of `Authorization: AWS4-HMAC-SHA256 Credential=…, SignedHeaders=…, Signature=…`.
pub(crate) struct Authorization<'a> {
    pub access_key_id: &'a str,
    pub date: &'a str,
    pub region: &'a str,
    pub service: &'a str,
    pub signed_headers: Vec<&'a str>,
    pub signature: &'a str,
}

pub(crate) fn parse(header: &str) -> Option<Authorization<'_>> {
    let rest = header.strip_prefix("AWS4-HMAC-SHA256 ")?;
    let mut credential = None;
    let mut signed = None;
    let mut signature = None;
    for field in rest.split(',').map(str::trim) {
        let (name, value) = field.split_once('=')?;
        match name {
            "Credential" => credential = Some(value),
            "SignedHeaders" => signed = Some(value),
            "Signature" => signature = Some(value),
            _ => {}
        }
    }
    let mut scope = credential?.split('/');
    let access_key_id = scope.next()?;
    let date = scope.next()?;
    let region = scope.next()?;
    let service = scope.next()?;
    (scope.next()? == "aws4_request").then_some(())?;
    Some(Authorization {
        access_key_id,
        date,
        region,
        service,
        signed_headers: signed?.split(';').collect(),
        signature: signature?,
    })
}

fn hmac(key: &[u8], data: &[u8]) -> Vec<u8> {
    // HMAC takes a key of any length.
    #[allow(clippy::expect_used, reason = "HMAC accepts keys of every length")]
    let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("any key length");
    mac.update(data);
    mac.finalize().into_bytes().to_vec()
}

fn sha256_hex(data: &[u8]) -> String {
    hex::encode(Sha256::digest(data))
}

/// RFC 3986 encoding as SigV4 wants it: unreserved characters kept, `/` kept when `slash`.
fn uri_encode(text: &str, slash: bool) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => out.push(byte as char),
            b'/' if slash => out.push('/'),
            _ => out.push_str(&format!("%{byte:02X}")),
        }
    }
    out
}

/// The canonical query string: each name and value encoded, sorted by name then value.
fn canonical_query(query: &str) -> String {
    let decode = |s: &str| percent_decode(s);
    let mut pairs: Vec<(String, String)> = query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (uri_encode(&decode(k), false), uri_encode(&decode(v), false))
        })
        .collect();
    pairs.sort();
    pairs.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join("&")
}

fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && i + 2 < bytes.len()
            && let Ok(byte) = u8::from_str_radix(&text[i + 1..i + 3], 16)
        {
            out.push(byte);
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A request as received: the path and query as sent (still percent-encoded).
pub(crate) struct Request<'a> {
    pub method: &'a str,
    pub raw_path: &'a str,
    pub query: &'a str,
    pub headers: &'a [(String, String)],
    pub body: &'a [u8],
}

/// The signature of a request, for a non-S3 service: the path as sent is encoded once more
/// (each `%` becomes `%25`), as every AWS SDK signs it.
pub(crate) fn signature(
    secret_access_key: &str,
    request: &Request<'_>,
    auth: &Authorization<'_>,
    amz_date: &str,
) -> String {
    let Request { method, raw_path, query, headers, body } = *request;
    let canonical_headers: String = auth
        .signed_headers
        .iter()
        .map(|name| {
            let values: Vec<String> = headers
                .iter()
                .filter(|(k, _)| k.eq_ignore_ascii_case(name))
                .map(|(_, v)| v.split_whitespace().collect::<Vec<_>>().join(" "))
                .collect();
            format!("{name}:{}\n", values.join(","))
        })
        .collect();
    let path = if raw_path.is_empty() { "/".to_string() } else { uri_encode(raw_path, true) };
    let canonical = format!(
        "{method}\n{path}\n{}\n{canonical_headers}\n{}\n{}",
        canonical_query(query),
        auth.signed_headers.join(";"),
        sha256_hex(body)
    );
    let scope = format!("{}/{}/{}/aws4_request", auth.date, auth.region, auth.service);
    let to_sign = format!("AWS4-HMAC-SHA256\n{amz_date}\n{scope}\n{}", sha256_hex(canonical.as_bytes()));
    let mut key = hmac(format!("AWS4{secret_access_key}").as_bytes(), auth.date.as_bytes());
    for part in [auth.region, auth.service, "aws4_request"] {
        key = hmac(&key, part.as_bytes());
    }
    hex::encode(hmac(&key, to_sign.as_bytes()))
}

/// Checks a request's signature against the trusted key pairs.
pub(crate) fn verify(
    trusted: &std::collections::HashMap<String, KeyPair>,
    request: &Request<'_>,
) -> Result<(), Refusal> {
    let headers = request.headers;
    let header = |name: &str| headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str());
    let auth = header("authorization").and_then(parse).ok_or(Refusal::Mismatch("no AWS4-HMAC-SHA256 authorization"))?;
    let pair = trusted.get(auth.access_key_id).ok_or(Refusal::UnknownKey)?;
    // Bedrock's runtime signs as `bedrock`, not `bedrock-runtime`.
    if auth.service != "bedrock" {
        return Err(Refusal::Mismatch("the credential scope's service must be bedrock"));
    }
    let amz_date = header("x-amz-date").ok_or(Refusal::Mismatch("no x-amz-date"))?;
    if !amz_date.starts_with(auth.date) {
        return Err(Refusal::Mismatch("x-amz-date is not the credential scope's date"));
    }
    for required in ["host", "x-amz-date"] {
        if !auth.signed_headers.contains(&required) {
            return Err(Refusal::Mismatch("host and x-amz-date must be signed"));
        }
    }
    match (&pair.session_token, header("x-amz-security-token")) {
        (Some(expected), Some(sent)) if expected == sent => {
            if !auth.signed_headers.contains(&"x-amz-security-token") {
                return Err(Refusal::Mismatch("the session token must be signed"));
            }
        }
        (None, None) => {}
        _ => return Err(Refusal::Mismatch("the session token is missing or wrong")),
    }
    let expected = signature(&pair.secret_access_key, request, &auth, amz_date);
    if expected != auth.signature {
        return Err(Refusal::Mismatch("the request signature we calculated does not match the signature you provided"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// AWS's published example: IAM `ListUsers` (docs.aws.amazon.com, "Elements of an AWS
    /// API request signature", the `create-signed-request` walkthrough), as in the SigV4 test
    /// suite's `get-vanilla-query` family.
    #[test]
    fn the_published_example_signs_as_aws_says() {
        // From the AWS General Reference's SigV4 example (service iam, us-east-1).
        let headers = vec![
            ("content-type".to_string(), "application/x-www-form-urlencoded; charset=utf-8".to_string()),
            ("host".to_string(), "iam.amazonaws.com".to_string()),
            ("x-amz-date".to_string(), "20150830T123600Z".to_string()),
        ];
        let auth = Authorization {
            access_key_id: "AKIDEXAMPLE",
            date: "20150830",
            region: "us-east-1",
            service: "iam",
            signed_headers: vec!["content-type", "host", "x-amz-date"],
            signature: "",
        };
        let request = Request {
            method: "GET",
            raw_path: "/",
            query: "Action=ListUsers&Version=2010-05-08",
            headers: &headers,
            body: b"",
        };
        let signature = signature("wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", &request, &auth, "20150830T123600Z");
        assert_eq!(signature, "5d672d79c15b13162d9279b0855cfba6789a8edb4c82c400e06b5924a6f2b5d7");
    }
}
