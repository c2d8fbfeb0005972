//! Audit events for the proxy's streaming sessions (`--audit-log`): what the request names
//! (pod, container, command, ports), who the caller is, and the start of its trail. Every
//! streaming path (translated, tunnel, relays, followed logs over plain HTTP) goes through
//! here, so their events say the same things the same way.

use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{header, HeaderMap, HeaderValue, Response};
use http_body_util::BodyExt;
use hyper::body::{Body, Frame, SizeHint};

use crate::audit::{
    BoundedInfo, HttpVersion, IdentitySource, ImpersonatedUser, ProtocolPath, SessionAudit,
    SessionEnd, SessionInfo, Verb,
};
use crate::proxy::auth::Caller;
use crate::proxy::observability::metrics::SessionOutcome;
use crate::proxy::route::stream_request::{StreamRequest, StreamTarget};
use crate::proxy::sessions::state::ProxyState;
use crate::proxy::wire::body::ProxyBody;
use crate::translate::exec_options::Subresource;

/// Longest wait for a passthrough caller's SelfSubjectReview.
pub const REVIEW_TIMEOUT: Duration = Duration::from_secs(5);

/// Who the caller is, as an audit event says it.
#[derive(Debug, Clone)]
pub struct AuditIdentity {
    pub user: Option<String>,
    pub groups: Vec<String>,
    pub source: IdentitySource,
    /// Whom the caller asks to act as (`Impersonate-*`, passthrough and front-proxy modes).
    pub impersonated: Option<ImpersonatedUser>,
}

/// Who `caller` is: the authenticated identity, or in passthrough mode (with an audit log) the
/// upstream's answer for `credentials`, the `Authorization` value sent upstream; and whom it
/// asks to impersonate.
pub async fn identify(
    state: &ProxyState,
    caller: &Caller,
    credentials: Option<HeaderValue>,
) -> AuditIdentity {
    AuditIdentity {
        impersonated: caller.impersonating().cloned(),
        ..caller_identity(state, caller, credentials).await
    }
}

/// Who `caller` itself is (its impersonation aside).
async fn caller_identity(
    state: &ProxyState,
    caller: &Caller,
    credentials: Option<HeaderValue>,
) -> AuditIdentity {
    match caller {
        Caller::Identified { identity: id, .. } => AuditIdentity {
            user: Some(id.user().to_owned()),
            groups: id.groups().to_vec(),
            source: IdentitySource::Authenticated,
            impersonated: None,
        },
        Caller::Passthrough { .. } if state.audit.is_some() => {
            let timeout = state.handshake_timeout.min(REVIEW_TIMEOUT);
            match state
                .cluster
                .self_reviews
                .who(
                    &state.cluster.client,
                    &state.cluster.upstream,
                    credentials,
                    timeout,
                )
                .await
            {
                Some(reviewed) => AuditIdentity {
                    user: Some(reviewed.user),
                    groups: reviewed.groups,
                    source: IdentitySource::SelfSubjectReview,
                    impersonated: None,
                },
                None => unknown(),
            }
        }
        Caller::Passthrough { .. } => unknown(),
    }
}

/// The `Authorization` a request from `caller` with `headers` carries upstream (the auth
/// mode's: in passthrough the caller's own, its subprotocol token made one).
pub fn outbound_credentials(
    state: &ProxyState,
    caller: &Caller,
    headers: &HeaderMap,
) -> Option<HeaderValue> {
    let mut outbound = HeaderMap::new();
    if let Some(a) = headers.get(header::AUTHORIZATION) {
        outbound.insert(header::AUTHORIZATION, a.clone());
    }
    state.cluster.auth.apply(caller, &mut outbound);
    outbound.remove(header::AUTHORIZATION)
}

fn unknown() -> AuditIdentity {
    AuditIdentity {
        user: None,
        groups: Vec::new(),
        source: IdentitySource::Unknown,
        impersonated: None,
    }
}

/// Where a session's client is, as its events say it: its address and how it came.
#[derive(Debug, Clone, Copy)]
pub struct SessionClient {
    /// The caller's address as the proxy saw it.
    pub address: SocketAddr,
    /// The HTTP version of the request that opened the session.
    pub http_version: HttpVersion,
    /// The address a refused session is charged to ([`Caller::address`]).
    pub charged_to: IpAddr,
}

impl SessionClient {
    /// The client at `address` whose request came in `http_version`, its refusals charged to
    /// `charged_to`.
    pub fn new(
        address: SocketAddr,
        http_version: impl Into<HttpVersion>,
        charged_to: IpAddr,
    ) -> SessionClient {
        SessionClient {
            address,
            http_version: http_version.into(),
            charged_to,
        }
    }
}

/// What a session's events say about it, from its request as the front door read it; `None`
/// for a path that is not a pod's streaming subresource (nothing to audit).
pub fn session_info(
    session: u64,
    target: &StreamTarget,
    client: SessionClient,
    identity: AuditIdentity,
    protocol_path: ProtocolPath,
    protocol: Option<String>,
    audit_id: Option<String>,
) -> Option<SessionInfo> {
    let pod = target.pod.as_ref()?;
    let options = &target.options;
    let verb = match pod.subresource {
        Subresource::Exec => Verb::Exec,
        Subresource::Attach => Verb::Attach,
        Subresource::PortForward => Verb::PortForward,
        Subresource::Log => Verb::Log,
    };
    Some(SessionInfo {
        session_id: crate::audit::instance::session_id(session),
        verb,
        namespace: pod.namespace.clone(),
        pod: pod.pod.clone(),
        container: options.container.clone(),
        node: target.node.clone(),
        command: options.command.clone(),
        tty: options.tty,
        stdin: options.stdin,
        ports: target.ports.clone(),
        user: identity.user,
        groups: identity.groups,
        identity_source: identity.source,
        impersonated_user: identity.impersonated,
        client_address: client.address.to_string(),
        http_version: client.http_version,
        protocol_path,
        protocol,
        recording: None,
        audit_id,
        charged_to: Some(client.charged_to),
        cluster: None,
    })
}

/// [`session_info`] of a streaming request: its target, client and audit id as the front door
/// read them.
pub fn stream_info(
    session: u64,
    stream: &StreamRequest,
    identity: AuditIdentity,
    protocol_path: ProtocolPath,
    protocol: Option<String>,
) -> Option<SessionInfo> {
    session_info(
        session,
        &stream.target,
        SessionClient::new(stream.peer, stream.client.form, stream.caller.address()),
        identity,
        protocol_path,
        protocol,
        stream.audit_id.clone(),
    )
}

/// Ends the trail (if any) of a session that never carried a byte.
pub fn end_unstarted(
    audit: Option<SessionAudit>,
    outcome: SessionOutcome,
    ended_by: &'static str,
    status: Option<String>,
    recording_error: Option<String>,
    refused_with: Option<u16>,
) {
    if let Some(audit) = audit {
        audit.end_unstarted(
            outcome.label(),
            ended_by,
            status,
            recording_error,
            refused_with,
        );
    }
}

/// What the trail says of a session the upstream refused (or never answered).
pub const UPSTREAM_REFUSED: &str = crate::audit::UPSTREAM_REFUSED;

/// What the trail says of a session refused because it could not be recorded
/// (`--record=required`).
pub const REFUSED_UNRECORDABLE: &str = "refused: it could not be recorded";

/// What the trail says of a session whose client went away before the upstream was asked.
pub const CLIENT_GONE_BEFORE_UPSTREAM: &str = crate::audit::CLIENT_GONE_BEFORE_UPSTREAM;

/// What the trail says of a client whose upgrade never completed.
pub const CLIENT_UPGRADE_FAILED: &str = crate::audit::CLIENT_UPGRADE_FAILED;

/// Starts the trail of a session (its `started` event); `None` when there is nothing to audit.
pub fn start(state: &ProxyState, info: Option<SessionInfo>) -> Option<SessionAudit> {
    let log = state.audit.clone()?;
    Some(SessionAudit::start(log, bounded(state, info?)))
}

/// `info` as the session's audit trail and the registry of live sessions share it: named
/// with the request's cluster, cut to the audit's caps.
pub fn bounded(state: &ProxyState, mut info: SessionInfo) -> BoundedInfo {
    // Every event of a session says which of the proxy's named clusters it went to.
    info.cluster = state.cluster.name.as_ref().map(ToString::to_string);
    BoundedInfo::new(info)
}

/// Starts the trail of a session described by `info` (shared with its listing), if the audit
/// log is on.
pub fn start_bounded(state: &ProxyState, info: &BoundedInfo) -> Option<SessionAudit> {
    let log = state.audit.clone()?;
    Some(SessionAudit::start(log, info.clone()))
}

/// A followed log's response body: counts what it carries and ends the trail when the log
/// ends, fails, or the client goes away (the body is dropped).
pub struct AuditedBody {
    inner: ProxyBody,
    audit: Option<SessionAudit>,
    status: u16,
    bytes: u64,
}

impl AuditedBody {
    /// Wraps `resp`'s body; the trail was started when the request came.
    pub fn wrap(resp: Response<ProxyBody>, audit: Option<SessionAudit>) -> Response<ProxyBody> {
        if audit.is_none() {
            return resp;
        }
        let status = resp.status().as_u16();
        resp.map(|inner| {
            AuditedBody {
                inner,
                audit,
                status,
                bytes: 0,
            }
            .boxed()
        })
    }

    fn finish(&mut self, ended_by: &'static str) {
        if let Some(audit) = self.audit.take() {
            let success = (200..300).contains(&self.status);
            // An answer other than 2xx is the upstream refusing the log: charged as one.
            let ended_by = if success { ended_by } else { UPSTREAM_REFUSED };
            let duration_ms = audit.elapsed_ms();
            audit.end(SessionEnd {
                bytes_in: 0,
                bytes_out: self.bytes,
                duration_ms,
                exit_code: None,
                status: (!success).then(|| format!("upstream answered {}", self.status)),
                outcome: if success { "success" } else { "upstream_error" },
                ended_by,
                recording_error: None,
                refused_with: (!success).then_some(self.status),
                ..Default::default()
            });
        }
    }
}

impl Body for AuditedBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    self.bytes += data.len() as u64;
                }
            }
            Poll::Ready(Some(Err(_))) => self.finish("upstream error"),
            Poll::Ready(None) => self.finish("completed"),
            Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for AuditedBody {
    fn drop(&mut self) {
        self.finish("client gone");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proxy::wire::client_stream::HandshakeForm;
    use crate::request::target::RequestTarget;

    fn target(pq: &str) -> StreamTarget {
        StreamTarget::read(
            &http::Method::GET,
            &RequestTarget::parse_path_and_query(pq).unwrap(),
        )
    }

    fn who() -> AuditIdentity {
        AuditIdentity {
            user: Some("tina".into()),
            groups: vec!["dev".into()],
            source: IdentitySource::Authenticated,
            impersonated: None,
        }
    }

    #[test]
    fn exec_requests_name_pod_container_and_command() {
        let peer: SocketAddr = "127.0.0.1:40000".parse().unwrap();
        let info = session_info(
            7,
            &target("/api/v1/namespaces/team/pods/web/exec?command=tar&command=cf&command=-&container=main&stdin=true&tty=false"),
            SessionClient::new(peer, HandshakeForm::ExtendedConnect, peer.ip()),
            who(),
            ProtocolPath::Translated,
            Some("v5.channel.k8s.io".into()),
            Some("0a1b".into()),
        )
        .unwrap();
        assert_eq!(info.audit_id.as_deref(), Some("0a1b"));
        assert_eq!(info.verb, Verb::Exec);
        assert_eq!(info.namespace, "team");
        assert_eq!(info.pod, "web");
        assert_eq!(info.container.as_deref(), Some("main"));
        assert_eq!(info.command, ["tar", "cf", "-"]);
        assert!(info.stdin && !info.tty);
        assert_eq!(info.user.as_deref(), Some("tina"));
        assert_eq!(info.client_address, "127.0.0.1:40000");
        assert_eq!(info.http_version, HttpVersion::Http2);
        assert!(info.session_id.ends_with("-7"));
    }

    #[test]
    fn port_forward_ports_and_non_pod_paths() {
        let peer: SocketAddr = "127.0.0.1:1".parse().unwrap();
        let info = session_info(
            1,
            &target("/api/v1/namespaces/default/pods/db/portforward?ports=5432&ports=8080,9090"),
            SessionClient::new(peer, HandshakeForm::Http1Upgrade, peer.ip()),
            who(),
            ProtocolPath::RelayWebsocket,
            None,
            None,
        )
        .unwrap();
        assert_eq!(info.verb, Verb::PortForward);
        assert_eq!(info.ports, [5432, 8080, 9090]);
        assert_eq!(info.http_version, HttpVersion::Http11);
        assert!(session_info(
            1,
            &target("/api/v1/namespaces/default/services/x/proxy"),
            SessionClient::new(peer, http::Version::HTTP_11, peer.ip()),
            who(),
            ProtocolPath::RelayWebsocket,
            None,
            None,
        )
        .is_none());
    }
}
