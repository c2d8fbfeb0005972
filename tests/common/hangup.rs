//! Clients that hang up while the proxy sets their session up, and what the simulated cluster
//! and the proxy are left with once everything settled: every session the cluster saw had its
//! audit `started` event, no session or process is left running in the cluster, and the
//! proxy's session counts add up (`admitted = finished + active`, nothing active). Used by
//! the tests of issue 35's Finding 1, the cancellation sweep and the early ends.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::Duration;

use kube_ws_proxy::sim::{SimCluster, SimConfig, SimEvent};
use serde_json::Value;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::h2_ws::H2Connection;
use super::pki::Ca;
use super::proxy_process::ProxyProcess;
use super::ws_client::exec_path;

/// A valid `Sec-WebSocket-Key` (RFC 6455's example).
pub const KEY: &str = "dGhlIHNhbXBsZSBub25jZQ==";

/// A streaming session as a client asks for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A v5 exec WebSocket (translated to SPDY, or passed through to a cluster serving v5).
    V5Exec,
    /// The port-forward tunnel (a WebSocket offering `SPDY/3.1+portforward.k8s.io`).
    Tunnel,
    /// A SPDY exec (relayed, or reverse-translated to a WebSocket).
    SpdyExec,
    /// A SPDY port-forward (relayed, or reverse-translated to the tunnel).
    SpdyPortForward,
    /// A legacy v4 WebSocket exec (relayed).
    V4Exec,
}

impl Kind {
    /// A short name for pod names and messages.
    pub fn tag(self) -> &'static str {
        match self {
            Kind::V5Exec => "v5",
            Kind::Tunnel => "tunnel",
            Kind::SpdyExec => "spdy",
            Kind::SpdyPortForward => "spdypf",
            Kind::V4Exec => "v4",
        }
    }

    /// Whether it is a WebSocket (and so can come over HTTP/2 as well).
    pub fn is_websocket(self) -> bool {
        matches!(self, Kind::V5Exec | Kind::Tunnel | Kind::V4Exec)
    }

    /// The request target on `pod`: an exec of `cat` reading stdin (it runs until its
    /// session ends), or a port-forward.
    pub fn path(self, pod: &str) -> String {
        match self {
            Kind::Tunnel | Kind::SpdyPortForward => {
                format!("/api/v1/namespaces/default/pods/{pod}/portforward")
            }
            _ => exec_path(pod, &["cat"], true, true, false),
        }
    }

    /// The protocol headers of its upgrade (`Sec-WebSocket-Protocol` or the SPDY version).
    fn protocol_header(self) -> (&'static str, &'static str) {
        match self {
            Kind::V5Exec => ("Sec-WebSocket-Protocol", "v5.channel.k8s.io"),
            Kind::Tunnel => ("Sec-WebSocket-Protocol", "SPDY/3.1+portforward.k8s.io"),
            Kind::V4Exec => ("Sec-WebSocket-Protocol", "v4.channel.k8s.io"),
            Kind::SpdyExec => ("X-Stream-Protocol-Version", "v4.channel.k8s.io"),
            Kind::SpdyPortForward => ("X-Stream-Protocol-Version", "portforward.k8s.io"),
        }
    }

    /// Its HTTP/1.1 upgrade request on `pod`, with `bearer` as the caller's token if given.
    pub fn http1_request(self, pod: &str, bearer: Option<&str>) -> String {
        let mut r = format!(
            "GET {} HTTP/1.1\r\nHost: kube\r\nConnection: Upgrade\r\n",
            self.path(pod)
        );
        if self.is_websocket() {
            r.push_str(&format!(
                "Upgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: {KEY}\r\n"
            ));
        } else {
            r.push_str("Upgrade: SPDY/3.1\r\n");
        }
        let (name, value) = self.protocol_header();
        r.push_str(&format!("{name}: {value}\r\n"));
        if let Some(token) = bearer {
            r.push_str(&format!("Authorization: Bearer {token}\r\n"));
        }
        r.push_str("\r\n");
        r
    }
}

/// When a client hangs up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HangUp {
    /// This long after its request went out.
    After(Duration),
    /// As soon as the head of the proxy's answer came (before it takes the upgrade).
    Answered,
}

/// The simulated cluster and the proxy in front of it, with the audit log and required
/// recordings on.
pub struct Rig {
    pub sim: SimCluster,
    pub proxy: ProxyProcess,
    pub audit: PathBuf,
    pub records: PathBuf,
    /// The proxy's TLS CA, when it serves TLS (HTTP/2 needs it).
    pub ca: Option<Ca>,
    _dir: tempfile::TempDir,
}

impl Rig {
    /// Starts the cluster with `sim`, and the proxy (TLS when `tls`) with
    /// `--audit-log`, `--record required` and `extra`.
    pub async fn start(sim: SimConfig, tls: bool, extra: &[&str]) -> Rig {
        let sim = SimCluster::start(sim).await.expect("start the sim");
        let dir = tempfile::tempdir().unwrap();
        let audit = dir.path().join("audit.log");
        let records = dir.path().join("records");
        std::fs::create_dir(&records).unwrap();
        let mut args: Vec<String> = [
            "--upstream",
            &sim.url(),
            "--audit-log",
            &audit.display().to_string(),
            "--record",
            "required",
            "--record-dir",
            &records.display().to_string(),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let ca = tls.then(|| Ca::new("proxy"));
        if let Some(ca) = &ca {
            let (cert, key) = ca.server().write(dir.path(), "serving");
            args.extend([
                "--tls-cert-file".to_owned(),
                cert.display().to_string(),
                "--tls-private-key-file".to_owned(),
                key.display().to_string(),
            ]);
        }
        args.extend(extra.iter().map(|s| s.to_string()));
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        let proxy = ProxyProcess::launch(&refs, &[]);
        Rig {
            sim,
            proxy,
            audit,
            records,
            ca,
            _dir: dir,
        }
    }

    /// Sends `request` on a fresh HTTP/1.1 connection (TLS when the proxy serves it) and
    /// closes the connection `when`.
    pub async fn hang_up_h1(&self, request: &str, when: HangUp) {
        let tcp = tokio::net::TcpStream::connect(self.proxy.addr)
            .await
            .unwrap();
        let _ = tcp.set_nodelay(true);
        match &self.ca {
            None => send_and_close(tcp, request, when).await,
            Some(ca) => {
                let tls =
                    super::tls_client::connect(self.proxy.addr, &ca.pem, None, &[b"http/1.1"])
                        .await
                        .expect("TLS to the proxy");
                drop(tcp);
                send_and_close(tls, request, when).await
            }
        }
    }

    /// An HTTP/2 connection to the proxy (it must serve TLS).
    pub async fn h2(&self) -> H2Connection {
        let ca = self.ca.as_ref().expect("HTTP/2 needs the proxy's TLS");
        H2Connection::connect(self.proxy.addr, &ca.pem, 1 << 20, 16 << 20).await
    }

    /// Opens `kind` on `pod` as a stream of `conn` (an extended CONNECT) and resets the stream
    /// (RST_STREAM CANCEL) `when`.
    pub async fn hang_up_h2(
        &self,
        conn: &H2Connection,
        kind: Kind,
        pod: &str,
        bearer: Option<&str>,
        when: HangUp,
    ) {
        assert!(kind.is_websocket(), "{kind:?} has no HTTP/2 form");
        let authorization = bearer.map(|t| format!("Bearer {t}"));
        let (_, protocol) = kind.protocol_header();
        let mut headers = vec![
            ("sec-websocket-version", "13"),
            ("sec-websocket-protocol", protocol),
        ];
        if let Some(a) = &authorization {
            headers.push(("authorization", a));
        }
        let Ok((answer, mut stream)) = conn
            .start_stream(&kind.path(pod), Some("websocket"), &headers)
            .await
        else {
            return;
        };
        match when {
            HangUp::After(delay) => {
                tokio::time::sleep(delay).await;
                stream.send_reset(h2::Reason::CANCEL);
                drop(answer);
            }
            HangUp::Answered => {
                let _ = tokio::time::timeout(Duration::from_secs(10), answer).await;
                stream.send_reset(h2::Reason::CANCEL);
            }
        }
    }

    /// Every audit event so far.
    pub fn audit_events(&self) -> Vec<Value> {
        std::fs::read_to_string(&self.audit)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).expect("an audit line is JSON"))
            .collect()
    }

    /// The proxy's session counts: admitted, finished and running, all kinds together.
    pub fn session_counts(&self) -> Counts {
        let text = self.proxy.metrics();
        Counts {
            admitted: family_sum(&text, "kube_ws_proxy_sessions_admitted_total"),
            finished: family_sum(&text, "kube_ws_proxy_sessions_total"),
            active: family_sum(&text, "kube_ws_proxy_sessions_active"),
        }
    }

    /// Waits until fewer than `slots` sessions run in the proxy (at most `within`).
    pub async fn wait_for_room(&self, slots: i64, within: Duration) {
        let deadline = tokio::time::Instant::now() + within;
        while self.session_counts().active >= slots && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Waits (at most `within`) until the cluster runs no session and no process of the pods
    /// named with `prefix` and the proxy no session, then says what is left.
    pub async fn settle(&self, prefix: &str, within: Duration) -> Ledger {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let ledger = self.ledger(prefix);
            if ledger.is_quiet() || tokio::time::Instant::now() > deadline {
                return ledger;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// What the cluster, the audit log and the metrics say now about the pods named with
    /// `prefix`.
    pub fn ledger(&self, prefix: &str) -> Ledger {
        let cluster = ClusterSessions::read(&self.sim.events(), prefix);
        let events = self.audit_events();
        let of = |stage: &str| -> BTreeMap<String, usize> {
            let mut pods = BTreeMap::new();
            for e in events.iter().filter(|e| e["stage"] == stage) {
                let pod = e["pod"].as_str().unwrap_or("");
                if pod.starts_with(prefix) {
                    *pods.entry(pod.to_owned()).or_insert(0) += 1;
                }
            }
            pods
        };
        let (started, ended) = (of("started"), of("ended"));
        let unaudited = cluster
            .pods
            .iter()
            .filter(|pod| !started.contains_key(*pod))
            .cloned()
            .collect();
        let unended = started
            .iter()
            .filter(|(pod, n)| ended.get(*pod) != Some(n))
            .map(|(pod, _)| pod.clone())
            .collect();
        Ledger {
            cluster,
            audited: started.len(),
            unaudited,
            unended,
            counts: self.session_counts(),
        }
    }
}

/// Sends `request` on `io`, then closes it `when`.
async fn send_and_close<S: AsyncRead + AsyncWrite + Unpin>(mut io: S, request: &str, when: HangUp) {
    if io.write_all(request.as_bytes()).await.is_err() {
        return;
    }
    match when {
        HangUp::After(delay) => tokio::time::sleep(delay).await,
        HangUp::Answered => {
            let mut head = Vec::new();
            let mut byte = [0u8; 1];
            let read_head = async {
                while !head.ends_with(b"\r\n\r\n") {
                    match io.read(&mut byte).await {
                        Ok(1) => head.push(byte[0]),
                        _ => return,
                    }
                }
            };
            let _ = tokio::time::timeout(Duration::from_secs(10), read_head).await;
        }
    }
    drop(io);
}

/// The proxy's session counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Counts {
    pub admitted: i64,
    pub finished: i64,
    pub active: i64,
}

impl Counts {
    /// Whether every admitted session is either finished or running.
    pub fn add_up(&self) -> bool {
        self.admitted == self.finished + self.active
    }
}

/// The sessions and processes the cluster ran for the pods under test.
#[derive(Debug, Default)]
pub struct ClusterSessions {
    /// Pods with a session the cluster started (an upgrade it answered).
    pub pods: BTreeSet<String>,
    pub sessions: usize,
    pub processes: usize,
    /// Sessions started and not ended.
    pub open_sessions: usize,
    /// Processes started and not exited.
    pub open_processes: usize,
}

impl ClusterSessions {
    fn read(events: &[SimEvent], prefix: &str) -> ClusterSessions {
        let mut ours = BTreeMap::new();
        for e in events {
            if let SimEvent::SessionStarted { session, pod, .. } = e {
                if pod.starts_with(prefix) {
                    ours.insert(*session, pod.clone());
                }
            }
        }
        let (mut ended, mut started_processes, mut exited) =
            (BTreeSet::new(), BTreeSet::new(), BTreeSet::new());
        for e in events {
            match e {
                SimEvent::SessionEnded { session, .. } if ours.contains_key(session) => {
                    ended.insert(*session);
                }
                SimEvent::ProcessStarted { session, .. } if ours.contains_key(session) => {
                    started_processes.insert(*session);
                }
                SimEvent::ProcessExited { session, .. } if ours.contains_key(session) => {
                    exited.insert(*session);
                }
                _ => {}
            }
        }
        ClusterSessions {
            pods: ours.values().cloned().collect(),
            sessions: ours.len(),
            processes: started_processes.len(),
            open_sessions: ours.len() - ended.len(),
            open_processes: started_processes.difference(&exited).count(),
        }
    }
}

/// What is left once the clients hung up.
#[derive(Debug)]
pub struct Ledger {
    pub cluster: ClusterSessions,
    /// Pods with an audit `started` event.
    pub audited: usize,
    /// Pods the cluster ran a session for without an audit `started` event.
    pub unaudited: Vec<String>,
    /// Pods whose `started` events outnumber their `ended` ones.
    pub unended: Vec<String>,
    pub counts: Counts,
}

impl Ledger {
    /// Whether everything has settled. A scrape reads the metric families one after another
    /// (`active` first), so a session admitted during it can show as admitted and not yet
    /// active: a scrape in which the counts do not add up is not taken as settled (a real loss
    /// still fails, at the deadline).
    fn is_quiet(&self) -> bool {
        self.cluster.open_sessions == 0
            && self.cluster.open_processes == 0
            && self.counts.active == 0
            && self.counts.add_up()
            && self.unended.is_empty()
    }

    /// Asserts the principle: nothing ran upstream unaudited, nothing is left running, every
    /// admitted session ended and was counted once.
    pub fn assert_clean(&self, what: &str) {
        assert!(
            self.unaudited.is_empty(),
            "{what}: the cluster ran sessions with no audit `started` event: {} of {} ({:?})",
            self.unaudited.len(),
            self.cluster.sessions,
            self.unaudited
        );
        assert_eq!(
            (self.cluster.open_sessions, self.cluster.open_processes),
            (0, 0),
            "{what}: sessions and processes left running in the cluster: {self:?}"
        );
        assert!(
            self.unended.is_empty(),
            "{what}: audited sessions that never ended: {:?}",
            self.unended
        );
        assert!(
            self.counts.add_up() && self.counts.active == 0,
            "{what}: admitted {} = finished {} + active {} does not hold at rest",
            self.counts.admitted,
            self.counts.finished,
            self.counts.active
        );
    }
}

/// The sum of every series of `family` in a Prometheus text (all its labels together).
pub fn family_sum(text: &str, family: &str) -> i64 {
    text.lines()
        .filter(|l| {
            l.strip_prefix(family)
                .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .map(|v| v as i64)
        .sum()
}
