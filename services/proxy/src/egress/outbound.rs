//! An upstream request's body: a [`Spliced`] body sent one part per frame, so the slices of
//! the caller's own body it holds go to the socket without being copied into one buffer first
//! (hyper queues a request's frames and writes them with one `writev`; issue 33).

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use hyper::body::{Frame, SizeHint};
use shield_core::spliced::Spliced;

/// Always whole and of known length: hyper sends it with a `content-length`, as before.
pub struct Body {
    parts: std::vec::IntoIter<Bytes>,
    remaining: u64,
}

impl Body {
    pub fn empty() -> Body {
        Body::from(Spliced::default())
    }
}

impl From<Spliced> for Body {
    fn from(body: Spliced) -> Body {
        let remaining = body.len() as u64;
        Body { parts: body.into_parts().into_iter(), remaining }
    }
}

impl hyper::body::Body for Body {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let this = self.get_mut();
        Poll::Ready(this.parts.next().map(|part| {
            this.remaining = this.remaining.saturating_sub(part.len() as u64);
            Ok(Frame::data(part))
        }))
    }

    fn is_end_stream(&self) -> bool {
        self.remaining == 0
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.remaining)
    }
}

#[cfg(test)]
mod tests {
    use http_body_util::BodyExt;
    use shield_core::spliced::Splicer;

    use super::*;

    #[tokio::test]
    async fn every_part_is_sent_in_order_with_its_length_known() {
        let source = Bytes::from(vec![b'a'; 5000]);
        let mut spliced = Splicer::default();
        spliced.text().extend_from_slice(b"{\"m\":");
        spliced.share(&source, 0..4000);
        spliced.text().extend_from_slice(b"}");
        let spliced = spliced.finish();
        let expected = spliced.to_vec();
        let body = Body::from(spliced);
        assert_eq!(hyper::body::Body::size_hint(&body).exact(), Some(expected.len() as u64));
        assert!(!hyper::body::Body::is_end_stream(&body));
        assert_eq!(body.collect().await.unwrap().to_bytes(), expected);
        assert!(hyper::body::Body::is_end_stream(&Body::empty()));
    }
}
