//! Requests to the proxy's own API group, `kube-ws-proxy.io` (the sessions API), read once.
//! Every path under `/apis/kube-ws-proxy.io` is the proxy's to answer, whatever its method or
//! upgrade: a request to this group never goes upstream, where the cluster would not know it.

use http::Method;

use crate::request::target::RequestTarget;

pub use crate::proxy::auth::access_attributes::{
    RECORDING_SUBRESOURCE as RECORDING, SESSIONS_GROUP as GROUP, SESSIONS_RESOURCE as RESOURCE,
};

/// The group's one version.
pub const VERSION: &str = "v1";

/// What a request to the group asks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SessionsCall {
    /// `GET /apis/kube-ws-proxy.io`: the group (discovery).
    Group,
    /// `GET /apis/kube-ws-proxy.io/v1`: its resources (discovery).
    Resources,
    /// `GET …/sessions` (all namespaces) or `…/namespaces/NS/sessions`.
    List { namespace: Option<String> },
    /// The same with `?watch=true`: the live sessions, then their changes as they happen,
    /// for at most `timeout` (`?timeoutSeconds=`).
    Watch {
        namespace: Option<String>,
        timeout: std::time::Duration,
    },
    /// `GET …/namespaces/NS/sessions/ID`.
    Get { namespace: String, name: String },
    /// `DELETE …/namespaces/NS/sessions/ID`: terminate it, for the `reason` its query gives
    /// (first value, as the API server reads a query), if it gives one.
    Delete {
        namespace: String,
        name: String,
        reason: Option<String>,
    },
    /// `GET …/namespaces/NS/sessions/ID/recording`: the session's asciicast so far, or with
    /// `?follow=true` as it grows until the session ends. `follow` is the one query it takes.
    Recording {
        namespace: String,
        name: String,
        follow: bool,
    },
}

/// Why a request to the group is not a call it serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NotServed {
    /// No such path in the group (404).
    NotFound(String),
    /// The path exists, not with this method (405).
    MethodNotAllowed(Method),
    /// A query the call does not take yet (400), e.g. `watch`.
    Unsupported(String),
}

/// How long a watch runs when the caller does not say (`timeoutSeconds`), and at most: as the
/// API server, which ends watches after 30 to 60 minutes, so that clients list again.
pub const WATCH_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30 * 60);

/// The header a replica puts on a call it passes on to the others (`--peers`): the replica
/// asked answers from its own sessions only, so that a call never goes round. A caller who
/// sets it only narrows their own answer.
pub const PASSED_ON: &str = "kube-ws-proxy-passed-on";

/// Which replicas a call asks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Reach {
    /// `?allReplicas=true` (or `1`): every replica's sessions, not this one's only.
    pub all_replicas: bool,
    /// Passed on by another replica ([`PASSED_ON`]): this replica's sessions only.
    pub passed_on: bool,
}

impl Reach {
    /// Whether the call is passed on to every replica.
    pub fn everywhere(self) -> bool {
        self.all_replicas && !self.passed_on
    }
}

/// Which replicas the request (its `target` and `headers`) asks.
pub fn reach(target: &RequestTarget, headers: &http::HeaderMap) -> Reach {
    Reach {
        all_replicas: target
            .first("allReplicas")
            .is_some_and(|v| v == "true" || v == "1"),
        passed_on: headers.contains_key(PASSED_ON),
    }
}

/// Whether `path` lies under `/apis/kube-ws-proxy.io` (the group itself included).
pub fn is_ours(path: &str) -> bool {
    let mut segments = path.split('/');
    segments.next() == Some("") && segments.next() == Some("apis") && segments.next() == Some(GROUP)
}

/// Reads a request to the group: `None` for a request that is not the proxy's (it goes on as
/// any other), else the call, or why it is not one.
pub fn read(method: &Method, target: &RequestTarget) -> Option<Result<SessionsCall, NotServed>> {
    let path = target.path();
    if !is_ours(path) {
        return None;
    }
    let rest: Vec<&str> = path.split('/').skip(3).collect();
    // A trailing slash names the same thing, as the API server's router reads it.
    let rest: &[&str] = match rest.as_slice() {
        [head @ .., ""] => head,
        all => all,
    };
    Some(call(method, rest, target).and_then(|c| allowed(method, c)))
}

/// The call a path (after `/apis/kube-ws-proxy.io`) names, before its method is checked.
fn call(method: &Method, rest: &[&str], target: &RequestTarget) -> Result<SessionsCall, NotServed> {
    let not_found = || NotServed::NotFound(format!("/apis/{GROUP}/{}", rest.join("/")));
    let name = |s: &str| -> Result<String, NotServed> {
        match is_name(s) {
            true => Ok(s.to_owned()),
            false => Err(not_found()),
        }
    };
    let call = match rest {
        [] => SessionsCall::Group,
        [VERSION] => SessionsCall::Resources,
        [VERSION, RESOURCE] => SessionsCall::List { namespace: None },
        [VERSION, "namespaces", ns, RESOURCE] => SessionsCall::List {
            namespace: Some(name(ns)?),
        },
        [VERSION, "namespaces", ns, RESOURCE, id, RECORDING] => {
            return Ok(SessionsCall::Recording {
                namespace: name(ns)?,
                name: name(id)?,
                follow: recording_query(target)?,
            });
        }
        [VERSION, "namespaces", ns, RESOURCE, id] => {
            let (namespace, name) = (name(ns)?, name(id)?);
            match *method == Method::DELETE {
                true => SessionsCall::Delete {
                    namespace,
                    name,
                    reason: target.first("reason").map(str::to_owned),
                },
                false => SessionsCall::Get { namespace, name },
            }
        }
        _ => return Err(not_found()),
    };
    match (
        call,
        target
            .first("watch")
            .is_some_and(|w| w == "true" || w == "1"),
    ) {
        (SessionsCall::List { namespace }, true) => Ok(SessionsCall::Watch {
            namespace,
            timeout: watch_timeout(target)?,
        }),
        (_, true) => Err(NotServed::Unsupported(
            "only a list of sessions can be watched".into(),
        )),
        (call, false) => Ok(call),
    }
}

/// A recording's query: `follow` (as Go's `strconv.ParseBool` reads it, first value), and
/// nothing else.
fn recording_query(target: &RequestTarget) -> Result<bool, NotServed> {
    if let Some((key, _)) = target.query().iter().find(|(k, _)| k != "follow") {
        return Err(NotServed::Unsupported(format!(
            "a recording takes no query parameter {key:?} (only follow)"
        )));
    }
    match target.first("follow") {
        None => Ok(false),
        Some("1" | "t" | "T" | "true" | "TRUE" | "True") => Ok(true),
        Some("0" | "f" | "F" | "false" | "FALSE" | "False") => Ok(false),
        Some(other) => Err(NotServed::Unsupported(format!(
            "follow {other:?} is not a boolean"
        ))),
    }
}

/// A watch's `timeoutSeconds`, at most [`WATCH_TIMEOUT`].
fn watch_timeout(target: &RequestTarget) -> Result<std::time::Duration, NotServed> {
    match target.first("timeoutSeconds") {
        None => Ok(WATCH_TIMEOUT),
        Some(s) => s
            .parse::<u64>()
            .map(|s| std::time::Duration::from_secs(s).min(WATCH_TIMEOUT))
            .map_err(|_| NotServed::Unsupported(format!("timeoutSeconds {s:?} is not a number"))),
    }
}

/// `call` if `method` may ask it: reads are GET (HEAD too), a terminate is DELETE.
fn allowed(method: &Method, call: SessionsCall) -> Result<SessionsCall, NotServed> {
    let ok = match call {
        SessionsCall::Delete { .. } => true,
        _ => *method == Method::GET || *method == Method::HEAD,
    };
    match ok {
        true => Ok(call),
        false => Err(NotServed::MethodNotAllowed(method.clone())),
    }
}

/// A namespace or session id: a DNS label's characters (lower-case letters, digits, `-`), at
/// most 253 bytes. Anything else names nothing the proxy lists.
fn is_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read_str(method: Method, target: &str) -> Option<Result<SessionsCall, NotServed>> {
        let t = RequestTarget::parse_path_and_query(target).unwrap();
        read(&method, &t)
    }

    #[test]
    fn the_groups_paths_are_its_calls() {
        let get = |t| read_str(Method::GET, t).unwrap().unwrap();
        assert_eq!(get("/apis/kube-ws-proxy.io"), SessionsCall::Group);
        assert_eq!(get("/apis/kube-ws-proxy.io/v1/"), SessionsCall::Resources);
        assert_eq!(
            get("/apis/kube-ws-proxy.io/v1/sessions"),
            SessionsCall::List { namespace: None }
        );
        assert_eq!(
            get("/apis/kube-ws-proxy.io/v1/namespaces/team-a/sessions"),
            SessionsCall::List {
                namespace: Some("team-a".into())
            }
        );
        assert_eq!(
            get("/apis/kube-ws-proxy.io/v1/namespaces/team-a/sessions/r1-7"),
            SessionsCall::Get {
                namespace: "team-a".into(),
                name: "r1-7".into()
            }
        );
        assert_eq!(
            read_str(
                Method::DELETE,
                "/apis/kube-ws-proxy.io/v1/namespaces/team-a/sessions/r1-7?reason=a%20b&reason=c"
            ),
            Some(Ok(SessionsCall::Delete {
                namespace: "team-a".into(),
                name: "r1-7".into(),
                reason: Some("a b".into()),
            }))
        );
    }

    #[test]
    fn everything_under_the_group_is_ours_and_nothing_else_is() {
        for ours in [
            "/apis/kube-ws-proxy.io/v2/sessions",
            "/apis/kube-ws-proxy.io/v1/pods",
            "/apis/kube-ws-proxy.io/v1/namespaces/a/sessions/b/c/d",
            "/apis/kube-ws-proxy.io/v1/namespaces/A_B/sessions",
            "/apis/kube-ws-proxy.io/../../api/v1/pods",
            // Decoded first: an encoded slash is a slash here as it is for the API server.
            "/apis/kube-ws-proxy.io%2Fv1/x",
        ] {
            assert!(
                matches!(
                    read_str(Method::GET, ours),
                    Some(Err(NotServed::NotFound(_)))
                ),
                "{ours}"
            );
        }
        for not_ours in [
            "/apis/kube-ws-proxy.iox/v1/sessions",
            "/apis/apps/v1",
            "/api/v1/namespaces/kube-ws-proxy.io/pods",
            "/apis",
        ] {
            assert_eq!(read_str(Method::GET, not_ours), None, "{not_ours}");
        }
    }

    #[test]
    fn a_method_the_path_does_not_take_is_refused() {
        for (method, target) in [
            (Method::POST, "/apis/kube-ws-proxy.io/v1/sessions"),
            (Method::DELETE, "/apis/kube-ws-proxy.io/v1/sessions"),
            (
                Method::PUT,
                "/apis/kube-ws-proxy.io/v1/namespaces/a/sessions/b",
            ),
            (
                Method::PATCH,
                "/apis/kube-ws-proxy.io/v1/namespaces/a/sessions/b",
            ),
        ] {
            assert_eq!(
                read_str(method.clone(), target),
                Some(Err(NotServed::MethodNotAllowed(method))),
                "{target}"
            );
        }
    }

    #[test]
    fn a_recording_is_read_or_followed_and_takes_no_other_query() {
        let path = "/apis/kube-ws-proxy.io/v1/namespaces/a/sessions/r-1/recording";
        let recording = |follow| {
            Some(Ok(SessionsCall::Recording {
                namespace: "a".into(),
                name: "r-1".into(),
                follow,
            }))
        };
        assert_eq!(read_str(Method::GET, path), recording(false));
        assert_eq!(read_str(Method::GET, &format!("{path}/")), recording(false));
        assert_eq!(
            read_str(Method::GET, &format!("{path}?follow=true")),
            recording(true)
        );
        assert_eq!(
            read_str(Method::GET, &format!("{path}?follow=0")),
            recording(false)
        );
        for bad in ["?follow=yes", "?watch=true", "?follow=true&limit=1", "?x"] {
            assert!(
                matches!(
                    read_str(Method::GET, &format!("{path}{bad}")),
                    Some(Err(NotServed::Unsupported(_)))
                ),
                "{bad}"
            );
        }
        assert_eq!(
            read_str(Method::DELETE, path),
            Some(Err(NotServed::MethodNotAllowed(Method::DELETE)))
        );
        assert!(matches!(
            read_str(
                Method::GET,
                "/apis/kube-ws-proxy.io/v1/namespaces/a/sessions/r-1/recordings"
            ),
            Some(Err(NotServed::NotFound(_)))
        ));
    }

    #[test]
    fn a_list_can_be_watched_and_nothing_else() {
        assert_eq!(
            read_str(
                Method::GET,
                "/apis/kube-ws-proxy.io/v1/namespaces/a/sessions?watch=true&timeoutSeconds=5"
            ),
            Some(Ok(SessionsCall::Watch {
                namespace: Some("a".into()),
                timeout: std::time::Duration::from_secs(5)
            }))
        );
        assert_eq!(
            read_str(
                Method::GET,
                "/apis/kube-ws-proxy.io/v1/sessions?watch=1&timeoutSeconds=99999"
            ),
            Some(Ok(SessionsCall::Watch {
                namespace: None,
                timeout: WATCH_TIMEOUT
            }))
        );
        assert!(matches!(
            read_str(
                Method::GET,
                "/apis/kube-ws-proxy.io/v1/namespaces/a/sessions/b?watch=true"
            ),
            Some(Err(NotServed::Unsupported(_)))
        ));
        assert!(matches!(
            read_str(
                Method::GET,
                "/apis/kube-ws-proxy.io/v1/sessions?watch=true&timeoutSeconds=x"
            ),
            Some(Err(NotServed::Unsupported(_)))
        ));
    }
}
