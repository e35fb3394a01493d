//! The proxy's chat request parser on arbitrary bytes: it refuses or accepts, never panics;
//! what it accepts is typed (the typed request's text and size readable) and yields an
//! upstream body that is JSON with the target's model in it.
#![no_main]

use libfuzzer_sys::fuzz_target;
use shield_core::chat_request::ChatRequest;

fuzz_target!(|data: &[u8]| {
    let Ok(request) = ChatRequest::parse(data) else { return };
    let _ = request.check_routable();
    let _ = (request.stream(), request.max_output_tokens(), request.wants_usage(), request.prompt_chars());
    let _ = request.prompt_text();
    for ask_usage in [false, true] {
        let upstream = request.upstream_body("target-model", None, ask_usage, &[]).expect("a Chat Completions body");
        let value: serde_json::Value = serde_json::from_slice(&upstream).expect("the upstream body is JSON");
        assert_eq!(value["model"], "target-model");
        assert!(value.get("x_shield").is_none(), "Shield-only fields never go upstream");
    }
});
