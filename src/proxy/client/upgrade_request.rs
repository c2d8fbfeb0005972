//! An upgrade request made ready before it may take a session slot: its body (if it declares
//! one) read in full, within a time limit, and the connection's upgrade handle taken out.
//!
//! Reading first matters: a slot taken before the body is read could be held for ever by a
//! caller that declares a body and never sends it, with no credentials checked. The bytes read
//! are bounded per request ([`MAX_UPGRADE_BODY`]) and for all requests together
//! ([`UpgradeBodyBudget`]): legitimate upgrades carry no body, so a flood of bodies is refused
//! rather than held.

use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::request::Parts;
use http::{Request, StatusCode};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::upgrade::OnUpgrade;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::proxy::wire::client_stream::{ClientStream, ConnectionId, HandshakeForm};

/// Largest request body accepted with an upgrade request (they normally have none).
pub const MAX_UPGRADE_BODY: usize = 1024 * 1024;

/// The bytes of upgrade request bodies the proxy may hold at once, every caller together.
#[derive(Debug, Clone)]
pub struct UpgradeBodyBudget(Arc<Semaphore>);

impl UpgradeBodyBudget {
    /// A budget of `bytes`.
    pub fn new(bytes: usize) -> UpgradeBodyBudget {
        UpgradeBodyBudget(Arc::new(Semaphore::new(bytes.min(Semaphore::MAX_PERMITS))))
    }

    /// Takes `len` bytes of the budget for `held` (merged into it), or fails without waiting.
    fn take(&self, held: &mut Option<OwnedSemaphorePermit>, len: usize) -> Result<(), ()> {
        if len == 0 {
            return Ok(());
        }
        let permits = u32::try_from(len).map_err(|_| ())?;
        let permit = self
            .0
            .clone()
            .try_acquire_many_owned(permits)
            .map_err(|_| ())?;
        match held {
            Some(h) => h.merge(permit),
            None => *held = Some(permit),
        }
        Ok(())
    }

    /// Bytes of the budget not held now.
    pub fn available(&self) -> usize {
        self.0.available_permits()
    }
}

/// An upgrade request whose body has been read.
#[derive(Debug)]
pub struct UpgradeRequest {
    /// Method, URI and headers.
    pub parts: Parts,
    /// The request body (empty for WebSocket handshakes and kubectl's SPDY upgrades).
    pub body: Bytes,
    /// Resolves to the client's connection (or HTTP/2 stream) once the 101 (or 200) has gone
    /// out.
    pub on_upgrade: OnUpgrade,
    /// The client connection it came on, and how it asked (HTTP/1.1 upgrade or HTTP/2
    /// extended CONNECT).
    pub client: ClientStream,
    /// The share of the upgrade body budget `body` holds, given back with the request.
    _budget: Option<OwnedSemaphorePermit>,
}

/// Why an upgrade request was refused before anything else happened.
#[derive(Debug, thiserror::Error)]
pub enum UpgradeRequestError {
    #[error("connection cannot be upgraded")]
    NotUpgradable,
    #[error("upgrade request body larger than {0} bytes")]
    TooLarge(usize),
    #[error("the upgrade request body did not arrive within {0:?}")]
    Timeout(Duration),
    #[error("error reading the upgrade request body: {0}")]
    Read(String),
    #[error(
        "kube-ws-proxy holds too many upgrade request bodies (--upgrade-body-budget); try again later"
    )]
    OverBudget,
}

impl UpgradeRequestError {
    /// The HTTP status and Kubernetes Status reason for the client.
    pub fn status(&self) -> (StatusCode, &'static str) {
        match self {
            UpgradeRequestError::NotUpgradable | UpgradeRequestError::Read(_) => {
                (StatusCode::BAD_REQUEST, "BadRequest")
            }
            UpgradeRequestError::TooLarge(_) => {
                (StatusCode::PAYLOAD_TOO_LARGE, "RequestEntityTooLarge")
            }
            UpgradeRequestError::Timeout(_) => (StatusCode::REQUEST_TIMEOUT, "Timeout"),
            UpgradeRequestError::OverBudget => {
                (StatusCode::SERVICE_UNAVAILABLE, "ServiceUnavailable")
            }
        }
    }
}

impl UpgradeRequest {
    /// Reads the body of `req` (at most `limit` bytes, within `timeout`, each byte taken from
    /// `budget` as it arrives), which came on `connection`.
    pub async fn read(
        req: Request<Incoming>,
        connection: ConnectionId,
        limit: usize,
        timeout: Duration,
        budget: &UpgradeBodyBudget,
    ) -> Result<UpgradeRequest, UpgradeRequestError> {
        let (mut parts, body) = req.into_parts();
        let client = ClientStream {
            connection,
            // Marked by extended_connect::normalize; anything else is an HTTP/1.1 upgrade.
            form: parts
                .extensions
                .get::<HandshakeForm>()
                .copied()
                .unwrap_or_default(),
        };
        let on_upgrade = parts
            .extensions
            .remove::<OnUpgrade>()
            .ok_or(UpgradeRequestError::NotUpgradable)?;
        let held = HeldBody::read(body, limit, timeout, budget).await?;
        Ok(UpgradeRequest {
            parts,
            body: held.bytes,
            on_upgrade,
            client,
            _budget: held.budget,
        })
    }

    /// The request's path and query (the target upstream).
    pub fn path_and_query(&self) -> String {
        self.parts
            .uri
            .path_and_query()
            .map(|pq| pq.as_str().to_owned())
            .unwrap_or_else(|| self.parts.uri.path().to_owned())
    }
}

/// A request body read whole as an upgrade request's is, for a plain request whose body the
/// proxy must read before it goes on (the kubelet's `run`, whose command a form body holds).
#[derive(Debug)]
pub struct HeldBody {
    pub bytes: Bytes,
    /// The share of the upgrade body budget the bytes hold, given back with them.
    budget: Option<OwnedSemaphorePermit>,
}

impl HeldBody {
    /// Reads `body` (at most `limit` bytes, within `timeout`, each byte taken from `budget` as
    /// it arrives).
    pub async fn read(
        body: Incoming,
        limit: usize,
        timeout: Duration,
        budget: &UpgradeBodyBudget,
    ) -> Result<HeldBody, UpgradeRequestError> {
        let mut held = None;
        let bytes = tokio::time::timeout(timeout, read_body(body, limit, budget, &mut held))
            .await
            .map_err(|_| UpgradeRequestError::Timeout(timeout))??;
        Ok(HeldBody {
            bytes,
            budget: held,
        })
    }
}

/// Reads a body of at most `limit` bytes, taking each frame's bytes from `budget` into `held`
/// before keeping them.
async fn read_body(
    mut body: Incoming,
    limit: usize,
    budget: &UpgradeBodyBudget,
    held: &mut Option<OwnedSemaphorePermit>,
) -> Result<Bytes, UpgradeRequestError> {
    let mut collected = BytesMut::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| UpgradeRequestError::Read(e.to_string()))?;
        let Ok(data) = frame.into_data() else {
            continue; // trailers
        };
        if collected.len() + data.len() > limit {
            return Err(UpgradeRequestError::TooLarge(limit));
        }
        budget
            .take(held, data.len())
            .map_err(|()| UpgradeRequestError::OverBudget)?;
        collected.extend_from_slice(&data);
    }
    Ok(collected.freeze())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_is_shared_and_given_back() {
        let budget = UpgradeBodyBudget::new(100);
        let (mut a, mut b) = (None, None);
        budget.take(&mut a, 60).unwrap();
        budget.take(&mut a, 30).unwrap();
        assert!(budget.take(&mut b, 20).is_err());
        budget.take(&mut b, 10).unwrap();
        assert_eq!(budget.available(), 0);
        drop(a);
        assert_eq!(budget.available(), 90);
        budget.take(&mut b, 0).unwrap();
        drop(b);
        assert_eq!(budget.available(), 100);
    }
}
