//! Issue 35, Finding 5: `kube_ws_proxy_sessions_admitted_total` = `sessions_total` +
//! `sessions_active` after every kind of early end: a handshake refused (never admitted), an
//! upstream that refuses, a client gone while its caller is reviewed (before admission: never
//! admitted), a client gone while the upstream is asked, a client that never takes its upgrade,
//! a session refused because it cannot be recorded (relayed and translated), an upstream that
//! cannot be reached, and kubelet sessions through `nodes/{node}/proxy` (a relayed exec and a
//! `run`) whose client goes while the kubelet is asked. Each end is counted once, under the
//! outcome it had.

use crate::common;

use std::time::Duration;

use common::hangup::{family_sum, Counts, HangUp, Kind, Rig};
use common::proxy_process::ProxyProcess;
use kube_ws_proxy::sim::{SimConfig, SimDelays, SimStreaming};

/// How long the slow cluster holds each review and each streaming answer.
const HOLD: Duration = Duration::from_millis(150);

/// The value of one series (`name{labels}`) in a Prometheus text; 0 when absent.
fn series(text: &str, name_and_labels: &str) -> i64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name_and_labels)?.trim().parse::<f64>().ok())
        .map_or(0, |v| v as i64)
}

/// The proxy's session counts, read from `text`.
fn counts(text: &str) -> Counts {
    Counts {
        admitted: family_sum(text, "kube_ws_proxy_sessions_admitted_total"),
        finished: family_sum(text, "kube_ws_proxy_sessions_total"),
        active: family_sum(text, "kube_ws_proxy_sessions_active"),
    }
}

/// Runs `end` against `proxy` and checks what it leaves: `admitted` more sessions admitted,
/// all of them ended (nothing active), the identity holding, and `counted` (a series of the
/// metrics text) one more, or, with `None`, no session counted at all.
async fn after_end<F: std::future::Future<Output = ()>>(
    proxy: &ProxyProcess,
    what: &str,
    admitted: i64,
    counted: Option<&str>,
    end: F,
) {
    let before_text = proxy.metrics();
    let before = counts(&before_text);
    end.await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let text = loop {
        let text = proxy.metrics();
        let now = counts(&text);
        // One scrape reads the families one after another (`active` first), so a session
        // admitted during it can show as admitted but not yet active: only a scrape in which
        // the identity holds is taken as settled; a real loss still fails after the deadline.
        let settled = now.active == 0 && now.admitted == before.admitted + admitted && now.add_up();
        if settled || tokio::time::Instant::now() > deadline {
            break text;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let now = counts(&text);
    assert_eq!(
        now.admitted - before.admitted,
        admitted,
        "{what}: admitted {before:?} -> {now:?}"
    );
    assert!(
        now.add_up() && now.active == 0,
        "{what}: admitted = finished + active does not hold: {now:?}"
    );
    match counted {
        Some(counted) => assert_eq!(
            series(&text, counted) - series(&before_text, counted),
            1,
            "{what}: {counted} did not count it once"
        ),
        None => assert_eq!(
            now.finished, before.finished,
            "{what}: a session was counted"
        ),
    }
}

/// Sends `request` and reads the head of the answer.
async fn ask(proxy: &ProxyProcess, request: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut tcp = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    tcp.write_all(request.as_bytes()).await.unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    let read = async {
        while !head.ends_with(b"\r\n\r\n") && tcp.read(&mut byte).await.unwrap_or(0) == 1 {
            head.push(byte[0]);
        }
    };
    let _ = tokio::time::timeout(Duration::from_secs(10), read).await;
    String::from_utf8_lossy(&head).into_owned()
}

/// A v5 exec WebSocket to `pod`, read to its Close: what the translation tells inside it.
async fn v5_exec(proxy: &ProxyProcess, pod: &str) -> Vec<u8> {
    let path = common::ws_client::exec_path(pod, &["echo", "hi"], false, true, true);
    let (mut ws, _) = common::ws_client::connect(proxy.addr, &path, "v5.channel.k8s.io")
        .await
        .expect("the WebSocket is accepted");
    common::ws_client::read_to_close(&mut ws).await.status
}

const EXEC_CLIENT_GONE: &str =
    r#"kube_ws_proxy_sessions_total{cluster="default",kind="exec",outcome="client_gone"}"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_early_end_is_counted_once_and_admitted_is_finished_plus_active() {
    let sim = SimConfig {
        streaming: SimStreaming::SpdyOnly,
        delays: SimDelays {
            streaming: HOLD,
            reviews: HOLD,
        },
        ..SimConfig::default()
    };
    let rig = Rig::start(sim, false, &["--upstream-streaming", "spdy"]).await;
    let proxy = &rig.proxy;
    let token = |n: &str| format!("token-{n}");

    let mut bad = Kind::V5Exec.http1_request("ends-bad-handshake", None);
    bad = bad.replace("Sec-WebSocket-Version: 13", "Sec-WebSocket-Version: 8");
    let refused =
        r#"kube_ws_proxy_handshake_rejections_total{cluster="default",reason="bad_request"}"#;
    after_end(proxy, "a refused handshake", 0, Some(refused), async {
        let answer = ask(proxy, &bad).await;
        assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
    })
    .await;

    let forbidden = Kind::SpdyExec.http1_request("forbidden-ends", None);
    let upstream_error = r#"kube_ws_proxy_sessions_total{cluster="default",kind="spdy_relay",outcome="upstream_error"}"#;
    after_end(
        proxy,
        "an upstream refusal",
        1,
        Some(upstream_error),
        async {
            let answer = ask(proxy, &forbidden).await;
            assert!(answer.starts_with("HTTP/1.1 403"), "{answer}");
        },
    )
    .await;

    // In passthrough mode with the audit log the caller's review comes before admission (a
    // caller the cluster does not authenticate is refused there): a client gone during it
    // was never admitted and leaves nothing.
    let identifying = Kind::V5Exec.http1_request("ends-identifying", Some(&token("a")));
    after_end(proxy, "a client gone while reviewed", 0, None, async {
        rig.hang_up_h1(&identifying, HangUp::After(HOLD / 2)).await;
    })
    .await;

    let asking = Kind::V5Exec.http1_request("ends-asking", Some(&token("b")));
    after_end(
        proxy,
        "a client gone while the upstream is asked",
        1,
        Some(EXEC_CLIENT_GONE),
        async {
            rig.hang_up_h1(&asking, HangUp::After(HOLD + HOLD / 2))
                .await;
        },
    )
    .await;

    let answered = Kind::V5Exec.http1_request("ends-answered", Some(&token("c")));
    after_end(
        proxy,
        "a client that never takes its upgrade",
        1,
        Some(EXEC_CLIENT_GONE),
        async {
            rig.hang_up_h1(&answered, HangUp::Answered).await;
        },
    )
    .await;

    // No recording can be made once the directory is gone.
    std::fs::remove_dir_all(&rig.records).unwrap();
    let relayed = Kind::SpdyExec.http1_request("ends-unrecordable-relayed", None);
    let unrecordable = r#"kube_ws_proxy_sessions_total{cluster="default",kind="spdy_relay",outcome="recording_failed"}"#;
    after_end(
        proxy,
        "a relayed session that cannot be recorded",
        1,
        Some(unrecordable),
        async {
            let answer = ask(proxy, &relayed).await;
            assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
        },
    )
    .await;
    let unrecordable =
        r#"kube_ws_proxy_sessions_total{cluster="default",kind="exec",outcome="recording_failed"}"#;
    after_end(
        proxy,
        "a translated session that cannot be recorded",
        1,
        Some(unrecordable),
        async {
            let status = v5_exec(proxy, "ends-unrecordable-translated").await;
            let status = String::from_utf8_lossy(&status);
            assert!(status.contains("recordings are required"), "{status}");
        },
    )
    .await;
    assert!(
        rig.sim
            .requests()
            .iter()
            .all(|r| !r.path.contains("unrecordable")),
        "a session that cannot be recorded went upstream"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_whose_upstream_cannot_be_reached_is_counted_once() {
    // A port nothing listens on.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let upstream = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    let proxy = ProxyProcess::start(&upstream, &["--upstream-streaming", "spdy"]);
    let relayed = Kind::SpdyExec.http1_request("ends-unreachable", None);
    let upstream_error = r#"kube_ws_proxy_sessions_total{cluster="default",kind="spdy_relay",outcome="upstream_error"}"#;
    after_end(
        &proxy,
        "an unreachable upstream (relayed)",
        1,
        Some(upstream_error),
        async {
            let answer = ask(&proxy, &relayed).await;
            assert!(answer.starts_with("HTTP/1.1 502"), "{answer}");
        },
    )
    .await;
    let upstream_error =
        r#"kube_ws_proxy_sessions_total{cluster="default",kind="exec",outcome="upstream_error"}"#;
    after_end(
        &proxy,
        "an unreachable upstream (translated)",
        1,
        Some(upstream_error),
        async {
            let status = v5_exec(&proxy, "ends-unreachable-translated").await;
            assert!(!status.is_empty(), "no Status told inside the WebSocket");
        },
    )
    .await;
}

/// Kubelet sessions through `nodes/{node}/proxy` (`--node-proxy-sessions audit`) are admitted,
/// audited and ended as pod sessions are: a relayed kubelet exec and a kubelet `run` whose
/// client goes while the kubelet is asked are each counted once, the identity holding, and
/// each has its `ended` event naming the node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubelet_sessions_whose_client_goes_are_counted_once() {
    let sim = SimConfig {
        delays: SimDelays {
            streaming: HOLD,
            reviews: HOLD,
        },
        ..SimConfig::default()
    };
    let extra = [
        "--upstream-streaming",
        "spdy",
        "--node-proxy-sessions",
        "audit",
    ];
    let rig = Rig::start(sim, false, &extra).await;
    let proxy = &rig.proxy;
    // After the caller's review (before admission) and into the kubelet's hold.
    let asking = HangUp::After(HOLD + HOLD / 2);

    let exec = Kind::SpdyExec.http1_request("kubelet-exec-ends", Some("token-k1"));
    let exec = exec.replacen(
        &Kind::SpdyExec.path("kubelet-exec-ends"),
        "/api/v1/nodes/sim-node/proxy/exec/default/kubelet-exec-ends/main?command=cat&input=1&output=1",
        1,
    );
    let relay_gone = r#"kube_ws_proxy_sessions_total{cluster="default",kind="spdy_relay",outcome="client_gone"}"#;
    after_end(
        proxy,
        "a kubelet exec whose client goes while the kubelet is asked",
        1,
        Some(relay_gone),
        rig.hang_up_h1(&exec, asking),
    )
    .await;

    let run = "POST /api/v1/nodes/sim-node/proxy/run/default/kubelet-run-ends/main?cmd=echo+hi \
               HTTP/1.1\r\nHost: kube\r\nContent-Length: 0\r\nAuthorization: Bearer token-k2\r\n\r\n";
    let run_gone = r#"kube_ws_proxy_sessions_total{cluster="default",kind="kubelet_run",outcome="client_gone"}"#;
    after_end(
        proxy,
        "a kubelet run whose client goes while the kubelet is asked",
        1,
        Some(run_gone),
        rig.hang_up_h1(run, asking),
    )
    .await;

    let events = rig.audit_events();
    for pod in ["kubelet-exec-ends", "kubelet-run-ends"] {
        let stages: Vec<_> = events
            .iter()
            .filter(|e| e["pod"] == pod)
            .map(|e| (e["stage"].clone(), e["node"].clone(), e["outcome"].clone()))
            .collect();
        assert_eq!(stages.len(), 2, "{pod}: {stages:?}");
        assert_eq!(stages[0].0, "started", "{pod}: {stages:?}");
        assert_eq!(stages[1].0, "ended", "{pod}: {stages:?}");
        assert_eq!(stages[1].2, "client_gone", "{pod}: {stages:?}");
        assert!(
            stages.iter().all(|s| s.1 == "sim-node"),
            "{pod}: {stages:?}"
        );
    }
}
