//! The container image as scripts/build-image.sh makes it from scratch layers: built from the
//! binary under test and inspected (configuration, every file in the layer, owners, size, no
//! shell), its root filesystem run on its own with chroot, and, where the machine lets a
//! container start, run under podman with a request through it.
//!
//! Missing tools skip locally and fail in CI (`CI=true`). A container start that the machine
//! itself refuses (the OCI runtime cannot set up the container) is reported as NOT RUN with
//! podman's own words; the build-and-inspect test does not depend on it.

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use clap::Parser;
use common::clients::require;
use kube_ws_proxy::cli::Cli;
use serde_json::Value;
use sha2::{Digest, Sha256};

const BINARY: &str = env!("CARGO_BIN_EXE_kube-ws-proxy");
const TAG: &str = "test";
const ENTRYPOINT: &str = "/usr/local/bin/kube-ws-proxy";
/// The bounds docs/deployment.md states: the unpacked root filesystem and the compressed layer.
const MAX_ROOTFS_BYTES: u64 = 32 << 20;
const MAX_LAYER_BYTES: u64 = 16 << 20;
/// Names of shells and multi-call binaries that provide one.
const SHELLS: &[&str] = &[
    "sh", "bash", "dash", "ash", "zsh", "ksh", "mksh", "csh", "tcsh", "fish", "busybox", "toybox",
];

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn on_path(name: &str) -> Option<PathBuf> {
    let paths = std::env::var_os("PATH")?;
    std::env::split_paths(&paths)
        .map(|p| p.join(name))
        .find(|p| p.is_file())
}

/// Every tool the build script uses, or `None` after [`require`] has reported the first one
/// missing.
fn build_tools() -> Option<()> {
    for tool in ["umoci", "tar", "strip", "ldd"] {
        require(
            &format!("{tool} (scripts/install-test-deps.sh installs it)"),
            on_path(tool),
        )?;
    }
    Some(())
}

/// An OCI image layout built from the binary under test.
struct Image {
    dir: tempfile::TempDir,
    layout: PathBuf,
    archive: PathBuf,
}

impl Image {
    fn build() -> Image {
        let dir = tempfile::tempdir().unwrap();
        let layout = dir.path().join("oci");
        let archive = dir.path().join("oci.tar");
        let started = Instant::now();
        let out = Command::new(root().join("scripts/build-image.sh"))
            .args(["--binary", BINARY, "--tag", TAG])
            .arg("--out")
            .arg(&layout)
            .arg("--archive")
            .arg(&archive)
            .output()
            .expect("run scripts/build-image.sh");
        let took = started.elapsed();
        assert!(
            out.status.success(),
            "scripts/build-image.sh failed: {}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        eprintln!("image built in {took:.1?}");
        assert!(
            took < Duration::from_secs(60),
            "the image build took {took:?}"
        );
        Image {
            dir,
            layout,
            archive,
        }
    }

    /// A blob of the layout, its digest checked.
    fn blob(&self, descriptor: &Value) -> Vec<u8> {
        let digest = descriptor["digest"].as_str().expect("a digest");
        let hex = digest.strip_prefix("sha256:").expect("a sha256 digest");
        let bytes = std::fs::read(self.layout.join("blobs/sha256").join(hex)).unwrap();
        let actual = Sha256::digest(&bytes)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>();
        assert_eq!(actual, hex, "blob content does not match its digest");
        assert_eq!(descriptor["size"].as_u64(), Some(bytes.len() as u64));
        bytes
    }

    fn manifest(&self) -> Value {
        let index: Value =
            serde_json::from_slice(&std::fs::read(self.layout.join("index.json")).unwrap())
                .unwrap();
        let manifests = index["manifests"].as_array().expect("manifests");
        assert_eq!(manifests.len(), 1, "one image in the layout: {index}");
        let descriptor = &manifests[0];
        assert_eq!(
            descriptor["annotations"]["org.opencontainers.image.ref.name"],
            TAG
        );
        serde_json::from_slice(&self.blob(descriptor)).unwrap()
    }

    fn config(&self) -> Value {
        serde_json::from_slice(&self.blob(&self.manifest()["config"])).unwrap()
    }

    /// The single layer's path (digest already checked).
    fn layer(&self) -> PathBuf {
        let manifest = self.manifest();
        let layers = manifest["layers"].as_array().expect("layers");
        assert_eq!(layers.len(), 1, "one layer: {manifest}");
        assert_eq!(
            layers[0]["mediaType"],
            "application/vnd.oci.image.layer.v1.tar+gzip"
        );
        self.blob(&layers[0]);
        let hex = layers[0]["digest"].as_str().unwrap();
        self.layout
            .join("blobs/sha256")
            .join(hex.trim_start_matches("sha256:"))
    }
}

/// One entry of the layer as `tar -tv` lists it.
#[derive(Debug)]
struct Entry {
    mode: String,
    owner: String,
    size: u64,
}

fn list_layer(layer: &Path) -> BTreeMap<String, Entry> {
    let out = Command::new("tar")
        .args(["--numeric-owner", "-tvzf"])
        .arg(layer)
        .output()
        .unwrap();
    assert!(out.status.success(), "tar cannot read the layer");
    let mut entries = BTreeMap::new();
    for line in String::from_utf8(out.stdout).unwrap().lines() {
        // mode owner/group size date time name (our names have no spaces)
        let f: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(f.len(), 6, "unexpected entry {line:?}");
        let name = f[5]
            .trim_start_matches("./")
            .trim_end_matches('/')
            .to_owned();
        entries.insert(
            format!("/{name}"),
            Entry {
                mode: f[0].to_owned(),
                owner: f[1].to_owned(),
                size: f[2].parse().unwrap(),
            },
        );
    }
    entries
}

/// The libraries the binary links and its dynamic loader, as ldd resolves them here.
fn linked_libraries() -> BTreeSet<String> {
    let out = Command::new("ldd").arg(BINARY).output().unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(!text.contains("not found"), "{text}");
    text.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            match f.as_slice() {
                [_, "=>", path, ..] if path.starts_with('/') => Some(path.to_string()),
                [path, ..] if path.starts_with('/') => Some(path.to_string()),
                _ => None,
            }
        })
        .collect()
}

/// The Dockerfile's CMD and EXPOSE, which the image must repeat.
fn dockerfile() -> (Vec<String>, BTreeSet<String>) {
    let text = std::fs::read_to_string(root().join("docker/Dockerfile")).unwrap();
    let cmd = text.lines().find_map(|l| l.strip_prefix("CMD ")).unwrap();
    let expose = text
        .lines()
        .find_map(|l| l.strip_prefix("EXPOSE "))
        .unwrap()
        .split_whitespace()
        .map(|p| format!("{p}/tcp"))
        .collect();
    (serde_json::from_str(cmd).unwrap(), expose)
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

#[test]
fn image_is_built_from_scratch_and_holds_only_the_proxy() {
    if build_tools().is_none() {
        return;
    }
    let image = Image::build();

    // Configuration: the user, entrypoint, command and ports of docker/Dockerfile.
    let config = image.config();
    let c = &config["config"];
    assert_eq!(config["os"], "linux");
    assert_eq!(c["User"], "65532:65532", "{config}");
    assert_eq!(c["Entrypoint"], serde_json::json!([ENTRYPOINT]));
    let (cmd, expose) = dockerfile();
    assert_eq!(
        c["Cmd"],
        serde_json::json!(cmd),
        "CMD differs from docker/Dockerfile"
    );
    let argv = std::iter::once("kube-ws-proxy".to_owned()).chain(cmd.iter().cloned());
    Cli::try_parse_from(argv).expect("the image's CMD parses");
    let ports: BTreeSet<String> = c["ExposedPorts"]
        .as_object()
        .expect("exposed ports")
        .keys()
        .cloned()
        .collect();
    assert_eq!(ports, expose, "EXPOSE differs from docker/Dockerfile");
    assert_eq!(
        ports,
        BTreeSet::from(["8081/tcp".to_owned(), "8443/tcp".to_owned()])
    );

    // Contents: exactly these regular files, nothing else but their directories.
    let layer = image.layer();
    let entries = list_layer(&layer);
    let mut expected: BTreeSet<String> = [
        ENTRYPOINT,
        "/etc/passwd",
        "/etc/group",
        "/etc/nsswitch.conf",
        "/etc/ssl/certs/ca-certificates.crt",
    ]
    .into_iter()
    .map(String::from)
    .collect();
    expected.extend(linked_libraries());
    let files: BTreeSet<String> = entries
        .iter()
        .filter(|(_, e)| e.mode.starts_with('-'))
        .map(|(n, _)| n.clone())
        .collect();
    assert_eq!(files, expected, "the image's files");
    for (name, e) in &entries {
        assert!(
            e.mode.starts_with('-') || e.mode.starts_with('d'),
            "{name}: only files and directories, no links or devices ({})",
            e.mode
        );
        assert!(
            !e.mode.contains('s') && !e.mode.contains('S'),
            "{name}: set-id bit ({})",
            e.mode
        );
        let base = name.rsplit('/').next().unwrap();
        assert!(!SHELLS.contains(&base), "{name}: a shell in the image");
        let owner = if name == "/home/nonroot" {
            "65532/65532"
        } else {
            "0/0"
        };
        assert_eq!(e.owner, owner, "{name}: owner");
    }
    assert!(!entries.contains_key("/bin") && !entries.contains_key("/usr/bin"));
    assert_eq!(entries["/tmp"].mode, "drwxrwxrwt");

    // Size.
    let rootfs_bytes: u64 = entries.values().map(|e| e.size).sum();
    let layer_bytes = std::fs::metadata(&layer).unwrap().len();
    eprintln!(
        "root filesystem {:.1} MiB, compressed layer {:.1} MiB",
        rootfs_bytes as f64 / 1048576.0,
        layer_bytes as f64 / 1048576.0
    );
    assert!(
        rootfs_bytes < MAX_ROOTFS_BYTES,
        "{rootfs_bytes} bytes unpacked"
    );
    assert!(
        layer_bytes < MAX_LAYER_BYTES,
        "{layer_bytes} bytes compressed"
    );

    // The user and group entries.
    let rootfs = image.dir.path().join("rootfs");
    std::fs::create_dir(&rootfs).unwrap();
    let out = Command::new("tar")
        .args(["--numeric-owner", "-xzf"])
        .arg(&layer)
        .arg("-C")
        .arg(&rootfs)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let passwd = std::fs::read_to_string(rootfs.join("etc/passwd")).unwrap();
    let user = passwd
        .lines()
        .map(|l| l.split(':').collect::<Vec<_>>())
        .find(|f| f[2] == "65532")
        .expect("an /etc/passwd entry for 65532");
    assert_eq!(user[3], "65532", "primary group");
    assert!(
        !rootfs.join(user[6].trim_start_matches('/')).exists(),
        "the user's login shell {} exists",
        user[6]
    );
    let group = std::fs::read_to_string(rootfs.join("etc/group")).unwrap();
    assert!(
        group.lines().any(|l| l.split(':').nth(2) == Some("65532")),
        "an /etc/group entry for 65532: {group}"
    );

    // Reproducible: the same binary and commit give the same image digest.
    let again = Image::build();
    let digest = |image: &Image| -> Value {
        let index: Value =
            serde_json::from_slice(&std::fs::read(image.layout.join("index.json")).unwrap())
                .unwrap();
        index["manifests"][0]["digest"].clone()
    };
    assert_eq!(digest(&image), digest(&again), "two builds, two digests");

    // The archive is the same layout.
    let out = Command::new("tar")
        .arg("-tf")
        .arg(&image.archive)
        .output()
        .unwrap();
    let listing = String::from_utf8_lossy(&out.stdout);
    assert!(listing.contains("./index.json") && listing.contains("./oci-layout"));

    // The root filesystem alone runs the binary as 65532: the loader and libraries in it are
    // enough. (chroot, not a container; needs root.)
    if is_root() {
        let chroot = on_path("chroot").expect("chroot (coreutils)");
        let out = Command::new(chroot)
            .arg("--userspec=65532:65532")
            .arg(&rootfs)
            .args([ENTRYPOINT, "--version"])
            .env_clear()
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "the binary does not run in its root filesystem: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let version = String::from_utf8_lossy(&out.stdout);
        assert_eq!(
            version.trim(),
            format!("kube-ws-proxy {}", env!("CARGO_PKG_VERSION"))
        );
    } else {
        eprintln!("NOT RUN: the chroot run of the root filesystem needs root");
    }
}

/// What became of a `podman run`.
enum Start {
    /// The proxy in the container logged that it is ready.
    Ready { addr: SocketAddr, admin: SocketAddr },
    /// The OCI runtime refused to create the container; podman's message.
    Refused(String),
}

/// podman with storage of its own under `dir`, so the test neither uses nor leaves anything in
/// the machine's image store.
struct Podman {
    dir: PathBuf,
    name: String,
}

impl Podman {
    fn command(&self) -> Command {
        let mut c = Command::new("podman");
        c.arg("--root")
            .arg(self.dir.join("storage"))
            .arg("--runroot")
            .arg(self.dir.join("run"))
            .arg("--tmpdir")
            .arg(self.dir.join("tmp"))
            .args([
                "--storage-driver",
                "vfs",
                "--cgroup-manager",
                "cgroupfs",
                "--events-backend",
                "file",
            ]);
        c
    }
}

impl Drop for Podman {
    fn drop(&mut self) {
        let _ = self
            .command()
            .args(["rm", "--force", "--time", "0", &self.name])
            .output();
    }
}

/// The resource limits the container asks for. podman's defaults (a million descriptors and
/// processes) raise hard limits, which needs CAP_SYS_RESOURCE; without it the runtime fails
/// with EPERM. The descriptors stay at this process's limits; the processes go lower, because
/// podman lowers its own limit when it starts (to 32768 on our machines) and its runtime can
/// only stay under that.
fn ulimits() -> Vec<String> {
    let get = |resource| {
        let mut rl = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: rl is a valid rlimit to write into.
        assert_eq!(unsafe { libc::getrlimit(resource, &mut rl) }, 0);
        rl
    };
    let nofile = get(libc::RLIMIT_NOFILE);
    let nproc = get(libc::RLIMIT_NPROC).rlim_cur.min(4096);
    vec![
        format!("--ulimit=nofile={}:{}", nofile.rlim_cur, nofile.rlim_max),
        format!("--ulimit=nproc={nproc}:{nproc}"),
    ]
}

/// Starts the image with `runtime` (podman's default when `None`), host network, the proxy
/// on free loopback ports in front of `upstream`. Returns the child (podman run) and what
/// happened; the log lines go to `logs`.
fn start_container(
    podman: &Podman,
    image: &str,
    runtime: Option<&str>,
    upstream: &str,
    logs: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
) -> (std::process::Child, Start) {
    let mut cmd = podman.command();
    cmd.args(["run", "--rm", "--name", &podman.name, "--network", "host"]);
    if let Some(r) = runtime {
        cmd.args(["--runtime", r]);
    }
    cmd.args(ulimits())
        .arg(image)
        .args([
            "--listen",
            "127.0.0.1:0",
            "--admin-listen",
            "127.0.0.1:0",
            "--log-format",
            "json",
            "--upstream",
            upstream,
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("start podman");
    let (tx, rx) = std::sync::mpsc::channel::<Option<String>>();
    for stream in [
        Box::new(child.stdout.take().unwrap()) as Box<dyn Read + Send>,
        Box::new(child.stderr.take().unwrap()),
    ] {
        let tx = tx.clone();
        let logs = logs.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stream).lines().map_while(Result::ok) {
                logs.lock().unwrap().push(line.clone());
                let _ = tx.send(Some(line));
            }
            let _ = tx.send(None);
        });
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut closed = 0;
    while closed < 2 {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(Some(line)) if line.contains("kube-ws-proxy ready") => {
                let v: Value = serde_json::from_str(&line).expect("a JSON log line");
                let field = |n: &str| v["fields"][n].as_str().unwrap().parse().unwrap();
                let start = Start::Ready {
                    addr: field("addr"),
                    admin: field("admin_addr"),
                };
                return (child, start);
            }
            Ok(Some(_)) => {}
            Ok(None) => closed += 1,
            Err(_) => {
                let _ = child.kill();
                panic!(
                    "the container did not become ready in 60 s:\n{}",
                    logs.lock().unwrap().join("\n")
                );
            }
        }
    }
    let status = child.wait().unwrap();
    let said = logs.lock().unwrap().join("\n");
    // 125: podman or the OCI runtime failed before the entrypoint ran; 126: the runtime could
    // not invoke it. Anything else came from the proxy itself and is the image's fault. (An
    // entrypoint that cannot run would also give 126; the other test runs it under chroot.)
    let runtime_failed = matches!(status.code(), Some(125 | 126)) && said.contains("OCI");
    assert!(
        runtime_failed,
        "the container exited ({status}) before it was ready:\n{said}"
    );
    (child, Start::Refused(said))
}

fn http_get(addr: SocketAddr, path: &str) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut answer = String::new();
    s.read_to_string(&mut answer).unwrap();
    answer
}

/// A v5 exec upgrade through the proxy: the status line.
fn exec_status(addr: SocketAddr) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    write!(
        s,
        "GET /api/v1/namespaces/default/pods/web/exec?command=true&stdout=true HTTP/1.1\r\n\
         Host: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\n\
         Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Protocol: v5.channel.k8s.io\r\n\r\n"
    )
    .unwrap();
    let mut answer = vec![0u8; 512];
    let n = s.read(&mut answer).unwrap();
    String::from_utf8_lossy(&answer[..n])
        .lines()
        .next()
        .unwrap_or_default()
        .to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn image_runs_under_podman() {
    if build_tools().is_none()
        || require(
            "podman (scripts/install-test-deps.sh installs it)",
            on_path("podman"),
        )
        .is_none()
    {
        return;
    }
    let image = Image::build();
    let sim = kube_ws_proxy::sim::SimCluster::start(kube_ws_proxy::sim::SimConfig::default())
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let podman = Podman {
        dir: dir.path().to_owned(),
        name: format!("kube-ws-proxy-test-{}", std::process::id()),
    };

    // The archive, as users would load it; podman names the image after the layout's tag.
    let out = podman
        .command()
        .args(["load", "--quiet", "--input"])
        .arg(&image.archive)
        .output()
        .unwrap();
    let loaded = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "podman load: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let image_name = loaded
        .lines()
        .find_map(|l| l.strip_prefix("Loaded image: "))
        .unwrap_or_else(|| panic!("podman load said {loaded:?}"))
        .trim()
        .to_owned();

    // podman's default runtime first; runc as well where it is installed, since Debian 12's
    // crun refuses hosts with cgroup v1 and v2 mounted side by side.
    let mut runtimes = vec![None];
    if on_path("runc").is_some() {
        runtimes.push(Some("runc"));
    }
    let mut refusals = Vec::new();
    for runtime in runtimes {
        let logs = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let (mut child, start) = tokio::task::block_in_place(|| {
            start_container(&podman, &image_name, runtime, &sim.url(), logs.clone())
        });
        let (addr, admin) = match start {
            Start::Ready { addr, admin } => (addr, admin),
            Start::Refused(said) => {
                // Frees the name for the next runtime.
                let _ = podman
                    .command()
                    .args(["rm", "--force", &podman.name])
                    .output();
                refusals.push(format!(
                    "runtime {}: {said}",
                    runtime.unwrap_or("(podman's default)")
                ));
                continue;
            }
        };
        tokio::task::block_in_place(|| {
            let healthz = http_get(admin, "/healthz");
            assert!(healthz.starts_with("HTTP/1.1 200"), "{healthz}");
            let version = http_get(addr, "/version");
            assert!(
                version.starts_with("HTTP/1.1 200") && version.contains("gitVersion"),
                "{version}"
            );
            assert!(exec_status(addr).contains(" 101 "), "exec upgrade refused");

            // The process in the container runs as 65532.
            let out = podman
                .command()
                .args(["inspect", "--format", "{{.State.Pid}}", &podman.name])
                .output()
                .unwrap();
            let pid = String::from_utf8_lossy(&out.stdout).trim().to_owned();
            let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
            let uid = status.lines().find(|l| l.starts_with("Uid:")).unwrap();
            assert_eq!(
                uid.split_whitespace().skip(1).collect::<Vec<_>>(),
                ["65532"; 4],
                "{uid}"
            );

            // SIGTERM (podman stop) drains and exits 0, though the proxy is PID 1.
            let out = podman
                .command()
                .args(["stop", "--time", "20", &podman.name])
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            let exit = child.wait().unwrap();
            let said = logs.lock().unwrap().join("\n");
            assert!(exit.success(), "podman run ended with {exit}:\n{said}");
            assert!(said.contains("drained"), "{said}");
        });
        eprintln!(
            "container started with runtime {}: /healthz, /version and a v5 exec upgrade answered; \
             uid 65532; SIGTERM drained and exited 0",
            runtime.unwrap_or("(podman's default)")
        );
        for refusal in &refusals {
            eprintln!("refused before that: {refusal}");
        }
        return;
    }
    eprintln!(
        "NOT RUN: this machine does not let podman start a container; the image was built and \
         inspected only.\n{}",
        refusals.join("\n")
    );
}
