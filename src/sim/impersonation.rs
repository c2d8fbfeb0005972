//! `Impersonate-User`, `Impersonate-Group` and `Impersonate-Extra-<key>`, as kube-apiserver's
//! impersonation filter reads them. Authorization is simple: the users listed in
//! `SimConfig::impersonators` may impersonate anyone, nobody else anyone.

use http::HeaderMap;

use super::authn::{header_text, prefixed_values};
use super::identity::SimIdentity;
use super::status::Status;

const USER_HEADER: &str = "impersonate-user";
const GROUP_HEADER: &str = "impersonate-group";
const EXTRA_PREFIX: &str = "impersonate-extra-";

/// Why impersonation was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum ImpersonationError {
    /// Groups or extras without a user (400).
    #[error("requested {0} without impersonating a user")]
    WithoutUser(String),
    /// The caller may not impersonate (403).
    #[error("users \"{target}\" is forbidden: User \"{caller}\" cannot impersonate resource \"users\" in API group \"\" at the cluster scope")]
    Forbidden { caller: String, target: String },
}

impl ImpersonationError {
    /// The Status kube-apiserver answers with, and its HTTP code.
    pub(crate) fn status(&self) -> (Status, u16) {
        match self {
            ImpersonationError::WithoutUser(_) => {
                (Status::api_error(400, "BadRequest", self.to_string()), 400)
            }
            ImpersonationError::Forbidden { target, .. } => (
                Status::api_error(403, "Forbidden", self.to_string()).with_object(target, "users"),
                403,
            ),
        }
    }
}

/// The identity to act as: `Ok(None)` without impersonation headers.
pub(crate) fn apply(
    impersonators: &[String],
    caller: &SimIdentity,
    headers: &HeaderMap,
) -> Result<Option<SimIdentity>, ImpersonationError> {
    // An empty user header is no request to impersonate, as in kube-apiserver.
    // Values above 0x7f are kept, as Go keeps them (see `header_text`).
    let user = headers
        .get(USER_HEADER)
        .map(header_text)
        .filter(|u| !u.is_empty());
    let groups: Vec<String> = headers
        .get_all(GROUP_HEADER)
        .iter()
        .map(header_text)
        .collect();
    let extra = prefixed_values(headers, &[EXTRA_PREFIX.to_owned()]);
    let Some(user) = user else {
        if groups.is_empty() && extra.is_empty() {
            return Ok(None);
        }
        let mut asked: Vec<String> = groups.iter().map(|g| format!("group {g:?}")).collect();
        asked.extend(extra.keys().map(|k| format!("extra {k:?}")));
        return Err(ImpersonationError::WithoutUser(format!(
            "[{}]",
            asked.join(" ")
        )));
    };
    if !impersonators.contains(&caller.name) {
        return Err(ImpersonationError::Forbidden {
            caller: caller.name.clone(),
            target: user,
        });
    }
    Ok(Some(SimIdentity::authenticated(user, groups, extra)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::identity::test_support::headers;
    use crate::sim::identity::AUTHENTICATED_GROUP;

    fn bob() -> SimIdentity {
        SimIdentity::authenticated("bob", Vec::new(), Default::default())
    }

    #[test]
    fn none_without_headers() {
        assert_eq!(apply(&[], &bob(), &HeaderMap::new()), Ok(None));
    }

    #[test]
    fn allowed_for_impersonators() {
        let h = headers(&[
            ("impersonate-user", "alice"),
            ("impersonate-group", "g1"),
            ("impersonate-group", "g2"),
            ("impersonate-extra-Reason%20Code", "x"),
        ]);
        let id = apply(&["bob".into()], &bob(), &h).unwrap().unwrap();
        assert_eq!(id.name, "alice");
        assert_eq!(id.groups, ["g1", "g2", AUTHENTICATED_GROUP]);
        assert_eq!(id.extra["reason code"], ["x"]);
    }

    #[test]
    fn refused_for_others_with_the_apiservers_wording() {
        let h = headers(&[("impersonate-user", "alice")]);
        let e = apply(&["carol".into()], &bob(), &h).unwrap_err();
        assert_eq!(
            e.to_string(),
            r#"users "alice" is forbidden: User "bob" cannot impersonate resource "users" in API group "" at the cluster scope"#
        );
        assert_eq!(e.status().1, 403);
    }

    #[test]
    fn groups_without_user_are_a_bad_request() {
        let h = headers(&[("impersonate-user", ""), ("impersonate-group", "g1")]);
        let e = apply(&["bob".into()], &bob(), &h).unwrap_err();
        assert_eq!(e.status().1, 400);
        assert!(
            e.to_string().contains("without impersonating a user"),
            "{e}"
        );
    }
}
