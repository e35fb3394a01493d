//! Property-test strategies for the texts a converted request carries, shared by the request
//! writers' tests.

use proptest::prelude::*;
use shield_core::exchange::Text;

pub fn text() -> impl Strategy<Value = String> {
    prop_oneof!["\\PC{0,10}", Just("line\nbreak \"quoted\" \\ \u{1} é 🙂".to_string()), Just(String::new())]
}

/// `text` plain, or as a JSON string as sent: as serde_json writes it, or with escapes it does
/// not write (`\/`, `\u00e9`), which are copied as they came.
pub fn either_form() -> impl Strategy<Value = Text> {
    (text(), 0..3u8).prop_map(|(text, form)| {
        let token = serde_json::to_string(&text).unwrap();
        match form {
            0 => text.into(),
            1 => Text::json(serde_json::from_str(&token).unwrap()).unwrap(),
            _ => {
                let token = token.replace('/', "\\/").replace('é', "\\u00e9");
                Text::json(serde_json::from_str(&token).unwrap()).unwrap()
            }
        }
    })
}
