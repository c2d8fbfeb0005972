//! An upstream's refusal of a streaming upgrade (a non-101 answer), held while `auto` decides
//! on it: the head and the first bytes of the body are read, the rest stays unread in the
//! connection until the refusal is passed on (then it streams through) or dropped.
//!
//! Memory per request is bounded: [`DECISION_PREFIX`] bytes (plus what remains of the one
//! body frame hyper had already read when the prefix filled) while deciding, and at most
//! [`MAX_STATUS_BODY`] when a refusal must be read whole to become a `Status` inside a
//! WebSocket. Passing a refusal on as an HTTP answer holds nothing more: the body streams.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::{header, HeaderMap, Response, StatusCode};
use http_body_util::{BodyExt, Limited};
use hyper::body::{Body, Frame, Incoming, SizeHint};

use super::streaming::{after_refusal, RefusalAnswer};
use crate::proxy::wire::body::ProxyBody;
use crate::proxy::wire::headers::remove_hop_by_hop;

/// Bytes of a refusal's body read to decide whether it is a Kubernetes `Status` (its `kind`
/// comes first; a whole Status is usually a few hundred bytes).
pub const DECISION_PREFIX: usize = 64 * 1024;

/// Most bytes of a refusal read whole, to be delivered as a `Status` inside a WebSocket (the
/// exec/attach client's channel 3); beyond it the Status is reported by its HTTP code alone.
pub const MAX_STATUS_BODY: usize = 1024 * 1024;

/// A non-101 answer, its body's beginning read.
#[derive(Debug)]
pub struct HeldRefusal {
    /// The upstream's status code.
    pub status: StatusCode,
    /// The upstream's headers, as sent.
    pub headers: HeaderMap,
    /// The body's first bytes (all of it when `rest` is `None`).
    prefix: Bytes,
    /// What is still to come.
    rest: Option<Incoming>,
}

impl HeldRefusal {
    /// Reads the head's body up to [`DECISION_PREFIX`] bytes, the end, an error, or `timeout`,
    /// whichever comes first; a slow or endless body is decided on by what came.
    pub async fn hold(resp: Response<Incoming>, timeout: Duration) -> HeldRefusal {
        let (parts, body) = resp.into_parts();
        let deadline = tokio::time::Instant::now() + timeout;
        let mut prefix = BytesMut::new();
        let mut rest = Some(body);
        while prefix.len() < DECISION_PREFIX {
            let Some(body) = rest.as_mut() else { break };
            match tokio::time::timeout_at(deadline, body.frame()).await {
                Ok(Some(Ok(frame))) => {
                    if let Ok(data) = frame.into_data() {
                        prefix.extend_from_slice(&data);
                    }
                }
                // The end, or a body cut short: what was read is all there is.
                Ok(None) | Ok(Some(Err(_))) => rest = None,
                Err(_) => break,
            }
        }
        HeldRefusal {
            status: parts.status,
            headers: parts.headers,
            prefix: prefix.freeze(),
            rest,
        }
    }

    /// The answer's `Content-Type`.
    pub fn content_type(&self) -> Option<&str> {
        self.headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
    }

    /// Whether it is the cluster's own answer, judged by the head and the body's beginning.
    pub fn answer(&self) -> RefusalAnswer {
        after_refusal(self.status.as_u16(), self.content_type(), &self.prefix)
    }

    /// The refusal as the upstream sent it, for an HTTP answer to the client: status, headers
    /// (hop-by-hop ones and the length aside), and the whole body, what was read first and the
    /// rest as it comes.
    pub fn into_response(self) -> Response<ProxyBody> {
        let mut headers = self.headers;
        remove_hop_by_hop(&mut headers);
        headers.remove(header::CONTENT_LENGTH);
        let body = PrefixedBody {
            prefix: Some(self.prefix),
            rest: self.rest,
        };
        let mut resp = Response::new(body.boxed());
        *resp.status_mut() = self.status;
        *resp.headers_mut() = headers;
        resp
    }

    /// The whole body (within `timeout`), for a Status the client hears inside its WebSocket;
    /// `None` when it is larger than [`MAX_STATUS_BODY`] or does not arrive in time.
    pub async fn whole_body(self, timeout: Duration) -> Option<Bytes> {
        let Some(rest) = self.rest else {
            return Some(self.prefix);
        };
        let room = MAX_STATUS_BODY.checked_sub(self.prefix.len())?;
        let more = tokio::time::timeout(timeout, Limited::new(rest, room).collect())
            .await
            .ok()?
            .ok()?
            .to_bytes();
        let mut whole = BytesMut::with_capacity(self.prefix.len() + more.len());
        whole.extend_from_slice(&self.prefix);
        whole.extend_from_slice(&more);
        Some(whole.freeze())
    }
}

/// A body that was partly read: the bytes read, then the rest of the original.
struct PrefixedBody {
    prefix: Option<Bytes>,
    rest: Option<Incoming>,
}

impl Body for PrefixedBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = self.get_mut();
        if let Some(prefix) = this.prefix.take().filter(|p| !p.is_empty()) {
            return Poll::Ready(Some(Ok(Frame::data(prefix))));
        }
        match this.rest.as_mut() {
            Some(rest) => Pin::new(rest).poll_frame(cx),
            None => Poll::Ready(None),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.prefix.as_ref().is_none_or(Bytes::is_empty)
            && self.rest.as_ref().is_none_or(Body::is_end_stream)
    }

    /// Exact when the rest's length is known (or nothing is left), so that the client gets a
    /// `Content-Length` as the upstream sent one, not a chunked body: a WebSocket client reads
    /// a refused handshake's body as the bytes after the head.
    fn size_hint(&self) -> SizeHint {
        let prefix = self.prefix.as_ref().map_or(0, |p| p.len() as u64);
        let mut hint = self
            .rest
            .as_ref()
            .map_or_else(|| SizeHint::with_exact(0), Body::size_hint);
        if let Some(upper) = hint.upper() {
            hint.set_upper(upper + prefix);
        }
        hint.set_lower(hint.lower() + prefix);
        hint
    }
}
