//! Starting the proxy: binding the listeners, wiring the shared state and the clusters
//! ([`clusters`], reached by host name too: [`host_routing`]), reloading the clusters when the
//! config file changes ([`reload`], with [`fleet_change`]), stopping on a signal.

#[cfg(test)]
mod access_review_tests;
mod clusters;
mod fleet_change;
mod host_routing;
mod reload;

pub use clusters::configured_names;
pub use host_routing::suffix as cluster_host_suffix;

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::sync::watch;
use tracing::{info, warn};

use crate::audit::log_file::REFUSAL_REPORT_INTERVAL;
use crate::audit::recording::{RecordPolicy, RecordingConfig, Recordings};
use crate::audit::upload::{AuditBatches, Store, UploadKind, UploadTarget, Uploader};
use crate::audit::{AuditLog, AuditLogConfig, AuditTarget, RefusalLimits};
use crate::cli::{nonzero, ServeArgs};
use crate::proxy::client::upgrade_request::UpgradeBodyBudget;
use crate::proxy::listen::front_door::FrontDoor;
use crate::proxy::listen::{admin, server};
use crate::proxy::sessions::state::Shared;
use crate::translate::ws::Keepalive;

/// Why the proxy could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("one of --upstream, --kubeconfig, --in-cluster or --cluster is required")]
    NoUpstream,
    #[error("invalid authentication setup: {0}")]
    Auth(String),
    #[error("invalid upstream: {0}")]
    Upstream(String),
    #[error("listener TLS: {0}")]
    Tls(#[from] crate::proxy::listen::tls::ListenerTlsError),
    #[error("routing by host name: {0}")]
    HostRouting(String),
    #[error("cannot open the audit log {path}: {source}")]
    AuditLog {
        path: String,
        source: std::io::Error,
    },
    #[error("recordings: {0}")]
    Recording(String),
    #[error("uploads: {0}")]
    Encryption(#[from] crate::audit::upload::EncryptionError),
    #[error("--peers: {0}")]
    Peers(String),
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
}

/// A running proxy; dropping it does not stop it, call [`RunningProxy::shutdown`].
#[derive(Debug)]
pub struct RunningProxy {
    /// Where the main listener ended up (useful with port 0).
    pub addr: SocketAddr,
    /// Where the admin listener ended up.
    pub admin_addr: SocketAddr,
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
    state: Arc<Shared>,
    drain_timeout: std::time::Duration,
    /// Reloads the config file's clusters (`None` without `--config`).
    reloader: Option<tokio::task::JoinHandle<()>>,
    /// Stops with the proxy (its drop ends the timer).
    _memory_trim: crate::memory_trim::MemoryTrim,
}

/// How long sessions told to stop get to send their Status and Close.
const STOP_GRACE: std::time::Duration = std::time::Duration::from_secs(5);

impl RunningProxy {
    /// Graceful drain: `/readyz` turns unready and the listener closes at once; running
    /// sessions continue up to the drain timeout, then each is ended (a Status and Close for
    /// translated sessions, a cut for relays) and given a moment to say so.
    pub async fn shutdown(self) {
        if let Some(reloader) = &self.reloader {
            // A configuration read now would serve no new request.
            reloader.abort();
        }
        let sessions = self.state.sessions.clone();
        sessions.start_drain();
        let _ = self.stop.send(true);
        let _ = self.task.await;
        let running = sessions.active();
        if running > 0 {
            info!(
                sessions = running,
                timeout_s = self.drain_timeout.as_secs_f64(),
                "draining"
            );
            if tokio::time::timeout(self.drain_timeout, sessions.wait_idle())
                .await
                .is_err()
            {
                info!(
                    sessions = sessions.active(),
                    "drain timeout: ending the remaining sessions"
                );
                sessions.stop_all();
                let _ = tokio::time::timeout(STOP_GRACE, sessions.wait_idle()).await;
            }
        }
        if let Some(audit) = self.state.audit.clone() {
            // The last sessions' `ended` events must reach the file before the process exits.
            let _ = tokio::task::spawn_blocking(move || audit.sync(STOP_GRACE)).await;
        }
        info!("drained");
    }
}

/// Binds both listeners and serves in the background.
pub async fn start(args: &ServeArgs) -> Result<RunningProxy, StartError> {
    let mut state = Shared::default();
    configure_sessions(&mut state, args);
    let (fleet, specs) = clusters::fleet_from_args(args, &state.sessions)?;
    configure_connections(&mut state, args)?;
    // The store's settings are checked whether or not anything is uploaded: a security
    // setting that disagrees with itself is refused, never left to be found later.
    args.audit.store_settings()?;
    open_audit_log(&mut state, args).await?;
    start_recordings(&mut state, args).await?;
    let state = Arc::new(state);
    let clusters: Vec<String> = fleet
        .clusters()
        .map(|c| format!("{}={}", c.label(), c.upstream))
        .collect();
    let front = Arc::new(FrontDoor::new(state.clone(), fleet));
    let reloader = reload::Reloader::new(front.clone(), args, specs).map(|r| tokio::spawn(r.run()));

    let (main, addr) = bind(args.listeners.listen).await?;
    let (admin_listener, admin_addr) = bind(args.listeners.admin_listen).await?;
    let (stop, stop_rx) = watch::channel(false);
    // The admin listener outlives the main one: probes and scrapes keep working while draining.
    let admin_limits = admin::AdminLimits {
        max_connections: usize::try_from(args.limits.admin_max_connections).unwrap_or(usize::MAX),
    };
    tokio::spawn(admin::serve(admin_listener, front.clone(), admin_limits));
    let task = tokio::spawn(async move {
        let _ = server::serve(main, front, stop_rx).await;
    });
    info!(%addr, %admin_addr, clusters = %clusters.join(","), auth_mode = ?args.auth.auth_mode, upstream_streaming = ?args.streaming.upstream_streaming, "kube-ws-proxy ready");
    Ok(RunningProxy {
        addr,
        admin_addr,
        stop,
        task,
        state,
        drain_timeout: args.process.drain_timeout,
        reloader,
        _memory_trim: crate::memory_trim::MemoryTrim::start(nonzero(
            args.process.memory_trim_interval,
        )),
    })
}

/// The sessions' settings: streaming, keepalives, timeouts and the session limit.
fn configure_sessions(state: &mut Shared, args: &ServeArgs) {
    state.node_proxy_sessions = args.audit.node_proxy_sessions;
    state.max_message_size = args.streaming.max_message_size;
    state.memory_budget = crate::session_memory::MemoryBudget::new(
        args.limits.session_memory_budget,
        crate::proxy::sessions::state::session_lane_limits(args.streaming.max_message_size),
    );
    state
        .metrics
        .watch_session_memory(state.memory_budget.clone());
    state.upstream_ping_interval = nonzero(args.keepalive.upstream_ping_interval);
    state.upstream_ping_timeout = nonzero(args.keepalive.upstream_ping_timeout);
    state.client_keepalive =
        nonzero(args.keepalive.client_ping_interval).map(|interval| Keepalive {
            interval,
            timeout: nonzero(args.keepalive.client_ping_timeout),
        });
    state.stream_idle_timeout = nonzero(args.streaming.stream_idle_timeout);
    state.tcp_keepalive = nonzero(args.keepalive.tcp_keepalive);
    state.session_limits.close_drain_timeout = args.streaming.close_drain_timeout;
    state.sessions = crate::proxy::sessions::registry::Sessions::new(args.limits.max_sessions);
    state.handshake_timeout = args.limits.handshake_timeout;
}

/// The client connections' settings: routing by host name, the listener's TLS (with the
/// clusters' own certificates), timeouts and budgets.
fn configure_connections(state: &mut Shared, args: &ServeArgs) -> Result<(), StartError> {
    state.cluster_host_suffix = host_routing::suffix(args)?;
    if let (Some(cert), Some(key)) = (
        &args.listeners.tls_cert_file,
        &args.listeners.tls_private_key_file,
    ) {
        state.tls = Some(crate::proxy::listen::tls::acceptor(
            crate::proxy::listen::tls::ListenerTlsFiles {
                cert: cert.clone(),
                key: key.clone(),
                client_ca: args.listeners.client_ca_file.clone(),
                by_name: host_routing::named_certs(args, state.cluster_host_suffix.as_ref())?,
            },
            state.metrics.clone(),
        )?);
    }
    let listen = args.listeners.listen;
    if state.tls.is_none() && !listen.ip().is_loopback() {
        // Said before the listener is bound: the setting is the mistake, wherever it binds.
        warn!(
            %listen,
            "the main listener speaks plain HTTP on an address other than loopback: callers' \
             bearer tokens cross the network in the clear (give it --tls-cert-file and \
             --tls-private-key-file, or keep it behind a gateway that terminates TLS)"
        );
    }
    if !args.listeners.peers.is_empty() {
        let ca = args
            .listeners
            .peer_ca_file
            .clone()
            .map(crate::proxy::upstream::pem::Pem::File);
        let peers = crate::proxy::upstream::peers::Peers::new(&args.listeners.peers, ca)
            .map_err(|e| StartError::Peers(e.to_string()))?;
        state.peers = Some(peers);
    }
    state.request_header_timeout = args.limits.request_header_timeout;
    state.idle_connection_timeout = args.limits.idle_connection_timeout;
    state.response_write_timeout = nonzero(args.limits.response_write_timeout);
    state.trust_forwarded_for = args.listeners.trust_x_forwarded_for;
    state.sessions_discovery = args.listeners.sessions_discovery;
    state.http2_websockets = args.listeners.http2_websockets;
    state.max_request_header_bytes = args.limits.max_request_header_bytes.max(8192);
    state.upgrade_body_budget = UpgradeBodyBudget::new(args.limits.upgrade_body_budget);
    state.waiting_connections = crate::proxy::client::waiting_connections::WaitingConnections::new(
        usize::try_from(args.limits.max_pending_connections).unwrap_or(usize::MAX),
    );
    Ok(())
}

/// Opens the audit log, if `--audit-log` asks for one, with its batches for the store if
/// `--audit-upload` asks for those.
async fn open_audit_log(state: &mut Shared, args: &ServeArgs) -> Result<(), StartError> {
    let Some(path) = &args.audit.audit_log else {
        if args.audit.audit_upload.is_some() {
            return Err(StartError::Recording(
                "--audit-upload needs --audit-log (a file)".into(),
            ));
        }
        return Ok(());
    };
    let config = AuditLogConfig {
        target: AuditTarget::parse(path),
        max_size: args.audit.audit_log_max_size,
        max_backups: args.audit.audit_log_max_backups,
    };
    let batches = match &args.audit.audit_upload {
        Some(target) => Some(audit_batches(state, args, &config.target, target.clone()).await?),
        None => None,
    };
    let limits = RefusalLimits {
        burst: args.audit.audit_refusal_burst,
        refill: args.audit.audit_refusal_refill,
    };
    let log = AuditLog::open_batched(
        config,
        state.metrics.audit_counters(),
        limits,
        REFUSAL_REPORT_INTERVAL,
        batches,
    )
    .map_err(|source| StartError::AuditLog {
        path: path.clone(),
        source,
    })?;
    state.audit = Some(Arc::new(log));
    Ok(())
}

/// The audit log's batches for `--audit-upload`, in the folder `<audit log>.upload`; the
/// batches an earlier run left there are queued first.
async fn audit_batches(
    state: &Shared,
    args: &ServeArgs,
    log: &AuditTarget,
    target: UploadTarget,
) -> Result<AuditBatches, StartError> {
    let AuditTarget::File(file) = log else {
        return Err(StartError::Recording(
            "--audit-upload needs --audit-log to name a file, not stdout".into(),
        ));
    };
    let mut dir = file.clone().into_os_string();
    dir.push(".upload");
    let dir = std::path::PathBuf::from(dir);
    let uploader = start_uploader(
        state,
        args,
        target,
        UploadKind::Audit,
        std::time::Duration::ZERO,
    )
    .await?;
    let batches = AuditBatches::new(
        dir.clone(),
        uploader.clone(),
        args.audit.audit_upload_interval,
    )
    .map_err(|e| StartError::Recording(format!("{}: {e}", dir.display())))?;
    let leftovers = crate::audit::upload::audit_batches::leftovers(&dir, uploader.target())
        .map_err(|e| StartError::Recording(format!("{}: {e}", dir.display())))?;
    for job in leftovers {
        uploader.upload_later(job, None);
    }
    Ok(batches)
}

/// Starts the session recordings, if `--record` asks for them, and their uploads, if
/// `--record-upload` asks for those.
async fn start_recordings(state: &mut Shared, args: &ServeArgs) -> Result<(), StartError> {
    let a = &args.audit;
    match (a.record, &a.record_dir) {
        (RecordPolicy::Off, _) if a.record_upload.is_some() => {
            return Err(StartError::Recording(
                "--record-upload needs --record (and --record-dir, its spool)".into(),
            ))
        }
        (RecordPolicy::Off, _) => {}
        (_, None) => return Err(StartError::Recording("--record needs --record-dir".into())),
        (policy, Some(dir)) => {
            let config = RecordingConfig {
                dir: dir.clone(),
                policy,
                record_stdin: a.record_stdin,
                min_free: a.record_min_free,
                max_bytes: (a.record_max_bytes > 0).then_some(a.record_max_bytes),
            };
            let mut recordings = Recordings::start(config, state.metrics.recording_counters())
                .map_err(|e| StartError::Recording(format!("{}: {e}", dir.display())))?;
            if let Some(target) = &a.record_upload {
                let wait = a.record_upload_wait;
                let uploader =
                    start_uploader(state, args, target.clone(), UploadKind::Recording, wait)
                        .await?;
                if let Some(audit) = &state.audit {
                    uploader.audit_to(audit.clone());
                }
                queue_leftovers(&uploader, dir)?;
                let spool_max = (a.record_spool_max > 0).then_some(a.record_spool_max);
                recordings.upload_to(uploader, spool_max);
            }
            state.recordings = Some(Arc::new(recordings));
        }
    }
    Ok(())
}

/// An uploader to `target` (`--record-upload`, `--audit-upload`), whose files' owners wait
/// `wait` for their upload; the store is checked in the background (it may come up after the
/// proxy: files wait in the spool until it does).
async fn start_uploader(
    state: &Shared,
    args: &ServeArgs,
    target: UploadTarget,
    kind: UploadKind,
    wait: std::time::Duration,
) -> Result<Uploader, StartError> {
    let store = Store::new(target, &args.audit.store_settings()?)
        .await
        .map_err(|e| StartError::Recording(e.to_string()))?;
    let check = store.clone();
    tokio::spawn(async move {
        match check.check().await {
            Ok(()) => info!(target = %check.target(), "the upload target is reachable"),
            Err(e) => warn!(
                target = %check.target(),
                error = %e,
                "the upload target cannot be reached yet; recordings wait in the spool"
            ),
        }
    });
    Ok(Uploader::start(
        store,
        kind,
        state.metrics.upload_counters(),
        wait,
    ))
}

/// Queues the recordings an earlier run left in the spool, before any new session's.
fn queue_leftovers(uploader: &Uploader, spool: &std::path::Path) -> Result<(), StartError> {
    let leftovers = crate::audit::upload::pending::scan(spool, uploader.target())
        .map_err(|e| StartError::Recording(format!("{}: {e}", spool.display())))?;
    if !leftovers.is_empty() {
        info!(
            recordings = leftovers.len(),
            "uploading the recordings an earlier run left in the spool"
        );
    }
    for leftover in leftovers {
        uploader.upload_later(leftover.job, None);
    }
    Ok(())
}

/// A listener on `addr`, and where it ended up (useful with port 0).
async fn bind(addr: SocketAddr) -> Result<(TcpListener, SocketAddr), StartError> {
    let bind_error = |source| StartError::Bind { addr, source };
    let listener = TcpListener::bind(addr).await.map_err(bind_error)?;
    let local = listener.local_addr().map_err(bind_error)?;
    Ok((listener, local))
}

/// Resolves on SIGTERM or SIGINT.
pub async fn wait_for_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = match signal(SignalKind::terminate()) {
        Ok(s) => s,
        Err(_) => return std::future::pending().await,
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}
