//! The cancellation sweep (issue 35): for every session kind (translated exec, reverse exec,
//! tunnel, reverse port-forward, relayed SPDY, relayed v4, pass-through, and both `auto`
//! paths that ask the upstream twice) over HTTP/1.1 and, for the WebSockets, HTTP/2, a client
//! hangs up at each step of its session's setup. The steps are held open by a slow cluster
//! (its reviews and its streaming answers each take [`HOLD`]), so that each hang-up lands
//! where it is aimed: at once, while the caller is identified, while the upstream is asked
//! (first and second attempt), and as soon as the answer came. Afterwards no session ran in
//! the cluster without an audit `started` event, nothing is left running there, every audited
//! session ended, and the proxy's counts add up with nothing active. A client gone while its
//! caller was reviewed (before admission) leaves nothing at all: no event, nothing asked of the
//! cluster.
//!
//! A longer, finer sweep (a hang-up every 0.25 ms from 0 to 20 ms after the request, no held
//! steps, `N` rounds of it) runs with `KUBE_WS_PROXY_SWEEP_LONG=N` (RELIABILITY.md).

use crate::common;

use std::time::Duration;

use common::hangup::{HangUp, Kind, Rig};
use kube_ws_proxy::sim::{SimConfig, SimDelays, SimStreaming};

/// How long the cluster holds each review and each streaming answer.
const HOLD: Duration = Duration::from_millis(120);

/// How long the cluster and the proxy may take to let everything go once the clients left.
const SETTLE: Duration = Duration::from_secs(20);

/// Where a client hangs up, and when.
#[derive(Debug, Clone, Copy)]
struct Step {
    name: &'static str,
    when: HangUp,
}

/// The steps of a session's setup, each hit in the middle of its hold.
fn steps() -> Vec<Step> {
    let half = HOLD / 2;
    vec![
        Step {
            name: "at-once",
            when: HangUp::After(Duration::ZERO),
        },
        Step {
            name: "identifying",
            when: HangUp::After(half),
        },
        Step {
            name: "asking",
            when: HangUp::After(HOLD + half),
        },
        Step {
            name: "asking-again",
            when: HangUp::After(2 * HOLD + half),
        },
        Step {
            name: "answered",
            when: HangUp::Answered,
        },
    ]
}

/// The long sweep's steps: every 0.25 ms from 0 to 20 ms, `rounds` times.
fn fine_steps(rounds: u64) -> Vec<Step> {
    (0..80 * rounds)
        .map(|i| Step {
            name: "fine",
            when: HangUp::After(Duration::from_micros(250 * (i % 80))),
        })
        .collect()
}

/// The long sweep's rounds (`KUBE_WS_PROXY_SWEEP_LONG`), if it runs.
fn long_sweep_rounds() -> Option<u64> {
    let rounds = std::env::var("KUBE_WS_PROXY_SWEEP_LONG").ok()?;
    Some(rounds.parse().unwrap_or(1).max(1))
}

fn long_sweep() -> bool {
    long_sweep_rounds().is_some()
}

/// How a client comes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Form {
    Http1,
    Http2,
}

/// Every kind of `kinds` over each form it has, hung up at every step, all kinds at once;
/// then the rig is checked clean. `name` prefixes the pods.
async fn sweep(rig: &Rig, name: &str, kinds: &[Kind]) {
    let steps = match long_sweep_rounds() {
        Some(rounds) => fine_steps(rounds),
        None => steps(),
    };
    let mut clients = Vec::new();
    for &kind in kinds {
        for form in [Form::Http1, Form::Http2] {
            if form == Form::Http2 && !kind.is_websocket() {
                continue;
            }
            clients.push(one_kind(rig, name, kind, form, &steps));
        }
    }
    futures_util::future::join_all(clients).await;
    let prefix = format!("{name}-");
    let ledger = rig.settle(&prefix, SETTLE).await;
    eprintln!(
        "{name}: the cluster ran {} sessions, {} processes; {} audited; {:?}",
        ledger.cluster.sessions, ledger.cluster.processes, ledger.audited, ledger.counts
    );
    ledger.assert_clean(name);
    if !long_sweep() {
        assert_gone_before_the_upstream(rig, &prefix);
    }
}

/// One kind over one form, hung up at each step in turn; each client on its own pod and with
/// its own token (so that its caller is identified anew: nothing cached).
async fn one_kind(rig: &Rig, name: &str, kind: Kind, form: Form, steps: &[Step]) {
    let h2 = match form {
        Form::Http2 => Some(rig.h2().await),
        Form::Http1 => None,
    };
    for (i, step) in steps.iter().enumerate() {
        let form_tag = match form {
            Form::Http1 => "h1",
            Form::Http2 => "h2",
        };
        let pod = format!("{name}-{}-{form_tag}-{}-{i}", kind.tag(), step.name);
        let token = format!("token-{pod}");
        match &h2 {
            None => {
                let request = kind.http1_request(&pod, Some(&token));
                rig.hang_up_h1(&request, step.when).await
            }
            Some(conn) => {
                rig.hang_up_h2(conn, kind, &pod, Some(&token), step.when)
                    .await
            }
        }
    }
}

/// A client gone while its caller was reviewed (in passthrough mode with the audit log, before
/// admission: the review refuses a caller the cluster does not authenticate): never admitted,
/// so it left no audit event, and the cluster was never asked for its session.
fn assert_gone_before_the_upstream(rig: &Rig, prefix: &str) {
    let events = rig.audit_events();
    let identifying: Vec<_> = events
        .iter()
        .filter(|e| {
            let pod = e["pod"].as_str().unwrap_or("");
            pod.starts_with(prefix) && pod.contains("-identifying-")
        })
        .collect();
    assert!(identifying.is_empty(), "audited: {identifying:?}");
    let asked = upstream_requests(rig, prefix);
    let seen: Vec<_> = asked
        .keys()
        .filter(|pod| pod.contains("-identifying-"))
        .collect();
    assert!(seen.is_empty(), "the cluster was asked for: {seen:?}");
}

/// A slow cluster of `streaming`, and the proxy (TLS, for HTTP/2) with `upstream_streaming`.
async fn rig(streaming: SimStreaming, upstream_streaming: &str) -> Rig {
    let hold = if long_sweep() { Duration::ZERO } else { HOLD };
    let sim = SimConfig {
        streaming,
        delays: SimDelays {
            streaming: hold,
            reviews: hold,
        },
        ..SimConfig::default()
    };
    Rig::start(sim, true, &["--upstream-streaming", upstream_streaming]).await
}

/// Translated exec, the tunnel, relayed SPDY (exec and port-forward) and relayed v4, against
/// an old SPDY-only cluster.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hang_ups_at_every_step_of_translated_tunnelled_and_relayed_sessions() {
    let rig = rig(SimStreaming::SpdyOnly, "spdy").await;
    let kinds = [
        Kind::V5Exec,
        Kind::Tunnel,
        Kind::SpdyExec,
        Kind::SpdyPortForward,
        Kind::V4Exec,
    ];
    sweep(&rig, "spdy", &kinds).await;
}

/// Reverse exec and port-forward (SPDY clients) and the passed-through v5 exec and tunnel,
/// against a WebSocket-only cluster.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hang_ups_at_every_step_of_reverse_and_passed_through_sessions() {
    let rig = rig(SimStreaming::WebSocketOnly, "websocket").await;
    let kinds = [
        Kind::SpdyExec,
        Kind::SpdyPortForward,
        Kind::V5Exec,
        Kind::Tunnel,
    ];
    sweep(&rig, "ws", &kinds).await;
}

/// `auto` asking twice: v5 and the tunnel passed through first and refused by an old
/// cluster (after the hold), then translated (after another). A client gone during the first
/// attempt is not asked for again; one gone during the second was asked for twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hang_ups_at_every_step_of_auto_falling_back_to_the_translation() {
    let rig = rig(SimStreaming::SpdyOnly, "auto").await;
    sweep(&rig, "auto-old", &[Kind::V5Exec, Kind::Tunnel]).await;
    if long_sweep() {
        return;
    }
    let asked = upstream_requests(&rig, "auto-old-");
    let first_attempt = |pod: &str| pod.contains("-asking-") && !pod.contains("-asking-again-");
    for (pod, n) in asked.iter().filter(|(pod, _)| first_attempt(pod)) {
        assert_eq!(*n, 1, "{pod}: asked again for a client that was gone");
    }
    assert!(
        asked
            .iter()
            .any(|(pod, n)| pod.contains("-asking-again-") && *n == 2),
        "no client hung up during a second attempt: {asked:?}"
    );
}

/// `auto` asking twice: SPDY relayed first and refused at once by a gateway, then
/// reverse-translated (after the hold): a client gone while that second attempt is held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hang_ups_at_every_step_of_auto_falling_back_to_the_reverse_translation() {
    let rig = rig(SimStreaming::WebSocketOnly, "auto").await;
    sweep(&rig, "auto-new", &[Kind::SpdyExec, Kind::SpdyPortForward]).await;
    if long_sweep() {
        return;
    }
    let asked = upstream_requests(&rig, "auto-new-");
    let second_attempt = |pod: &str| pod.contains("-asking-") && !pod.contains("-asking-again-");
    assert!(
        asked.iter().any(|(pod, n)| second_attempt(pod) && *n == 2),
        "no client hung up during a second attempt: {asked:?}"
    );
}

/// How many streaming requests the cluster got for each pod named with `prefix`.
fn upstream_requests(rig: &Rig, prefix: &str) -> std::collections::BTreeMap<String, usize> {
    let mut asked = std::collections::BTreeMap::new();
    for r in rig.sim.requests() {
        let pod = r
            .path
            .split('/')
            .skip_while(|s| *s != "pods")
            .nth(1)
            .unwrap_or("");
        if pod.starts_with(prefix) {
            *asked.entry(pod.to_owned()).or_insert(0) += 1;
        }
    }
    asked
}
