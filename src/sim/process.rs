//! Real local processes for simulated containers: pipes, or a pseudo-terminal when `tty`.
//!
//! Every process leads its own process group (pipes) or session (pty), so the whole group can
//! be killed when its session ends.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;

use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::process::{Child, ChildStdin};

/// Terminal size before the first resize event (what a kubelet gives a fresh tty).
const DEFAULT_SIZE: (u16, u16) = (80, 24);
/// Ctrl-D: what the process sees when a tty session's stdin ends (a pty cannot be half-closed).
const VEOF: u8 = 0x04;

/// What to run.
#[derive(Debug, Clone)]
pub(crate) struct SpawnSpec {
    pub argv: Vec<String>,
    pub cwd: PathBuf,
    pub env: Vec<(String, String)>,
    pub stdin: bool,
    pub stdout: bool,
    pub stderr: bool,
    pub tty: bool,
    /// The terminal's size at start (columns, rows), when the client sent one in time.
    pub initial_size: Option<(u16, u16)>,
}

/// A started process and its plumbing.
pub(crate) struct Spawned {
    pub child: Child,
    /// Process group id (= pid) to kill.
    pub pgid: i32,
    pub stdin: Option<StdinSink>,
    pub stdout: Option<OutputSource>,
    pub stderr: Option<OutputSource>,
    pub pty: Option<Arc<Pty>>,
}

/// Where session stdin goes.
pub(crate) enum StdinSink {
    Pipe(ChildStdin),
    Pty(Arc<Pty>),
}

impl StdinSink {
    pub(crate) async fn write_all(&mut self, data: &[u8]) -> io::Result<()> {
        match self {
            StdinSink::Pipe(p) => {
                p.write_all(data).await?;
                p.flush().await
            }
            StdinSink::Pty(p) => p.write_all(data).await,
        }
    }

    /// End of input: closes the pipe, or types Ctrl-D on the terminal.
    pub(crate) async fn close(self) {
        match self {
            StdinSink::Pipe(mut p) => {
                let _ = p.shutdown().await;
            }
            StdinSink::Pty(p) => {
                let _ = p.write_all(&[VEOF]).await;
            }
        }
    }
}

/// Where process output comes from.
pub(crate) enum OutputSource {
    Pipe(Box<dyn AsyncRead + Send + Unpin>),
    Pty(Arc<Pty>),
}

impl OutputSource {
    /// Reads some bytes; `Ok(0)` is the end (for a pty: every slave descriptor closed).
    pub(crate) async fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            OutputSource::Pipe(r) => r.read(buf).await,
            OutputSource::Pty(p) => p.read(buf).await,
        }
    }
}

/// Starts the process. The error is the spawn error (e.g. `NotFound`).
pub(crate) fn spawn(spec: &SpawnSpec) -> io::Result<Spawned> {
    let (program, args) = spec
        .argv
        .split_first()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "empty command"))?;
    let mut cmd = tokio::process::Command::new(program);
    cmd.args(args)
        .current_dir(&spec.cwd)
        .envs(spec.env.iter().map(|(k, v)| (k, v)))
        .kill_on_drop(true);
    if spec.tty {
        let (cols, rows) = spec.initial_size.unwrap_or(DEFAULT_SIZE);
        let (pty, slave) = Pty::open(cols, rows)?;
        let term = std::env::var("TERM")
            .ok()
            .filter(|t| !t.is_empty())
            .unwrap_or_else(|| "xterm".into());
        cmd.env("TERM", term)
            .stdin(Stdio::from(slave.try_clone()?))
            .stdout(Stdio::from(slave.try_clone()?))
            .stderr(Stdio::from(slave));
        // SAFETY: only async-signal-safe calls between fork and exec. std has already
        // installed the slave as fds 0-2 when this runs.
        unsafe {
            cmd.pre_exec(|| {
                if libc::setsid() < 0 {
                    return Err(io::Error::last_os_error());
                }
                if libc::ioctl(0, libc::TIOCSCTTY as _, 0) < 0 {
                    return Err(io::Error::last_os_error());
                }
                Ok(())
            });
        }
        // `cmd` (and with it the parent's copies of the slave) is dropped at the end of this
        // function, so the master sees EIO once the process tree closes the terminal.
        let child = cmd.spawn()?;
        let pgid = child.id().map(|p| p as i32).unwrap_or(0);
        return Ok(Spawned {
            child,
            pgid,
            stdin: spec.stdin.then(|| StdinSink::Pty(pty.clone())),
            stdout: Some(OutputSource::Pty(pty.clone())),
            stderr: None,
            pty: Some(pty),
        });
    }
    let pipe_or_null = |on: bool| if on { Stdio::piped() } else { Stdio::null() };
    cmd.stdin(pipe_or_null(spec.stdin))
        .stdout(pipe_or_null(spec.stdout))
        .stderr(pipe_or_null(spec.stderr))
        .process_group(0);
    let mut child = cmd.spawn()?;
    let pgid = child.id().map(|p| p as i32).unwrap_or(0);
    let stdin = child.stdin.take().map(StdinSink::Pipe);
    let stdout = child
        .stdout
        .take()
        .map(|s| OutputSource::Pipe(Box::new(s) as Box<dyn AsyncRead + Send + Unpin>));
    let stderr = child
        .stderr
        .take()
        .map(|s| OutputSource::Pipe(Box::new(s) as Box<dyn AsyncRead + Send + Unpin>));
    Ok(Spawned {
        child,
        pgid,
        stdin,
        stdout,
        stderr,
        pty: None,
    })
}

/// SIGKILL to a whole process group (ignored if it is gone).
pub(crate) fn kill_group(pgid: i32) {
    if pgid > 1 {
        // SAFETY: plain syscall; a negative pid addresses the group.
        unsafe {
            libc::kill(-pgid, libc::SIGKILL);
        }
    }
}

/// The exit code a runtime reports: the status, or 128 + signal.
pub(crate) fn exit_code(status: std::process::ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(c), _) => c,
        (None, Some(sig)) => 128 + sig,
        (None, None) => 255,
    }
}

/// The non-blocking master side of a pseudo-terminal.
#[derive(Debug)]
pub(crate) struct Pty {
    master: AsyncFd<OwnedFd>,
}

impl Pty {
    /// Opens a pty pair; returns the master and the slave descriptor for the child.
    fn open(cols: u16, rows: u16) -> io::Result<(Arc<Pty>, OwnedFd)> {
        let mut master: libc::c_int = -1;
        let mut slave: libc::c_int = -1;
        let size = winsize(cols, rows);
        // SAFETY: out-pointers are valid; name and termios may be null.
        let rc = unsafe {
            libc::openpty(
                &mut master,
                &mut slave,
                std::ptr::null_mut(),
                std::ptr::null(),
                &size,
            )
        };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: openpty returned two fresh descriptors that we now own.
        let (master, slave) =
            unsafe { (OwnedFd::from_raw_fd(master), OwnedFd::from_raw_fd(slave)) };
        for fd in [master.as_raw_fd(), slave.as_raw_fd()] {
            // SAFETY: fcntl on descriptors we own.
            unsafe {
                libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC);
            }
        }
        // SAFETY: as above.
        unsafe {
            let flags = libc::fcntl(master.as_raw_fd(), libc::F_GETFL);
            if flags < 0
                || libc::fcntl(master.as_raw_fd(), libc::F_SETFL, flags | libc::O_NONBLOCK) < 0
            {
                return Err(io::Error::last_os_error());
            }
        }
        // SAFETY: an OwnedFd stays open and refers to the same file for its whole life, and the
        // AsyncFd owns it from now on.
        let master = unsafe { AsyncFd::register(master) }?;
        Ok((Arc::new(Pty { master }), slave))
    }

    /// Sets the terminal size; the kernel signals SIGWINCH to the foreground group.
    pub(crate) fn resize(&self, cols: u16, rows: u16) -> io::Result<()> {
        let size = winsize(cols, rows);
        // SAFETY: TIOCSWINSZ reads a winsize from a valid pointer.
        let rc = unsafe { libc::ioctl(self.master.as_raw_fd(), libc::TIOCSWINSZ, &size) };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    async fn read(&self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            let mut guard = self.master.readable().await?;
            let res = guard.try_io(|fd| {
                // SAFETY: buf is valid for buf.len() bytes.
                let n = unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
                if n < 0 {
                    Err(io::Error::last_os_error())
                } else {
                    Ok(n as usize)
                }
            });
            match res {
                Ok(Ok(n)) => return Ok(n),
                // EIO: the slave side is closed everywhere — the terminal's end of file.
                Ok(Err(e)) if e.raw_os_error() == Some(libc::EIO) => return Ok(0),
                Ok(Err(e)) if e.kind() == io::ErrorKind::Interrupted => continue,
                Ok(Err(e)) => return Err(e),
                Err(_would_block) => continue,
            }
        }
    }

    async fn write_all(&self, mut data: &[u8]) -> io::Result<()> {
        while !data.is_empty() {
            let mut guard = self.master.writable().await?;
            let res = guard.try_io(|fd| {
                // SAFETY: data is valid for data.len() bytes.
                let n = unsafe { libc::write(fd.as_raw_fd(), data.as_ptr().cast(), data.len()) };
                if n < 0 {
                    Err(io::Error::last_os_error())
                } else {
                    Ok(n as usize)
                }
            });
            match res {
                Ok(Ok(0)) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(Ok(n)) => data = &data[n..],
                Ok(Err(e)) if e.kind() == io::ErrorKind::Interrupted => continue,
                Ok(Err(e)) => return Err(e),
                Err(_would_block) => continue,
            }
        }
        Ok(())
    }
}

fn winsize(cols: u16, rows: u16) -> libc::winsize {
    libc::winsize {
        ws_row: rows,
        ws_col: cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    }
}
