//! An authenticated caller: user name, groups and extra attributes, as Kubernetes' `user.Info`.

use std::collections::BTreeMap;

use http::HeaderValue;

/// The group every authenticated user belongs to; the API server adds it itself, so it is never
/// sent upstream.
pub const AUTHENTICATED_GROUP: &str = "system:authenticated";

/// Who the caller is.
#[derive(Clone, PartialEq, Eq)]
pub struct Identity {
    user: String,
    groups: Vec<String>,
    extra: BTreeMap<String, Vec<String>>,
}

/// Why an identity cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdentityError {
    #[error("the user name is empty")]
    EmptyUser,
    #[error("the identity contains characters that cannot travel in an HTTP header")]
    NotHeaderSafe,
    #[error("the extra key {0:?} is empty or not valid")]
    BadExtraKey(String),
}

impl Identity {
    /// An identity whose every part can be carried in HTTP headers (checked here, once, so
    /// that writing it upstream cannot fail). Extra keys are lowercased, as the API server does.
    pub fn new(
        user: impl Into<String>,
        groups: Vec<String>,
        extra: BTreeMap<String, Vec<String>>,
    ) -> Result<Identity, IdentityError> {
        let user = user.into();
        if user.is_empty() {
            return Err(IdentityError::EmptyUser);
        }
        let safe = |s: &str| HeaderValue::from_str(s).is_ok() && s.trim() == s;
        if !safe(&user) || !groups.iter().all(|g| safe(g)) {
            return Err(IdentityError::NotHeaderSafe);
        }
        let mut lowered = BTreeMap::new();
        for (key, values) in extra {
            if key.is_empty() || key.chars().any(|c| c.is_control()) {
                return Err(IdentityError::BadExtraKey(key));
            }
            if !values.iter().all(|v| safe(v)) {
                return Err(IdentityError::NotHeaderSafe);
            }
            lowered
                .entry(key.to_lowercase())
                .or_insert_with(Vec::new)
                .extend(values);
        }
        let groups = groups.into_iter().filter(|g| !g.is_empty()).collect();
        Ok(Identity {
            user,
            groups,
            extra: lowered,
        })
    }

    /// The user name.
    pub fn user(&self) -> &str {
        &self.user
    }

    /// The groups, as authenticated (may include `system:authenticated`).
    pub fn groups(&self) -> &[String] {
        &self.groups
    }

    /// The groups worth sending upstream: all but `system:authenticated`, which the API server
    /// adds to every authenticated request itself.
    pub fn forwarded_groups(&self) -> impl Iterator<Item = &str> {
        self.groups
            .iter()
            .map(String::as_str)
            .filter(|g| *g != AUTHENTICATED_GROUP)
    }

    /// Extra attributes (keys lowercased).
    pub fn extra(&self) -> &BTreeMap<String, Vec<String>> {
        &self.extra
    }
}

impl std::fmt::Debug for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // User and groups are not secrets (they appear in audit logs); extra values may be.
        f.debug_struct("Identity")
            .field("user", &self.user)
            .field("groups", &self.groups)
            .field("extra_keys", &self.extra.keys().collect::<Vec<_>>())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn valid_identity_lowercases_extra_keys() {
        let mut extra = BTreeMap::new();
        extra.insert("Scopes".to_owned(), vec!["a".to_owned()]);
        extra.insert("scopes".to_owned(), vec!["b".to_owned()]);
        let id = Identity::new(
            "alice",
            vec!["dev".into(), AUTHENTICATED_GROUP.into()],
            extra,
        )
        .unwrap();
        assert_eq!(id.extra()["scopes"], ["a", "b"]);
        assert_eq!(id.forwarded_groups().collect::<Vec<_>>(), ["dev"]);
    }

    #[test]
    fn unsafe_identities_are_refused() {
        assert_eq!(
            Identity::new("", vec![], BTreeMap::new()),
            Err(IdentityError::EmptyUser)
        );
        assert_eq!(
            Identity::new("a\r\nImpersonate-User: root", vec![], BTreeMap::new()),
            Err(IdentityError::NotHeaderSafe)
        );
        assert_eq!(
            Identity::new("a", vec!["g\n".into()], BTreeMap::new()),
            Err(IdentityError::NotHeaderSafe)
        );
    }
}
