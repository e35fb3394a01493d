//! The proxy's own HTTP server (issue 33, `services/proxy/src/server/`), as a client meets it:
//! refusals that reach a client still sending its body, `Expect: 100-continue` on a body over
//! the limit, the connection cap, and a stop that lets requests in flight end (a second signal
//! cuts it short).

use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::json;
use shield_e2e::stack::{Stack, chat_body};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// What arrives on `stream` within `wait` (until the peer closes or goes quiet).
async fn read_for(stream: &mut TcpStream, wait: Duration) -> String {
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    let deadline = Instant::now() + wait;
    while let Some(left) = deadline.checked_duration_since(Instant::now()) {
        match tokio::time::timeout(left, stream.read(&mut buf)).await {
            Ok(Ok(n)) if n > 0 => {
                out.extend_from_slice(&buf[..n]);
                if out.windows(4).any(|w| w == b"\r\n\r\n") && out.ends_with(b"}") {
                    break;
                }
            }
            _ => break,
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn signal(pid: u32, name: &str) {
    let status = std::process::Command::new("kill").args([&format!("-{name}"), &pid.to_string()]).status().unwrap();
    assert!(status.success());
}

/// Whether the process runs (an exited child the stack has not reaped yet is a zombie: gone).
fn running(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .is_ok_and(|stat| stat.rsplit_once(") ").is_some_and(|(_, rest)| !rest.starts_with('Z')))
}

async fn exits_within(pid: u32, limit: Duration) -> Duration {
    let started = Instant::now();
    while running(pid) {
        assert!(started.elapsed() < limit, "the proxy still runs after {limit:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    started.elapsed()
}

#[tokio::test]
async fn refusals_reach_a_client_still_sending_its_body() {
    let stack = Stack::start().await;
    stack.mock_target("a", "", json!({})).await;
    stack.put_route("r", json!({"targets": ["a"]})).await;
    let (key, _) = stack.key(None).await;
    let url = format!("http://{}/v1/chat/completions", stack.proxy);

    // Refused before the body is read (no key): the client, still writing 4 MB, reads the 401.
    for _ in 0..3 {
        let response = stack.client.post(&url).body(vec![b' '; 4 * 1024 * 1024]).send().await;
        let response = response.expect("the refusal, not a broken connection");
        assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
        let text = response.text().await.unwrap();
        assert!(text.contains("missing API key"), "{text}");
    }

    // Over the limit, with `Expect: 100-continue`: 413 at once, the body never invited.
    let mut raw = TcpStream::connect(&stack.proxy).await.unwrap();
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {key}\r\ncontent-type: application/json\r\ncontent-length: 100000000\r\nexpect: 100-continue\r\n\r\n"
    );
    let started = Instant::now();
    raw.write_all(head.as_bytes()).await.unwrap();
    let answer = read_for(&mut raw, Duration::from_secs(5)).await;
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    assert!(!answer.contains("100 Continue"), "{answer}");
    assert!(answer.contains("request_too_large"), "{answer}");
    assert!(started.elapsed() < Duration::from_secs(2), "{:?}", started.elapsed());

    let (status, _, body) = stack.chat(&key, chat_body("r"), &[]).await;
    assert_eq!(status, StatusCode::OK, "still serving: {body}");
    assert_eq!(stack.received("a").await.len(), 1, "no refused request reached the target");
}

#[tokio::test]
async fn connections_past_the_cap_wait_for_a_free_one() {
    let mut stack = Stack::start().await;
    stack.restart_proxy(&[("SHIELD_PROXY_MAX_CONNECTIONS", "2".to_string())]).await;
    let probe = b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n";
    let mut held = Vec::new();
    for _ in 0..2 {
        let mut stream = TcpStream::connect(&stack.proxy).await.unwrap();
        stream.write_all(probe).await.unwrap();
        assert!(read_for(&mut stream, Duration::from_secs(5)).await.starts_with("HTTP/1.1 200"));
        held.push(stream);
    }
    // A third connection is queued by the kernel, not served, while two are open.
    let mut third = TcpStream::connect(&stack.proxy).await.unwrap();
    third.write_all(probe).await.unwrap();
    let early = read_for(&mut third, Duration::from_secs(1)).await;
    assert_eq!(early, "", "served past the cap");
    drop(held.pop());
    let answer = read_for(&mut third, Duration::from_secs(5)).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "served once a connection closed: {answer:?}");
}

#[tokio::test]
async fn a_stop_lets_requests_in_flight_end_and_a_second_signal_cuts_them() {
    let mut stack = Stack::start().await;
    stack.mock_target("slow", "delay:2500", json!({})).await;
    stack.put_route("slow", json!({"targets": ["slow"]})).await;
    stack.mock_target("slower", "delay:10000", json!({})).await;
    stack.put_route("slower", json!({"targets": ["slower"]})).await;
    let (key, _) = stack.key(None).await;
    let client = stack.client.clone();
    let request = |proxy: String, route: &'static str| {
        let (client, key) = (client.clone(), key.clone());
        tokio::spawn(async move {
            let url = format!("http://{proxy}/v1/chat/completions");
            client.post(url).bearer_auth(key).json(&chat_body(route)).send().await.map(|r| r.status())
        })
    };
    shield_e2e::eventually(10, "the route", || async {
        (stack.chat(&key, chat_body("slow"), &[]).await.0 == StatusCode::OK).then_some(())
    })
    .await;

    // SIGTERM: the request in flight is answered, new connections are refused, then it exits.
    let pid = stack.pid("proxy");
    let in_flight = request(stack.proxy.clone(), "slow");
    tokio::time::sleep(Duration::from_millis(500)).await;
    signal(pid, "TERM");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(TcpStream::connect(&stack.proxy).await.is_err(), "no longer accepting");
    assert_eq!(in_flight.await.unwrap().expect("answered while stopping"), StatusCode::OK);
    exits_within(pid, Duration::from_secs(10)).await;
    assert!(stack.all_logs().contains("usage flushed at shutdown"), "flushed after the drain");

    // A second signal while draining: what is in flight (10 s more of it) is cut off, and the
    // process exits.
    let other = stack.extra_proxy().await;
    let pid = stack.pid(&format!("proxy-{other}"));
    let in_flight = request(other.clone(), "slower");
    tokio::time::sleep(Duration::from_millis(500)).await;
    signal(pid, "TERM");
    tokio::time::sleep(Duration::from_millis(200)).await;
    signal(pid, "INT");
    let took = exits_within(pid, Duration::from_secs(5)).await;
    assert!(took < Duration::from_millis(2000), "cut at once, not after the request: {took:?}");
    assert!(in_flight.await.unwrap().is_err(), "the cut request's connection closed");
}
