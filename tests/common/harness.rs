//! One end-to-end setup: the simulated SPDY-only cluster, the real proxy binary in front of it,
//! and the SPDY-dropping middlebox in front of the proxy, with a kubeconfig for each entry point.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use kube_ws_proxy::sim::{SimCluster, SimConfig};

use super::middlebox::Middlebox;
use super::proxy_process::ProxyProcess;

pub struct Harness {
    pub sim: SimCluster,
    pub proxy: ProxyProcess,
    pub middlebox: Middlebox,
    pub dir: tempfile::TempDir,
    /// Kubeconfig through the middlebox (the users' gateway): WebSocket only.
    pub via_gateway: PathBuf,
    /// Kubeconfig straight to the proxy (SPDY clients).
    pub direct: PathBuf,
}

impl Harness {
    pub async fn start() -> Harness {
        Self::start_with(SimConfig::default(), &[]).await
    }

    pub async fn start_with(sim_config: SimConfig, proxy_flags: &[&str]) -> Harness {
        Self::start_with_env(sim_config, proxy_flags, &[]).await
    }

    /// [`Harness::start_with`], the proxy given extra environment variables too (a setting
    /// an older binary ignores, where a flag would stop it from starting).
    pub async fn start_with_env(
        sim_config: SimConfig,
        proxy_flags: &[&str],
        proxy_env: &[(&str, &str)],
    ) -> Harness {
        let token = sim_config.require_bearer_token.clone();
        let sim = SimCluster::start(sim_config)
            .await
            .expect("start sim cluster");
        let url = sim.url();
        let mut args = vec!["--upstream", url.as_str()];
        args.extend_from_slice(proxy_flags);
        let proxy = ProxyProcess::launch(&args, proxy_env);
        let middlebox = Middlebox::start(proxy.addr).await;
        let dir = tempfile::tempdir().unwrap();
        let gw_dir = dir.path().join("gateway");
        let direct_dir = dir.path().join("direct");
        std::fs::create_dir_all(&gw_dir).unwrap();
        std::fs::create_dir_all(&direct_dir).unwrap();
        let via_gateway = super::clients::write_kubeconfig(
            &gw_dir,
            &format!("http://{}", middlebox.addr),
            token.as_deref(),
        );
        let direct = super::clients::write_kubeconfig(&direct_dir, &proxy.url(), token.as_deref());
        Harness {
            sim,
            proxy,
            middlebox,
            dir,
            via_gateway,
            direct,
        }
    }

    /// A kubectl command with `--kubeconfig`, isolated from the user's environment.
    pub fn kubectl(&self, bin: &Path, kubeconfig: &Path) -> Command {
        let mut cmd = Command::new(bin);
        cmd.arg("--kubeconfig")
            .arg(kubeconfig)
            .env_remove("KUBECTL_REMOTE_COMMAND_WEBSOCKETS")
            .env_remove("KUBECTL_PORT_FORWARD_WEBSOCKETS")
            .env_remove("KUBECONFIG")
            .env("HOME", self.dir.path());
        cmd
    }
}

/// Runs `cmd` with `stdin` bytes, returning its output; kills it after `timeout`.
pub async fn run(mut cmd: Command, stdin: Option<Vec<u8>>, timeout: Duration) -> Output {
    cmd.stdin(if stdin.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    })
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    let mut cmd = tokio::process::Command::from(cmd);
    cmd.kill_on_drop(true);
    let mut child = cmd.spawn().expect("spawn");
    if let Some(input) = stdin {
        let mut w = child.stdin.take().unwrap();
        tokio::spawn(async move {
            use tokio::io::AsyncWriteExt;
            let _ = w.write_all(&input).await;
            let _ = w.shutdown().await;
        });
    }
    tokio::time::timeout(timeout, child.wait_with_output())
        .await
        .expect("command timed out")
        .expect("wait for command")
}

/// stdout as text, for assertions.
pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// stderr as text, for assertions.
pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// sha256 of a byte slice, hex.
pub fn sha256_hex(data: &[u8]) -> String {
    use sha2::Digest;
    let d = sha2::Sha256::digest(data);
    d.iter().map(|b| format!("{b:02x}")).collect()
}

/// A file of `len` deterministic pseudo-random bytes.
pub fn random_file(path: &Path, len: usize, seed: u64) -> String {
    let mut state = seed | 1;
    let mut data = vec![0u8; len];
    for chunk in data.chunks_mut(8) {
        // xorshift64*: fast and incompressible enough for transfer tests.
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        let v = state.wrapping_mul(0x2545_F491_4F6C_DD1D).to_le_bytes();
        chunk.copy_from_slice(&v[..chunk.len()]);
    }
    std::fs::write(path, &data).unwrap();
    sha256_hex(&data)
}
