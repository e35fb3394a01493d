//! issue 33, bench/ingress/measure.py: the same POST handler on actix-web and on hyper's http1 server, reading a body the
//! way Shield does (actix: its payload's chunks, gathered when more than one; hyper: frames
//! gathered into one buffer sized from Content-Length), reading one byte in eight (a checksum:
//! the body is brought into the cache, as a parser would), answering ~700 bytes. `ingress actix|hyper PORT`.
use bytes::{Bytes, BytesMut};
use mimalloc::MiMalloc;

#[global_allocator]
static GLOBAL: MiMalloc = MiMalloc;

const ANSWER: &str = r#"{"id":"chatcmpl-static","object":"chat.completion","created":1700000000,"model":"static","system_fingerprint":"fp_static","choices":[{"index":0,"message":{"role":"assistant","content":"A static answer from nginx, the cheapest upstream: the gateway's own cost is what is left.","refusal":null,"annotations":[]},"logprobs":null,"finish_reason":"stop"}],"usage":{"prompt_tokens":19,"completion_tokens":21,"total_tokens":40,"prompt_tokens_details":{"cached_tokens":0,"audio_tokens":0},"completion_tokens_details":{"reasoning_tokens":0,"audio_tokens":0,"accepted_prediction_tokens":0,"rejected_prediction_tokens":0}},"service_tier":"default"}"#;

fn touch(body: &[u8]) -> u64 {
    body.chunks(8).fold(0u64, |acc, c| acc.wrapping_add(c[0] as u64))
}

mod on_actix {
    use super::*;
    use actix_web::{App, HttpRequest, HttpResponse, HttpServer, web};
    use futures_util::StreamExt;

    async fn read(req: &HttpRequest, mut payload: web::Payload) -> Bytes {
        let Some(Ok(first)) = payload.next().await else { return Bytes::new() };
        let Some(Ok(second)) = payload.next().await else { return first };
        let declared = req
            .headers()
            .get("content-length")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<usize>().ok())
            .unwrap_or(0);
        let mut body = BytesMut::with_capacity(declared.max(first.len() + second.len()));
        body.extend_from_slice(&first);
        body.extend_from_slice(&second);
        while let Some(Ok(chunk)) = payload.next().await {
            body.extend_from_slice(&chunk);
        }
        body.freeze()
    }

    async fn handle(req: HttpRequest, payload: web::Payload) -> HttpResponse {
        let body = read(&req, payload).await;
        let sum = touch(&body);
        HttpResponse::Ok().content_type("application/json").insert_header(("x-sum", sum.to_string())).body(ANSWER)
    }

    pub fn run(port: u16) -> std::io::Result<()> {
        actix_web::rt::System::new().block_on(async move {
            HttpServer::new(|| App::new().route("/v1/chat/completions", web::post().to(handle)))
                .workers(2)
                .on_connect(|conn, _| {
                    if let Some(tcp) = conn.downcast_ref::<actix_web::rt::net::TcpStream>() {
                        let _ = tcp.set_nodelay(true);
                    }
                })
                .bind(("127.0.0.1", port))?
                .run()
                .await
        })
    }
}

mod on_hyper {
    use super::*;
    use http_body_util::{BodyExt, Full};
    use hyper::body::{Body, Incoming};
    use hyper::{Request, Response};
    use hyper_util::rt::TokioIo;

    async fn handle(req: Request<Incoming>) -> Result<Response<Full<Bytes>>, hyper::Error> {
        let mut body = req.into_body();
        let exact = body.size_hint().exact().unwrap_or(0) as usize;
        let mut first: Option<Bytes> = None;
        let mut gathered: Option<BytesMut> = None;
        while let Some(frame) = body.frame().await {
            let Ok(data) = frame?.into_data() else { continue };
            match (&mut gathered, first.take()) {
                (Some(buf), _) => buf.extend_from_slice(&data),
                (None, None) => first = Some(data),
                (None, Some(one)) => {
                    let mut buf = BytesMut::with_capacity(exact.max(one.len() + data.len()));
                    buf.extend_from_slice(&one);
                    buf.extend_from_slice(&data);
                    gathered = Some(buf);
                }
            }
        }
        let body = gathered.map(BytesMut::freeze).or(first).unwrap_or_default();
        let sum = touch(&body);
        Ok(Response::builder()
            .header("content-type", "application/json")
            .header("x-sum", sum.to_string())
            .body(Full::new(Bytes::from_static(ANSWER.as_bytes())))
            .unwrap())
    }

    /// One listening socket per thread (SO_REUSEPORT: the kernel spreads connections, as
    /// actix's acceptor hands them out in turn), each with its own current-thread runtime.
    pub fn run(port: u16) -> std::io::Result<()> {
        let threads: Vec<_> = (0..2)
            .map(|_| {
                let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)?;
                socket.set_reuse_port(true)?;
                socket.set_nonblocking(true)?;
                socket.bind(&std::net::SocketAddr::from(([127, 0, 0, 1], port)).into())?;
                socket.listen(4096)?;
                let listener: std::net::TcpListener = socket.into();
                Ok(std::thread::spawn(move || {
                    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
                    let local = tokio::task::LocalSet::new();
                    local.block_on(&rt, async move {
                        let listener = tokio::net::TcpListener::from_std(listener).unwrap();
                        loop {
                            let Ok((stream, _)) = listener.accept().await else { continue };
                            let _ = stream.set_nodelay(true);
                            tokio::task::spawn_local(async move {
                                // A timer, as a real ingress needs one (hyper arms no header
                                // timeout without it; actix arms its own per request).
                                let _ = hyper::server::conn::http1::Builder::new()
                                    .timer(hyper_util::rt::TokioTimer::new())
                                    .header_read_timeout(std::time::Duration::from_secs(30))
                                    .serve_connection(TokioIo::new(stream), hyper::service::service_fn(handle))
                                    .await;
                            });
                        }
                    })
                }))
            })
            .collect::<std::io::Result<_>>()?;
        for t in threads {
            let _ = t.join();
        }
        Ok(())
    }
}

fn main() -> std::io::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let port: u16 = args[2].parse().unwrap();
    match args[1].as_str() {
        "actix" => on_actix::run(port),
        _ => on_hyper::run(port),
    }
}
