//! A TCP relay between the proxy and the simulated cluster that injects faults on command:
//! stall (stop forwarding both ways, closing nothing: a hung upstream or a black-holed
//! network), reset (every relayed connection closed with a TCP RST), and delay (each read held
//! back). New connections are accepted throughout; while stalled they are held too.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// What the relay does to the bytes it carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RelayMode {
    /// Forwards as it comes.
    Pass,
    /// Forwards nothing, closes nothing.
    Stall,
    /// Holds every read back this long.
    Delay(Duration),
}

/// Handle of a running fault relay.
pub struct FaultRelay {
    pub addr: SocketAddr,
    mode: watch::Sender<RelayMode>,
    /// Bumped to end every connection open now: with RST (`true`) or a plain close.
    resets: watch::Sender<(u64, bool)>,
}

impl FaultRelay {
    /// A relay to `target` on a free loopback port.
    pub async fn start(target: SocketAddr) -> Arc<FaultRelay> {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (mode, mode_rx) = watch::channel(RelayMode::Pass);
        let (resets, resets_rx) = watch::channel((0u64, true));
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let mode = mode_rx.clone();
                let resets = resets_rx.clone();
                tokio::spawn(async move {
                    let Ok(upstream) = TcpStream::connect(target).await else {
                        // The cluster is down: the proxy sees its dial refused, as it would.
                        let _ = client.set_zero_linger();
                        return;
                    };
                    relay(client, upstream, mode, resets).await;
                });
            }
        });
        Arc::new(FaultRelay { addr, mode, resets })
    }

    /// Sets what the relay does from now on.
    pub fn set(&self, mode: RelayMode) {
        self.mode.send_replace(mode);
    }

    /// Resets (RST) every connection open now.
    pub fn reset_all(&self) {
        self.resets.send_modify(|(n, rst)| {
            *n += 1;
            *rst = true;
        });
    }

    /// Closes every connection open now in the middle of whatever it carried (FIN both ways):
    /// a truncated stream.
    pub fn truncate_all(&self) {
        self.resets.send_modify(|(n, rst)| {
            *n += 1;
            *rst = false;
        });
    }
}

async fn relay(
    mut client: TcpStream,
    mut upstream: TcpStream,
    mode: watch::Receiver<RelayMode>,
    mut resets: watch::Receiver<(u64, bool)>,
) {
    let _ = client.set_nodelay(true);
    let _ = upstream.set_nodelay(true);
    resets.mark_unchanged();
    let reset = {
        let (cr, cw) = client.split();
        let (ur, uw) = upstream.split();
        tokio::select! {
            _ = async { tokio::join!(one_way(ur, cw, mode.clone()), one_way(cr, uw, mode)) } => false,
            _ = resets.changed() => resets.borrow().1,
        }
    };
    if reset {
        // Linger 0: closing sends RST, as a crashed middlebox or a firewall would.
        let _ = client.set_zero_linger();
        let _ = upstream.set_zero_linger();
    }
}

async fn one_way<R, W>(mut r: R, mut w: W, mut mode: watch::Receiver<RelayMode>)
where
    R: tokio::io::AsyncRead + Unpin,
    W: tokio::io::AsyncWrite + Unpin,
{
    let mut buf = vec![0u8; 32 * 1024];
    loop {
        // While stalled nothing is read, so the sender's buffers fill and it blocks.
        loop {
            let m = *mode.borrow_and_update();
            match m {
                RelayMode::Stall => {
                    if mode.changed().await.is_err() {
                        return;
                    }
                }
                RelayMode::Delay(d) => {
                    tokio::time::sleep(d).await;
                    break;
                }
                RelayMode::Pass => break,
            }
        }
        let n = match r.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if w.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
    let _ = w.shutdown().await;
}
