//! The JSON an API server 1.28 answers for discovery and the few core objects kubectl needs
//! before it streams: `/version`, `/api`, `/apis`, `/api/v1`, namespaces and pods.
//!
//! Every pod name exists: it is a Running, Ready pod with the containers [`CONTAINERS`].

use std::time::{Duration, SystemTime};

use serde_json::{json, Value};

pub(crate) use crate::timestamp::rfc3339;

/// The containers of every simulated pod; the first is the default container.
pub const CONTAINERS: [&str; 2] = ["main", "sidecar"];
/// The node every simulated pod runs on.
pub const NODE_NAME: &str = "sim-node";
/// The version the simulated cluster reports.
pub(crate) const GIT_VERSION: &str = "v1.28.15";
const IMAGE: &str = "registry.local/sim/busybox:1.36";

pub(crate) fn version() -> Value {
    json!({
        "major": "1",
        "minor": "28",
        "gitVersion": GIT_VERSION,
        "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean",
        "buildDate": "2024-10-22T20:26:30Z",
        "goVersion": "go1.22.8",
        "compiler": "gc",
        "platform": "linux/amd64"
    })
}

pub(crate) fn api_versions(server_addr: &str) -> Value {
    json!({
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server_addr}]
    })
}

/// The one API group besides core: `authentication.k8s.io` (TokenReview, SelfSubjectReview).
fn authentication_group_fields() -> Value {
    let v1 = json!({"groupVersion": "authentication.k8s.io/v1", "version": "v1"});
    json!({"name": "authentication.k8s.io", "versions": [v1.clone()], "preferredVersion": v1})
}

pub(crate) fn api_group_list() -> Value {
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": [authentication_group_fields()]})
}

/// `/apis` in aggregated form (`apidiscovery.k8s.io/` `version`): the authentication group
/// with its resources.
pub(crate) fn api_group_discovery_list(version: &str) -> Value {
    let resource = |name: &str, singular: &str, kind: &str| {
        json!({
            "resource": name,
            "responseKind": {"group": "authentication.k8s.io", "version": "v1", "kind": kind},
            "scope": "Cluster",
            "singularResource": singular,
            "verbs": ["create"],
        })
    };
    json!({
        "kind": "APIGroupDiscoveryList",
        "apiVersion": format!("apidiscovery.k8s.io/{version}"),
        "metadata": {},
        "items": [{
            "metadata": {"name": "authentication.k8s.io", "creationTimestamp": null},
            "versions": [{
                "version": "v1",
                "resources": [
                    resource("selfsubjectreviews", "selfsubjectreview", "SelfSubjectReview"),
                    resource("tokenreviews", "tokenreview", "TokenReview"),
                ],
                "freshness": "Current",
            }],
        }],
    })
}

/// `/apis/authentication.k8s.io`.
pub(crate) fn authentication_group() -> Value {
    let mut group = authentication_group_fields();
    if let Some(o) = group.as_object_mut() {
        o.insert("kind".into(), "APIGroup".into());
        o.insert("apiVersion".into(), "v1".into());
    }
    group
}

/// `/apis/authentication.k8s.io/v1`.
pub(crate) fn authentication_v1_resources() -> Value {
    let create = |name: &str, singular: &str, kind: &str| json!({"name": name, "singularName": singular, "namespaced": false, "kind": kind, "verbs": ["create"]});
    json!({
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": "authentication.k8s.io/v1",
        "resources": [
            create("selfsubjectreviews", "selfsubjectreview", "SelfSubjectReview"),
            create("tokenreviews", "tokenreview", "TokenReview")
        ]
    })
}

pub(crate) fn core_v1_resources() -> Value {
    let sub = |name: &str, kind: &str, verbs: &[&str]| json!({"name": name, "singularName": "", "namespaced": true, "kind": kind, "verbs": verbs});
    json!({
        "kind": "APIResourceList",
        "groupVersion": "v1",
        "resources": [
            {
                "name": "namespaces", "singularName": "namespace", "namespaced": false,
                "kind": "Namespace", "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"],
                "shortNames": ["ns"], "storageVersionHash": "Q3oi5N2YM8M="
            },
            {
                "name": "pods", "singularName": "pod", "namespaced": true, "kind": "Pod",
                "verbs": ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"],
                "shortNames": ["po"], "categories": ["all"], "storageVersionHash": "xPOwRZ+Yhw8="
            },
            sub("pods/attach", "PodAttachOptions", &["create", "get"]),
            sub("pods/exec", "PodExecOptions", &["create", "get"]),
            sub("pods/log", "Pod", &["get"]),
            sub("pods/portforward", "PodPortForwardOptions", &["create", "get"]),
            sub("pods/status", "Pod", &["get", "patch", "update"])
        ]
    })
}

/// A stable pseudo-UID for an object name (FNV-1a based, formatted like a UUID).
pub(crate) fn uid(kind: &str, namespace: &str, name: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut h2: u64 = 0x8422_2325_cbf2_9ce4;
    for b in kind
        .bytes()
        .chain([0])
        .chain(namespace.bytes())
        .chain([0])
        .chain(name.bytes())
    {
        h = (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
        h2 = (h2 ^ u64::from(b))
            .wrapping_mul(0x0000_0100_0000_01b3)
            .rotate_left(7);
    }
    let hex = format!("{h:016x}{h2:016x}");
    format!(
        "{}-{}-4{}-a{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[13..16],
        &hex[17..20],
        &hex[20..32]
    )
}

pub(crate) fn namespace(name: &str, created: SystemTime) -> Value {
    json!({
        "kind": "Namespace",
        "apiVersion": "v1",
        "metadata": {
            "name": name,
            "uid": uid("Namespace", "", name),
            "resourceVersion": "1",
            "creationTimestamp": rfc3339(created),
            "labels": {"kubernetes.io/metadata.name": name}
        },
        "spec": {"finalizers": ["kubernetes"]},
        "status": {"phase": "Active"}
    })
}

pub(crate) fn namespace_list(names: &[String], created: SystemTime) -> Value {
    let items: Vec<Value> = names.iter().map(|n| namespace(n, created)).collect();
    json!({"kind": "NamespaceList", "apiVersion": "v1", "metadata": {"resourceVersion": "1"}, "items": items})
}

fn pod_metadata(namespace: &str, name: &str, created: SystemTime) -> Value {
    json!({
        "name": name,
        "namespace": namespace,
        "uid": uid("Pod", namespace, name),
        "resourceVersion": "1",
        "creationTimestamp": rfc3339(created),
        "labels": {"app": "sim"},
        "annotations": {"kubectl.kubernetes.io/default-container": CONTAINERS[0]}
    })
}

pub(crate) fn pod(namespace: &str, name: &str, created: SystemTime) -> Value {
    let ts = rfc3339(created);
    let containers: Vec<Value> = CONTAINERS
        .iter()
        .map(|c| {
            json!({
                "name": c,
                "image": IMAGE,
                "command": ["sh", "-c", "sleep infinity"],
                "resources": {},
                "terminationMessagePath": "/dev/termination-log",
                "terminationMessagePolicy": "File",
                "imagePullPolicy": "IfNotPresent",
                "stdin": true
            })
        })
        .collect();
    let statuses: Vec<Value> = CONTAINERS
        .iter()
        .map(|c| {
            json!({
                "name": c,
                "state": {"running": {"startedAt": ts}},
                "lastState": {},
                "ready": true,
                "restartCount": 0,
                "image": IMAGE,
                "imageID": format!("{IMAGE}@sha256:{}", "0".repeat(64)),
                "containerID": format!("containerd://{}", uid("Container", name, c).replace('-', "")),
                "started": true
            })
        })
        .collect();
    let cond = |t: &str| json!({"type": t, "status": "True", "lastProbeTime": null, "lastTransitionTime": ts});
    json!({
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": pod_metadata(namespace, name, created),
        "spec": {
            "containers": containers,
            "restartPolicy": "Always",
            "terminationGracePeriodSeconds": 30,
            "dnsPolicy": "ClusterFirst",
            "serviceAccountName": "default",
            "serviceAccount": "default",
            "nodeName": NODE_NAME,
            "securityContext": {},
            "schedulerName": "default-scheduler",
            "tolerations": [],
            "priority": 0,
            "enableServiceLinks": true,
            "preemptionPolicy": "PreemptLowerPriority"
        },
        "status": {
            "phase": "Running",
            "conditions": [cond("Initialized"), cond("Ready"), cond("ContainersReady"), cond("PodScheduled")],
            "hostIP": "127.0.0.1",
            "podIP": "127.0.0.1",
            "podIPs": [{"ip": "127.0.0.1"}],
            "startTime": ts,
            "containerStatuses": statuses,
            "qosClass": "BestEffort"
        }
    })
}

pub(crate) fn pod_list(pods: &[(String, String)], created: SystemTime) -> Value {
    let items: Vec<Value> = pods.iter().map(|(ns, n)| pod(ns, n, created)).collect();
    json!({"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": "1"}, "items": items})
}

fn column(name: &str, format: &str, priority: u8, description: &str) -> Value {
    json!({"name": name, "type": "string", "format": format, "description": description, "priority": priority})
}

fn table(columns: Vec<Value>, rows: Vec<Value>) -> Value {
    json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {"resourceVersion": "1"},
        "columnDefinitions": columns,
        "rows": rows
    })
}

fn partial(metadata: Value) -> Value {
    json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": metadata})
}

/// Server-side printing (`Accept: application/json;as=Table;...`) for pods.
pub(crate) fn pod_table(pods: &[(String, String)], created: SystemTime) -> Value {
    let age = human_age(created);
    let columns = vec![
        column("Name", "name", 0, "Name must be unique within a namespace."),
        column(
            "Ready",
            "",
            0,
            "The aggregate readiness state of this pod for accepting traffic.",
        ),
        column(
            "Status",
            "",
            0,
            "The aggregate status of the containers in this pod.",
        ),
        column(
            "Restarts",
            "",
            0,
            "The number of times the containers in this pod have been restarted.",
        ),
        column("Age", "", 0, "CreationTimestamp of the object."),
        column("IP", "", 1, "IP address allocated to the pod."),
        column(
            "Node",
            "",
            1,
            "Name of the node where the pod is scheduled.",
        ),
        column(
            "Nominated Node",
            "",
            1,
            "Name of the node nominated for the pod.",
        ),
        column("Readiness Gates", "", 1, "Readiness gates of the pod."),
    ];
    let rows = pods
        .iter()
        .map(|(ns, n)| {
            json!({
                "cells": [n, format!("{0}/{0}", CONTAINERS.len()), "Running", "0", age, "127.0.0.1", NODE_NAME, "<none>", "<none>"],
                "object": partial(pod_metadata(ns, n, created))
            })
        })
        .collect();
    table(columns, rows)
}

/// Server-side printing for namespaces.
pub(crate) fn namespace_table(names: &[String], created: SystemTime) -> Value {
    let age = human_age(created);
    let columns = vec![
        column("Name", "name", 0, "Name must be unique within a namespace."),
        column("Status", "", 0, "The status of the namespace"),
        column("Age", "", 0, "CreationTimestamp of the object."),
    ];
    let rows = names
        .iter()
        .map(|n| {
            json!({
                "cells": [n, "Active", age],
                "object": partial(namespace(n, created)["metadata"].clone())
            })
        })
        .collect();
    table(columns, rows)
}

/// kubectl-style short age ("42s", "5m10s", "3h", "2d").
fn human_age(since: SystemTime) -> String {
    let s = SystemTime::now()
        .duration_since(since)
        .unwrap_or(Duration::ZERO)
        .as_secs();
    let (m, h) = (s / 60, s / 3600);
    if s < 120 {
        format!("{s}s")
    } else if m < 10 {
        match s % 60 {
            0 => format!("{m}m"),
            r => format!("{m}m{r}s"),
        }
    } else if m < 180 {
        format!("{m}m")
    } else if h < 48 {
        format!("{h}h")
    } else {
        format!("{}d", h / 24)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uid_is_stable_and_uuid_shaped() {
        let a = uid("Pod", "default", "web");
        assert_eq!(a, uid("Pod", "default", "web"));
        assert_ne!(a, uid("Pod", "default", "web2"));
        assert_eq!(a.len(), 36);
        assert_eq!(a.matches('-').count(), 4);
    }

    #[test]
    fn pod_has_what_kubectl_needs() {
        let p = pod("ns", "x", SystemTime::now());
        assert_eq!(p["status"]["phase"], "Running");
        assert_eq!(p["spec"]["containers"][0]["name"], "main");
        assert_eq!(p["spec"]["containers"][1]["name"], "sidecar");
    }
}
