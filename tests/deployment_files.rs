//! The deployment files ask the binary for flags it really has: every `--flag` in the
//! manifests' container args and in the Dockerfile's CMD parses with the real command line.
//! (Schema validation of docker/*.yaml runs in scripts/test.sh with kubernetes-validate.)
//!
//! The kustomizations in deploy/ are rendered with kubectl 1.27 and 1.33 (which must agree),
//! validated with kubernetes-validate against Kubernetes 1.27 and 1.33, and read the way the
//! binary reads them: args plus the config file the pod provides, every file it names mounted,
//! ports, probes and grace period matching the settings the proxy ends up with.

use std::path::{Path, PathBuf};

use clap::Parser;
use kube_ws_proxy::cli::Cli;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The `- --flag=value` lines of each container's args, one list per container.
fn manifest_args(text: &str) -> Vec<Vec<String>> {
    let mut all = Vec::new();
    let mut current: Option<Vec<String>> = None;
    for line in text.lines() {
        let t = line.trim();
        if t == "args:" {
            if let Some(a) = current.take() {
                all.push(a);
            }
            current = Some(Vec::new());
        } else if let (Some(a), Some(arg)) = (current.as_mut(), t.strip_prefix("- --")) {
            a.push(format!("--{arg}"));
        } else if current.as_ref().is_some_and(|a| !a.is_empty()) {
            all.push(current.take().unwrap());
        }
    }
    all.extend(current.filter(|a| !a.is_empty()));
    all
}

#[test]
fn manifests_use_real_flags() {
    for file in ["docker/deployment.yaml", "docker/sidecar.yaml"] {
        let text = std::fs::read_to_string(root().join(file)).unwrap();
        let lists = manifest_args(&text);
        assert!(!lists.is_empty(), "no container args found in {file}");
        for args in lists {
            let argv = std::iter::once("kube-ws-proxy".to_owned()).chain(args.clone());
            if let Err(e) = Cli::try_parse_from(argv) {
                panic!("{file}: {args:?} do not parse: {e}");
            }
        }
    }
}

#[test]
fn dockerfile_cmd_uses_real_flags() {
    let text = std::fs::read_to_string(root().join("docker/Dockerfile")).unwrap();
    let cmd = text
        .lines()
        .find_map(|l| l.strip_prefix("CMD "))
        .expect("a CMD line");
    let args: Vec<String> = serde_json::from_str(cmd).expect("CMD in exec form");
    let argv = std::iter::once("kube-ws-proxy".to_owned()).chain(args.clone());
    if let Err(e) = Cli::try_parse_from(argv) {
        panic!("Dockerfile CMD {args:?} does not parse: {e}");
    }
    assert!(
        text.contains("USER 65532"),
        "the image must run as non-root"
    );
}

/// The Dockerfile's dependency stage (stand-in sources beside Cargo.toml and Cargo.lock, built
/// before the real sources are copied) makes a package cargo accepts: a target Cargo.toml
/// declares without a file stops `docker build` there.
#[test]
fn dockerfile_dependency_stage_is_a_package_cargo_accepts() {
    let text = std::fs::read_to_string(root().join("docker/Dockerfile")).unwrap();
    // Docker joins continued lines before running them.
    let joined = text.replace("\\\n", " ");
    let step = joined
        .lines()
        .find_map(|l| {
            l.strip_prefix("RUN ")
                .filter(|c| c.contains("mkdir -p src benches"))
        })
        .expect("the Dockerfile's stand-in step");
    assert!(
        !step.contains("cargo "),
        "the stand-in step builds nothing: {step}"
    );
    let dir = tempfile::tempdir().unwrap();
    for file in ["Cargo.toml", "Cargo.lock"] {
        std::fs::copy(root().join(file), dir.path().join(file)).unwrap();
    }
    let out = std::process::Command::new("sh")
        .args(["-c", step])
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Asking for a bin that does not exist makes cargo read the whole manifest and stop
    // before building anything.
    let out = std::process::Command::new(env!("CARGO"))
        .args(["build", "--offline", "--locked", "--bin", "no-such-bin"])
        .current_dir(dir.path())
        .env("CARGO_TARGET_DIR", dir.path().join("target"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("no bin target named `no-such-bin`"),
        "cargo refuses the Dockerfile's dependency stage:\n{err}"
    );
}

// ---- kustomize: deploy/base and the overlays for the three deployments of config/ ----

use crate::common;

use std::net::SocketAddr;
use std::process::Command;

use kube_ws_proxy::cli::{AuthMode, ServeArgs};
use serde_json::Value;

/// A kustomization of deploy/ and the config/ example it carries: in a generated ConfigMap
/// (a copy beside the kustomization) or, for a static pod, in a file on the node.
struct Kustomization {
    dir: &'static str,
    example: Option<&'static str>,
    /// A file on the node (hostPath) and the example it holds.
    node_file: Option<(&'static str, &'static str)>,
}

const KUSTOMIZATIONS: &[Kustomization] = &[
    Kustomization {
        dir: "deploy/base",
        example: None,
        node_file: None,
    },
    Kustomization {
        dir: "deploy/overlays/old-cluster",
        example: Some("config/old-cluster.yaml"),
        node_file: None,
    },
    Kustomization {
        dir: "deploy/overlays/behind-gateway",
        example: Some("config/behind-gateway.yaml"),
        node_file: None,
    },
    Kustomization {
        dir: "deploy/overlays/fleet",
        example: Some("config/fleet.yaml"),
        node_file: None,
    },
    Kustomization {
        dir: "deploy/overlays/sidecar",
        example: Some("config/sidecar.yaml"),
        node_file: Some(("/etc/kubernetes/kube-ws-proxy.yaml", "config/sidecar.yaml")),
    },
];

/// The oldest and newest kubectl we target, each with its own kustomize.
const KUBECTLS: [&str; 2] = ["1.27", "1.33"];

fn render(kubectl: &Path, dir: &str) -> String {
    let out = Command::new(kubectl)
        .arg("kustomize")
        .arg(root().join(dir))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{} kustomize {dir}: {}",
        kubectl.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The objects of a multi-document YAML stream.
fn documents(text: &str) -> Vec<Value> {
    let mut docs = Vec::new();
    let mut current = String::new();
    for line in text.lines().chain(std::iter::once("---")) {
        if line == "---" {
            if !current.trim().is_empty() {
                docs.push(serde_saphyr::from_str::<Value>(&current).unwrap());
            }
            current.clear();
        } else {
            current.push_str(line);
            current.push('\n');
        }
    }
    docs
}

/// Every kustomization rendered by every targeted kubectl: (dir, objects). The kubectls must
/// agree. `None` when a kubectl is missing locally (CI fails instead).
fn rendered() -> Option<Vec<(&'static Kustomization, Vec<Value>)>> {
    let kubectls = KUBECTLS
        .iter()
        .map(|v| common::clients::require_kubectl(v))
        .collect::<Option<Vec<_>>>()?;
    Some(
        KUSTOMIZATIONS
            .iter()
            .map(|k| {
                let objects = documents(&render(&kubectls[0], k.dir));
                for kubectl in &kubectls[1..] {
                    assert_eq!(
                        documents(&render(kubectl, k.dir)),
                        objects,
                        "{} renders {} differently",
                        kubectl.display(),
                        k.dir
                    );
                }
                (k, objects)
            })
            .collect(),
    )
}

#[test]
fn kustomizations_render_and_validate_against_1_27_and_1_33() {
    let Some(kubectl) = common::clients::require_kubectl("1.33") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let files: Vec<_> = KUSTOMIZATIONS
        .iter()
        .map(|k| {
            let file = dir.path().join(format!("{}.yaml", k.dir.replace('/', "-")));
            std::fs::write(&file, render(&kubectl, k.dir)).unwrap();
            file
        })
        .collect();
    validate(&files, "rendered manifests");
}

/// deploy/rbac: the sessions API's roles render alike with both kubectls, validate against
/// 1.27 and 1.33, and grant what SECURITY.md says: the viewer sees sessions but not their
/// output, the operator and the namespace admin may also end them and read recordings, and
/// the proxy's own role creates only SubjectAccessReviews.
#[test]
fn session_roles_render_validate_and_grant_what_they_say() {
    let kubectls = KUBECTLS
        .iter()
        .map(|v| common::clients::require_kubectl(v))
        .collect::<Option<Vec<_>>>();
    let Some(kubectls) = kubectls else { return };
    let text = render(&kubectls[0], "deploy/rbac");
    let objects = documents(&text);
    for kubectl in &kubectls[1..] {
        assert_eq!(documents(&render(kubectl, "deploy/rbac")), objects);
    }
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("rbac.yaml");
    std::fs::write(&file, &text).unwrap();
    validate(&[file], "deploy/rbac's roles");
    let grants = |kind: &str, name: &str| -> Vec<(String, String)> {
        let role = objects
            .iter()
            .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
            .unwrap_or_else(|| panic!("no {kind} {name}"));
        let mut grants = Vec::new();
        for rule in list(&role["rules"]) {
            for resource in list(&rule["resources"]) {
                for verb in list(&rule["verbs"]) {
                    let group = list(&rule["apiGroups"])[0].as_str().unwrap();
                    grants.push((
                        format!("{}.{group}", resource.as_str().unwrap()),
                        verb.as_str().unwrap().to_owned(),
                    ));
                }
            }
        }
        grants.sort();
        grants
    };
    let g = |r: &str, v: &str| (r.to_owned(), v.to_owned());
    let sessions = "sessions.kube-ws-proxy.io";
    let recording = "sessions/recording.kube-ws-proxy.io";
    let viewer = vec![
        g(sessions, "get"),
        g(sessions, "list"),
        g(sessions, "watch"),
    ];
    assert_eq!(
        grants("ClusterRole", "kube-ws-proxy-sessions-viewer"),
        viewer
    );
    let mut operator = viewer.clone();
    operator.extend([g(sessions, "delete"), g(recording, "get")]);
    operator.sort();
    assert_eq!(
        grants("ClusterRole", "kube-ws-proxy-sessions-operator"),
        operator
    );
    assert_eq!(grants("Role", "kube-ws-proxy-sessions-admin"), operator);
    assert_eq!(
        grants("ClusterRole", "kube-ws-proxy-access-reviewer"),
        [g("subjectaccessreviews.authorization.k8s.io", "create")]
    );
}

/// Validates rendered manifests with kubernetes-validate against 1.27 and 1.33 (skipped, or
/// failed in CI, without the validator).
fn validate(files: &[PathBuf], what: &str) {
    let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
    let has_validator = Command::new(&python)
        .args(["-c", "import kubernetes_validate"])
        .output()
        .is_ok_and(|o| o.status.success());
    if common::clients::require("kubernetes-validate (Python)", has_validator.then_some(()))
        .is_none()
    {
        return;
    }
    for version in ["1.27.0", "1.33.0"] {
        let out = Command::new(&python)
            .args(["-m", "kubernetes_validate", "-k", version, "--strict"])
            .args(files)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{what} do not validate against Kubernetes {version}:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// The fleet's cluster list is reloaded in place: its ConfigMap keeps one name (a generated
/// name would roll the pods on every edit instead), and the pod mounts it without subPath (a
/// subPath mount never sees an update). Each cluster's credentials come from a Secret of its
/// own.
#[test]
fn fleet_overlay_reloads_its_clusters_in_place() {
    let Some(all) = rendered() else { return };
    let (_, objects) = all
        .iter()
        .find(|(k, _)| k.dir == "deploy/overlays/fleet")
        .unwrap();
    let config_maps: Vec<&str> = objects
        .iter()
        .filter(|o| o["kind"] == "ConfigMap")
        .filter_map(|o| o["metadata"]["name"].as_str())
        .collect();
    assert_eq!(config_maps, ["kube-ws-proxy-config"]);
    let (_, pod) = pod_specs(objects).into_iter().next().unwrap();
    let container = &list(&pod["containers"])[0];
    for mount in list(&container["volumeMounts"]) {
        assert!(mount.get("subPath").is_none(), "{mount}: a subPath mount");
    }
    let secrets: Vec<&str> = list(&pod["volumes"])
        .iter()
        .flat_map(|v| list(&v["projected"]["sources"]))
        .filter_map(|src| src["secret"]["name"].as_str())
        .filter(|name| name.starts_with("kube-ws-proxy-cluster-"))
        .collect();
    let s = kube_ws_proxy::config_file::parse_args([
        "kube-ws-proxy".to_owned(),
        format!("--config={}", root().join("config/fleet.yaml").display()),
    ])
    .unwrap()
    .serve;
    let names: Vec<String> = s
        .upstream
        .file_clusters
        .iter()
        .map(|c| format!("kube-ws-proxy-cluster-{}", c.name))
        .collect();
    assert_eq!(
        secrets, names,
        "one Secret per cluster, in the file's order"
    );
}

#[test]
fn base_is_docker_deployment_yaml() {
    let Some(all) = rendered() else { return };
    let docker = std::fs::read_to_string(root().join("docker/deployment.yaml")).unwrap();
    // kustomize orders objects by kind; the objects themselves must be the same.
    let sorted = |mut objects: Vec<Value>| {
        objects.sort_by_key(|o| format!("{}/{}", o["kind"], o["metadata"]["name"]));
        objects
    };
    assert_eq!(
        sorted(all[0].1.clone()),
        sorted(documents(&docker)),
        "deploy/base and docker/deployment.yaml differ"
    );
}

/// A carried copy must be the config/ example itself, and the rendered ConfigMap must hold it.
#[test]
fn overlays_carry_the_config_examples_unchanged() {
    for k in KUSTOMIZATIONS {
        let (Some(example), None) = (k.example, k.node_file) else {
            continue;
        };
        let original = std::fs::read_to_string(root().join(example)).unwrap();
        let copy = std::fs::read_to_string(root().join(k.dir).join("config.yaml")).unwrap();
        assert!(
            copy == original,
            "{}/config.yaml differs from {example}: copy it again",
            k.dir
        );
    }
    let Some(all) = rendered() else { return };
    for (k, objects) in all {
        let (Some(example), None) = (k.example, k.node_file) else {
            continue;
        };
        let original = std::fs::read_to_string(root().join(example)).unwrap();
        let data: Vec<&str> = objects
            .iter()
            .filter(|o| o["kind"] == "ConfigMap")
            .filter_map(|o| o["data"]["config.yaml"].as_str())
            .collect();
        assert_eq!(
            data,
            [original.as_str()],
            "{}: the rendered ConfigMap",
            k.dir
        );
    }
}

/// The pod specs in rendered objects: (object name, pod spec).
fn pod_specs(objects: &[Value]) -> Vec<(String, &Value)> {
    objects
        .iter()
        .filter_map(|o| {
            let spec = match o["kind"].as_str()? {
                "Pod" => &o["spec"],
                "Deployment" | "DaemonSet" | "StatefulSet" => &o["spec"]["template"]["spec"],
                _ => return None,
            };
            let kind = o["kind"].as_str().unwrap_or_default();
            let name = o["metadata"]["name"].as_str().unwrap_or_default();
            Some((format!("{kind}/{name}"), spec))
        })
        .collect()
}

fn list(v: &Value) -> &[Value] {
    v.as_array().map(Vec::as_slice).unwrap_or_default()
}

/// Where a file the proxy opens comes from in the pod. `Ok(Some(text))` when the render holds
/// it (a generated ConfigMap), `Ok(None)` when something outside the render provides it (a
/// Secret, a ConfigMap created separately, the node, the service-account mount), `Err` when
/// nothing does.
fn provided(
    pod: &Value,
    container: &Value,
    path: &str,
    objects: &[Value],
) -> Result<Option<String>, String> {
    let mount = list(&container["volumeMounts"])
        .iter()
        .filter(|m| {
            let at = m["mountPath"].as_str().unwrap_or_default();
            path == at || path.starts_with(&format!("{}/", at.trim_end_matches('/')))
        })
        .max_by_key(|m| m["mountPath"].as_str().unwrap_or_default().len());
    let Some(mount) = mount else {
        let sa = "/var/run/secrets/kubernetes.io/serviceaccount/";
        if path.starts_with(sa) && pod["automountServiceAccountToken"] != false {
            return Ok(None);
        }
        return Err(format!("{path}: no volume is mounted there"));
    };
    let at = mount["mountPath"].as_str().unwrap();
    let mut rel = path[at.len()..].trim_start_matches('/').to_owned();
    if let Some(sub) = mount["subPath"].as_str() {
        rel = if rel.is_empty() {
            sub.to_owned()
        } else {
            format!("{sub}/{rel}")
        };
    }
    let volume = list(&pod["volumes"])
        .iter()
        .find(|v| v["name"] == mount["name"])
        .ok_or_else(|| format!("{path}: volume {} is not in the pod", mount["name"]))?;
    let config_map = |source: &Value, key: &str| -> Option<String> {
        let name = source["name"].as_str()?;
        objects
            .iter()
            .find(|o| o["kind"] == "ConfigMap" && o["metadata"]["name"] == name)
            .map(|cm| cm["data"][key].as_str().map(str::to_owned))?
    };
    // The key a source with `items` puts at `rel`; without items, any key (or none found).
    let key_at = |source: &Value| -> Option<String> {
        match source["items"].as_array() {
            Some(items) => items
                .iter()
                .find(|i| i["path"] == rel.as_str())
                .and_then(|i| i["key"].as_str().map(str::to_owned)),
            None => (!rel.is_empty() && !rel.contains('/')).then(|| rel.clone()),
        }
    };
    if let Some(host) = volume.get("hostPath") {
        let kind = host["type"].as_str().unwrap_or_default();
        let fits = if rel.is_empty() {
            matches!(kind, "File" | "")
        } else {
            matches!(kind, "Directory" | "DirectoryOrCreate" | "")
        };
        return if fits {
            Ok(None)
        } else {
            Err(format!("{path}: hostPath of type {kind:?}"))
        };
    }
    let sources: Vec<(&str, &Value)> = if let Some(p) = volume.get("projected") {
        list(&p["sources"])
            .iter()
            .flat_map(|s| {
                ["configMap", "secret", "serviceAccountToken"]
                    .into_iter()
                    .filter_map(move |kind| s.get(kind).map(|v| (kind, v)))
            })
            .collect()
    } else {
        ["configMap", "secret"]
            .into_iter()
            .filter_map(|kind| volume.get(kind).map(|v| (kind, v)))
            .collect()
    };
    for (kind, source) in sources {
        if kind == "serviceAccountToken" {
            if source["path"] == rel.as_str() {
                return Ok(None);
            }
            continue;
        }
        let Some(key) = key_at(source) else { continue };
        if kind == "configMap" {
            let generated = objects
                .iter()
                .any(|o| o["kind"] == "ConfigMap" && o["metadata"]["name"] == source["name"]);
            if generated {
                return config_map(source, &key)
                    .map(Some)
                    .ok_or_else(|| format!("{path}: ConfigMap {} has no {key}", source["name"]));
            }
        }
        return Ok(None);
    }
    Err(format!(
        "{path}: volume {} provides no such file",
        mount["name"]
    ))
}

/// The proxy's settings as the binary reads them from the container's args and the config
/// file the pod provides.
fn effective_settings(
    k: &Kustomization,
    pod: &Value,
    container: &Value,
    objects: &[Value],
    scratch: &Path,
) -> ServeArgs {
    let args: Vec<String> = list(&container["args"])
        .iter()
        .map(|a| a.as_str().unwrap().to_owned())
        .collect();
    let argv = || std::iter::once("kube-ws-proxy".to_owned()).chain(args.iter().cloned());
    let flags_only = Cli::try_parse_from(argv())
        .unwrap_or_else(|e| panic!("{}: {args:?} do not parse: {e}", k.dir));
    let Some(config) = flags_only.serve.process.config else {
        return kube_ws_proxy::config_file::parse_args(argv())
            .unwrap()
            .serve;
    };
    let config = config.to_str().unwrap().to_owned();
    let text = match provided(pod, container, &config, objects) {
        Ok(Some(text)) => text,
        Ok(None) => {
            let (node_path, example) = k
                .node_file
                .unwrap_or_else(|| panic!("{}: --config {config} is not in the render", k.dir));
            assert_eq!(config, node_path, "{}: the config file on the node", k.dir);
            std::fs::read_to_string(root().join(example)).unwrap()
        }
        Err(e) => panic!("{}: --config: {e}", k.dir),
    };
    let file = scratch.join(format!("{}.yaml", k.dir.replace('/', "-")));
    std::fs::write(&file, text).unwrap();
    let file = file.to_str().unwrap();
    let mut replaced = Vec::new();
    for (i, a) in args.iter().enumerate() {
        if a == &format!("--config={config}") {
            replaced.push(format!("--config={file}"));
        } else if a == &config && i > 0 && args[i - 1] == "--config" {
            replaced.push(file.to_owned());
        } else {
            replaced.push(a.clone());
        }
    }
    let argv = std::iter::once("kube-ws-proxy".to_owned()).chain(replaced);
    kube_ws_proxy::config_file::parse_args(argv)
        .unwrap_or_else(|e| panic!("{}: the binary refuses its configuration: {e}", k.dir))
        .serve
}

/// The files each named cluster of the config file opens: its own kubeconfig, CA and
/// credentials (`--cluster NAME=URL` opens only the proxy's `--upstream-ca-file`, listed
/// already).
fn cluster_files(s: &ServeArgs) -> Vec<PathBuf> {
    let mut paths = Vec::new();
    for c in &s.upstream.file_clusters {
        let files = [
            &c.kubeconfig,
            &c.upstream_ca_file,
            &c.upstream_token_file,
            &c.upstream_client_cert_file,
            &c.upstream_client_key_file,
            &c.front_proxy_client_cert_file,
            &c.front_proxy_client_key_file,
        ];
        paths.extend(files.into_iter().flatten().cloned());
        if c.in_cluster {
            let dir = c
                .service_account_dir
                .clone()
                .unwrap_or_else(|| s.upstream.service_account_dir.clone());
            paths.push(dir.join("ca.crt"));
        }
    }
    paths
}

/// A container port by name or number.
fn port_number(container: &Value, port: &Value) -> u64 {
    port.as_u64().unwrap_or_else(|| {
        list(&container["ports"])
            .iter()
            .find(|p| p["name"] == *port)
            .and_then(|p| p["containerPort"].as_u64())
            .unwrap_or_else(|| panic!("no container port {port}"))
    })
}

/// Everything the rendered pods ask of the proxy, the proxy accepts: its args and config
/// file parse; every file it will open is provided by a volume; its ports, probes, grace
/// period and Services agree with the settings it ends up with.
#[test]
fn rendered_pods_match_what_the_binary_reads() {
    let Some(all) = rendered() else { return };
    let scratch = tempfile::tempdir().unwrap();
    for (k, objects) in &all {
        let mut proxies = 0;
        let mut listener_tls = None;
        for (name, pod) in pod_specs(objects) {
            let where_ = format!("{} {name}", k.dir);
            for container in list(&pod["containers"]) {
                let image = container["image"].as_str().unwrap_or_default();
                if !image.contains("kube-ws-proxy") {
                    continue;
                }
                proxies += 1;
                let s = effective_settings(k, pod, container, objects, scratch.path());

                let files = [
                    &s.upstream.kubeconfig,
                    &s.upstream.upstream_ca_file,
                    &s.upstream.upstream_token_file,
                    &s.upstream.upstream_client_cert_file,
                    &s.upstream.upstream_client_key_file,
                    &s.auth.front_proxy_client_cert_file,
                    &s.auth.front_proxy_client_key_file,
                    &s.listeners.tls_cert_file,
                    &s.listeners.tls_private_key_file,
                    &s.listeners.client_ca_file,
                    &s.listeners.peer_ca_file,
                ];
                let mut paths: Vec<PathBuf> = files.into_iter().flatten().cloned().collect();
                paths.extend(cluster_files(&s));
                if s.upstream.in_cluster {
                    // Passthrough sends no credentials of the proxy's own: the CA is enough.
                    if s.auth.auth_mode != AuthMode::Passthrough {
                        paths.push(s.upstream.service_account_dir.join("token"));
                    }
                    paths.push(s.upstream.service_account_dir.join("ca.crt"));
                }
                for path in paths {
                    if let Err(e) = provided(pod, container, path.to_str().unwrap(), objects) {
                        panic!("{where_}: a file the proxy opens is missing: {e}");
                    }
                }

                check_peers(&where_, pod, objects, &s);
                check_ports(
                    &where_,
                    pod,
                    container,
                    s.listeners.listen,
                    s.listeners.admin_listen,
                );
                check_credentials_mounted_only_where_needed(&where_, &name, pod, &s);
                check_secret_files_are_private(&where_, pod);
                listener_tls = Some(s.listeners.tls_cert_file.is_some());
                if s.auth.auth_mode == AuthMode::FrontProxy {
                    check_api_server_trusts(&where_, pod, &s);
                }
                let grace = pod["terminationGracePeriodSeconds"].as_u64().unwrap_or(30);
                assert!(
                    grace > s.process.drain_timeout.as_secs(),
                    "{where_}: terminationGracePeriodSeconds {grace} does not outlast \
                     drain-timeout {:?}",
                    s.process.drain_timeout
                );
            }
        }
        assert_eq!(proxies, 1, "{}: one kube-ws-proxy container", k.dir);

        // A Service's target port is a port of the pods it selects.
        for service in objects.iter().filter(|o| o["kind"] == "Service") {
            let (_, pod) = pod_specs(objects)
                .into_iter()
                .next()
                .expect("a Service and no pods");
            for port in list(&service["spec"]["ports"]) {
                let target = &port["targetPort"];
                let found = list(&pod["containers"]).iter().any(|c| {
                    list(&c["ports"])
                        .iter()
                        .any(|p| p["name"] == *target || p["containerPort"] == *target)
                });
                assert!(
                    found,
                    "{}: Service targetPort {target} is no container port",
                    k.dir
                );
                check_service_port_says_what_it_serves(k.dir, port, listener_tls);
            }
        }
        check_network_policy(k.dir, objects);
    }
}

/// A Service port named or numbered for HTTPS is served with TLS, and a plain listener's port
/// is not called HTTPS (the base's Service said 443 while the container spoke plain HTTP).
fn check_service_port_says_what_it_serves(dir: &str, port: &Value, listener_tls: Option<bool>) {
    if port["targetPort"] != "api" {
        return;
    }
    let tls = listener_tls.expect("a proxy container");
    let name = port["name"].as_str().unwrap_or_default();
    let says_https = port["port"] == 443 || name.contains("https") || name.contains("tls");
    assert_eq!(
        says_https,
        tls,
        "{dir}: Service port {port} and a main listener {} TLS",
        if tls { "with" } else { "without" }
    );
}

/// A pod whose proxy uses no service-account token mounts none (passthrough sends no
/// credentials of its own; a kubeconfig or a token file bring their own). Static pods have no
/// service account.
fn check_credentials_mounted_only_where_needed(
    where_: &str,
    object: &str,
    pod: &Value,
    s: &ServeArgs,
) {
    if object.starts_with("Pod/") {
        return;
    }
    let uses_token = s.upstream.in_cluster
        && s.auth.auth_mode != AuthMode::Passthrough
        && s.upstream.upstream_token_file.is_none();
    let projected_token = list(&pod["volumes"]).iter().any(|v| {
        list(&v["projected"]["sources"])
            .iter()
            .any(|src| src.get("serviceAccountToken").is_some())
    });
    let automount = pod["automountServiceAccountToken"] != false;
    if !uses_token {
        assert!(
            !automount && !projected_token,
            "{where_}: a service-account token is mounted that the proxy never uses"
        );
    }
}

/// Every file of a Secret the pod mounts is readable by the proxy (through the pod's fsGroup:
/// the kubelet gives the files of Secret, ConfigMap and projected volumes to it) and by no one
/// else, and writable by no one: mode 0440 or narrower.
fn check_secret_files_are_private(where_: &str, pod: &Value) {
    let fs_group = pod["securityContext"]["fsGroup"].as_u64();
    for volume in list(&pod["volumes"]) {
        let (default_mode, secrets): (&Value, Vec<&Value>) =
            if let Some(secret) = volume.get("secret") {
                (&secret["defaultMode"], vec![secret])
            } else if let Some(projected) = volume.get("projected") {
                let secrets = list(&projected["sources"])
                    .iter()
                    .filter_map(|src| src.get("secret"))
                    .collect();
                (&projected["defaultMode"], secrets)
            } else {
                continue;
            };
        for secret in secrets {
            // Kubernetes' default mode is 0644.
            let default = default_mode.as_u64().unwrap_or(0o644);
            let items = list(&secret["items"]);
            let modes: Vec<u64> = if items.is_empty() {
                vec![default]
            } else {
                items
                    .iter()
                    .map(|i| i["mode"].as_u64().unwrap_or(default))
                    .collect()
            };
            for mode in modes {
                assert!(
                    mode & !0o440 == 0,
                    "{where_}: Secret {} mounted with mode {mode:o}, beyond 0440",
                    secret["name"]
                );
                assert!(
                    fs_group.is_some() && mode & 0o040 != 0,
                    "{where_}: Secret {} (mode {mode:o}, owned by root) is readable by the \
                     proxy only through the pod's fsGroup and the group bit",
                    secret["name"]
                );
            }
        }
    }
}

/// Where the render holds a Deployment, a NetworkPolicy selects its pods: the API port is open
/// to every client; the admin port (no authentication) only to named peers, never to all.
fn check_network_policy(dir: &str, objects: &[Value]) {
    let Some(deployment) = objects.iter().find(|o| o["kind"] == "Deployment") else {
        return;
    };
    let template = &deployment["spec"]["template"];
    let labels = &template["metadata"]["labels"];
    let policy = objects
        .iter()
        .filter(|o| o["kind"] == "NetworkPolicy")
        .find(|p| {
            let wanted = p["spec"]["podSelector"]["matchLabels"].as_object();
            wanted.is_some_and(|m| m.iter().all(|(k, v)| labels[k] == *v))
        })
        .unwrap_or_else(|| panic!("{dir}: no NetworkPolicy selects the proxy's pods"));
    assert!(
        list(&policy["spec"]["policyTypes"])
            .iter()
            .any(|t| t == "Ingress"),
        "{dir}: the NetworkPolicy does not restrict ingress"
    );
    let container = list(&template["spec"]["containers"])
        .iter()
        .find(|c| {
            c["image"]
                .as_str()
                .unwrap_or_default()
                .contains("kube-ws-proxy")
        })
        .unwrap();
    let number = |name: &str| port_number(container, &Value::from(name));
    // The rules that let a connection to `port` in, by name or number (no ports: every port).
    let rules_for = |port: u64| -> Vec<&Value> {
        list(&policy["spec"]["ingress"])
            .iter()
            .filter(|rule| {
                let ports = list(&rule["ports"]);
                ports.is_empty()
                    || ports.iter().any(|p| {
                        p["port"].as_u64() == Some(port) || {
                            p["port"].as_str().is_some_and(|n| number(n) == port)
                        }
                    })
            })
            .collect()
    };
    let open_to_all = |rule: &Value| {
        let from = list(&rule["from"]);
        from.is_empty()
            || from.iter().any(|peer| {
                let cidr = peer["ipBlock"]["cidr"].as_str().unwrap_or_default();
                let any_namespace = peer["namespaceSelector"]
                    .as_object()
                    .is_some_and(|m| m.is_empty())
                    && peer.get("podSelector").is_none();
                cidr == "0.0.0.0/0" || cidr == "::/0" || any_namespace
            })
    };
    let admin = rules_for(number("admin"));
    assert!(
        !admin.is_empty(),
        "{dir}: no scraper can reach the admin port"
    );
    for rule in admin {
        assert!(
            !open_to_all(rule),
            "{dir}: the admin port is open to all: {rule}"
        );
    }
    assert!(
        rules_for(number("api")).into_iter().any(open_to_all),
        "{dir}: clients cannot reach the API port"
    );
}

fn check_ports(
    where_: &str,
    pod: &Value,
    container: &Value,
    listen: SocketAddr,
    admin: SocketAddr,
) {
    let host_network = pod["hostNetwork"] == true;
    if let Some(api) = list(&container["ports"])
        .iter()
        .find(|p| p["name"] == "api")
    {
        assert_eq!(
            api["containerPort"].as_u64(),
            Some(u64::from(listen.port())),
            "{where_}: container port api and the listen address {listen}"
        );
    }
    if let Some(admin_port) = list(&container["ports"])
        .iter()
        .find(|p| p["name"] == "admin")
    {
        assert_eq!(
            admin_port["containerPort"].as_u64(),
            Some(u64::from(admin.port())),
            "{where_}: container port admin and the admin address {admin}"
        );
    }
    for probe in ["readinessProbe", "livenessProbe"] {
        let get = &container[probe]["httpGet"];
        assert!(get.is_object(), "{where_}: no {probe} over HTTP");
        assert_eq!(
            port_number(container, &get["port"]),
            u64::from(admin.port()),
            "{where_}: {probe} port and the admin address {admin}"
        );
        let path = get["path"].as_str().unwrap_or_default();
        assert!(
            path == "/healthz" || path == "/readyz",
            "{where_}: {probe} path {path}"
        );
        // The kubelet probes the pod's address, or with hostNetwork the host it names.
        if admin.ip().is_loopback() {
            assert!(
                host_network && get["host"] == "127.0.0.1",
                "{where_}: {probe} cannot reach an admin listener on {admin}"
            );
        }
    }
    // A non-root proxy binds a port below 1024 only when the pod lowers the privileged range.
    let pod_user = &pod["securityContext"]["runAsUser"];
    let user = container["securityContext"]["runAsUser"]
        .as_u64()
        .or(pod_user.as_u64());
    if listen.port() < 1024 && user != Some(0) {
        let start = list(&pod["securityContext"]["sysctls"])
            .iter()
            .find(|s| s["name"] == "net.ipv4.ip_unprivileged_port_start")
            .and_then(|s| s["value"].as_str()?.parse::<u16>().ok());
        assert!(
            start.is_some_and(|s| s <= listen.port()),
            "{where_}: uid {user:?} cannot bind {listen}"
        );
    }
}

/// A kube-apiserver in the same pod takes the proxy's front-proxy headers: it has a
/// request-header CA and allowed names, and its header flags name the proxy's headers.
fn check_api_server_trusts(where_: &str, pod: &Value, s: &ServeArgs) {
    let Some(api_server) = list(&pod["containers"])
        .iter()
        .find(|c| c["name"] == "kube-apiserver")
    else {
        return;
    };
    let flag = |name: &str| -> Vec<String> {
        list(&api_server["command"])
            .iter()
            .filter_map(|a| a.as_str()?.strip_prefix(&format!("--{name}=")))
            .flat_map(|v| v.split(','))
            .map(str::to_ascii_lowercase)
            .collect()
    };
    for name in [
        "requestheader-client-ca-file",
        "requestheader-allowed-names",
    ] {
        assert!(
            !flag(name).is_empty(),
            "{where_}: kube-apiserver has no --{name}"
        );
    }
    for (name, header) in [
        (
            "requestheader-username-headers",
            &s.auth.front_proxy_username_header,
        ),
        (
            "requestheader-group-headers",
            &s.auth.front_proxy_group_header,
        ),
        (
            "requestheader-extra-headers-prefix",
            &s.auth.front_proxy_extra_header_prefix,
        ),
    ] {
        assert!(
            flag(name).contains(&header.as_str().to_ascii_lowercase()),
            "{where_}: kube-apiserver --{name} does not name the proxy's {header}"
        );
    }
}

/// A Deployment's replicas find each other (`--peers`) through a headless Service of the render
/// that selects their pods and leaves out the not-ready ones, at the pods' own main port (a
/// headless name resolves to pod addresses, so the Service's port mapping does not apply),
/// over TLS when the listener speaks it.
fn check_peers(where_: &str, pod: &Value, objects: &[Value], s: &ServeArgs) {
    let Some(deployment) = objects.iter().find(|o| o["kind"] == "Deployment") else {
        return;
    };
    assert_eq!(
        &deployment["spec"]["template"]["spec"], pod,
        "{where_}: one Deployment"
    );
    let peers = &s.listeners.peers;
    assert_eq!(peers.len(), 1, "{where_}: --peers {peers:?}");
    let url = url::Url::parse(&peers[0]).unwrap();
    let host = url.host_str().unwrap();
    let namespace = deployment["metadata"]["namespace"].as_str().unwrap();
    let service = objects
        .iter()
        .filter(|o| o["kind"] == "Service" && o["metadata"]["namespace"] == namespace)
        .find(|o| {
            format!(
                "{}.{namespace}.svc",
                o["metadata"]["name"].as_str().unwrap()
            ) == host
        })
        .unwrap_or_else(|| panic!("{where_}: no Service is the peers' host {host}"));
    let spec = &service["spec"];
    assert_eq!(
        spec["clusterIP"], "None",
        "{where_}: {host} is not headless"
    );
    assert_ne!(
        spec["publishNotReadyAddresses"], true,
        "{where_}: {host} publishes replicas that are not ready"
    );
    let labels = &deployment["spec"]["template"]["metadata"]["labels"];
    let selector = spec["selector"].as_object().expect("a selector");
    assert!(
        !selector.is_empty() && selector.iter().all(|(k, v)| labels[k] == *v),
        "{where_}: {host} does not select the proxy's pods"
    );
    assert_eq!(
        url.port_or_known_default(),
        Some(s.listeners.listen.port()),
        "{where_}: --peers {url} and the listen address {}",
        s.listeners.listen
    );
    assert_eq!(
        url.scheme() == "https",
        s.listeners.tls_cert_file.is_some(),
        "{where_}: --peers {url} and the main listener's TLS"
    );
}
