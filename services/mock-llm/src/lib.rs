//! shield-mock-llm: an OpenAI-compatible fake upstream for tests and the demo.
//!
//! `POST /v1/chat/completions` answers a completion that echoes the last user message, with
//! usage computed at 4 characters per token. Faults are chosen by a path prefix so a target's
//! `base_url` alone selects the behaviour: `/status/{code}/v1/chat/completions` answers that
//! status in OpenAI error shape. (Latency, hangs, resets and broken streams arrive with the
//! data-plane issue.)

use actix_web::{App, HttpResponse, HttpServer, get, http::StatusCode, post, web};
use serde_json::{Value, json};

fn completion(body: &Value) -> Value {
    let model = body.get("model").and_then(Value::as_str).unwrap_or("mock");
    let last = body
        .get("messages")
        .and_then(Value::as_array)
        .and_then(|m| {
            m.iter()
                .rev()
                .find(|m| m.get("role").and_then(Value::as_str) == Some("user"))
        })
        .and_then(|m| m.get("content"))
        .and_then(Value::as_str)
        .unwrap_or("");
    let content = format!("mock answer to: {last}");
    let prompt_chars: usize = body
        .get("messages")
        .map(|m| m.to_string().len())
        .unwrap_or(0);
    let (input, output) = (prompt_chars.div_ceil(4), content.len().div_ceil(4));
    json!({
        "id": "chatcmpl-mock", "object": "chat.completion", "created": 0, "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": input, "completion_tokens": output, "total_tokens": input + output},
    })
}

#[post("/v1/chat/completions")]
async fn chat(body: web::Json<Value>) -> HttpResponse {
    HttpResponse::Ok().json(completion(&body))
}

#[post("/status/{code}/v1/chat/completions")]
async fn chat_status(code: web::Path<u16>) -> HttpResponse {
    let status = StatusCode::from_u16(*code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    HttpResponse::build(status).json(json!({"error": {"message": format!("mock failure {status}"), "type": "mock_error", "code": null, "param": null}}))
}

#[get("/v1/models")]
async fn models() -> HttpResponse {
    HttpResponse::Ok().json(json!({"object": "list", "data": [{"id": "mock-1", "object": "model", "owned_by": "shield-mock"}]}))
}

#[get("/healthz")]
async fn healthz() -> HttpResponse {
    HttpResponse::Ok().json(json!({"status": "ok"}))
}

pub async fn serve(addr: &str) -> std::io::Result<()> {
    tracing::info!(%addr, "mock LLM listening");
    HttpServer::new(|| {
        App::new()
            .service(chat)
            .service(chat_status)
            .service(models)
            .service(healthz)
    })
    .workers(2)
    .bind(addr)?
    .run()
    .await
}
