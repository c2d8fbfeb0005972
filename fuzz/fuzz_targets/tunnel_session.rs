//! The port-forward tunnel (`translate::tunnel::run`) driven in-process by an interleaved script
//! of client and upstream events: the client's WebSocket and the upstream connection are
//! in-memory pipes, the clock is paused so that keepalive, idle and close timers fire as soon as
//! nothing else can run.
//!
//! Input: one option byte (keepalive, idle timeout, a polite client, which side ends it), the
//! bytes the upstream sent after its 101, then operations, one opcode byte each with arguments.
//!
//! Checks, besides "never panics":
//! - the tunnel always ends once the script is over and one side leaves (bounded in virtual
//!   time), and leaves no task behind;
//! - the proxy's frames are well formed: binary, final, unmasked, nothing after its close;
//! - what the client got is a prefix of what the upstream sent, all of it when the upstream
//!   ended the tunnel and the client read throughout; what the upstream got is a prefix of the
//!   client's binary messages, all of them when the client ended it within the protocol;
//! - `TunnelOutcome`: `bytes_up`/`bytes_down` are what the other side got; a reading client
//!   gets a close frame with the code the end calls for; a polite client is never
//!   "unresponsive", a client within the protocol never a "violation".

#![no_main]

mod session_harness;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use kube_ws_proxy::translate::tunnel::{run, TunnelEnd, TunnelOutcome};
use kube_ws_proxy::translate::ws::{Config as WsConfig, Keepalive, WebSocket};
use libfuzzer_sys::fuzz_target;
use session_harness::{
    assert_forwarded, client_action, client_frame, client_message, peer_writer, run_case,
    ClientLog, ClientPeer, PeerOut, ReadMode, Script, PIPE,
};
use tokio::io::{AsyncReadExt, DuplexStream, ReadHalf};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

fuzz_target!(|data: &[u8]| {
    run_case(tunnel_case(data));
});

#[derive(Default)]
struct UpLog {
    received: Vec<u8>,
    eof: bool,
}

async fn upstream_reader(
    mut rd: ReadHalf<DuplexStream>,
    log: Arc<Mutex<UpLog>>,
    mut mode: watch::Receiver<ReadMode>,
) {
    let mut chunk = [0u8; 4096];
    loop {
        let current = *mode.borrow_and_update();
        match current {
            ReadMode::Gone => return,
            ReadMode::Stalled => {
                if mode.changed().await.is_err() {
                    return;
                }
                continue;
            }
            ReadMode::Reading => {}
        }
        let n = tokio::select! {
            n = rd.read(&mut chunk) => n,
            _ = mode.changed() => continue,
        };
        match n {
            Ok(0) | Err(_) => {
                log.lock().unwrap().eof = true;
                return;
            }
            Ok(n) => log.lock().unwrap().received.extend_from_slice(&chunk[..n]),
        }
    }
}

async fn tunnel_case(data: &[u8]) {
    let mut s = Script::new(data);
    let a = s.byte();
    let keepalive = (a & 1 != 0).then_some(Keepalive {
        interval: Duration::from_secs(30),
        timeout: Some(Duration::from_secs(10)),
    });
    let idle_timeout = (a & 2 != 0).then_some(Duration::from_secs(60));
    let polite = a & 4 == 0;
    let ending = (a >> 3) & 3;
    let leftover = s.payload(32).to_vec();

    let (client_io, server_io) = tokio::io::duplex(PIPE);
    let (proxy_up, upstream_io) = tokio::io::duplex(PIPE);
    let mut client = ClientPeer::start(client_io, polite);
    let (ur, uw) = tokio::io::split(upstream_io);
    let (up_tx, up_rx) = mpsc::unbounded_channel();
    let (up_mode, up_mode_rx) = watch::channel(ReadMode::Reading);
    let up_log = Arc::new(Mutex::new(UpLog::default()));
    let mut tasks = vec![
        tokio::spawn(peer_writer(uw, up_rx)),
        tokio::spawn(upstream_reader(ur, up_log.clone(), up_mode_rx)),
    ];

    let ws = WebSocket::new(
        server_io,
        WsConfig {
            max_message_size: 1024,
            keepalive,
            memory: None,
        },
    );
    let stop = CancellationToken::new();
    let session_stop = kube_ws_proxy::session_stop::SessionStop::child_of(&stop);
    let carried = Bytes::from(leftover.clone());
    let mut session = tokio::spawn(async move {
        let traffic = kube_ws_proxy::session_traffic::SessionTraffic::new();
        run(ws, proxy_up, carried, session_stop, idle_timeout, None, &traffic).await
    });

    // What the upstream sent (after its 101 too), and the client's binary messages, in order.
    let mut up_sent = leftover;
    let mut client_sent = Vec::new();
    // The client sent something that is not a plain message: its bytes stop counting.
    let mut frozen = false;
    let mut text_sent = false;
    let mut up_gone = false;
    // The upstream sent its EOF: later bytes never leave it.
    let mut up_done = false;

    while !s.is_empty() && !session.is_finished() {
        let op = s.byte();
        match op % 20 {
            n @ 0..=9 => {
                client_action(n, &mut s, &mut client);
                // After a close, a half-close or leaving, later messages never arrive.
                frozen |= !client.clean || matches!(n, 2 | 6 | 7);
            }
            // A binary message (kubectl writes SPDY frames as several of them).
            10 | 11 => {
                let payload = s.payload(96);
                if !frozen {
                    client_sent.extend_from_slice(payload);
                }
                client.send(client_message(0x2, payload));
            }
            // A text message: not allowed in the tunnel.
            12 => {
                text_sent = true;
                frozen = true;
                client.send(client_message(0x1, s.payload(8)));
            }
            // A binary message in fragments, with a ping between them.
            13 => {
                let payload = s.payload(96);
                if !frozen {
                    client_sent.extend_from_slice(payload);
                }
                let cut = usize::from(s.byte()) % (payload.len() + 1);
                let mut out = Vec::new();
                client_frame(0x02, &payload[..cut], false, &mut out);
                client_frame(0x89, b"mid", false, &mut out);
                client_frame(0x80, &payload[cut..], false, &mut out);
                client.send(out);
            }
            // Upstream bytes: a few, or a burst (reads grow past the idle size).
            14 => {
                let bytes = s.payload(128).to_vec();
                if !up_done {
                    up_sent.extend_from_slice(&bytes);
                }
                let _ = up_tx.send(PeerOut::Bytes(bytes));
            }
            15 => {
                let len = usize::from(s.byte()) * 64;
                let fill = s.byte();
                let bytes: Vec<u8> = (0..len).map(|i| fill.wrapping_add(i as u8)).collect();
                if !up_done {
                    up_sent.extend_from_slice(&bytes);
                }
                let _ = up_tx.send(PeerOut::Bytes(bytes));
            }
            // The upstream: EOF, gone, stops reading, reads again.
            16 => match s.byte() % 4 {
                0 => {
                    up_done = true;
                    let _ = up_tx.send(PeerOut::Shutdown);
                }
                1 => {
                    up_done = true;
                    up_gone = true;
                    let _ = up_mode.send(ReadMode::Gone);
                    let _ = up_tx.send(PeerOut::Drop);
                }
                2 => {
                    if !up_gone {
                        let _ = up_mode.send(ReadMode::Stalled);
                    }
                }
                _ => {
                    if !up_gone {
                        let _ = up_mode.send(ReadMode::Reading);
                    }
                }
            },
            // Time passes (up to ~25 s: pings, timeouts).
            17 => tokio::time::sleep(Duration::from_millis(u64::from(s.byte()) * 100)).await,
            18 => {
                for _ in 0..s.byte() % 8 {
                    tokio::task::yield_now().await;
                }
            }
            _ => stop.cancel(),
        }
        tokio::task::yield_now().await;
    }

    // The end: both read again, time passes, then one side leaves.
    if ending != 3 {
        // A drain must end the tunnel whatever the client does: it may stay stalled then.
        client.set_mode(ReadMode::Reading);
    }
    if !up_gone {
        let _ = up_mode.send(ReadMode::Reading);
    }
    let mut ended = tokio::time::timeout(Duration::from_secs(30), &mut session)
        .await
        .ok();
    if ended.is_none() {
        match ending {
            0 => client.set_mode(ReadMode::Gone),
            1 => {
                client.log.lock().unwrap().sent_close = true;
                client.send(client_message(0x8, &[0x03, 0xe8]));
                // Behind a half-sent frame the close is not one: the client then leaves.
                ended = tokio::time::timeout(Duration::from_secs(30), &mut session)
                    .await
                    .ok();
                if ended.is_none() {
                    client.set_mode(ReadMode::Gone);
                }
            }
            2 => {
                let _ = up_tx.send(PeerOut::Shutdown);
            }
            _ => stop.cancel(),
        }
        if ended.is_none() {
            ended = Some(
                tokio::time::timeout(Duration::from_secs(60), &mut session)
                    .await
                    .unwrap_or_else(|_| {
                        panic!(
                            "the tunnel did not end within 60 s (virtual) of the ending ({ending})"
                        )
                    }),
            );
        }
    }
    let outcome = ended.expect("ended").expect("tunnel task");

    drop(up_tx);
    drop(up_mode);
    let client_reading = client.healthy();
    let client_clean = client.clean && !text_sent;
    let client_log = client.log.clone();
    tasks.append(&mut client.tasks);
    drop(client);
    for task in tasks {
        tokio::time::timeout(Duration::from_secs(30), task)
            .await
            .expect("a peer's pipe never ended: the proxy kept it open")
            .expect("peer task");
    }
    check(
        &outcome,
        &client_log.lock().unwrap(),
        &up_log.lock().unwrap(),
        Ctx {
            up_sent: &up_sent,
            client_sent: &client_sent,
            frozen,
            client_reading,
            client_clean,
            polite,
            up_gone,
        },
    );
}

struct Ctx<'a> {
    up_sent: &'a [u8],
    client_sent: &'a [u8],
    frozen: bool,
    client_reading: bool,
    client_clean: bool,
    polite: bool,
    up_gone: bool,
}

fn check(outcome: &TunnelOutcome, client: &ClientLog, up: &UpLog, ctx: Ctx<'_>) {
    if session_harness::debug() {
        eprintln!(
            "outcome: {outcome:?}\nclient: {client:?}\nupstream got {} bytes",
            up.received.len()
        );
    }
    assert_eq!(
        client.after_close, 0,
        "frames after the proxy's close frame"
    );
    let mut down = Vec::new();
    for (opcode, payload) in &client.messages {
        assert_eq!(*opcode, 0x2, "a text message in the tunnel");
        down.extend_from_slice(payload);
    }
    assert!(
        ctx.up_sent.starts_with(&down),
        "the client's bytes are not a prefix of the upstream's"
    );
    assert!(outcome.bytes_down >= down.len() as u64);
    let up_got = &up.received;
    assert_forwarded(up_got, ctx.client_sent, !ctx.frozen, "the upstream's bytes");
    if !ctx.up_gone {
        assert!(up.eof, "the upstream was not shut down");
        assert_eq!(
            outcome.bytes_up,
            up_got.len() as u64,
            "bytes_up is what the upstream got"
        );
        if outcome.ended_by == TunnelEnd::Client && !ctx.frozen {
            assert_eq!(up_got, ctx.client_sent, "client bytes held back at the end");
        }
    }
    if ctx.client_reading && outcome.ended_by != TunnelEnd::ClientUnresponsive {
        assert_eq!(
            outcome.bytes_down,
            down.len() as u64,
            "bytes_down is what the client got"
        );
        if outcome.ended_by == TunnelEnd::Upstream {
            assert_eq!(down, ctx.up_sent, "upstream bytes lost");
        }
        let close = client
            .close
            .as_ref()
            .expect("a reading client gets a close frame");
        let code = close.get(..2).map(|c| u16::from_be_bytes([c[0], c[1]]));
        // A client that sent its own close gets that code back, whatever ended the tunnel.
        let ours = (!client.sent_close).then_some(outcome.ended_by);
        match ours {
            Some(TunnelEnd::ClientViolation) => {
                assert!(
                    matches!(code, Some(1002 | 1007 | 1009)),
                    "violation code {code:?}"
                )
            }
            Some(TunnelEnd::Drained) => assert_eq!(code, Some(1001), "drained"),
            Some(TunnelEnd::IdleTimeout | TunnelEnd::Upstream) => assert_eq!(code, Some(1000)),
            _ => {}
        }
    }
    if ctx.client_reading && ctx.polite {
        assert_ne!(
            outcome.ended_by,
            TunnelEnd::ClientUnresponsive,
            "a client answering every ping was declared unresponsive"
        );
    }
    if ctx.client_reading && ctx.client_clean {
        assert_ne!(
            outcome.ended_by,
            TunnelEnd::ClientViolation,
            "a client within the protocol was closed for a violation"
        );
    }
}
