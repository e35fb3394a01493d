//! Config decoding and validation on arbitrary bytes: a target or a route body is refused with
//! field errors or accepted, never panics; an accepted body survives a round trip and still
//! validates; every rule of an accepted route can be described.
#![no_main]

use std::collections::BTreeMap;

use libfuzzer_sys::fuzz_target;
use shield_core::parse::decode;
use shield_core::route::Route;
use shield_core::target::Target;
use shield_core::validate::{validate_route, validate_target};

fuzz_target!(|data: &[u8]| {
    let bindings = BTreeMap::from([("openai_prod".to_string(), vec!["api.openai.com".to_string()])]);
    if let Ok(mut target) = decode::<Target>(data) {
        if validate_target("fuzz-target", &mut target, &bindings).is_ok() {
            let again: Target = decode(&serde_json::to_vec(&target).unwrap()).expect("a valid target round-trips");
            let mut again = again;
            assert!(validate_target("fuzz-target", &mut again, &bindings).is_ok());
        }
    }
    let mut targets = BTreeMap::new();
    for id in ["a", "b", "onprem"] {
        let target: Target = serde_json::from_value(serde_json::json!({
            "base_url": "https://api.example.com/v1", "model": "m", "auth": {"mode": "none"}, "id": id
        }))
        .unwrap();
        targets.insert(id.to_string(), target);
    }
    if let Ok(mut route) = decode::<Route>(data) {
        if validate_route("fuzz-route", &mut route, &targets).is_ok() {
            for rule in &route.rules {
                let _ = rule.describe();
            }
            let mut again: Route = decode(&serde_json::to_vec(&route).unwrap()).expect("a valid route round-trips");
            assert!(validate_route("fuzz-route", &mut again, &targets).is_ok());
        }
    }
});
