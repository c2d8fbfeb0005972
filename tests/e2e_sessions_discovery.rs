//! The sessions API's group in the cluster's discovery (`--sessions-discovery`, on by
//! default): kubectl 1.33 (aggregated discovery, `apidiscovery.k8s.io/v2`, which the simulated
//! cluster answers when asked) and kubectl 1.27 find `sessions.kube-ws-proxy.io` through the
//! proxy's `/apis` with the operator's own kubeconfig and a fresh discovery cache each, list a
//! live session with `kubectl get … -A` and `-n` (a `Table`), a user RBAC denies gets
//! kubectl's Forbidden error, and `kubectl delete sessions.kube-ws-proxy.io` ends one.

use crate::common;

use std::path::Path;

use common::clients::require_kubectl;
use common::harness::stderr;
use common::operated::{failed_stderr, forbidden, Operated, OLGA, TINA};

/// Whether a file under `dir` (kubectl's discovery cache) names the group.
fn cache_names_the_group(dir: &Path) -> bool {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return false;
    };
    entries.flatten().any(|e| {
        let path = e.path();
        match path.is_dir() {
            true => cache_names_the_group(&path),
            false => {
                std::fs::read_to_string(&path).is_ok_and(|text| text.contains("kube-ws-proxy.io"))
            }
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_gets_and_deletes_sessions_by_their_resource_name() {
    let (Some(k33), Some(k27)) = (require_kubectl("1.33"), require_kubectl("1.27")) else {
        return;
    };
    let o = Operated::start(&[]).await;
    let (tina, olga) = (
        o.kubeconfig("tina", Some(TINA), None),
        o.kubeconfig("olga", Some(OLGA), None),
    );
    let session = o.running_exec(&k33, &tina, "echo started; sleep 50").await;
    let (id, _) = o.only_session(&k33, &olga).await;

    for (version, k) in [("1.33", &k33), ("1.27", &k27)] {
        let cache = tempfile::tempdir().unwrap();
        let cache_dir = cache.path().to_str().unwrap();
        let get = |who, args: &'static [&'static str]| {
            let mut all = vec!["--cache-dir", cache_dir, "get", "sessions.kube-ws-proxy.io"];
            all.extend_from_slice(args);
            let o = &o;
            async move { o.kubectl(k, who, &all).await }
        };
        let listed = get(&olga, &["-A"]).await;
        assert!(listed.status.success(), "{version}: {}", stderr(&listed));
        let text = String::from_utf8_lossy(&listed.stdout).into_owned();
        let header: Vec<&str> = text.lines().next().unwrap().split_whitespace().collect();
        assert_eq!(
            header,
            [
                "NAMESPACE",
                "NAME",
                "USER",
                "POD",
                "CONTAINER",
                "COMMAND",
                "VERB",
                "AGE"
            ],
            "{version}: {text}"
        );
        let row = text.lines().nth(1).unwrap_or_default();
        for cell in ["default", id.as_str(), "tina", "web", "exec"] {
            assert!(
                row.split_whitespace().any(|c| c == cell),
                "{version}: {text}"
            );
        }
        let in_default = get(&olga, &["-n", "default"]).await;
        let text = String::from_utf8_lossy(&in_default.stdout).into_owned();
        assert!(
            text.contains(&id),
            "{version}: {text}{}",
            stderr(&in_default)
        );
        assert!(
            cache_names_the_group(cache.path()),
            "{version}: nothing cached"
        );

        let denied = get(&tina, &["-A"]).await;
        assert!(!denied.status.success());
        let printed = stderr(&denied);
        assert!(
            printed.contains(&format!(
                "Error from server (Forbidden): {}",
                forbidden("tina", "list", None)
            )),
            "{version}: {printed}"
        );
    }

    let cache = tempfile::tempdir().unwrap();
    let args = [
        "--cache-dir",
        cache.path().to_str().unwrap(),
        "delete",
        "sessions.kube-ws-proxy.io",
        &id,
        "-n",
        "default",
    ];
    let deleted = o.kubectl(&k33, &olga, &args).await;
    assert!(deleted.status.success(), "{}", stderr(&deleted));
    let said = String::from_utf8_lossy(&deleted.stdout).into_owned();
    assert!(
        said.contains(&format!("session.kube-ws-proxy.io \"{id}\" deleted")),
        "{said}"
    );
    let printed = failed_stderr(session).await;
    assert!(printed.contains("terminated by olga"), "{printed}");
    assert_eq!(o.ended(&id).await["terminated_by"], "olga");
}
