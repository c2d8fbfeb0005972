//! The sessions API (`/apis/kube-ws-proxy.io/v1/sessions`) with real kubectl on both sides:
//! kubectl 1.33 runs a session, operators use `kubectl get --raw` and `kubectl delete --raw`
//! with their own kubeconfigs, and the simulated cluster decides with its RBAC policy
//! (SelfSubjectAccessReviews with the caller's token in passthrough mode,
//! SubjectAccessReviews with the proxy's in impersonate mode). A terminated session's kubectl
//! prints who ended it and why and exits non-zero; its audit `ended` event names them; the
//! pod's process ends.

use crate::common;

use std::process::Stdio;
use std::time::Duration;

use common::clients::require_kubectl;
use common::harness::stderr;
use common::operated::{
    forbidden, forbidden_one, Operated, OLGA, PROXY_USER, SESSIONS, T, TINA, VIC,
};
use kube_ws_proxy::sim::{SimEvent, SimReviewKind};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passthrough_operators_list_and_terminate_under_the_clusters_rbac() {
    let Some(k33) = require_kubectl("1.33") else {
        return;
    };
    let o = Operated::start(&[]).await;
    let (tina, olga, vic) = (
        o.kubeconfig("tina", Some(TINA), None),
        o.kubeconfig("olga", Some(OLGA), None),
        o.kubeconfig("vic", Some(VIC), None),
    );
    let session = o.running_exec(&k33, &tina, "echo started; sleep 50").await;

    // olga sees it, with who runs what where.
    let items = o.sessions(&k33, &olga, 1).await;
    let s = &items[0];
    let id = s["metadata"]["name"].as_str().unwrap().to_owned();
    assert_eq!(s["metadata"]["namespace"], "default", "{s}");
    assert_eq!(s["spec"]["user"], "tina", "{s}");
    assert_eq!(s["spec"]["pod"], "web", "{s}");
    assert_eq!(s["spec"]["verb"], "exec", "{s}");
    assert_eq!(s["spec"]["protocolPath"], "translated", "{s}");
    let one = format!("/apis/kube-ws-proxy.io/v1/namespaces/default/sessions/{id}");
    assert_eq!(
        o.get_raw(&k33, &olga, &one).await.unwrap()["metadata"]["name"],
        id
    );

    // vic may list only team-a; tina may not list, nor end her own session.
    let denied = o.get_raw(&k33, &vic, SESSIONS).await.unwrap_err();
    assert!(denied.contains(&forbidden("vic", "list", None)), "{denied}");
    let team_a = "/apis/kube-ws-proxy.io/v1/namespaces/team-a/sessions";
    let listed = o.get_raw(&k33, &vic, team_a).await.unwrap();
    assert_eq!(listed["items"], serde_json::json!([]), "{listed}");
    let denied = o.get_raw(&k33, &tina, SESSIONS).await.unwrap_err();
    assert!(
        denied.contains(&forbidden("tina", "list", None)),
        "{denied}"
    );
    let refused = o.kubectl(&k33, &tina, &["delete", "--raw", &one]).await;
    assert!(!refused.status.success());
    assert!(
        stderr(&refused).contains(&forbidden_one("tina", "delete", Some("default"), Some(&id))),
        "{}",
        stderr(&refused)
    );

    // olga ends it: tina's kubectl is told who and why and fails; the pod's process ends.
    let reason = format!("{one}?reason=incident-42");
    let printed = o.terminate(&k33, &olga, &reason, session).await;
    assert!(
        printed.contains("terminated by olga: incident-42"),
        "{printed}"
    );
    let event = o.ended(&id).await;
    assert_eq!(event["outcome"], "terminated", "{event}");
    assert_eq!(event["terminated_by"], "olga", "{event}");
    assert_eq!(event["termination_reason"], "incident-42", "{event}");
    o.sim
        .wait_for_event(T, |e| matches!(e, SimEvent::ProcessExited { .. }))
        .await
        .expect("the pod's process ended");
    assert!(o.sessions(&k33, &olga, 0).await.is_empty());
    let gone = o.get_raw(&k33, &olga, &one).await.unwrap_err();
    assert!(gone.contains("not found"), "{gone}");

    // Every review was the caller's own: the proxy spent no privilege of its own.
    let reviews = o.sim.access_reviews();
    assert!(!reviews.is_empty());
    for r in &reviews {
        assert_eq!(r.kind, SimReviewKind::SelfSubject, "{r:?}");
        assert_ne!(r.made_by, PROXY_USER, "{r:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn impersonate_mode_asks_the_cluster_about_the_authenticated_caller() {
    let Some(k33) = require_kubectl("1.33") else {
        return;
    };
    let o = Operated::start(&["--auth-mode", "impersonate"]).await;
    let olga = o.kubeconfig("olga", None, Some(&o.client_ca.client("olga", None)));
    let tina = o.kubeconfig("tina", None, Some(&o.client_ca.client("tina", None)));
    let session = o.running_exec(&k33, &tina, "echo started; sleep 50").await;
    let items = o.sessions(&k33, &olga, 1).await;
    assert_eq!(items[0]["spec"]["user"], "tina", "{}", items[0]);
    let denied = o.get_raw(&k33, &tina, SESSIONS).await.unwrap_err();
    assert!(
        denied.contains(&forbidden("tina", "list", None)),
        "{denied}"
    );
    let id = items[0]["metadata"]["name"].as_str().unwrap();
    let one = format!("/apis/kube-ws-proxy.io/v1/namespaces/default/sessions/{id}");
    o.terminate(&k33, &olga, &one, session).await;
    assert_eq!(o.ended(id).await["terminated_by"], "olga");
    // SubjectAccessReviews, made by the proxy's own account about the caller.
    let reviews = o.sim.access_reviews();
    assert!(reviews.iter().any(|r| r.subject.name == "olga"));
    for r in &reviews {
        assert_eq!(r.kind, SimReviewKind::Subject, "{r:?}");
        assert_eq!(r.made_by, PROXY_USER, "{r:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_shows_sessions_come_and_go() {
    let Some(k33) = require_kubectl("1.33") else {
        return;
    };
    let o = Operated::start(&[]).await;
    let (tina, olga) = (
        o.kubeconfig("tina", Some(TINA), None),
        o.kubeconfig("olga", Some(OLGA), None),
    );
    let mut watch = o.kubectl_cmd(&k33, &olga);
    watch
        .args([
            "get",
            "--raw",
            &format!("{SESSIONS}?watch=true&timeoutSeconds=20"),
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped());
    let mut watch = watch.spawn().unwrap();
    let mut events = BufReader::new(watch.stdout.take().unwrap()).lines();
    // The watch is there before the session (its list is empty), then sees it start and end.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let out = o
        .kubectl(&k33, &tina, &["exec", "web", "--", "echo", "hi"])
        .await;
    assert!(out.status.success(), "{}", stderr(&out));
    let mut seen = Vec::new();
    while seen.len() < 2 {
        let line = tokio::time::timeout(T, events.next_line())
            .await
            .expect("an event")
            .unwrap()
            .expect("the watch goes on");
        let e: Value = serde_json::from_str(&line).unwrap();
        seen.push((
            e["type"].as_str().unwrap().to_owned(),
            e["object"]["spec"]["user"].clone(),
        ));
    }
    assert_eq!(
        seen,
        [
            ("ADDED".to_owned(), Value::from("tina")),
            ("DELETED".to_owned(), Value::from("tina"))
        ]
    );
    let _ = watch.kill().await;
}
