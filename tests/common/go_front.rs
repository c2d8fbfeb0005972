//! tests/interop/go_front: a Go `net/http` server built in the test run, reading requests as
//! kube-apiserver's HTTP stack does (decoded path, `url.ParseQuery`, first-value options).
//! `reads` answers each request with that reading; `front` is a reverse proxy acting on it.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Arc, Mutex, OnceLock};

use super::clients::in_ci;

/// The built program, once per test binary; `None` (skip, with a note) without Go outside CI.
pub fn binary() -> Option<&'static Path> {
    static BINARY: OnceLock<Option<PathBuf>> = OnceLock::new();
    BINARY.get_or_init(build).as_deref()
}

fn build() -> Option<PathBuf> {
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/interop/go_front");
    let out_dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("go_front");
    std::fs::create_dir_all(&out_dir).unwrap();
    // A per-process name: concurrent test binaries never write into one another's executable.
    let binary = out_dir.join(format!("go_front.{}", std::process::id()));
    let built = Command::new("go")
        .args(["build", "-o"])
        .arg(&binary)
        .arg(".")
        .current_dir(&source)
        .env("GO111MODULE", "off")
        .env("GOCACHE", out_dir.join("gocache"))
        .env("GOFLAGS", "")
        .env("GOPROXY", "off")
        .env("GOTOOLCHAIN", "local")
        .output();
    match built {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            assert!(!in_ci(), "go not found (required because CI is set)");
            eprintln!("note: skipping: go not found");
            None
        }
        Err(e) => panic!("running go: {e}"),
        Ok(o) if !o.status.success() => panic!(
            "building go_front failed:\n{}",
            String::from_utf8_lossy(&o.stderr)
        ),
        Ok(_) => Some(binary),
    }
}

/// A running go_front; it exits when its stdin closes (when this is dropped).
pub struct GoFront {
    pub addr: SocketAddr,
    /// In `front` mode, what it read of each request so far (one JSON object each).
    pub readings: Arc<Mutex<Vec<serde_json::Value>>>,
    _stdin: ChildStdin,
    child: Child,
}

impl Drop for GoFront {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl GoFront {
    /// Starts `binary` with `args` (`["reads"]` or `["front", "127.0.0.1:PORT"]`).
    pub fn start(binary: &Path, args: &[&str]) -> GoFront {
        let mut child = Command::new(binary)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start go_front");
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        let readings = Arc::new(Mutex::new(Vec::new()));
        let sink = readings.clone();
        std::thread::spawn(move || {
            for line in out.lines().map_while(Result::ok) {
                if let Ok(v) = serde_json::from_str(&line) {
                    sink.lock().unwrap().push(v);
                }
            }
        });
        GoFront {
            addr: line.trim().parse().expect("go_front prints its address"),
            readings,
            _stdin: child.stdin.take().unwrap(),
            child,
        }
    }
}
