//! Runs the real `kube-ws-proxy` binary, as users do, and finds its addresses in its JSON log.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The binary under test. KUBE_WS_PROXY_BIN: a copy of the binary, for a target directory
/// shared by worktrees (whose last build owns the uplifted binary, whichever worktree it came
/// from), or another build to compare with.
pub fn binary() -> std::ffi::OsString {
    std::env::var_os("KUBE_WS_PROXY_BIN")
        .unwrap_or_else(|| env!("CARGO_BIN_EXE_kube-ws-proxy").into())
}

/// Runs the binary with `args` until it exits (within 20 s, else it is killed): its exit
/// code and what it wrote to stderr.
pub fn run_to_exit(args: &[&str]) -> (Option<i32>, String) {
    run_to_exit_with_env(args, &[])
}

/// As [`run_to_exit`], with extra environment variables.
pub fn run_to_exit_with_env(args: &[&str], env: &[(&str, &str)]) -> (Option<i32>, String) {
    let mut child = Command::new(binary())
        .args(args)
        .envs(env.iter().copied())
        .env("RUST_LOG", "info")
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start kube-ws-proxy");
    let deadline = Instant::now() + Duration::from_secs(20);
    let code = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status.code();
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut stderr = String::new();
    use std::io::Read;
    let _ = child.stderr.take().unwrap().read_to_string(&mut stderr);
    (code, stderr)
}

/// A plain HTTP/1.1 GET of `target` (sent byte for byte) on `addr`: the status code and body.
pub fn http_get(addr: SocketAddr, target: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        s,
        "GET {target} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").expect("an HTTP response");
    let code = head.split_whitespace().nth(1).unwrap().parse().unwrap();
    (code, body.to_owned())
}

/// A running proxy process; killed on drop.
pub struct ProxyProcess {
    pub addr: SocketAddr,
    pub admin_addr: SocketAddr,
    child: Child,
    /// Every log line so far.
    pub logs: Arc<Mutex<Vec<String>>>,
}

impl Drop for ProxyProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl ProxyProcess {
    /// Starts the proxy in front of `upstream` with extra flags.
    pub fn start(upstream: &str, extra: &[&str]) -> ProxyProcess {
        let mut args = vec!["--upstream", upstream];
        args.extend_from_slice(extra);
        Self::launch(&args, &[])
    }

    /// Starts the proxy with exactly `args` (the upstream source among them) and extra
    /// environment variables; listeners on free loopback ports, JSON logs.
    pub fn launch(args: &[&str], env: &[(&str, &str)]) -> ProxyProcess {
        Self::launch_with_fd_limit(args, env, None)
    }

    /// As [`ProxyProcess::launch`], with at most `nofile` open descriptors (RLIMIT_NOFILE).
    pub fn launch_with_fd_limit(
        args: &[&str],
        env: &[(&str, &str)],
        nofile: Option<u64>,
    ) -> ProxyProcess {
        let mut command = Command::new(binary());
        if let Some(limit) = nofile {
            use std::os::unix::process::CommandExt;
            // SAFETY: setrlimit is async-signal-safe; nothing else runs between fork and exec.
            unsafe {
                command.pre_exec(move || {
                    let rl = libc::rlimit {
                        rlim_cur: limit,
                        rlim_max: limit,
                    };
                    if libc::setrlimit(libc::RLIMIT_NOFILE, &rl) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        let mut child = command
            .args([
                "--listen",
                "127.0.0.1:0",
                "--admin-listen",
                "127.0.0.1:0",
                "--log-format",
                "json",
            ])
            .args(args)
            .envs(env.iter().copied())
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start kube-ws-proxy");
        let stderr = child.stderr.take().unwrap();
        let logs = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        let sink = logs.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if line.contains("kube-ws-proxy ready") {
                    let _ = tx.send(line.clone());
                }
                sink.lock().unwrap().push(line);
            }
        });
        let ready = rx
            .recv_timeout(Duration::from_secs(20))
            .expect("kube-ws-proxy did not log that it is ready");
        let v: serde_json::Value = serde_json::from_str(&ready).expect("JSON log line");
        let field = |name: &str| -> SocketAddr {
            v["fields"][name]
                .as_str()
                .unwrap_or_else(|| panic!("no {name} in {ready}"))
                .parse()
                .unwrap()
        };
        ProxyProcess {
            addr: field("addr"),
            admin_addr: field("admin_addr"),
            child,
            logs,
        }
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Resident memory (VmRSS) and open descriptors of the process, from /proc.
    pub fn footprint(&self) -> (u64, usize) {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid())).unwrap();
        let kib: u64 = status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap();
        let fds = std::fs::read_dir(format!("/proc/{}/fd", self.pid()))
            .unwrap()
            .count();
        (kib * 1024, fds)
    }

    /// The admin listener's `/metrics` answer (status line, headers and body).
    pub fn metrics(&self) -> String {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(self.admin_addr).unwrap();
        write!(
            s,
            "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut answer = String::new();
        s.read_to_string(&mut answer).unwrap();
        answer
    }

    /// `http://addr`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Waits until a log line containing `needle` appears.
    pub fn wait_for_log(&self, needle: &str, timeout: Duration) -> Option<String> {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Some(l) = self
                .logs
                .lock()
                .unwrap()
                .iter()
                .find(|l| l.contains(needle))
            {
                return Some(l.clone());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        None
    }

    /// Sends SIGTERM (what the kubelet does when a pod stops).
    pub fn terminate(&self) {
        self.signal(libc::SIGTERM);
    }

    /// Sends SIGHUP (reload the config file).
    pub fn hangup(&self) {
        self.signal(libc::SIGHUP);
    }

    fn signal(&self, signal: libc::c_int) {
        // SAFETY: kill(2) on our own child's pid.
        unsafe {
            libc::kill(self.child.id() as libc::pid_t, signal);
        }
    }

    /// The value of the series `series` (`name` or `name{labels}`, as exposed) on `/metrics`.
    pub fn metric(&self, series: &str) -> Option<f64> {
        let (_, body) = http_get(self.admin_addr, "/metrics");
        body.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
    }

    /// Waits for the process to exit, returning its exit code.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<i32> {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status.code();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }

    /// Every log line so far.
    pub fn log_lines(&self) -> Vec<String> {
        self.logs.lock().unwrap().clone()
    }
}
