//! The proxy's chat request parser on arbitrary bytes: it refuses or accepts, never panics;
//! what it accepts is typed (the typed request's text and size readable) and yields an
//! upstream body that is JSON with the target's model in it; a tenant's memo of checked tool
//! schemas reads it alike.
#![no_main]

use libfuzzer_sys::fuzz_target;
use shield_core::chat_request::ChatRequest;
use shield_core::json_read::CheckedSchemas;

fuzz_target!(|data: &[u8]| {
    let Ok(request) = ChatRequest::parse(data) else { return };
    // A tenant's memo of the tool schemas that passed changes nothing: read twice with it
    // (walked and remembered, then taken from it), the same request.
    let (passed, shared) = (CheckedSchemas::default(), bytes::Bytes::copy_from_slice(data));
    for _ in 0..2 {
        let again = ChatRequest::parse_remembering(&shared, Some(&passed)).expect("read as without the memo");
        assert_eq!(again.exchange, request.exchange);
    }
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
