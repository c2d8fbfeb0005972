//! The exec/attach/cp checks every client path runs: output, exit codes, stderr, stdin EOF,
//! tty size, big transfers both ways, cp up and down, attach. Each takes the kubectl binary and
//! the kubeconfig of the path under test.

use std::path::Path;
use std::time::Duration;

use super::harness::{random_file, run, sha256_hex, stderr, stdout, Harness};

const T: Duration = Duration::from_secs(120);

/// echo, exit codes 0/1/3/127/255, stdout and stderr apart, stdin EOF with `-i`.
pub async fn basics(h: &Harness, kubectl: &Path, kubeconfig: &Path) {
    let k = || h.kubectl(kubectl, kubeconfig);

    let mut c = k();
    c.args(["exec", "web", "--", "echo", "hello"]);
    let o = run(c, None, T).await;
    assert!(o.status.success(), "exec echo failed: {}", stderr(&o));
    assert_eq!(stdout(&o), "hello\n");

    for code in [0, 1, 3, 127, 255] {
        let mut c = k();
        c.args(["exec", "web", "--", "sh", "-c", &format!("exit {code}")]);
        let o = run(c, None, T).await;
        assert_eq!(o.status.code(), Some(code), "exit {code}: {}", stderr(&o));
    }

    let mut c = k();
    c.args(["exec", "web", "--", "sh", "-c", "echo out; echo err >&2"]);
    let o = run(c, None, T).await;
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stdout(&o), "out\n");
    assert!(stderr(&o).contains("err\n"), "stderr: {}", stderr(&o));

    let mut c = k();
    c.args(["exec", "-i", "web", "--", "sh", "-c", "cat; echo done"]);
    let o = run(c, Some(b"in\n".to_vec()), T).await;
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stdout(&o), "in\ndone\n");
}

/// `exec -it` on a 100×40 terminal: the size reaches the pod.
pub async fn tty_size(h: &Harness, kubectl: &Path, kubeconfig: &Path) {
    let mut c = h.kubectl(kubectl, kubeconfig);
    c.args(["exec", "-it", "web", "--", "stty", "size"]);
    let r = tokio::task::spawn_blocking(move || {
        super::pty::run_on_pty(c, 100, 40, b"", Duration::from_millis(0), T)
    })
    .await
    .unwrap();
    assert!(r.status.success(), "exec -it failed: {}", r.output);
    assert!(r.output.contains("40 100"), "stty size saw: {:?}", r.output);
}

/// Large stdout and stdin, byte-exact.
pub async fn big_transfers(h: &Harness, kubectl: &Path, kubeconfig: &Path) {
    let pod = "bulk";
    let dir = h.sim.pod_dir("default", pod);
    std::fs::create_dir_all(&dir).unwrap();
    let down_sha = random_file(&dir.join("down.bin"), 200_000_000, 7);
    let mut c = h.kubectl(kubectl, kubeconfig);
    c.args(["exec", pod, "--", "cat", "down.bin"]);
    let o = run(c, None, T).await;
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(o.stdout.len(), 200_000_000);
    assert_eq!(sha256_hex(&o.stdout), down_sha, "200 MB of stdout differ");

    let up = h.dir.path().join("up.bin");
    let up_sha = random_file(&up, 100_000_000, 11);
    let mut c = h.kubectl(kubectl, kubeconfig);
    c.args([
        "exec",
        "-i",
        pod,
        "--",
        "sh",
        "-c",
        "cat > up.bin; echo stored",
    ]);
    let o = run(c, Some(std::fs::read(&up).unwrap()), T).await;
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stdout(&o), "stored\n");
    let stored = std::fs::read(dir.join("up.bin")).unwrap();
    assert_eq!(sha256_hex(&stored), up_sha, "100 MB of stdin differ");
}

/// `kubectl cp` up and down, byte-exact.
pub async fn copy_files(h: &Harness, kubectl: &Path, kubeconfig: &Path) {
    let pod = "files";
    let dir = h.sim.pod_dir("default", pod);
    std::fs::create_dir_all(&dir).unwrap();
    for (name, len) in [("small.bin", 3_000_000usize), ("large.bin", 100_000_000)] {
        let local = h.dir.path().join(name);
        let sha = random_file(&local, len, len as u64);
        let mut c = h.kubectl(kubectl, kubeconfig);
        c.current_dir(h.dir.path())
            .args(["cp", name, &format!("{pod}:{name}")]);
        let o = run(c, None, T).await;
        assert!(o.status.success(), "cp up {name}: {}", stderr(&o));
        let uploaded = std::fs::read(dir.join(name)).unwrap();
        assert_eq!(sha256_hex(&uploaded), sha, "cp up {name} differs");

        let back = format!("back-{name}");
        let mut c = h.kubectl(kubectl, kubeconfig);
        c.current_dir(h.dir.path())
            .args(["cp", &format!("{pod}:{name}"), &back]);
        let o = run(c, None, T).await;
        assert!(o.status.success(), "cp down {name}: {}", stderr(&o));
        let downloaded = std::fs::read(h.dir.path().join(&back)).unwrap();
        assert_eq!(sha256_hex(&downloaded), sha, "cp down {name} differs");
    }
}

/// `kubectl attach -i`: a line goes in and comes back.
pub async fn attach(h: &Harness, kubectl: &Path, kubeconfig: &Path) {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
    let c = {
        let mut c = h.kubectl(kubectl, kubeconfig);
        c.args(["attach", "-i", "attached", "-c", "main"]);
        c
    };
    let mut c = tokio::process::Command::from(c);
    c.stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    let mut child = c.spawn().unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let seen = tokio::time::timeout(T, async {
        // The attach target only sees input once the session is up; resend until echoed.
        loop {
            stdin.write_all(b"ping-through-attach\n").await.unwrap();
            match tokio::time::timeout(Duration::from_millis(500), lines.next_line()).await {
                Ok(Ok(Some(line))) if line.contains("ping-through-attach") => return line,
                Ok(Ok(None)) => panic!("attach ended early"),
                _ => {}
            }
        }
    })
    .await
    .expect("attach output");
    assert!(seen.contains("ping-through-attach"));
    let _ = child.kill().await;
}
