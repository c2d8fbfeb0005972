//! Headless Chromium showing one page, with a fresh profile; killed (with every process it
//! started) on drop.

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};

/// A running headless Chromium.
pub struct Browser {
    child: Child,
    profile: tempfile::TempDir,
}

impl Browser {
    /// Starts `chromium` on `url`.
    pub fn open(chromium: &Path, url: &str) -> Browser {
        Self::open_with(chromium, url, &[])
    }

    /// Starts `chromium` on `url` with extra command-line flags.
    pub fn open_with(chromium: &Path, url: &str, flags: &[&str]) -> Browser {
        let profile = tempfile::tempdir().unwrap();
        let stderr = std::fs::File::create(profile.path().join("stderr.log")).unwrap();
        let child = Command::new(chromium)
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
            ])
            .arg(format!(
                "--user-data-dir={}",
                profile.path().join("profile").display()
            ))
            .args(flags)
            .arg(url)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            // Its own process group, so that the renderer and helper processes go with it.
            .process_group(0)
            .spawn()
            .unwrap_or_else(|e| panic!("start {}: {e}", chromium.display()));
        Browser { child, profile }
    }

    /// What Chromium wrote to stderr so far (for failure messages).
    pub fn stderr(&self) -> String {
        std::fs::read_to_string(self.profile.path().join("stderr.log")).unwrap_or_default()
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        // SIGKILL to the whole group while the leader is still unreaped, so the group id
        // cannot belong to anything else; the profile is thrown away, so nothing needs a
        // graceful exit.
        // SAFETY: kill(2) on the process group of our own child.
        unsafe {
            libc::kill(-(self.child.id() as libc::pid_t), libc::SIGKILL);
        }
        let _ = self.child.wait();
    }
}
