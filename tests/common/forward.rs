//! A running `kubectl port-forward` started from any command (harness, direct, gateway), and
//! an echo through it.

use std::collections::HashMap;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

use super::pod_server::{send_pattern, verify_pattern};

/// A running `kubectl port-forward`; killed when dropped.
pub struct Forward {
    child: tokio::process::Child,
    /// Remote (pod) port → local port; empty when it did not start.
    local: HashMap<u16, u16>,
    stderr: Arc<Mutex<String>>,
}

impl Forward {
    /// Runs `cmd` (a kubectl with its kubeconfig) as `port-forward pod/<pod> :<remote>...` and
    /// waits (up to 30 s) until every port is listening or kubectl exited.
    pub async fn start(mut cmd: Command, pod: &str, remote: &[u16]) -> Forward {
        cmd.args([
            "port-forward",
            "--address",
            "127.0.0.1",
            &format!("pod/{pod}"),
        ]);
        cmd.args(remote.iter().map(|p| format!(":{p}")));
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut cmd = tokio::process::Command::from(cmd);
        cmd.kill_on_drop(true);
        let mut child = cmd.spawn().expect("spawn kubectl port-forward");
        let stderr = Arc::new(Mutex::new(String::new()));
        let mut err_lines = BufReader::new(child.stderr.take().unwrap()).lines();
        let sink = stderr.clone();
        tokio::spawn(async move {
            while let Ok(Some(line)) = err_lines.next_line().await {
                let mut s = sink.lock().unwrap();
                s.push_str(&line);
                s.push('\n');
            }
        });
        let mut out = BufReader::new(child.stdout.take().unwrap()).lines();
        let mut local = HashMap::new();
        let wait = async {
            while local.len() < remote.len() {
                let Ok(Some(line)) = out.next_line().await else {
                    break;
                };
                // "Forwarding from 127.0.0.1:40123 -> 8080"
                if let Some(rest) = line.strip_prefix("Forwarding from 127.0.0.1:") {
                    let (l, r) = rest.split_once(" -> ").expect("forwarding line");
                    local.insert(r.trim().parse().unwrap(), l.trim().parse().unwrap());
                }
            }
        };
        let _ = tokio::time::timeout(Duration::from_secs(30), wait).await;
        tokio::spawn(async move { while let Ok(Some(_)) = out.next_line().await {} });
        Forward {
            child,
            local,
            stderr,
        }
    }

    /// Whether every requested port is listening.
    pub fn ready(&self) -> bool {
        !self.local.is_empty()
    }

    /// The local port for a pod port.
    pub fn port(&self, remote: u16) -> u16 {
        self.local[&remote]
    }

    /// What kubectl wrote to stderr so far.
    pub fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// Waits (bounded) for kubectl to exit; how it exited, if it did.
    pub async fn exit_status(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        tokio::time::timeout(timeout, self.child.wait())
            .await
            .ok()
            .map(|s| s.expect("kubectl's exit"))
    }

    /// What kubectl wrote to stderr, once `done` says it is all there (kubectl's stderr is
    /// read by a background task: its last line may land after its exit), or after 10 s.
    pub async fn stderr_once(&self, done: impl Fn(&str) -> bool) -> String {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while !done(&self.stderr()) && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        self.stderr()
    }

    /// Waits (bounded) for kubectl to exit; whether it did.
    pub async fn exited(&mut self, timeout: Duration) -> bool {
        tokio::time::timeout(timeout, self.child.wait())
            .await
            .is_ok()
    }
}

/// Echoes `len` pattern bytes through a forwarded port of a [`super::pod_server::PodServer`]
/// (`commands` flavour) and checks them.
pub async fn echo(port: u16, len: u64) {
    let s = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    s.set_nodelay(true).unwrap();
    let (mut r, mut w) = s.into_split();
    let writer = tokio::spawn(async move {
        w.write_u8(b'E').await.unwrap();
        send_pattern(&mut w, len).await.unwrap();
        w.shutdown().await.unwrap();
    });
    assert_eq!(
        verify_pattern(&mut r, len).await.unwrap(),
        None,
        "echo of {len} bytes"
    );
    writer.await.unwrap();
}
