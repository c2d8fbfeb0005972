//! The corporate gateway of our users: a TCP relay that answers `400` to any request with
//! `Upgrade: SPDY…` and relays everything else. kubectl silently falls back to SPDY when a
//! WebSocket upgrade fails, so without this a missing translation would pass unnoticed.
//!
//! Only the first request of each connection is inspected: client-go dials a fresh connection
//! for every upgrade (WebSocket or SPDY), so that is where an upgrade can appear.
//!
//! Two more habits of real gateways can be switched on ([`Options`]): cutting connections that
//! carried no byte in either direction for a while (what idle-timeout firewalls and load
//! balancers do), and, at any time, freezing: every connection stops forwarding in both
//! directions without being closed (a gateway that hangs, a laptop whose lid closed). With
//! `drop_spdy` off it is a plain TCP relay, e.g. between the proxy and the cluster.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::time::Instant;

/// What the middlebox does besides relaying.
#[derive(Debug, Clone, Copy)]
pub struct Options {
    /// Answer `400` to SPDY upgrades (the users' gateway). Off: a plain TCP relay.
    pub drop_spdy: bool,
    /// Close both sides of any connection that carried no byte either way for this long.
    pub idle_cut: Option<Duration>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            drop_spdy: true,
            idle_cut: None,
        }
    }
}

/// Counters and switches shared by every connection of one middlebox.
struct Shared {
    target: SocketAddr,
    options: Options,
    dropped: AtomicUsize,
    websockets: AtomicUsize,
    /// Cuts of WebSocket connections (streaming sessions), a subset of `cuts`.
    websocket_cuts: AtomicUsize,
    cuts: AtomicUsize,
    frozen: watch::Sender<bool>,
}

/// A running middlebox.
pub struct Middlebox {
    pub addr: SocketAddr,
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Middlebox {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Middlebox {
    /// Starts the SPDY-dropping middlebox on 127.0.0.1 in front of `target`.
    pub async fn start(target: SocketAddr) -> Middlebox {
        Self::start_with(target, Options::default()).await
    }

    /// Starts a middlebox on 127.0.0.1 in front of `target` with `options`.
    pub async fn start_with(target: SocketAddr, options: Options) -> Middlebox {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let shared = Arc::new(Shared {
            target,
            options,
            dropped: AtomicUsize::new(0),
            websockets: AtomicUsize::new(0),
            websocket_cuts: AtomicUsize::new(0),
            cuts: AtomicUsize::new(0),
            frozen: watch::Sender::new(false),
        });
        let s = shared.clone();
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let s = s.clone();
                tokio::spawn(async move {
                    let _ = relay(client, s).await;
                });
            }
        });
        Middlebox { addr, shared, task }
    }

    /// SPDY upgrade attempts it dropped.
    pub fn dropped(&self) -> usize {
        self.shared.dropped.load(Ordering::SeqCst)
    }

    /// WebSocket upgrades it let through.
    pub fn websockets(&self) -> usize {
        self.shared.websockets.load(Ordering::SeqCst)
    }

    /// Connections it cut for carrying nothing for `idle_cut`, plain keep-alive connections
    /// (kubectl's requests before an upgrade) included.
    pub fn cuts(&self) -> usize {
        self.shared.cuts.load(Ordering::SeqCst)
    }

    /// WebSocket connections (streaming sessions) it cut for carrying nothing for `idle_cut`.
    pub fn websocket_cuts(&self) -> usize {
        self.shared.websocket_cuts.load(Ordering::SeqCst)
    }

    /// Stops forwarding on every connection, both ways, without closing anything (a chunk
    /// already read may still be held). Nothing is cut while frozen.
    pub fn freeze(&self) {
        self.shared.frozen.send_replace(true);
    }

    /// Forwards again.
    pub fn thaw(&self) {
        self.shared.frozen.send_replace(false);
    }
}

async fn relay(mut client: TcpStream, shared: Arc<Shared>) -> std::io::Result<()> {
    let mut head = Vec::with_capacity(4096);
    let mut websocket = false;
    if shared.options.drop_spdy {
        let mut buf = [0u8; 4096];
        while !head.windows(4).any(|w| w == b"\r\n\r\n") {
            let n = client.read(&mut buf).await?;
            if n == 0 {
                return Ok(());
            }
            head.extend_from_slice(&buf[..n]);
            if head.len() > 64 * 1024 {
                return Ok(());
            }
        }
        let text = String::from_utf8_lossy(&head).to_ascii_lowercase();
        let upgrade = text
            .lines()
            .find_map(|l| l.strip_prefix("upgrade:"))
            .map(|v| v.trim().to_owned());
        match upgrade.as_deref() {
            Some(u) if u.starts_with("spdy") => {
                shared.dropped.fetch_add(1, Ordering::SeqCst);
                let body = "SPDY is not allowed by this gateway";
                let resp = format!(
                    "HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                client.write_all(resp.as_bytes()).await?;
                return client.shutdown().await;
            }
            Some("websocket") => {
                shared.websockets.fetch_add(1, Ordering::SeqCst);
                websocket = true;
            }
            _ => {}
        }
    }
    let mut upstream = TcpStream::connect(shared.target).await?;
    upstream.set_nodelay(true)?;
    client.set_nodelay(true)?;
    upstream.write_all(&head).await?;
    let activity = Activity::new();
    let (cr, cw) = client.into_split();
    let (ur, uw) = upstream.into_split();
    let both = async {
        tokio::try_join!(
            pump(cr, uw, shared.frozen.subscribe(), &activity),
            pump(ur, cw, shared.frozen.subscribe(), &activity),
        )
    };
    tokio::select! {
        r = both => r.map(|_| ()),
        () = idle_watch(&shared, &activity) => {
            // Dropping both halves of both sockets closes the connection on either side.
            shared.cuts.fetch_add(1, Ordering::SeqCst);
            if websocket {
                shared.websocket_cuts.fetch_add(1, Ordering::SeqCst);
            }
            Ok(())
        }
    }
}

/// When a connection last carried a byte, in milliseconds after `base`.
struct Activity {
    base: Instant,
    last_ms: AtomicU64,
}

impl Activity {
    fn new() -> Activity {
        Activity {
            base: Instant::now(),
            last_ms: AtomicU64::new(0),
        }
    }

    fn touch(&self) {
        let ms = self.base.elapsed().as_millis() as u64;
        self.last_ms.store(ms, Ordering::SeqCst);
    }

    fn idle_for(&self) -> Duration {
        let last = self.base + Duration::from_millis(self.last_ms.load(Ordering::SeqCst));
        Instant::now().saturating_duration_since(last)
    }
}

/// Returns once the connection carried nothing for `idle_cut` (never without one); time spent
/// frozen does not count.
async fn idle_watch(shared: &Shared, activity: &Activity) {
    let Some(cut) = shared.options.idle_cut else {
        return std::future::pending().await;
    };
    loop {
        tokio::time::sleep(Duration::from_millis(50)).await;
        if *shared.frozen.borrow() {
            activity.touch();
            continue;
        }
        if activity.idle_for() >= cut {
            return;
        }
    }
}

/// Waits until the middlebox is not frozen.
async fn thawed(frozen: &mut watch::Receiver<bool>) {
    // The sender lives as long as the middlebox; if it is gone, so is the relay.
    if frozen.wait_for(|f| !*f).await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// Copies one direction until EOF (then half-closes the other side) or an error.
async fn pump(
    mut from: impl AsyncRead + Unpin,
    mut to: impl AsyncWrite + Unpin,
    mut frozen: watch::Receiver<bool>,
    activity: &Activity,
) -> std::io::Result<()> {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        thawed(&mut frozen).await;
        let n = from.read(&mut buf).await?;
        if n == 0 {
            let _ = to.shutdown().await;
            return Ok(());
        }
        activity.touch();
        thawed(&mut frozen).await;
        to.write_all(&buf[..n]).await?;
        activity.touch();
    }
}
