//! The proxy's chat request parser on arbitrary bytes: it refuses or accepts, never panics;
//! what it accepts is typed (the typed request's text and size readable) and yields an
//! upstream body that is JSON with the target's model in it; a tenant's memo (checked tool
//! schemas, messages and tools known by their bytes) reads it alike, and so does a reader that
//! refused it: what a memo reading accepts, the plain reading accepts.
#![no_main]

use libfuzzer_sys::fuzz_target;
use shield_core::chat_request::ChatRequest;
use shield_core::verdicts::Verdicts;

fuzz_target!(|data: &[u8]| {
    // A tenant's memo changes nothing: read twice with it (each message and the tools read and
    // remembered, then known by their bytes), the same request, the same characters, the same
    // error.
    // The memo of one tenant for the whole run as well, so that what one input's messages left
    // in it is read back by another's.
    static RUN: std::sync::OnceLock<std::sync::Arc<shield_core::verdicts::Memo>> = std::sync::OnceLock::new();
    let run = RUN.get_or_init(|| Verdicts::default().of("run"));
    let (memo, shared) = (Verdicts::default().of("tenant"), bytes::Bytes::copy_from_slice(data));
    let plain = ChatRequest::parse(data);
    for memo in [&memo, &memo, run] {
        let again = ChatRequest::parse_remembering(&shared, Some(memo));
        match (&plain, &again) {
            (Ok(plain), Ok(again)) => {
                assert_eq!(again.exchange.prompt_chars(), plain.exchange.prompt_chars());
                assert_eq!(again.exchange.tools.len(), plain.exchange.tools.len());
                assert_eq!(again.exchange, plain.exchange);
            }
            (Err(plain), Err(again)) => assert_eq!(plain, again),
            (plain, again) => panic!("read {:?} without the memo, {:?} with it", plain.is_ok(), again.is_ok()),
        }
    }
    let Ok(request) = plain else { return };
    let _ = request.check_routable();
    let _ = (request.stream(), request.max_output_tokens(), request.wants_usage(), request.prompt_chars());
    let _ = request.prompt_text();
    for ask_usage in [false, true] {
        let upstream = request.upstream_body("target-model", None, ask_usage, &[]).expect("a Chat Completions body").to_vec();
        let value: serde_json::Value = serde_json::from_slice(&upstream).expect("the upstream body is JSON");
        assert_eq!(value["model"], "target-model");
        assert!(value.get("x_shield").is_none(), "Shield-only fields never go upstream");
    }
});
