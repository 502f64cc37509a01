//! The body of every answer to a caller: the whole body a front answered with, or the stream
//! it put in place of it. An enum rather than a boxed body, so that a whole answer (almost
//! every one) costs no allocation and no dynamic call to send.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use http_body_util::Full;

use super::StreamBody;

/// An answer's body.
pub enum EdgeBody {
    /// A whole body, as the fronts answer.
    Whole(Full<Bytes>),
    /// A body that streams (the MCP front's SSE).
    Streamed(StreamBody),
}

impl Body for EdgeBody {
    type Data = Bytes;
    type Error = tower::BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        // Both variants are `Unpin`.
        match self.get_mut() {
            EdgeBody::Whole(b) => Pin::new(b).poll_frame(cx).map_err(|never| match never {}),
            EdgeBody::Streamed(b) => Pin::new(b).poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            EdgeBody::Whole(b) => b.is_end_stream(),
            EdgeBody::Streamed(b) => b.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            EdgeBody::Whole(b) => b.size_hint(),
            EdgeBody::Streamed(b) => b.size_hint(),
        }
    }
}

impl std::fmt::Debug for EdgeBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EdgeBody::Whole(b) => f.debug_tuple("Whole").field(b).finish(),
            EdgeBody::Streamed(_) => f.write_str("Streamed"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    #[tokio::test]
    async fn a_whole_body_is_sent_as_is_with_its_length() {
        let body = EdgeBody::Whole(Full::new(Bytes::from_static(b"{\"ok\":true}")));
        assert_eq!(body.size_hint().exact(), Some(11));
        assert!(!body.is_end_stream());
        let bytes = body.collect().await.unwrap().to_bytes();
        assert_eq!(&bytes[..], b"{\"ok\":true}");
    }

    #[tokio::test]
    async fn a_streamed_body_is_sent_frame_by_frame() {
        let frames = futures_util::stream::iter(
            [&b"data: 1\n\n"[..], &b"data: 2\n\n"[..]]
                .map(|b| Ok::<_, tower::BoxError>(Frame::data(Bytes::from_static(b)))),
        );
        let body = EdgeBody::Streamed(http_body_util::StreamBody::new(frames).boxed_unsync());
        assert_eq!(body.size_hint().exact(), None);
        let bytes = body.collect().await.unwrap().to_bytes();
        assert_eq!(&bytes[..], b"data: 1\n\ndata: 2\n\n");
    }
}
