//! `authorization.k8s.io/v1`: SubjectAccessReview (may this subject do this?) and
//! SelfSubjectAccessReview (may I?), answered from a small typed policy
//! ([`SimConfig::access_policy`]) as RBAC would: a rule grants its verbs on its resources to
//! its subject, in one namespace (a RoleBinding) or everywhere (a ClusterRoleBinding);
//! `system:masters` may do anything; nothing else is allowed (the default policy is empty:
//! nobody but `system:masters` may do anything).
//!
//! Anyone authenticated may create a SelfSubjectAccessReview (it is about themselves); only
//! the users in [`SimConfig::access_reviewers`] may create a SubjectAccessReview, as only
//! those bound to `create subjectaccessreviews` may on a real cluster (403 for the rest).
//! Every review answered is recorded ([`SimCluster::access_reviews`]).
//!
//! [`SimConfig::access_policy`]: super::SimConfig::access_policy
//! [`SimConfig::access_reviewers`]: super::SimConfig::access_reviewers
//! [`SimCluster::access_reviews`]: super::SimCluster::access_reviews

use http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use serde_json::{json, Map, Value};

use super::identity::SimIdentity;
use super::response::{bad_request, json_response, status_response, Body};
use super::reviews::read_json;
use super::status::Status;
use super::Inner;

/// The group whose members may do anything.
const MASTERS: &str = "system:masters";
const GROUP_VERSION: &str = "authorization.k8s.io/v1";

/// Who a rule grants to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SimSubject {
    User(String),
    Group(String),
}

/// One grant: `verbs` on `resources` of `group` to `subject`, in `namespace` or everywhere.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimAccessRule {
    pub subject: SimSubject,
    /// The API group (`kube-ws-proxy.io`), or `*`.
    pub group: String,
    /// `sessions`, `sessions/recording`, or `*`.
    pub resources: Vec<String>,
    /// `list`, `watch`, `get`, `delete`…, or `*`.
    pub verbs: Vec<String>,
    /// `Some(ns)`: only requests in `ns` (a RoleBinding); `None`: every namespace and the
    /// cluster scope (a ClusterRoleBinding).
    pub namespace: Option<String>,
}

impl SimAccessRule {
    /// `verbs` on `resources` of `group` for `subject` everywhere.
    pub fn cluster_wide(
        subject: SimSubject,
        group: &str,
        resources: &[&str],
        verbs: &[&str],
    ) -> Self {
        SimAccessRule {
            subject,
            group: group.to_owned(),
            resources: resources.iter().map(|r| r.to_string()).collect(),
            verbs: verbs.iter().map(|v| v.to_string()).collect(),
            namespace: None,
        }
    }

    /// The same rule, only in `namespace`.
    pub fn in_namespace(mut self, namespace: &str) -> Self {
        self.namespace = Some(namespace.to_owned());
        self
    }

    fn grants(&self, who: &SimIdentity, attrs: &Attributes) -> bool {
        let subject = match &self.subject {
            SimSubject::User(u) => *u == who.name,
            SimSubject::Group(g) => who.groups.contains(g),
        };
        let any = |list: &[String], value: &str| list.iter().any(|v| v == "*" || v == value);
        let resource = match attrs.subresource.as_str() {
            "" => attrs.resource.clone(),
            sub => format!("{}/{sub}", attrs.resource),
        };
        let namespace = match &self.namespace {
            None => true,
            Some(ns) => *ns == attrs.namespace,
        };
        subject
            && namespace
            && (self.group == "*" || self.group == attrs.group)
            && any(&self.resources, &resource)
            && any(&self.verbs, &attrs.verb)
    }
}

/// Which review.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SimReviewKind {
    Subject,
    SelfSubject,
}

/// One access review the cluster answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeenAccessReview {
    pub kind: SimReviewKind,
    /// Who made it (the user its request authenticated as).
    pub made_by: String,
    /// Whom it was about.
    pub subject: SimIdentity,
    pub verb: String,
    pub group: String,
    pub resource: String,
    pub subresource: String,
    pub namespace: String,
    pub name: String,
    pub allowed: bool,
}

/// `spec.resourceAttributes`, absent fields empty.
#[derive(Debug, Default)]
struct Attributes {
    namespace: String,
    verb: String,
    group: String,
    resource: String,
    subresource: String,
    name: String,
}

impl Attributes {
    fn from_spec(spec: &Value) -> Option<Attributes> {
        let attrs = spec.get("resourceAttributes")?;
        let field = |name: &str| {
            attrs
                .get(name)
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_owned()
        };
        Some(Attributes {
            namespace: field("namespace"),
            verb: field("verb"),
            group: field("group"),
            resource: field("resource"),
            subresource: field("subresource"),
            name: field("name"),
        })
    }
}

/// `POST …/subjectaccessreviews` from `caller`.
pub(crate) async fn subject_access_review(
    inner: &Inner,
    req: Request<Incoming>,
    caller: &SimIdentity,
) -> Response<Body> {
    if !inner.config.access_reviewers.contains(&caller.name) {
        return forbidden_create(caller, "subjectaccessreviews");
    }
    let review = match read_json(req).await {
        Ok(r) => r,
        Err(e) => return bad_request(e),
    };
    let spec = review.get("spec").cloned().unwrap_or_else(|| json!({}));
    let strings = |v: Option<&Value>| -> Vec<String> {
        v.and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(|s| s.as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default()
    };
    let subject = SimIdentity {
        name: spec
            .get("user")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned(),
        groups: strings(spec.get("groups")),
        extra: serde_json::from_value(spec.get("extra").cloned().unwrap_or(json!({})))
            .unwrap_or_default(),
    };
    if subject.name.is_empty() && subject.groups.is_empty() {
        return invalid("at least one of user or group must be specified");
    }
    answer(inner, SimReviewKind::Subject, caller, subject, review)
}

/// `POST …/selfsubjectaccessreviews` from `caller`: about `caller`.
pub(crate) async fn self_subject_access_review(
    inner: &Inner,
    req: Request<Incoming>,
    caller: &SimIdentity,
) -> Response<Body> {
    let review = match read_json(req).await {
        Ok(r) => r,
        Err(e) => return bad_request(e),
    };
    answer(
        inner,
        SimReviewKind::SelfSubject,
        caller,
        caller.clone(),
        review,
    )
}

/// Decides, records and answers (201, the review echoed with its status).
fn answer(
    inner: &Inner,
    kind: SimReviewKind,
    caller: &SimIdentity,
    subject: SimIdentity,
    review: Map<String, Value>,
) -> Response<Body> {
    let spec = review.get("spec").cloned().unwrap_or_else(|| json!({}));
    let Some(attrs) = Attributes::from_spec(&spec) else {
        return invalid(
            "exactly one of nonResourceAttributes or resourceAttributes must be specified",
        );
    };
    let rule = subject
        .groups
        .iter()
        .any(|g| g == MASTERS)
        .then_some(None)
        .or_else(|| {
            inner
                .config
                .access_policy
                .iter()
                .position(|r| r.grants(&subject, &attrs))
                .map(Some)
        });
    let mut status = Map::new();
    status.insert("allowed".into(), rule.is_some().into());
    if let Some(rule) = rule {
        let why = match rule {
            Some(i) => format!("allowed by the simulated cluster's access rule {i}"),
            None => format!("{MASTERS} may do anything"),
        };
        status.insert("reason".into(), why.into());
    }
    inner.record_access_review(SeenAccessReview {
        kind,
        made_by: caller.name.clone(),
        subject,
        allowed: rule.is_some(),
        verb: attrs.verb,
        group: attrs.group,
        resource: attrs.resource,
        subresource: attrs.subresource,
        namespace: attrs.namespace,
        name: attrs.name,
    });
    let kind = match kind {
        SimReviewKind::Subject => "SubjectAccessReview",
        SimReviewKind::SelfSubject => "SelfSubjectAccessReview",
    };
    json_response(
        StatusCode::CREATED,
        &json!({
            "kind": kind,
            "apiVersion": GROUP_VERSION,
            "metadata": {"creationTimestamp": null},
            "spec": spec,
            "status": status,
        }),
    )
}

/// The 403 a caller without `create` on `resource` gets (kube-apiserver's wording).
fn forbidden_create(caller: &SimIdentity, resource: &str) -> Response<Body> {
    let message = format!(
        "{resource}.authorization.k8s.io is forbidden: User {:?} cannot create resource {resource:?} in API group \"authorization.k8s.io\" at the cluster scope",
        caller.name
    );
    status_response(&Status::api_error(403, "Forbidden", message), 403)
}

fn invalid(message: &str) -> Response<Body> {
    status_response(&Status::api_error(422, "Invalid", message), 422)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alice() -> SimIdentity {
        SimIdentity::authenticated(
            "alice",
            vec!["team-a-admins".to_owned()],
            Default::default(),
        )
    }

    fn attrs(verb: &str, ns: &str, sub: &str) -> Attributes {
        Attributes {
            namespace: ns.into(),
            verb: verb.into(),
            group: "kube-ws-proxy.io".into(),
            resource: "sessions".into(),
            subresource: sub.into(),
            name: String::new(),
        }
    }

    #[test]
    fn rules_grant_as_rbac_bindings_do() {
        let viewer = SimAccessRule::cluster_wide(
            SimSubject::User("alice".into()),
            "kube-ws-proxy.io",
            &["sessions"],
            &["list", "watch", "get"],
        );
        assert!(viewer.grants(&alice(), &attrs("list", "", "")));
        assert!(viewer.grants(&alice(), &attrs("get", "team-b", "")));
        assert!(!viewer.grants(&alice(), &attrs("delete", "team-a", "")));
        // The recording is a subresource of its own.
        assert!(!viewer.grants(&alice(), &attrs("get", "team-a", "recording")));
        let admin = SimAccessRule::cluster_wide(
            SimSubject::Group("team-a-admins".into()),
            "kube-ws-proxy.io",
            &["*"],
            &["*"],
        )
        .in_namespace("team-a");
        assert!(admin.grants(&alice(), &attrs("delete", "team-a", "")));
        assert!(admin.grants(&alice(), &attrs("get", "team-a", "recording")));
        assert!(!admin.grants(&alice(), &attrs("list", "team-b", "")));
        // A namespace's binding does not grant all namespaces.
        assert!(!admin.grants(&alice(), &attrs("list", "", "")));
        let bob = SimIdentity::authenticated("bob", Vec::new(), Default::default());
        assert!(!viewer.grants(&bob, &attrs("list", "", "")));
    }
}
