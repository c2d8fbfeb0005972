//! The deployment files ask the binary for flags it really has: every `--flag` in the
//! manifests' container args and in the Dockerfile's CMD parses with the real command line.
//! (Schema validation of the manifests runs in scripts/test.sh with kubernetes-validate.)

use std::path::Path;

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
