//! The kubelet's `run` through `nodes/{node}/proxy` under `--node-proxy-sessions=audit`: a
//! plain POST that runs a command in a container to its end and answers with its output. It
//! is a session like an exec: its `started` event (verb `run`, the node named) is written and,
//! with `--record`, its recording opened before the request goes upstream; the output is
//! recorded as it is passed on, and the `ended` event says how it ended.
//!
//! Under `--record=required` a run whose recording fails is cut short: what was not recorded
//! is not passed on (the response ends early; its status is out already).

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use bytes::Bytes;
use http::request::Parts;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::body::{Body, Frame};
use tokio::sync::mpsc;
use tracing::info;

use super::forward::forward_body;
use super::lifecycle::audit::{self, SessionClient};
use super::lifecycle::end::{Finished, Running};
use super::lifecycle::recording::OpenedRecording;
use super::lifecycle::start;
use super::state::ProxyState;
use crate::audit::{ProtocolPath, Verb};
use crate::proxy::auth::Caller;
use crate::proxy::client::upgrade_request::HeldBody;
use crate::proxy::observability::metrics::SessionOutcome;
use crate::proxy::route::kubelet::KubeletRun;
use crate::proxy::wire::body::ProxyBody;

/// A `run` request as read by the front door: its head, its body (read whole), what it runs,
/// and who asks from where.
pub struct RunRequest {
    pub parts: Parts,
    pub body: HeldBody,
    pub run: KubeletRun,
    pub caller: Caller,
    pub peer: SocketAddr,
    pub audit_id: Option<String>,
}

/// Runs an admitted `run` (`running`, owned by its own task from admission): identified,
/// recorded and audited, then forwarded if its client is still there; the answer for the
/// client, its body passed on as it is recorded.
pub async fn run(
    state: Arc<ProxyState>,
    req: RunRequest,
    mut running: Running,
) -> Response<ProxyBody> {
    let state = &*state;
    let session_id = running.session_id();
    let target = req.run.target();
    let credentials = audit::outbound_credentials(state, &req.caller, &req.parts.headers);
    let identity = audit::identify(state, &req.caller, credentials).await;
    let client = SessionClient::new(req.peer, req.parts.version, req.caller.address());
    let mut info = audit::session_info(
        session_id,
        &target,
        client,
        identity,
        ProtocolPath::Http,
        None,
        req.audit_id.clone(),
    );
    if let Some(info) = info.as_mut() {
        info.verb = Verb::Run;
    }
    let recording = OpenedRecording::open_for(state, session_id, &target).await;
    recording.name_in(&mut info);
    // Evidence first: the trail (and the recording) exist before the request goes upstream.
    running.start_audit(state, info, recording.feed());
    if let Err(held) = start::may_go_upstream(&running, &recording) {
        return start::end_held(running, recording, held);
    }
    let started = Instant::now();
    // The body's share of the budget is given back once it went upstream.
    let body = Full::new(req.body.bytes.clone())
        .map_err(|never| match never {})
        .boxed();
    let resp = forward_body(
        state,
        Request::from_parts(req.parts, body),
        req.peer,
        &req.caller,
    )
    .await;
    if !resp.status().is_success() {
        let status = resp.status().as_u16();
        running.upstream_refused(format!("upstream answered {status}"), status);
        return resp;
    }
    let (parts, upstream_body) = resp.into_parts();
    // One frame in hand at a time: the pump waits for the client as it waits for the disk.
    let (tx, rx) = mpsc::channel(1);
    let pump = RunPump {
        body: upstream_body,
        tx,
        running,
        recording,
        started,
        session_id,
    };
    tokio::spawn(pump.run());
    Response::from_parts(parts, ChannelBody(rx).boxed())
}

/// Passes a run's output on as it records it, then finishes the session.
struct RunPump {
    body: ProxyBody,
    tx: mpsc::Sender<Result<Frame<Bytes>, hyper::Error>>,
    running: Running,
    recording: OpenedRecording,
    started: Instant,
    session_id: u64,
}

impl RunPump {
    async fn run(mut self) {
        let traffic = self.running.traffic().clone();
        let (outcome, ended_by) = loop {
            let frame = match self.body.frame().await {
                None => break (SessionOutcome::Success, "completed"),
                Some(Err(e)) => {
                    let _ = self.tx.send(Err(e)).await;
                    break (SessionOutcome::UpstreamError, "upstream error");
                }
                Some(Ok(frame)) => frame,
            };
            if let Some(data) = frame.data_ref() {
                traffic.to_client(data.len());
                if !self.record(data).await {
                    break (SessionOutcome::RecordingFailed, "recording failed");
                }
            }
            if self.tx.send(Ok(frame)).await.is_err() {
                break (SessionOutcome::ClientGone, "client gone");
            }
        };
        let duration = self.started.elapsed();
        let bytes_out = traffic.bytes_to_client();
        let recording_error = self.recording.finish().await;
        self.running.finish(Finished {
            recording_error,
            ..Finished::new(outcome, 0, bytes_out, duration, ended_by)
        });
        info!(
            session = self.session_id,
            verb = "run",
            outcome = outcome.label(),
            bytes_out,
            duration_ms = duration.as_millis() as u64,
            "kubelet run finished"
        );
    }

    /// Records `data`; whether it may be passed on (under `--record=required`, not once the
    /// recording failed).
    async fn record(&self, data: &Bytes) -> bool {
        match &self.recording.recording {
            Some(r) => r.recorder.output(data).await || !r.required,
            None => true,
        }
    }
}

/// A response body fed frame by frame through a channel.
struct ChannelBody(mpsc::Receiver<Result<Frame<Bytes>, hyper::Error>>);

impl Body for ChannelBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        self.0.poll_recv(cx)
    }
}
