//! The corporate gateway of our users: a TCP relay that answers `400` to any request with
//! `Upgrade: SPDY…` and relays everything else. kubectl silently falls back to SPDY when a
//! WebSocket upgrade fails, so without this a missing translation would pass unnoticed.
//!
//! Only the first request of each connection is inspected: client-go dials a fresh connection
//! for every upgrade (WebSocket or SPDY), so that is where an upgrade can appear.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// A running middlebox.
pub struct Middlebox {
    pub addr: SocketAddr,
    /// SPDY upgrade attempts it dropped.
    pub dropped: Arc<AtomicUsize>,
    /// WebSocket upgrades it let through.
    pub websockets: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Middlebox {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Middlebox {
    /// Starts a middlebox on 127.0.0.1 in front of `target`.
    pub async fn start(target: SocketAddr) -> Middlebox {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let dropped = Arc::new(AtomicUsize::new(0));
        let websockets = Arc::new(AtomicUsize::new(0));
        let (d, w) = (dropped.clone(), websockets.clone());
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let (d, w) = (d.clone(), w.clone());
                tokio::spawn(async move {
                    let _ = relay(client, target, d, w).await;
                });
            }
        });
        Middlebox {
            addr,
            dropped,
            websockets,
            task,
        }
    }

    pub fn dropped(&self) -> usize {
        self.dropped.load(Ordering::SeqCst)
    }

    pub fn websockets(&self) -> usize {
        self.websockets.load(Ordering::SeqCst)
    }
}

async fn relay(
    mut client: TcpStream,
    target: SocketAddr,
    dropped: Arc<AtomicUsize>,
    websockets: Arc<AtomicUsize>,
) -> std::io::Result<()> {
    let mut head = Vec::with_capacity(4096);
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
            dropped.fetch_add(1, Ordering::SeqCst);
            let body = "SPDY is not allowed by this gateway";
            let resp = format!(
                "HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            client.write_all(resp.as_bytes()).await?;
            return client.shutdown().await;
        }
        Some("websocket") => {
            websockets.fetch_add(1, Ordering::SeqCst);
        }
        _ => {}
    }
    let mut upstream = TcpStream::connect(target).await?;
    upstream.set_nodelay(true)?;
    client.set_nodelay(true)?;
    upstream.write_all(&head).await?;
    tokio::io::copy_bidirectional(&mut client, &mut upstream).await?;
    Ok(())
}
