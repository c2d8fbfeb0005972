//! A forward proxy for kubeconfig's `proxy-url`, so that kubectl can reach a host name that no
//! resolver knows (`a.kube.example.com`) without touching /etc/hosts: every `CONNECT host:port`
//! is tunnelled to one fixed target, and every other request (a plain-HTTP target in absolute
//! form, `GET http://host/...`) is relayed to it byte for byte. It records the authority each
//! connection asked for.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// A running forward proxy on 127.0.0.1.
pub struct ConnectProxy {
    pub addr: SocketAddr,
    seen: Arc<Mutex<Vec<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for ConnectProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl ConnectProxy {
    /// Tunnels and relays everything to `target`.
    pub async fn start(target: SocketAddr) -> ConnectProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let sink = seen.clone();
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let sink = sink.clone();
                tokio::spawn(async move {
                    let _ = serve(client, target, sink).await;
                });
            }
        });
        ConnectProxy { addr, seen, task }
    }

    /// What each connection asked for: `CONNECT a.kube.example.com:443` or `GET http://...`.
    pub fn requests(&self) -> Vec<String> {
        self.seen.lock().unwrap().clone()
    }
}

async fn serve(
    mut client: TcpStream,
    target: SocketAddr,
    seen: Arc<Mutex<Vec<String>>>,
) -> std::io::Result<()> {
    let mut head = Vec::with_capacity(4096);
    let mut buf = [0u8; 4096];
    let end = loop {
        if let Some(end) = head.windows(4).position(|w| w == b"\r\n\r\n") {
            break end + 4;
        }
        let n = client.read(&mut buf).await?;
        if n == 0 || head.len() > 64 * 1024 {
            return Ok(());
        }
        head.extend_from_slice(&buf[..n]);
    };
    let line = String::from_utf8_lossy(&head[..end]);
    let line = line.lines().next().unwrap_or("").to_owned();
    let mut words = line.split(' ');
    let (method, authority) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
    seen.lock().unwrap().push(format!("{method} {authority}"));
    let mut upstream = TcpStream::connect(target).await?;
    upstream.set_nodelay(true)?;
    client.set_nodelay(true)?;
    if method == "CONNECT" {
        client
            .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
            .await?;
        upstream.write_all(&head[end..]).await?;
    } else {
        upstream.write_all(&head).await?;
    }
    tokio::io::copy_bidirectional(&mut client, &mut upstream).await?;
    Ok(())
}
