//! Sessions against an in-memory kubelet (our SPDY server role) and a client that stops
//! reading: whatever ends such a session, it must end (found by the `exec_session` fuzz target).

use crate::session_stop::SessionStop;
use crate::session_traffic::SessionTraffic;
use std::time::Duration;

use bytes::Bytes;
use tokio::io::DuplexStream;
use tokio::task::JoinHandle;

use super::*;
use crate::spdy::proto::{Config as SpdyConfig, Connection};
use crate::translate::exec_options::ExecOptions;
use crate::translate::protocol::UpstreamVersion;
use crate::translate::status::Status;
use crate::translate::ws::{Config as WsConfig, WebSocket};

fn quiet() -> SpdyConfig {
    SpdyConfig {
        ping_interval: None,
        ..SpdyConfig::default()
    }
}

fn socket(io: DuplexStream) -> WebSocket<DuplexStream> {
    WebSocket::new(
        io,
        WsConfig {
            max_message_size: 1 << 20,
            keepalive: None,
            memory: None,
        },
    )
}

/// A kubelet that accepts the streams and writes `output` on stdout in DATA frames of 32 KiB
/// (as the kubelet's copy buffer makes them), never finishing.
fn kubelet(io: DuplexStream, output: usize) -> Connection {
    let (conn, mut incoming) = Connection::server(io, Bytes::new(), quiet());
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Some(s) = incoming.accept().await {
            let is_stdout = s.headers().get("streamtype") == Some(&b"stdout"[..]);
            let (mut tx, rx) = s.accept().await.unwrap().split();
            if is_stdout {
                let mut left = Bytes::from(vec![b'x'; output]);
                while !left.is_empty() {
                    let frame = left.split_to(left.len().min(32 * 1024));
                    let _ = tx.send(frame).await;
                }
            }
            held.push((tx, rx));
        }
    });
    conn
}

/// A translated session whose client end (returned, never read) has a `client_pipe`-byte pipe.
async fn session(
    client_pipe: usize,
    output: usize,
    limits: SessionLimits,
    stop: SessionStop,
) -> (DuplexStream, Connection, JoinHandle<Outcome>) {
    let (client, server) = tokio::io::duplex(client_pipe);
    let (ours, theirs) = tokio::io::duplex(64 * 1024);
    let kubelet = kubelet(theirs, output);
    let conn = Connection::client(ours, Bytes::new(), quiet());
    let options = ExecOptions {
        stdout: true,
        ..ExecOptions::default()
    };
    let streams = open_streams(conn, UpstreamVersion::V4, &options)
        .await
        .unwrap();
    let ready = options.ready_channel();
    let task = tokio::spawn(async move {
        let traffic = SessionTraffic::new();
        run(
            socket(server),
            streams,
            ready,
            false,
            &limits,
            stop,
            None,
            &traffic,
        )
        .await
    });
    (client, kubelet, task)
}

#[tokio::test(start_paused = true)]
async fn a_drain_ends_a_session_whose_client_stopped_reading() {
    let proxy = tokio_util::sync::CancellationToken::new();
    let stop = SessionStop::child_of(&proxy);
    let limits = SessionLimits::default();
    // The output fills the client's pipe: the status cannot go out behind it.
    let (_client, _kubelet, task) = session(4096, 64 * 1024, limits.clone(), stop.clone()).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(!task.is_finished());
    proxy.cancel();
    let outcome = tokio::time::timeout(limits.close_drain_timeout * 3, task)
        .await
        .expect("the drained session never ended")
        .unwrap();
    assert_eq!(outcome.end, SessionEndKind::Drained);
}

#[tokio::test(start_paused = true)]
async fn a_terminated_session_ends_saying_who_and_why() {
    let stop = SessionStop::default();
    let limits = SessionLimits::default();
    let (_client, _kubelet, task) = session(4096, 64 * 1024, limits.clone(), stop.clone()).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop.terminate(crate::session_stop::Termination {
        by: "alice".into(),
        reason: "incident 42".into(),
    });
    let outcome = tokio::time::timeout(limits.close_drain_timeout * 3, task)
        .await
        .expect("the terminated session never ended")
        .unwrap();
    assert_eq!(outcome.end, SessionEndKind::Terminated);
    let status = outcome.status.expect("a Status");
    assert_eq!((status.code, status.reason.as_str()), (403, "Forbidden"));
    assert_eq!(
        status.message,
        "kube-ws-proxy ended the session: terminated by alice: incident 42"
    );
}

#[tokio::test(start_paused = true)]
async fn an_idle_timeout_ends_a_session_whose_client_stopped_reading() {
    let limits = SessionLimits {
        idle_timeout: Some(Duration::from_secs(30)),
        ..SessionLimits::default()
    };
    let (_client, _kubelet, task) =
        session(4096, 64 * 1024, limits.clone(), SessionStop::default()).await;
    let outcome = tokio::time::timeout(
        Duration::from_secs(30) + limits.close_drain_timeout * 3,
        task,
    )
    .await
    .expect("the idle session never ended")
    .unwrap();
    assert_eq!(outcome.end, SessionEndKind::IdleTimeout);
}

#[tokio::test(start_paused = true)]
async fn a_refusal_ends_even_when_the_client_reads_nothing() {
    // Too small a pipe for the ready message, the status and the close frame.
    let (_client, server) = tokio::io::duplex(16);
    let limits = SessionLimits::default();
    let status = Status::internal_error("refused");
    let refusal = refuse(
        socket(server),
        crate::translate::channel::Channel::Stdout,
        status,
        &limits,
    );
    let outcome = tokio::time::timeout(limits.close_drain_timeout * 3, refusal)
        .await
        .expect("the refusal never ended");
    assert_eq!(outcome.end, SessionEndKind::UpstreamRefused);
}

/// Best-effort recordings into a fresh directory, and a `tar` session's recorder named `id`.
async fn recorded_session(
    id: &str,
) -> (
    tempfile::TempDir,
    crate::audit::recording::Recordings,
    crate::audit::recording::Recorder,
) {
    use crate::audit::recording::{
        RecordPolicy, RecordingConfig, RecordingCounters, RecordingPlace, Recordings,
    };
    let dir = tempfile::tempdir().unwrap();
    let recordings = Recordings::start(
        RecordingConfig {
            dir: dir.path().to_owned(),
            policy: RecordPolicy::BestEffort,
            record_stdin: false,
            min_free: 0,
            max_bytes: None,
        },
        RecordingCounters::unregistered(),
    )
    .unwrap();
    let recorder = recordings
        .open(
            RecordingPlace {
                cluster: "default",
                folder: None,
                namespace: "default",
            },
            id,
            &["tar".into()],
            format!("default/{id}"),
            false,
        )
        .await
        .unwrap();
    (dir, recordings, recorder)
}

/// A stdout-only session on `conn`, run over `ws` in the background with its output recorded
/// (best effort) by `recorder`.
async fn spawn_recorded_stdout(
    conn: Connection,
    ws: WebSocket<DuplexStream>,
    recorder: crate::audit::recording::Recorder,
) -> JoinHandle<Outcome> {
    let options = ExecOptions {
        stdout: true,
        ..ExecOptions::default()
    };
    let streams = open_streams(conn, UpstreamVersion::V4, &options)
        .await
        .unwrap();
    let ready = options.ready_channel();
    let recording = SessionRecording {
        recorder,
        required: false,
    };
    tokio::spawn(async move {
        let limits = SessionLimits::default();
        let stop = SessionStop::default();
        let traffic = SessionTraffic::new();
        run(
            ws,
            streams,
            ready,
            false,
            &limits,
            stop,
            Some(&recording),
            &traffic,
        )
        .await
    })
}

/// A session whose output waits for its recording (the shared budget spent by others, as behind
/// a slow disk) still pings its client and answers it, so a client that answers is never ended
/// as unresponsive, however long the recording holds the output back. The audited soak found
/// this: downloads cut after the keepalive's interval plus timeout under a busy writer.
#[tokio::test]
async fn a_session_waiting_for_its_recording_keeps_its_answering_client() {
    use crate::translate::ws::Keepalive;
    use futures_util::StreamExt;
    use tokio_tungstenite::tungstenite::protocol::Role;

    let (_dir, recordings, recorder) = recorded_session("held-1").await;
    let spent = recordings.spend_budget();

    let keepalive = Keepalive {
        interval: Duration::from_millis(100),
        timeout: Some(Duration::from_millis(200)),
    };
    let (client, server) = tokio::io::duplex(1 << 20);
    let (ours, theirs) = tokio::io::duplex(64 * 1024);
    let _kubelet = kubelet(theirs, 64 * 1024);
    let conn = Connection::client(ours, Bytes::new(), quiet());
    let ws = WebSocket::new(
        server,
        WsConfig {
            max_message_size: 1 << 20,
            keepalive: Some(keepalive),
            memory: None,
        },
    );
    let task = spawn_recorded_stdout(conn, ws, recorder).await;
    // A client that reads everything (tungstenite answers each ping as it reads).
    let mut client =
        tokio_tungstenite::WebSocketStream::from_raw_socket(client, Role::Client, None).await;
    let pings = tokio::spawn(async move {
        let mut pings = 0;
        while let Some(Ok(m)) = client.next().await {
            if m.is_ping() {
                pings += 1;
            }
        }
        pings
    });
    // Ten times the silence the keepalive allows, with the output held back throughout.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        !task.is_finished(),
        "the session ended while its recording held it back: {:?}",
        task.await.unwrap().end
    );
    drop(spent);
    task.abort();
    let pings = pings.await.unwrap();
    assert!(pings >= 10, "{pings} pings in 3 s at one per 100 ms");
}

/// A session whose upstream is cut off while its output waits for the recording budget (spent
/// by others, as behind a busy writer) passes on what it holds and ends at once: what a cut
/// stream holds can no longer grow, so it takes the recorder's cut lane instead of waiting a
/// turn behind every other session. The audited soak found this: downloads cut by a reset
/// ending seconds after it.
#[tokio::test]
async fn a_session_cut_off_by_its_upstream_ends_without_waiting_its_recording_turn() {
    use futures_util::StreamExt;
    use tokio_tungstenite::tungstenite::protocol::Role;

    let (_dir, recordings, recorder) = recorded_session("cut-1").await;
    let spent = recordings.spend_budget();

    // The kubelet sits behind a relay the test can cut, as the soak's faulty relay does.
    let (ours, near) = tokio::io::duplex(64 * 1024);
    let (far, theirs) = tokio::io::duplex(64 * 1024);
    let _kubelet = kubelet(theirs, 48 * 1024);
    let relay = tokio::spawn(async move {
        let (mut near, mut far) = (near, far);
        let _ = tokio::io::copy_bidirectional(&mut near, &mut far).await;
    });
    let conn = Connection::client(ours, Bytes::new(), quiet());
    let (client, server) = tokio::io::duplex(1 << 20);
    let task = spawn_recorded_stdout(conn, socket(server), recorder).await;
    let mut client =
        tokio_tungstenite::WebSocketStream::from_raw_socket(client, Role::Client, None).await;
    let received = tokio::spawn(async move {
        let mut stdout = 0;
        while let Some(Ok(m)) = client.next().await {
            if m.is_binary() && m.into_data().first() == Some(&1) {
                stdout += 1;
            }
        }
        stdout
    });
    // The output is received and waits for the budget; then the connection is cut.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!task.is_finished());
    relay.abort();
    let outcome = tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .expect("the cut session waited for its recording turn")
        .unwrap();
    assert_eq!(outcome.end, SessionEndKind::Completed, "{outcome:?}");
    assert!(
        received.await.unwrap() > 0,
        "what the session held was passed on"
    );
    drop(spent);
}

/// How a test ends the kubelet's TCP connection.
#[derive(Clone, Copy, Debug)]
enum Hangup {
    Fin,
    Reset,
}

/// A kubelet writing `output` bytes on stdout, reached over real TCP (the proxy's end a
/// `TcpStream` with room for all of it, as the soak's upstream socket is), behind a relay that
/// hangs up as told once everything the kubelet sent has crossed. The proxy's end, the kubelet,
/// and the relay's trigger.
async fn kubelet_over_tcp(
    output: usize,
) -> (
    tokio::net::TcpStream,
    Connection,
    tokio::sync::oneshot::Sender<Hangup>,
) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4 << 20).unwrap();
    let (ours, theirs) = tokio::join!(
        socket.connect(listener.local_addr().unwrap()),
        listener.accept()
    );
    let (mut theirs, _) = theirs.unwrap();
    let (near, far) = tokio::io::duplex(64 * 1024);
    let kubelet = kubelet(far, output);
    let (hang_up, how) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let mut near = near;
        let how = tokio::select! {
            _ = tokio::io::copy_bidirectional(&mut near, &mut theirs) => return,
            how = how => how,
        };
        match how {
            Ok(Hangup::Fin) => {
                use tokio::io::AsyncWriteExt;
                let _ = theirs.shutdown().await;
                // Holds its end open: only the FIN goes.
                std::future::pending::<()>().await;
            }
            Ok(Hangup::Reset) => {
                let _ = theirs.set_zero_linger();
            }
            Err(_) => {}
        }
    });
    (ours.unwrap(), kubelet, hang_up)
}

/// A recorded session whose output waits for the recording budget (spent by others, as
/// behind a busy writer) has far more received than its stream's inbox holds, the rest in the
/// kernel, when its upstream hangs up (`how`); the budget comes back `budget_back` after the
/// hang-up, if ever. A reset is seen on the socket though the reader is held back, what the
/// session still has is drained through the recorder's cut lane, and the session ends: what it
/// got to the client and how long it took after the hang-up.
async fn recorded_session_cut_behind_its_output(
    how: Hangup,
    watched: bool,
    budget_back: Option<Duration>,
) -> (usize, Duration) {
    use futures_util::StreamExt;
    use tokio_tungstenite::tungstenite::protocol::Role;

    const OUTPUT: usize = 1 << 20;
    let (_dir, recordings, recorder) = recorded_session("hangup-1").await;
    let spent = recordings.spend_budget();
    let (ours, _kubelet, hang_up) = kubelet_over_tcp(OUTPUT).await;
    let hangup = crate::peer_hangup::PeerHangup::of(&ours);
    let conn = if watched {
        Connection::client_watching(ours, Bytes::new(), quiet(), hangup)
    } else {
        Connection::client(ours, Bytes::new(), quiet())
    };
    let (client, server) = tokio::io::duplex(1 << 20);
    let task = spawn_recorded_stdout(conn, socket(server), recorder).await;
    let mut client =
        tokio_tungstenite::WebSocketStream::from_raw_socket(client, Role::Client, None).await;
    let received = tokio::spawn(async move {
        let mut stdout = 0;
        while let Some(Ok(m)) = client.next().await {
            let data = m.into_data();
            if data.first() == Some(&1) {
                stdout += data.len() - 1;
            }
        }
        stdout
    });
    // Everything crosses to the proxy's socket while the session waits for its budget: the
    // inbox is full, the rest is in the kernel.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!task.is_finished());
    hang_up.send(how).unwrap();
    let cut = std::time::Instant::now();
    let returned = tokio::spawn(async move {
        match budget_back {
            Some(after) => tokio::time::sleep(after).await,
            None => std::future::pending().await,
        }
        drop(spent);
    });
    let outcome = tokio::time::timeout(Duration::from_secs(3), task).await;
    let took = cut.elapsed();
    returned.abort();
    let outcome = outcome
        .expect("the session never saw its upstream hang up")
        .unwrap();
    assert_eq!(outcome.end, SessionEndKind::Completed, "{outcome:?}");
    (received.await.unwrap(), took)
}

/// The upstream's FIN behind a megabyte the session has not read yet is no cut by itself: a
/// session that ended well ends so too, and its output is no more urgent than anyone else's.
/// The session waits its recording turn (here until the budget comes back), reads on to the
/// connection's end (there its stream, left unfinished, is cut), and the whole megabyte still
/// reaches the client.
#[tokio::test]
async fn a_fin_behind_unread_output_waits_its_recording_turn() {
    let back = Duration::from_millis(700);
    let (received, took) =
        recorded_session_cut_behind_its_output(Hangup::Fin, true, Some(back)).await;
    assert_eq!(received, 1 << 20, "every byte the kubelet sent");
    assert!(took >= back, "ended before its turn: {took:?}");
}

/// The upstream's reset behind output not read yet: seen at once; what the kernel still gives
/// up reaches the client (Linux gives up all of it before the reset's error).
#[tokio::test]
async fn a_reset_behind_unread_output_ends_a_recorded_session_at_once() {
    let (received, took) = recorded_session_cut_behind_its_output(Hangup::Reset, true, None).await;
    assert!(received <= 1 << 20);
    assert!(took < Duration::from_secs(2), "{took:?}");
}

/// Without the watch on its socket, the same session waits for its recording turn: the reset
/// test above would hang (here, the shared budget never comes back).
#[tokio::test]
#[should_panic(expected = "never saw its upstream hang up")]
async fn without_the_socket_watch_the_cut_session_waits_for_its_turn() {
    recorded_session_cut_behind_its_output(Hangup::Reset, false, None).await;
}
