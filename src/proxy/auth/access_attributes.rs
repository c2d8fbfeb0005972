//! What a call to the proxy's sessions API asks to do (verb, namespace, subresource, name of a
//! `sessions.kube-ws-proxy.io`), the body of the access review that asks the cluster about it,
//! and the answer the caller gets when the cluster says no: a 403 Status worded as
//! kube-apiserver words its own (`sessions.kube-ws-proxy.io is forbidden: User "alice" cannot
//! list resource "sessions" in API group "kube-ws-proxy.io" in the namespace "team-a"`).

use std::collections::BTreeMap;

use http::{Response, StatusCode};
use serde::Serialize;

use super::identity::{Identity, AUTHENTICATED_GROUP};
use crate::proxy::wire::body::ProxyBody;
use crate::proxy::wire::status_response::status_response;
use crate::translate::status::{Status, StatusDetails};

/// The API group the proxy serves its sessions API as.
pub const SESSIONS_GROUP: &str = "kube-ws-proxy.io";
/// Its one resource.
pub const SESSIONS_RESOURCE: &str = "sessions";
/// The subresource of a session's recording.
pub const RECORDING_SUBRESOURCE: &str = "recording";
/// `apiVersion` of the access reviews.
const AUTHORIZATION_V1: &str = "authorization.k8s.io/v1";

/// What a sessions API call does, as RBAC names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SessionVerb {
    /// `GET …/sessions`.
    List,
    /// `GET …/sessions?watch=true`.
    Watch,
    /// `GET …/sessions/{id}` (and its recording).
    Get,
    /// `DELETE …/sessions/{id}`: terminate it.
    Delete,
}

impl SessionVerb {
    /// The RBAC verb.
    pub fn as_str(self) -> &'static str {
        match self {
            SessionVerb::List => "list",
            SessionVerb::Watch => "watch",
            SessionVerb::Get => "get",
            SessionVerb::Delete => "delete",
        }
    }
}

/// A request on `sessions.kube-ws-proxy.io`, as an authorizer sees it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct AccessAttributes {
    pub verb: SessionVerb,
    /// `None`: all namespaces (`GET /apis/kube-ws-proxy.io/v1/sessions`).
    pub namespace: Option<String>,
    /// [`RECORDING_SUBRESOURCE`] for a session's recording.
    pub subresource: Option<&'static str>,
    /// The session id, for `get` and `delete` of one.
    pub name: Option<String>,
}

/// What the cluster decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    pub allowed: bool,
    /// The authorizer's reason (often empty), and its evaluation error if it had one.
    pub reason: String,
    /// Who the cluster decided for, as a denial names them: the reviewed identity's user, or
    /// in passthrough what a SelfSubjectReview with the caller's credentials said (empty when
    /// it could not say).
    pub user: String,
}

impl super::review_cache::Answer for Decision {
    fn is_positive(&self) -> bool {
        self.allowed
    }
}

/// `authorization.k8s.io/v1` `ResourceAttributes`, fields in Go's order, empty ones left out.
#[derive(Serialize)]
struct ResourceAttributes<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    namespace: Option<&'a str>,
    verb: &'static str,
    group: &'static str,
    resource: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    subresource: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    name: Option<&'a str>,
}

/// `SubjectAccessReviewSpec` (the subject fields empty for a SelfSubjectAccessReview).
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Spec<'a> {
    resource_attributes: ResourceAttributes<'a>,
    #[serde(skip_serializing_if = "Option::is_none")]
    user: Option<&'a str>,
    #[serde(skip_serializing_if = "<[&str]>::is_empty")]
    groups: Vec<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    extra: Option<&'a BTreeMap<String, Vec<String>>>,
}

/// The review object as Go's encoder writes the typed value (a zero `metadata` and `status`
/// included, as it writes them).
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ReviewObject<'a> {
    kind: &'static str,
    api_version: &'static str,
    metadata: EmptyMeta,
    spec: Spec<'a>,
    status: EmptyStatus,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct EmptyMeta {
    creation_timestamp: Option<()>,
}

#[derive(Serialize)]
struct EmptyStatus {
    allowed: bool,
}

impl AccessAttributes {
    fn resource_attributes(&self) -> ResourceAttributes<'_> {
        ResourceAttributes {
            namespace: self.namespace.as_deref().filter(|n| !n.is_empty()),
            verb: self.verb.as_str(),
            group: SESSIONS_GROUP,
            resource: SESSIONS_RESOURCE,
            subresource: self.subresource.filter(|s| !s.is_empty()),
            name: self.name.as_deref().filter(|n| !n.is_empty()),
        }
    }

    /// The body of a SubjectAccessReview asking whether `identity` may do this. Its groups
    /// include `system:authenticated`, added if the identity lacks it: a SubjectAccessReview's
    /// subject is exactly what it names, and the API server adds that group to every
    /// authenticated (and impersonated) request, so bindings to it must match here too.
    pub fn subject_access_review(&self, identity: &Identity) -> Vec<u8> {
        let extra = identity.extra();
        let mut groups: Vec<&str> = identity.groups().iter().map(String::as_str).collect();
        if !groups.contains(&AUTHENTICATED_GROUP) {
            groups.push(AUTHENTICATED_GROUP);
        }
        let spec = Spec {
            resource_attributes: self.resource_attributes(),
            user: Some(identity.user()),
            groups,
            extra: (!extra.is_empty()).then_some(extra),
        };
        review_object("SubjectAccessReview", spec)
    }

    /// The body of a SelfSubjectAccessReview asking whether the credentials it is sent with
    /// may do this.
    pub fn self_subject_access_review(&self) -> Vec<u8> {
        let spec = Spec {
            resource_attributes: self.resource_attributes(),
            user: None,
            groups: Vec::new(),
            extra: None,
        };
        review_object("SelfSubjectAccessReview", spec)
    }

    /// What a denial says, as kube-apiserver's authorization filter says it: the resource
    /// (`sessions`, or `sessions/recording`), then the namespace or the cluster scope, then
    /// the authorizer's reason if it gave one.
    pub fn forbidden_message(&self, decision: &Decision) -> String {
        let mut resource = SESSIONS_RESOURCE.to_owned();
        if let Some(sub) = self.subresource {
            resource = format!("{resource}/{sub}");
        }
        let scope = match self.namespace.as_deref().filter(|n| !n.is_empty()) {
            Some(ns) => format!("in the namespace {}", go_quote(ns)),
            None => "at the cluster scope".to_owned(),
        };
        let mut why = format!(
            "User {} cannot {} resource {} in API group {} {scope}",
            go_quote(&decision.user),
            self.verb.as_str(),
            go_quote(&resource),
            go_quote(SESSIONS_GROUP),
        );
        if !decision.reason.is_empty() {
            why = format!("{why}: {}", decision.reason);
        }
        let qualified = format!("{SESSIONS_RESOURCE}.{SESSIONS_GROUP}");
        match self.name.as_deref().filter(|n| !n.is_empty()) {
            None => format!("{qualified} is forbidden: {why}"),
            Some(name) => format!("{qualified} {} is forbidden: {why}", go_quote(name)),
        }
    }

    /// The 403 Status of a denial (Go's `NewForbidden`: reason `Forbidden`, details naming
    /// the group, the resource as `kind` and the session).
    pub fn forbidden(&self, decision: &Decision) -> Response<ProxyBody> {
        let mut status = Status::failure(
            StatusCode::FORBIDDEN.as_u16(),
            "Forbidden",
            self.forbidden_message(decision),
        );
        status.details = Some(StatusDetails {
            name: self.name.clone().unwrap_or_default(),
            group: SESSIONS_GROUP.to_owned(),
            kind: SESSIONS_RESOURCE.to_owned(),
            ..StatusDetails::default()
        });
        status_response(StatusCode::FORBIDDEN, &status)
    }
}

fn review_object(kind: &'static str, spec: Spec<'_>) -> Vec<u8> {
    let object = ReviewObject {
        kind,
        api_version: AUTHORIZATION_V1,
        metadata: EmptyMeta {
            creation_timestamp: None,
        },
        spec,
        status: EmptyStatus { allowed: false },
    };
    // Strings, lists and maps of strings: serializing cannot fail.
    serde_json::to_vec(&object).unwrap_or_default()
}

/// Go's `%q` of a string as far as names and reasons need it: JSON's escaping of quotes,
/// backslashes and control characters is the same for them.
fn go_quote(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list_in(ns: Option<&str>) -> AccessAttributes {
        AccessAttributes {
            verb: SessionVerb::List,
            namespace: ns.map(str::to_owned),
            subresource: None,
            name: None,
        }
    }

    fn denied(user: &str, reason: &str) -> Decision {
        Decision {
            allowed: false,
            reason: reason.into(),
            user: user.into(),
        }
    }

    #[test]
    fn a_subject_access_review_is_what_go_writes() {
        let mut extra = BTreeMap::new();
        extra.insert("scopes".to_owned(), vec!["a".to_owned(), "b".to_owned()]);
        let alice = Identity::new(
            "alice",
            vec!["dev".into(), "system:authenticated".into()],
            extra,
        )
        .unwrap();
        let attrs = AccessAttributes {
            verb: SessionVerb::Get,
            namespace: Some("team-a".into()),
            subresource: Some(RECORDING_SUBRESOURCE),
            name: Some("0a1b-7".into()),
        };
        assert_eq!(
            String::from_utf8(attrs.subject_access_review(&alice)).unwrap(),
            r#"{"kind":"SubjectAccessReview","apiVersion":"authorization.k8s.io/v1","metadata":{"creationTimestamp":null},"spec":{"resourceAttributes":{"namespace":"team-a","verb":"get","group":"kube-ws-proxy.io","resource":"sessions","subresource":"recording","name":"0a1b-7"},"user":"alice","groups":["dev","system:authenticated"],"extra":{"scopes":["a","b"]}},"status":{"allowed":false}}"#
        );
        // No extra: left out, as omitempty leaves it; system:authenticated added.
        let bob = Identity::new("bob", vec![], BTreeMap::new()).unwrap();
        assert_eq!(
            String::from_utf8(list_in(None).subject_access_review(&bob)).unwrap(),
            r#"{"kind":"SubjectAccessReview","apiVersion":"authorization.k8s.io/v1","metadata":{"creationTimestamp":null},"spec":{"resourceAttributes":{"verb":"list","group":"kube-ws-proxy.io","resource":"sessions"},"user":"bob","groups":["system:authenticated"]},"status":{"allowed":false}}"#
        );
    }

    #[test]
    fn a_self_subject_access_review_names_no_subject() {
        let attrs = AccessAttributes {
            verb: SessionVerb::Watch,
            namespace: Some("team-a".into()),
            subresource: None,
            name: None,
        };
        assert_eq!(
            String::from_utf8(attrs.self_subject_access_review()).unwrap(),
            r#"{"kind":"SelfSubjectAccessReview","apiVersion":"authorization.k8s.io/v1","metadata":{"creationTimestamp":null},"spec":{"resourceAttributes":{"namespace":"team-a","verb":"watch","group":"kube-ws-proxy.io","resource":"sessions"}},"status":{"allowed":false}}"#
        );
    }

    #[test]
    fn denials_read_as_kube_apiservers() {
        assert_eq!(
            list_in(Some("team-a")).forbidden_message(&denied("alice", "")),
            r#"sessions.kube-ws-proxy.io is forbidden: User "alice" cannot list resource "sessions" in API group "kube-ws-proxy.io" in the namespace "team-a""#
        );
        assert_eq!(
            list_in(None).forbidden_message(&denied("alice", "")),
            r#"sessions.kube-ws-proxy.io is forbidden: User "alice" cannot list resource "sessions" in API group "kube-ws-proxy.io" at the cluster scope"#
        );
        let recording = AccessAttributes {
            verb: SessionVerb::Get,
            namespace: Some("team-a".into()),
            subresource: Some(RECORDING_SUBRESOURCE),
            name: Some("s-1".into()),
        };
        assert_eq!(
            recording.forbidden_message(&denied("bob", "no RBAC policy matched")),
            r#"sessions.kube-ws-proxy.io "s-1" is forbidden: User "bob" cannot get resource "sessions/recording" in API group "kube-ws-proxy.io" in the namespace "team-a": no RBAC policy matched"#
        );
    }

    #[test]
    fn a_denial_is_a_403_status_with_details() {
        use http_body_util::BodyExt;
        let attrs = AccessAttributes {
            verb: SessionVerb::Delete,
            namespace: Some("team-a".into()),
            subresource: None,
            name: Some("s-1".into()),
        };
        let resp = attrs.forbidden(&denied("alice", ""));
        assert_eq!(resp.status(), StatusCode::FORBIDDEN);
        let body = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(resp.into_body().collect())
            .unwrap()
            .to_bytes();
        assert_eq!(
            std::str::from_utf8(&body).unwrap(),
            r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"sessions.kube-ws-proxy.io \"s-1\" is forbidden: User \"alice\" cannot delete resource \"sessions\" in API group \"kube-ws-proxy.io\" in the namespace \"team-a\"","reason":"Forbidden","details":{"name":"s-1","group":"kube-ws-proxy.io","kind":"sessions"},"code":403}"#
        );
    }
}
