//! An upstream SSE stream cut into arbitrary chunks: the event parser and the streaming output
//! guardrail (PII and secrets, window with tail) see every event, whatever the cuts; nothing
//! panics, and the same bytes give the same events however they were cut.
#![no_main]

use futures::StreamExt;
use libfuzzer_sys::fuzz_target;
use shield_core::guardrails::{Detector, GuardrailPolicy, Mode};
use shield_core::exchange::Delta;
use shield_core::output_guard::StreamGuard;

fn events(chunks: Vec<Vec<u8>>) -> Vec<(String, String)> {
    use eventsource_stream::Eventsource;
    let stream = futures::stream::iter(chunks.into_iter().map(|c| Ok::<_, std::io::Error>(bytes::Bytes::from(c))));
    futures::executor::block_on(
        stream.eventsource().filter_map(|e| async move { e.ok().map(|e| (e.event, e.data)) }).collect(),
    )
}

fuzz_target!(|data: &[u8]| {
    // The first byte chooses the cut points; the rest is the stream.
    let Some((&step, body)) = data.split_first() else { return };
    let step = usize::from(step.max(1));
    let whole = events(vec![body.to_vec()]);
    let cut = events(body.chunks(step).map(<[u8]>::to_vec).collect());
    assert_eq!(whole, cut, "events do not depend on where the bytes were cut");

    let block = Detector { mode: Mode::Block };
    let policy = GuardrailPolicy { pii_detection: block.clone(), secrets_detection: block, ..Default::default() };
    let mut guard = StreamGuard::new(policy, Some("user".into()));
    for (_, data) in whole {
        if data == "[DONE]" {
            break;
        }
        // Each event's data as the text a decoder would read from it.
        if guard.check(&[Delta::Text(data)]).is_err() {
            break;
        }
    }
});
