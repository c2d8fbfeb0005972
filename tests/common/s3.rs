//! A real S3-compatible store for the upload tests: moto's server mode on a free loopback
//! port (installed by scripts/install-test-deps.sh), a TCP forwarder in front of it that the
//! tests take down and bring back ("the store is down"; moto keeps its objects meanwhile),
//! and a client of the proxy's own to make the bucket and read what landed.

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use kube_ws_proxy::audit::upload::{Encryption, Store, StoreSettings, UploadTarget};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// The proxy's environment for the tests' store: moto takes any keys; no instance metadata
/// lookups (there is none here, and its timeouts would slow the start).
pub const AWS_ENV: [(&str, &str); 4] = [
    ("AWS_ACCESS_KEY_ID", "kube-ws-proxy-test"),
    ("AWS_SECRET_ACCESS_KEY", "kube-ws-proxy-test-secret"),
    ("AWS_REGION", "us-east-1"),
    ("AWS_EC2_METADATA_DISABLED", "true"),
];

/// moto's server, killed on drop.
pub struct S3Server {
    child: Child,
    /// Where it listens.
    pub addr: SocketAddr,
}

impl S3Server {
    /// Starts `moto_server` on a free port of 127.0.0.1 and waits until it answers.
    pub async fn start(moto: &Path) -> S3Server {
        S3Server::launch(moto, None).await
    }

    /// [`S3Server::start`] serving TLS with the certificate and key files `tls`.
    pub async fn start_tls(moto: &Path, tls: (&Path, &Path)) -> S3Server {
        S3Server::launch(moto, Some(tls)).await
    }

    async fn launch(moto: &Path, tls: Option<(&Path, &Path)>) -> S3Server {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut command = Command::new(moto);
        command.args(["-H", "127.0.0.1", "-p", &port.to_string()]);
        if let Some((cert, key)) = tls {
            command.arg("-c").arg(cert).arg("-k").arg(key);
        }
        let child = command
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("start {}: {e}", moto.display()));
        let addr: SocketAddr = ([127, 0, 0, 1], port).into();
        let server = S3Server { child, addr };
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        while TcpStream::connect(addr).await.is_err() {
            assert!(
                tokio::time::Instant::now() < deadline,
                "moto_server did not listen on {addr}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        server
    }

    /// `http://127.0.0.1:PORT`.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A client of the store at `endpoint` for `target` (`s3://BUCKET/PREFIX`), with the keys of
/// [`AWS_ENV`].
pub async fn store(endpoint: &str, target: &str) -> Store {
    store_trusting(endpoint, target, None).await
}

/// [`store`], trusting the CAs of the PEM file `ca` too.
pub async fn store_trusting(endpoint: &str, target: &str, ca: Option<&Path>) -> Store {
    store_with(endpoint, target, ca, None).await
}

/// [`store`], asking the store to encrypt each object it writes with `encryption`.
pub async fn store_encrypting(endpoint: &str, target: &str, encryption: Encryption) -> Store {
    store_with(endpoint, target, None, Some(encryption)).await
}

async fn store_with(
    endpoint: &str,
    target: &str,
    ca: Option<&Path>,
    encryption: Option<Encryption>,
) -> Store {
    let settings = StoreSettings {
        endpoint: Some(endpoint.to_owned()),
        region: Some("us-east-1".into()),
        path_style: true,
        ca_file: ca.map(Path::to_owned),
        static_keys: Some((AWS_ENV[0].1.to_owned(), AWS_ENV[1].1.to_owned())),
        encryption,
    };
    let target: UploadTarget = target.parse().unwrap();
    Store::new(target, &settings).await.expect("a store client")
}

/// [`store`], with its bucket made.
pub async fn bucket(endpoint: &str, target: &str) -> Store {
    let s = store(endpoint, target).await;
    s.create_bucket().await.expect("make the bucket");
    s
}

/// A TCP forwarder to `to` on a port of its own, which the tests take down (its listener
/// closed and its connections reset: connection refused, as from a store that went away) and
/// bring back on the same port.
pub struct Forwarder {
    /// Where it listens while up.
    pub addr: SocketAddr,
    up: watch::Sender<bool>,
}

impl Forwarder {
    /// A forwarder to `to`, up.
    pub async fn start(to: SocketAddr) -> Forwarder {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (up, rx) = watch::channel(true);
        tokio::spawn(serve(Some(listener), addr, to, rx));
        Forwarder { addr, up }
    }

    /// `http://127.0.0.1:PORT`.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Takes it down: its listener closes and its connections are cut.
    pub fn down(&self) {
        self.up.send_replace(false);
    }

    /// Brings it back on the same port.
    pub fn up(&self) {
        self.up.send_replace(true);
    }
}

/// Accepts and forwards while `up` says so; closes everything while it does not.
async fn serve(
    mut listener: Option<TcpListener>,
    addr: SocketAddr,
    to: SocketAddr,
    mut up: watch::Receiver<bool>,
) {
    loop {
        let Some(l) = listener.take() else {
            // Down: wait to be brought back, then listen on the same port again.
            if up.wait_for(|up| *up).await.is_err() {
                return;
            }
            listener = Some(rebind(addr).await);
            continue;
        };
        let for_connections = up.clone();
        tokio::select! {
            accepted = l.accept() => {
                if let Ok((client, _)) = accepted {
                    tokio::spawn(forward(client, to, for_connections));
                }
                listener = Some(l);
            }
            changed = up.wait_for(|up| !*up) => {
                if changed.is_err() {
                    return;
                }
                drop(l);
            }
        }
    }
}

async fn rebind(addr: SocketAddr) -> TcpListener {
    // The old listener's port may linger a moment in the kernel.
    for _ in 0..100 {
        if let Ok(l) = TcpListener::bind(addr).await {
            return l;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("could not listen on {addr} again");
}

/// One connection, until either side closes or the forwarder goes down (then reset).
async fn forward(mut client: TcpStream, to: SocketAddr, mut up: watch::Receiver<bool>) {
    let Ok(mut server) = TcpStream::connect(to).await else {
        return;
    };
    tokio::select! {
        _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
        _ = up.wait_for(|up| !*up) => {
            // A reset, not a clean close: as a store that vanished.
            let _ = socket2::SockRef::from(&client).set_linger(Some(Duration::ZERO));
        }
    }
}
