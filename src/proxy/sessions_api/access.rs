//! Who may call the sessions API: the caller as the main listener authenticated it, authorized
//! by the cluster the request is routed to, with its RBAC, for group `kube-ws-proxy.io`,
//! resource `sessions` ([`AccessReviews`](crate::proxy::auth::access_review::AccessReviews):
//! a SubjectAccessReview about an authenticated caller, a SelfSubjectAccessReview with a
//! passthrough caller's own credentials). Discovery is open to every authenticated caller, as
//! the API server's is.

use http::{HeaderMap, Response};

use crate::proxy::auth::access_attributes::{AccessAttributes, SessionVerb, RECORDING_SUBRESOURCE};
use crate::proxy::auth::access_review;
use crate::proxy::auth::Caller;
use crate::proxy::route::sessions_api::SessionsCall;
use crate::proxy::sessions::lifecycle::audit;
use crate::proxy::sessions::state::ProxyState;
use crate::proxy::wire::body::ProxyBody;

/// The caller of an authorized call, as a terminate names them.
#[derive(Debug, Clone)]
pub struct Operator {
    /// Their user name as the cluster decided for it (`system:unknown` where it would not
    /// say).
    pub user: String,
}

/// Authorizes `call` for `caller` (whose request carried `headers`): the operator, or the
/// answer to a caller who may not (a 403 Status worded as kube-apiserver's, or the failed
/// review's Status: a review that fails never allows).
pub async fn check(
    state: &ProxyState,
    caller: &Caller,
    headers: &HeaderMap,
    call: &SessionsCall,
) -> Result<Operator, Response<ProxyBody>> {
    let Some(attrs) = attributes(call) else {
        return Ok(Operator {
            user: caller.user().unwrap_or(UNKNOWN).to_owned(),
        });
    };
    let reviews = &state.cluster.access_reviews;
    let outcome = reviews.authorize(caller, headers, &attrs).await;
    if let Some(refusal) = access_review::answer(&outcome, &attrs) {
        return Err(refusal);
    }
    let mut user = outcome.map(|d| d.user).unwrap_or_default();
    if user.is_empty() && matches!(call, SessionsCall::Delete { .. }) {
        // A SelfSubjectAccessReview does not say whom it allowed; a terminate must name its
        // operator, so the cluster is asked who these credentials are (cached as for audits).
        user = who(state, caller, headers).await.unwrap_or_default();
    }
    Ok(Operator {
        user: match user.is_empty() {
            true => UNKNOWN.to_owned(),
            false => user,
        },
    })
}

/// Who a passthrough caller's credentials are, as a SelfSubjectReview made with them says.
async fn who(state: &ProxyState, caller: &Caller, headers: &HeaderMap) -> Option<String> {
    let credentials = audit::outbound_credentials(state, caller, headers);
    let timeout = state.handshake_timeout.min(audit::REVIEW_TIMEOUT);
    let cluster = &state.cluster;
    let reviewed = cluster
        .self_reviews
        .who(&cluster.client, &cluster.upstream, credentials, timeout)
        .await?;
    Some(reviewed.user)
}

/// How a terminate names an operator the cluster would not name.
const UNKNOWN: &str = "system:unknown";

/// What RBAC is asked about `call`; `None` for discovery, which every authenticated caller
/// may read. A recording is the subresource `recording`, verb `get` (followed or not): `get`
/// on `sessions` alone does not show what a session showed.
fn attributes(call: &SessionsCall) -> Option<AccessAttributes> {
    let one = |verb, namespace: &String, name: &String| AccessAttributes {
        verb,
        namespace: Some(namespace.clone()),
        subresource: None,
        name: Some(name.clone()),
    };
    let all = |verb, namespace: &Option<String>| AccessAttributes {
        verb,
        namespace: namespace.clone(),
        subresource: None,
        name: None,
    };
    Some(match call {
        SessionsCall::Group | SessionsCall::Resources => return None,
        SessionsCall::List { namespace } => all(SessionVerb::List, namespace),
        SessionsCall::Watch { namespace, .. } => all(SessionVerb::Watch, namespace),
        SessionsCall::Get { namespace, name } => one(SessionVerb::Get, namespace, name),
        SessionsCall::Delete {
            namespace, name, ..
        } => one(SessionVerb::Delete, namespace, name),
        SessionsCall::Recording {
            namespace, name, ..
        } => AccessAttributes {
            subresource: Some(RECORDING_SUBRESOURCE),
            ..one(SessionVerb::Get, namespace, name)
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_call_asks_for_its_verb_in_its_namespace() {
        let get = SessionsCall::Get {
            namespace: "a".into(),
            name: "r-1".into(),
        };
        let attrs = attributes(&get).unwrap();
        assert_eq!(attrs.verb, SessionVerb::Get);
        assert_eq!(attrs.namespace.as_deref(), Some("a"));
        assert_eq!(attrs.name.as_deref(), Some("r-1"));
        let all = attributes(&SessionsCall::List { namespace: None }).unwrap();
        assert_eq!((all.verb, all.namespace), (SessionVerb::List, None));
        let watch = SessionsCall::Watch {
            namespace: Some("b".into()),
            timeout: std::time::Duration::from_secs(1),
        };
        assert_eq!(attributes(&watch).unwrap().verb, SessionVerb::Watch);
        assert!(attributes(&SessionsCall::Group).is_none());
        assert_eq!(attrs.subresource, None);
        let recording = attributes(&SessionsCall::Recording {
            namespace: "a".into(),
            name: "r-1".into(),
            follow: true,
        })
        .unwrap();
        assert_eq!(recording.verb, SessionVerb::Get);
        assert_eq!(recording.subresource, Some("recording"));
        assert_eq!(recording.name.as_deref(), Some("r-1"));
        assert_eq!(recording.namespace.as_deref(), Some("a"));
        assert!(attributes(&SessionsCall::Resources).is_none());
    }
}
