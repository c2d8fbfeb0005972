//! Finding the real clients the tests drive. Missing clients skip a test locally but fail it
//! loudly in CI (`CI=true`), so a green CI always means the clients really ran.

use std::path::{Path, PathBuf};

/// Whether we run in CI, where every client must be present.
pub fn in_ci() -> bool {
    std::env::var("CI")
        .map(|v| v == "true" || v == "1")
        .unwrap_or(false)
}

/// Reports a missing prerequisite: panics in CI, prints a note and returns `None` otherwise.
pub fn require<T>(what: &str, found: Option<T>) -> Option<T> {
    if found.is_none() {
        if in_ci() {
            panic!("{what} is required in CI but was not found");
        }
        eprintln!("SKIPPED: {what} not found");
    }
    found
}

/// The folder holding `kubectl.1.27` … `kubectl.1.33`: `$KUBECTL_DIR`, else the folder of
/// the `kubectl` on PATH (resolved through symlinks), else the Cloud SDK's bin folder.
pub fn kubectl_dir() -> Option<PathBuf> {
    if let Ok(dir) = std::env::var("KUBECTL_DIR") {
        return Some(PathBuf::from(dir));
    }
    let from_path = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|p| p.join("kubectl"))
            .find(|p| p.exists())
            .and_then(|p| std::fs::canonicalize(p).ok())
            .and_then(|p| p.parent().map(Path::to_path_buf))
    });
    from_path
        .into_iter()
        .chain(std::iter::once(PathBuf::from(
            "/usr/lib/google-cloud-sdk/bin",
        )))
        .find(|d| d.join("kubectl.1.33").exists())
}

/// `kubectl.<minor>` (e.g. "1.33"), or `None` (see [`require`]).
pub fn kubectl(minor: &str) -> Option<PathBuf> {
    let path = kubectl_dir()?.join(format!("kubectl.{minor}"));
    path.exists().then_some(path)
}

/// `kubectl.<minor>`, skipping locally / failing in CI when absent.
pub fn require_kubectl(minor: &str) -> Option<PathBuf> {
    require(&format!("kubectl {minor}"), kubectl(minor))
}

/// A python3 that can `import kubernetes`.
pub fn python_with_kubernetes() -> Option<PathBuf> {
    let py = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
    let ok = std::process::Command::new(&py)
        .args(["-c", "import kubernetes"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    ok.then(|| PathBuf::from(py))
}

/// Writes a kubeconfig for `server` (plain HTTP, optional bearer token) into `dir`.
pub fn write_kubeconfig(dir: &Path, server: &str, token: Option<&str>) -> PathBuf {
    let path = dir.join("kubeconfig");
    std::fs::write(&path, kube_ws_proxy::demo::kubeconfig(server, token)).unwrap();
    path
}

/// The first executable called `name` on PATH.
fn on_path(name: &str) -> Option<PathBuf> {
    let paths = std::env::var_os("PATH")?;
    std::env::split_paths(&paths)
        .map(|p| p.join(name))
        .find(|p| p.is_file())
}

/// Chromium for headless runs: `$CHROMIUM`, else `chromium` (Debian) or `chromium-browser` on
/// PATH.
pub fn chromium() -> Option<PathBuf> {
    if let Ok(path) = std::env::var("CHROMIUM") {
        return Some(PathBuf::from(path));
    }
    on_path("chromium").or_else(|| on_path("chromium-browser"))
}

/// The Node test project (`tests/node`, see `scripts/install-test-deps.sh`).
pub fn node_project() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/node")
}

/// `node` (`$NODE`, else on PATH), provided `tests/node` has its dependencies installed
/// (the official JavaScript client among them).
pub fn node_with_client_node() -> Option<PathBuf> {
    let installed = node_project()
        .join("node_modules/@kubernetes/client-node/package.json")
        .is_file();
    if !installed {
        return None;
    }
    match std::env::var("NODE") {
        Ok(path) => Some(PathBuf::from(path)),
        Err(_) => on_path("node"),
    }
}

/// Debian's `asciinema` (replays recordings), or `None` (a failure in CI).
pub fn require_asciinema() -> Option<PathBuf> {
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join("asciinema"))
            .find(|p| p.is_file())
    });
    require("asciinema", found)
}

/// moto's S3-compatible server (`moto_server`): `$MOTO_SERVER`, else the venv
/// scripts/install-test-deps.sh makes, else PATH; or `None` (a failure in CI).
pub fn require_moto() -> Option<PathBuf> {
    let found = std::env::var_os("MOTO_SERVER")
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME")
                .map(|home| PathBuf::from(home).join(".cache/kube-ws-proxy/moto/bin/moto_server"))
                .filter(|p| p.is_file())
        })
        .or_else(|| on_path("moto_server"));
    require("moto_server (S3-compatible store)", found)
}
