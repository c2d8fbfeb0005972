//! The body of an upstream's refusal of a streaming upgrade, read to decide whether it is the
//! cluster's own answer (a Kubernetes `Status`) or a path that does not serve the protocol.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;

/// Most bytes of a refusal's body read to decide on it (a Status is a few hundred).
pub const MAX_REFUSAL_BODY: usize = 64 * 1024;

/// Reads a refusal's body: at most [`MAX_REFUSAL_BODY`] bytes within `timeout`; what could not
/// be read is left out.
pub async fn read_body(body: Incoming, timeout: Duration) -> Bytes {
    match tokio::time::timeout(timeout, Limited::new(body, MAX_REFUSAL_BODY).collect()).await {
        Ok(Ok(collected)) => collected.to_bytes(),
        _ => Bytes::new(),
    }
}
