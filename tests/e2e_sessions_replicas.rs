//! Many replicas (`--peers`): two proxies in front of one simulated cluster with RBAC for the
//! sessions API. tina's kubectl 1.33 session runs on replica B; on replica A (peers: B, and an
//! address where no replica answers), olga's `?allReplicas=true` lists it with B's name, a
//! `get` finds it on B, its recording is followed from A as B writes it, and a `delete`
//! terminates it there (tina's kubectl is told who and
//! why). vic, who may list only `team-a`, is refused the fleet-wide list by A itself. Every
//! access review, on either replica, was made with the caller's own token: passing a call on
//! spends no privilege of the proxy's.

use crate::common;

use std::process::Stdio;

use common::clients::require_kubectl;
use common::harness::stderr;
use common::operated::{
    failed_stderr, forbidden, session_path, Operated, OLGA, PROXY_USER, SESSIONS, T, TINA, VIC,
};
use kube_ws_proxy::sim::SimReviewKind;
use tokio::io::{AsyncBufReadExt, BufReader};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_replica_lists_gets_and_ends_the_sessions_of_every_replica() {
    let Some(k33) = require_kubectl("1.33") else {
        return;
    };
    // B is the rig's proxy; A passes calls on to B and to a port where nothing listens.
    let records = tempfile::tempdir().unwrap();
    let record_dir = records.path().display().to_string();
    let o = Operated::start(&["--record", "required", "--record-dir", &record_dir]).await;
    let peer_ca = o.proxy_ca.write(o.dir.path(), "peer-ca");
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dead_url = format!("https://127.0.0.1:{}", dead.local_addr().unwrap().port());
    drop(dead);
    let peers = format!("{},{dead_url}", o.url());
    let a = o.replica(
        "a",
        &[
            "--peers",
            &peers,
            "--peer-ca-file",
            &peer_ca.display().to_string(),
        ],
    );
    let (olga_a, vic_a) = (
        o.kubeconfig_at(&a, "olga-a", OLGA),
        o.kubeconfig_at(&a, "vic-a", VIC),
    );

    // tina's session runs on B.
    let tina = o.kubeconfig("tina", Some(TINA), None);
    let mut c = o.kubectl_cmd(&k33, &tina);
    c.args(["exec", "web", "--", "sh", "-c", "echo started; sleep 60"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut kubectl = c.spawn().unwrap();
    let mut lines = BufReader::new(kubectl.stdout.take().unwrap()).lines();
    let first = tokio::time::timeout(T, lines.next_line())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(first.as_deref(), Some("started"));
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    let on_b = o
        .sessions(&k33, &o.kubeconfig("olga", Some(OLGA), None), 1)
        .await;
    let id = on_b[0]["metadata"]["name"].as_str().unwrap().to_owned();
    let b_replica = on_b[0]["status"]["replica"].as_str().unwrap().to_owned();

    // A alone has none; A asking every replica has B's, named by B, and says who did not answer.
    let own = o.get_raw(&k33, &olga_a, SESSIONS).await.unwrap();
    assert_eq!(own["items"], serde_json::json!([]), "{own}");
    let all = o
        .kubectl(
            &k33,
            &olga_a,
            &["get", "--raw", &format!("{SESSIONS}?allReplicas=true")],
        )
        .await;
    assert!(all.status.success(), "{}", stderr(&all));
    let list: serde_json::Value = serde_json::from_slice(&all.stdout).unwrap();
    let items = list["items"].as_array().unwrap();
    assert_eq!(items.len(), 1, "{list}");
    assert_eq!(items[0]["metadata"]["name"], id.as_str(), "{list}");
    assert_eq!(items[0]["status"]["replica"], b_replica.as_str(), "{list}");
    assert_eq!(items[0]["spec"]["user"], "tina", "{list}");
    let warned = stderr(&all);
    assert!(
        warned.contains("Warning") && warned.contains("did not answer"),
        "{warned}"
    );

    // vic may not list every namespace: A refuses before asking anyone.
    let denied = o
        .get_raw(&k33, &vic_a, &format!("{SESSIONS}?allReplicas=true"))
        .await
        .unwrap_err();
    assert!(denied.contains(&forbidden("vic", "list", None)), "{denied}");

    // A finds the session on B, and ends it there.
    let one = session_path("default", &id);
    let got = o.get_raw(&k33, &olga_a, &one).await.unwrap();
    assert_eq!(got["spec"]["user"], "tina", "{got}");
    let mut c = o.kubectl_cmd(&k33, &olga_a);
    c.args(["get", "--raw", &format!("{one}/recording?follow=true")])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut follower = c.spawn().unwrap();
    let mut followed = BufReader::new(follower.stdout.take().unwrap()).lines();
    let mut seen = Vec::new();
    while !seen.iter().any(|l: &String| l.contains("started\\n")) {
        let line = tokio::time::timeout(T, followed.next_line()).await;
        let line = line.unwrap().unwrap();
        seen.push(line.unwrap_or_else(|| panic!("B's recording, through A: {seen:#?}")));
    }
    let done = o
        .kubectl(
            &k33,
            &olga_a,
            &["delete", "--raw", &format!("{one}?reason=fleet-drill")],
        )
        .await;
    assert!(done.status.success(), "{}", stderr(&done));
    let printed = failed_stderr(kubectl).await;
    assert!(
        printed.contains("terminated by olga: fleet-drill"),
        "{printed}"
    );
    let event = o.ended(&id).await;
    assert_eq!(event["terminated_by"], "olga", "{event}");
    // The followed recording ended with the session, and is B's file.
    while let Some(line) = tokio::time::timeout(T, followed.next_line())
        .await
        .unwrap()
        .unwrap()
    {
        seen.push(line);
    }
    assert!(follower.wait().await.unwrap().success());
    let written = std::fs::read_to_string(event["recording"].as_str().unwrap()).unwrap();
    assert_eq!(seen.join("\n") + "\n", written);
    let gone = o.get_raw(&k33, &olga_a, &one).await.unwrap_err();
    assert!(gone.contains("not found"), "{gone}");

    // Every review, on both replicas, was the caller's own.
    let reviews = o.sim.access_reviews();
    assert!(!reviews.is_empty());
    for r in &reviews {
        assert_eq!(r.kind, SimReviewKind::SelfSubject, "{r:?}");
        assert_ne!(r.made_by, PROXY_USER, "{r:?}");
    }
}
