//! AWS's binary event stream (`application/vnd.amazon.eventstream`, PROVIDERS.md §2) as
//! frames: each message's `:event-type` and its JSON payload. Decoded with
//! `aws-smithy-eventstream`, which checks both CRCs; a frame that fails them ends the stream
//! as broken (before the first content the attempt fails over). An exception message
//! (`:message-type: exception`, or `error`) becomes a frame named `exception` whose payload
//! carries the exception's type as `__type`.

use std::collections::VecDeque;

use aws_smithy_eventstream::frame::{DecodedFrame, MessageFrameDecoder};
use aws_smithy_types::event_stream::{HeaderValue, Message};
use bytes::BytesMut;
use futures_util::StreamExt;
use serde_json::Value;

use crate::provider::{BodyBytes, Frame, Frames};

/// The name of the frame an exception message becomes.
pub const EXCEPTION: &str = "exception";

/// A header's string value.
fn header<'m>(message: &'m Message, name: &str) -> Option<&'m str> {
    let header = message.headers().iter().find(|h| h.name().as_str() == name)?;
    match header.value() {
        HeaderValue::String(value) => Some(value.as_str()),
        _ => None,
    }
}

/// One message as a frame.
fn frame_of(message: &Message) -> Result<Frame, String> {
    let payload = std::str::from_utf8(message.payload()).map_err(|_| "an event's payload is not UTF-8".to_string())?;
    match header(message, ":message-type").unwrap_or("event") {
        "event" => {
            Ok(Frame { event: header(message, ":event-type").unwrap_or_default().to_string(), data: payload.into() })
        }
        kind => {
            let name = header(message, ":exception-type").or_else(|| header(message, ":error-code")).unwrap_or(kind);
            let mut data = match serde_json::from_str::<Value>(payload) {
                Ok(Value::Object(fields)) => fields,
                _ => serde_json::Map::new(),
            };
            if let Some(said) = header(message, ":error-message") {
                data.entry("message").or_insert_with(|| Value::String(said.to_string()));
            }
            data.insert("__type".into(), Value::String(name.to_string()));
            Ok(Frame { event: EXCEPTION.into(), data: Value::Object(data).to_string() })
        }
    }
}

struct State {
    body: BodyBytes,
    buffer: BytesMut,
    decoder: MessageFrameDecoder,
    ready: VecDeque<Result<Frame, String>>,
    done: bool,
}

/// The body's messages, in order, as frames.
pub fn event_stream(body: BodyBytes) -> Frames {
    let state = State {
        body,
        buffer: BytesMut::new(),
        decoder: MessageFrameDecoder::new(),
        ready: VecDeque::new(),
        done: false,
    };
    Box::pin(futures_util::stream::unfold(state, |mut state| async move {
        loop {
            if let Some(next) = state.ready.pop_front() {
                if next.is_err() {
                    state.done = true;
                    state.ready.clear();
                }
                return Some((next, state));
            }
            if state.done {
                return None;
            }
            match state.body.next().await {
                None => {
                    state.done = true;
                    if !state.buffer.is_empty() {
                        state.ready.push_back(Err("the event stream ended inside a frame".into()));
                    }
                }
                Some(Err(err)) => {
                    state.done = true;
                    state.ready.push_back(Err(err));
                }
                Some(Ok(bytes)) => {
                    state.buffer.extend_from_slice(&bytes);
                    loop {
                        match state.decoder.decode_frame(&mut state.buffer) {
                            Ok(DecodedFrame::Complete(message)) => state.ready.push_back(frame_of(&message)),
                            Ok(DecodedFrame::Incomplete) => break,
                            Err(err) => {
                                state.ready.push_back(Err(format!("a malformed event-stream frame: {err}")));
                                break;
                            }
                        }
                    }
                }
            }
        }
    }))
}
