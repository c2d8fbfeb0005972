//! The container side of exec and attach, independent of the transport: bounded channels in,
//! bounded channels out, a Status at the end (or nothing if the session was cancelled).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::{broadcast, mpsc, watch};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::identity::SimIdentity;
use super::process::{self, OutputSource, SpawnSpec, StdinSink};
use super::status::Status;
use super::{Inner, SessionKind, SimEvent};

/// Size of one read from a process (the kubelet's copy buffer).
pub(crate) const CHUNK: usize = 32 * 1024;
/// Chunks that may wait between a process and its transport.
pub(crate) const CHANNEL_DEPTH: usize = 8;
/// After the process exits, how long its output may still drain (a background child can hold
/// the pipe open forever).
const DRAIN_AFTER_EXIT: Duration = Duration::from_secs(2);
/// How long a tty exec waits for the client's first terminal size before starting the command.
const INITIAL_SIZE_WAIT: Duration = Duration::from_secs(1);
/// Attach: once the session's stdin has ended, the session ends after this long without output.
const ATTACH_LINGER: Duration = Duration::from_millis(300);
/// The program every attach target runs.
const ATTACH_SCRIPT: &str = r#"while IFS= read -r l; do echo "attached: $l"; done"#;

/// What one exec/attach request asks for.
#[derive(Debug, Clone)]
pub(crate) struct Target {
    pub kind: SessionKind,
    pub namespace: String,
    pub pod: String,
    pub container: String,
    pub command: Vec<String>,
    pub stdin: bool,
    pub stdout: bool,
    pub stderr: bool,
    pub tty: bool,
    /// A `dying-*` pod: the transport drops the connection after the first output.
    pub dying: bool,
    /// Who the request acted as; exec'd processes see it as `SIM_USER` / `SIM_GROUPS`.
    pub user: SimIdentity,
}

/// The transport's ends of the session streams. A closed `stdin` channel is end of input.
#[derive(Default)]
pub(crate) struct ExecIo {
    pub stdin: Option<mpsc::Receiver<Bytes>>,
    pub stdout: Option<mpsc::Sender<Bytes>>,
    pub stderr: Option<mpsc::Sender<Bytes>>,
    pub resize: Option<mpsc::Receiver<(u16, u16)>>,
}

/// Runs the session's container side. Returns the status to report, or `None` when `cancel`
/// fired first (client gone, dying pod, shutdown); the process group is killed either way.
pub(crate) async fn run(
    inner: &Arc<Inner>,
    session: u64,
    target: &Target,
    io: ExecIo,
    cancel: &CancellationToken,
) -> Option<Status> {
    match target.kind {
        SessionKind::Attach => attach(inner, session, target, io, cancel).await,
        _ => exec(inner, session, target, io, cancel).await,
    }
}

fn env_for(inner: &Inner, target: &Target) -> Vec<(String, String)> {
    vec![
        ("POD_NAME".into(), target.pod.clone()),
        ("POD_NAMESPACE".into(), target.namespace.clone()),
        ("CONTAINER_NAME".into(), target.container.clone()),
        (
            "PWD".into(),
            inner
                .pod_dir(&target.namespace, &target.pod)
                .display()
                .to_string(),
        ),
    ]
}

/// The pod's environment plus who asked: the container's main process (attach) was not
/// started by this caller, so only exec'd processes get `SIM_USER` and `SIM_GROUPS`.
fn exec_env(inner: &Inner, target: &Target) -> Vec<(String, String)> {
    let mut env = env_for(inner, target);
    env.push(("SIM_USER".into(), target.user.name.clone()));
    env.push(("SIM_GROUPS".into(), target.user.groups.join(",")));
    env
}

/// Waits what a container runtime takes to start a process: a random time between half of
/// `delay` and `delay` (none when it is zero).
async fn start_delay(delay: Duration) {
    if delay.is_zero() {
        return;
    }
    let half = delay / 2;
    let spread = u64::try_from((delay - half).as_micros()).unwrap_or(u64::MAX);
    let jitter = getrandom::u64().unwrap_or(0) % spread.saturating_add(1);
    tokio::time::sleep(half + Duration::from_micros(jitter)).await;
}

/// An exec: start the command, wire it to the session, wait for it to exit, let its output
/// drain, and report how it ended.
async fn exec(
    inner: &Arc<Inner>,
    session: u64,
    target: &Target,
    mut io: ExecIo,
    cancel: &CancellationToken,
) -> Option<Status> {
    let initial_size = initial_size(target, &mut io).await;
    start_delay(inner.config.exec_start_delay).await;
    let mut spawned = match spawn_command(inner, session, target, &io, initial_size).await {
        Ok(spawned) => spawned,
        Err(status) => return Some(status),
    };
    let pgid = spawned.pgid;
    let mut pumps = Pumps::start(inner, session, &mut spawned, io);
    let status = tokio::select! {
        s = spawned.child.wait() => s,
        _ = cancel.cancelled() => {
            // Its input closes first (the aborted pump drops its end), then it is killed.
            pumps.abort();
            process::kill_group(pgid);
            let _ = spawned.child.kill().await;
            inner.event(SimEvent::ProcessExited { session, exit_code: None });
            return None;
        }
    };
    let code = match status {
        Ok(s) => process::exit_code(s),
        Err(_) => 255,
    };
    let cancelled = pumps.drain(cancel).await;
    process::kill_group(pgid);
    pumps.abort();
    inner.event(SimEvent::ProcessExited {
        session,
        exit_code: Some(code),
    });
    if cancelled {
        return None;
    }
    Some(if code == 0 {
        Status::success()
    } else {
        Status::non_zero_exit(&target.command, code)
    })
}

/// A command run to its end, as the kubelet's `run` runs it: its stdout, then its stderr; or
/// why it could not start.
pub(crate) async fn run_to_end(inner: &Arc<Inner>, target: &Target) -> Result<Vec<u8>, String> {
    let cwd = inner.pod_dir(&target.namespace, &target.pod);
    tokio::fs::create_dir_all(&cwd)
        .await
        .map_err(|e| format!("cannot prepare pod directory: {e}"))?;
    let Some((program, args)) = target.command.split_first() else {
        return Err("empty command".into());
    };
    let out = tokio::process::Command::new(program)
        .args(args)
        .current_dir(&cwd)
        .envs(exec_env(inner, target))
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output()
        .await
        .map_err(|e| start_failure(&target.command, &e))?;
    let mut data = out.stdout;
    data.extend_from_slice(&out.stderr);
    Ok(data)
}

/// A runtime applies the client's first size before the process reads it: kubectl sends it
/// right after the streams open, so a tty exec waits briefly for it instead of racing the
/// command.
async fn initial_size(target: &Target, io: &mut ExecIo) -> Option<(u16, u16)> {
    let (true, Some(rx)) = (target.tty, io.resize.as_mut()) else {
        return None;
    };
    match tokio::time::timeout(INITIAL_SIZE_WAIT, rx.recv()).await {
        Ok(Some((w, h))) => (w > 0 && h > 0).then_some((w, h)),
        _ => None,
    }
}

/// Starts the command in the pod's directory, with the streams the session has; a failure
/// is the Status to report.
async fn spawn_command(
    inner: &Arc<Inner>,
    session: u64,
    target: &Target,
    io: &ExecIo,
    initial_size: Option<(u16, u16)>,
) -> Result<process::Spawned, Status> {
    let cwd = inner.pod_dir(&target.namespace, &target.pod);
    if let Err(e) = tokio::fs::create_dir_all(&cwd).await {
        return Err(Status::internal_error(&format!(
            "error executing command in container: cannot prepare pod directory: {e}"
        )));
    }
    let spec = SpawnSpec {
        argv: target.command.clone(),
        cwd,
        env: exec_env(inner, target),
        stdin: io.stdin.is_some(),
        stdout: io.stdout.is_some(),
        stderr: io.stderr.is_some() && !target.tty,
        tty: target.tty,
        initial_size,
    };
    let spawned = match process::spawn(&spec) {
        Ok(s) => s,
        Err(e) => {
            inner.event(SimEvent::ProcessExited {
                session,
                exit_code: None,
            });
            return Err(Status::internal_error(&start_failure(&target.command, &e)));
        }
    };
    inner.event(SimEvent::ProcessStarted {
        session,
        container: target.container.clone(),
        command: target.command.clone(),
        tty: target.tty,
    });
    Ok(spawned)
}

/// The tasks between a process and its session.
struct Pumps {
    /// Stdin and resize.
    helpers: Vec<JoinHandle<()>>,
    /// Stdout and stderr, which may drain after the process exits.
    outputs: Vec<JoinHandle<()>>,
}

impl Pumps {
    /// Connects the process's pipes (or terminal) to the session's channels.
    fn start(inner: &Arc<Inner>, session: u64, spawned: &mut process::Spawned, io: ExecIo) -> Self {
        let mut helpers: Vec<JoinHandle<()>> = Vec::new();
        let mut outputs: Vec<JoinHandle<()>> = Vec::new();
        if let Some(src) = spawned.stdout.take() {
            outputs.push(tokio::spawn(pump_out(src, io.stdout.clone())));
        }
        if let Some(src) = spawned.stderr.take() {
            outputs.push(tokio::spawn(pump_out(src, io.stderr.clone())));
        }
        drop(io.stdout);
        drop(io.stderr);
        if let Some(rx) = io.stdin {
            helpers.push(tokio::spawn(pump_in(
                rx,
                spawned.stdin.take(),
                inner.clone(),
                session,
            )));
        }
        if let Some(rx) = io.resize {
            helpers.push(tokio::spawn(pump_resize(rx, spawned.pty.clone())));
        }
        Pumps { helpers, outputs }
    }

    /// Lets the output drain, bounded: grandchildren may keep the pipes or the terminal open.
    /// Returns whether `cancel` fired first.
    async fn drain(&mut self, cancel: &CancellationToken) -> bool {
        let drain = async {
            for h in self.outputs.iter_mut() {
                let _ = h.await;
            }
        };
        tokio::select! {
            _ = tokio::time::timeout(DRAIN_AFTER_EXIT, drain) => false,
            _ = cancel.cancelled() => true,
        }
    }

    fn abort(&self) {
        for h in self.helpers.iter().chain(&self.outputs) {
            h.abort();
        }
    }
}

/// Session terminal sizes → the process's terminal.
async fn pump_resize(mut rx: mpsc::Receiver<(u16, u16)>, pty: Option<Arc<process::Pty>>) {
    while let Some((w, h)) = rx.recv().await {
        // The kubelet ignores sizes with a zero dimension.
        if let (Some(pty), true) = (&pty, w > 0 && h > 0) {
            let _ = pty.resize(w, h);
        }
    }
}

/// containerd + runc's wording when the command cannot be started.
fn start_failure(argv: &[String], e: &std::io::Error) -> String {
    let cmd = argv.first().map(String::as_str).unwrap_or("");
    let cause = match e.kind() {
        std::io::ErrorKind::NotFound if !cmd.contains('/') => {
            format!("exec: \"{cmd}\": executable file not found in $PATH")
        }
        std::io::ErrorKind::NotFound => {
            format!("exec: \"{cmd}\": stat {cmd}: no such file or directory")
        }
        std::io::ErrorKind::PermissionDenied => format!("exec: \"{cmd}\": permission denied"),
        _ => format!("exec: \"{cmd}\": {e}"),
    };
    format!(
        "error executing command in container: failed to exec in container: failed to start exec \"sim\": OCI runtime exec failed: exec failed: unable to start container process: {cause}: unknown"
    )
}

/// Copies one process output to its channel. If the transport stops listening the output is
/// still drained, so the process never blocks on a full pipe.
async fn pump_out(mut src: OutputSource, mut tx: Option<mpsc::Sender<Bytes>>) {
    let mut buf = vec![0u8; CHUNK];
    loop {
        match src.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if let Some(t) = &tx {
                    if t.send(Bytes::copy_from_slice(&buf[..n])).await.is_err() {
                        tx = None;
                    }
                }
            }
        }
    }
}

/// Session stdin → process stdin; end of the channel → end of input for the process.
async fn pump_in(
    mut rx: mpsc::Receiver<Bytes>,
    sink: Option<StdinSink>,
    inner: Arc<Inner>,
    session: u64,
) {
    let mut stdin = ProcessStdin {
        sink,
        inner,
        session,
    };
    while let Some(chunk) = rx.recv().await {
        if let Some(s) = stdin.sink.as_mut() {
            if s.write_all(&chunk).await.is_err() {
                // The process no longer reads stdin; keep consuming so the session is not stuck.
                stdin.sink = None;
            }
        }
    }
    if let Some(s) = stdin.sink.take() {
        s.close().await;
    }
}

/// The process's end of a session's stdin. However the pump ends (the session's stdin ended,
/// or the session was cancelled when its connection went, aborting the pump), dropping it
/// closes the process's input and says so: a connection cut right after the stdin stream's end
/// must not hide that end from tests that wait for it.
struct ProcessStdin {
    sink: Option<StdinSink>,
    inner: Arc<Inner>,
    session: u64,
}

impl Drop for ProcessStdin {
    fn drop(&mut self) {
        // A pipe closes with its end. A terminal's input has no end of its own (its master
        // stays the session's): a cancelled session's process is killed right after.
        drop(self.sink.take());
        let session = self.session;
        self.inner.event(SimEvent::StdinClosed { session });
    }
}

/// A long-running attach target.
pub(crate) struct AttachProc {
    stdin: mpsc::Sender<Bytes>,
    /// (is_stderr, bytes) as the process writes them.
    output: broadcast::Sender<(bool, Bytes)>,
    exit: watch::Receiver<Option<i32>>,
    argv: Vec<String>,
}

impl AttachProc {
    fn alive(&self) -> bool {
        self.exit.borrow().is_none()
    }
}

impl Inner {
    /// Whether every attach target has exited (used while shutting down).
    pub(crate) fn attach_all_gone(&self) -> bool {
        self.attach
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .all(|p| !p.alive())
    }

    fn attach_proc(self: &Arc<Self>, target: &Target) -> std::io::Result<Arc<AttachProc>> {
        let key = (
            target.namespace.clone(),
            target.pod.clone(),
            target.container.clone(),
        );
        let mut map = self.attach.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(p) = map.get(&key) {
            if p.alive() {
                return Ok(p.clone());
            }
        }
        let cwd = self.pod_dir(&target.namespace, &target.pod);
        std::fs::create_dir_all(&cwd)?;
        let argv: Vec<String> = vec!["sh".into(), "-c".into(), ATTACH_SCRIPT.into()];
        let spec = SpawnSpec {
            argv: argv.clone(),
            cwd,
            env: env_for(self, target),
            stdin: true,
            stdout: true,
            stderr: true,
            tty: false,
            initial_size: None,
        };
        let mut spawned = process::spawn(&spec)?;
        let (stdin_tx, mut stdin_rx) = mpsc::channel::<Bytes>(CHANNEL_DEPTH);
        let (out_tx, _) = broadcast::channel(64);
        let (exit_tx, exit_rx) = watch::channel(None);
        let shutdown = self.shutdown.clone();
        if let Some(mut sink) = spawned.stdin.take() {
            tokio::spawn(async move {
                while let Some(chunk) = stdin_rx.recv().await {
                    if sink.write_all(&chunk).await.is_err() {
                        break;
                    }
                }
            });
        }
        for (is_err, src) in [
            (false, spawned.stdout.take()),
            (true, spawned.stderr.take()),
        ] {
            if let Some(mut src) = src {
                let out_tx = out_tx.clone();
                tokio::spawn(async move {
                    let mut buf = vec![0u8; CHUNK];
                    while let Ok(n @ 1..) = src.read(&mut buf).await {
                        let _ = out_tx.send((is_err, Bytes::copy_from_slice(&buf[..n])));
                    }
                });
            }
        }
        let mut child = spawned.child;
        let pgid = spawned.pgid;
        tokio::spawn(async move {
            let code = tokio::select! {
                s = child.wait() => s.map(process::exit_code).unwrap_or(255),
                _ = shutdown.cancelled() => {
                    process::kill_group(pgid);
                    let _ = child.kill().await;
                    137
                }
            };
            process::kill_group(pgid);
            let _ = exit_tx.send(Some(code));
        });
        let proc = Arc::new(AttachProc {
            stdin: stdin_tx,
            output: out_tx,
            exit: exit_rx,
            argv,
        });
        map.insert(key, proc.clone());
        Ok(proc)
    }
}

async fn attach(
    inner: &Arc<Inner>,
    session: u64,
    target: &Target,
    io: ExecIo,
    cancel: &CancellationToken,
) -> Option<Status> {
    let proc = match inner.attach_proc(target) {
        Ok(p) => p,
        Err(e) => {
            return Some(Status::internal_error(&format!(
                "error attaching to container: {e}"
            )))
        }
    };
    let mut output = proc.output.subscribe();
    let mut exit = proc.exit.clone();
    inner.event(SimEvent::ProcessStarted {
        session,
        container: target.container.clone(),
        command: proc.argv.clone(),
        tty: target.tty,
    });
    let ExecIo {
        mut stdin,
        stdout,
        stderr,
        mut resize,
    } = io;
    let mut linger: Option<tokio::time::Instant> = None;
    let status = loop {
        let linger_at = linger;
        tokio::select! {
            _ = cancel.cancelled() => return None,
            changed = exit.changed() => {
                let code = if changed.is_ok() { (*exit.borrow()).unwrap_or(0) } else { 0 };
                break if code == 0 { Status::success() } else { Status::non_zero_exit(&proc.argv, code) };
            }
            msg = output.recv() => match msg {
                Ok((is_err, data)) => {
                    // With a tty the container has no separate stderr: it all goes to stdout.
                    let tx = if is_err && !target.tty { &stderr } else { &stdout };
                    if let Some(tx) = tx {
                        let _ = tx.send(data).await;
                    }
                    if let Some(l) = linger.as_mut() {
                        *l = tokio::time::Instant::now() + ATTACH_LINGER;
                    }
                }
                Err(broadcast::error::RecvError::Lagged(_)) => {}
                Err(broadcast::error::RecvError::Closed) => break Status::success(),
            },
            chunk = recv_opt(&mut stdin) => match chunk {
                Some(data) => {
                    let _ = proc.stdin.send(data).await;
                }
                None => {
                    stdin = None;
                    inner.event(SimEvent::StdinClosed { session });
                    linger = Some(tokio::time::Instant::now() + ATTACH_LINGER);
                }
            },
            size = recv_opt(&mut resize) => if size.is_none() { resize = None },
            _ = sleep_opt(linger_at) => break Status::success(),
        }
    };
    Some(status)
}

/// Receives from an optional channel; pending forever when there is none.
async fn recv_opt<T>(rx: &mut Option<mpsc::Receiver<T>>) -> Option<T> {
    match rx {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    }
}

async fn sleep_opt(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
