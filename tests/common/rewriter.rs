//! A TCP relay that rewrites the request line of each connection's first request: the client
//! an attacker builds, with a real kubectl behind it (client-go dials a fresh connection for
//! every upgrade, so that is where an exec's request line is).

use std::net::SocketAddr;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// A running rewriter; stops when dropped.
pub struct Rewriter {
    pub addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Rewriter {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Rewriter {
    /// Relays to `target`, each first request line passed through `rewrite`.
    pub async fn start(target: SocketAddr, rewrite: fn(&str) -> String) -> Rewriter {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                tokio::spawn(relay(client, target, rewrite));
            }
        });
        Rewriter { addr, task }
    }
}

async fn relay(mut client: TcpStream, target: SocketAddr, rewrite: fn(&str) -> String) {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n") {
        if head.len() > 64 * 1024 || client.read(&mut byte).await.unwrap_or(0) == 0 {
            return;
        }
        head.push(byte[0]);
    }
    let line = String::from_utf8_lossy(&head[..head.len() - 2]).into_owned();
    let Ok(mut upstream) = TcpStream::connect(target).await else {
        return;
    };
    let rewritten = format!("{}\r\n", rewrite(&line));
    if upstream.write_all(rewritten.as_bytes()).await.is_err() {
        return;
    }
    let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
}
