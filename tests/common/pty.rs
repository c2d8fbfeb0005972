//! Runs a program on a pseudo-terminal of a given size (for `kubectl exec -it`).

use std::io::{Read, Write};
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// Output and exit status of a program run on a pty.
pub struct PtyRun {
    pub output: String,
    pub status: ExitStatus,
}

/// One step of what happens at the terminal.
#[derive(Debug, Clone, Copy)]
pub enum PtyStep<'a> {
    Wait(Duration),
    Type(&'a [u8]),
    /// The window changes size (the program gets SIGWINCH, as from a terminal emulator).
    Resize(u16, u16),
}

/// Runs `cmd` with its stdio on a new pty of `cols`×`rows`; `input` is typed after `delay`.
pub fn run_on_pty(
    cmd: Command,
    cols: u16,
    rows: u16,
    input: &[u8],
    delay: Duration,
    timeout: Duration,
) -> PtyRun {
    run_script_on_pty(
        cmd,
        cols,
        rows,
        &[PtyStep::Wait(delay), PtyStep::Type(input)],
        timeout,
    )
}

/// Runs `cmd` on a new pty of `cols`×`rows`, going through `steps` at the terminal.
pub fn run_script_on_pty(
    mut cmd: Command,
    cols: u16,
    rows: u16,
    steps: &[PtyStep],
    timeout: Duration,
) -> PtyRun {
    let mut master: libc::c_int = -1;
    let mut slave: libc::c_int = -1;
    let ws = libc::winsize {
        ws_row: rows,
        ws_col: cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: openpty writes two descriptors into valid pointers; the winsize is read only.
    let rc = unsafe {
        libc::openpty(
            &mut master,
            &mut slave,
            std::ptr::null_mut(),
            std::ptr::null(),
            &ws,
        )
    };
    assert_eq!(rc, 0, "openpty failed");
    // SAFETY: both descriptors were just created and are owned here.
    let master = unsafe { OwnedFd::from_raw_fd(master) };
    let slave = unsafe { OwnedFd::from_raw_fd(slave) };
    let slave_fd = {
        use std::os::fd::AsRawFd;
        slave.as_raw_fd()
    };
    cmd.stdin(Stdio::from(slave.try_clone().unwrap()))
        .stdout(Stdio::from(slave.try_clone().unwrap()))
        .stderr(Stdio::from(slave.try_clone().unwrap()));
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            if libc::setsid() < 0 {
                return Err(std::io::Error::last_os_error());
            }
            if libc::ioctl(slave_fd, libc::TIOCSCTTY as _, 0) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn().expect("spawn on pty");
    // The command keeps its copies of the slave open; the reader only sees EIO once all are
    // closed.
    drop(cmd);
    drop(slave);
    let mut reader = std::fs::File::from(master.try_clone().unwrap());
    let mut writer = std::fs::File::from(master);
    let out = std::thread::spawn(move || {
        let mut all = Vec::new();
        let mut buf = [0u8; 4096];
        // EIO once every slave descriptor is closed, i.e. the program ended.
        while let Ok(n) = reader.read(&mut buf) {
            if n == 0 {
                break;
            }
            all.extend_from_slice(&buf[..n]);
        }
        all
    });
    for step in steps {
        match *step {
            PtyStep::Wait(d) => std::thread::sleep(d),
            PtyStep::Type(input) => {
                let _ = writer.write_all(input);
            }
            PtyStep::Resize(cols, rows) => {
                use std::os::fd::AsRawFd;
                let ws = libc::winsize {
                    ws_row: rows,
                    ws_col: cols,
                    ws_xpixel: 0,
                    ws_ypixel: 0,
                };
                // SAFETY: TIOCSWINSZ reads a valid winsize; the kernel signals the foreground
                // process group of the pty (SIGWINCH).
                let rc = unsafe { libc::ioctl(writer.as_raw_fd(), libc::TIOCSWINSZ as _, &ws) };
                assert_eq!(rc, 0, "TIOCSWINSZ failed");
            }
        }
    }
    let deadline = Instant::now() + timeout;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            break child.wait().unwrap();
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    drop(writer);
    let output = out.join().unwrap_or_default();
    PtyRun {
        output: String::from_utf8_lossy(&output).into_owned(),
        status,
    }
}
