//! `exchange::Text` on arbitrary JSON values: a token it keeps is a string serde_json reads,
//! and reads, measures and writes as serde_json's reading of it — also inside another document
//! and joined with a plain text — so a token copied into an upstream body as it came means
//! what the caller sent (issue 33). What it does not keep is another type, or a string with a
//! `\u` escape of a surrogate.
#![no_main]

use libfuzzer_sys::fuzz_target;
use serde_json::Value;
use serde_json::value::RawValue;
use shield_core::exchange::Text;

fuzz_target!(|data: &[u8]| {
    let Ok(token) = std::str::from_utf8(data) else { return };
    let Ok(raw) = serde_json::from_str::<&RawValue>(token) else { return };
    let read = serde_json::from_str::<String>(raw.get());
    let Some(text) = Text::json(raw) else {
        let surrogate = raw.get().to_ascii_lowercase().contains("\\ud");
        assert!(!raw.get().starts_with('"') || surrogate, "a string left unkept: {token:?}");
        return;
    };
    let plain = read.expect("a kept token is a string serde_json reads");
    assert_eq!(text.len(), plain.len(), "{token:?}");
    assert_eq!(text.is_empty(), plain.is_empty());
    assert_eq!(text.as_str(), plain);
    let mut document = br#"{"a":"#.to_vec();
    text.push_json(&mut document);
    document.extend_from_slice(br#","b":"#);
    Text::push_joined(&mut document, [&text, &Text::from("\n\"x\"")], "\u{1}/");
    document.push(b'}');
    let value: Value = serde_json::from_slice(&document).expect("a kept token is JSON in any document");
    assert_eq!(value["a"], Value::String(plain.clone()));
    assert_eq!(value["b"], Value::String(format!("{plain}\u{1}/\n\"x\"")));
    assert_eq!(text.into_string(), plain);
});
