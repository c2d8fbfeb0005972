//! Who a request acts as: the identity types the simulated cluster authenticates, records and
//! hands to exec'd processes, and the token users it knows.

use std::collections::BTreeMap;
use std::str::FromStr;

/// The group every authenticated user is in (kube-apiserver adds it to each identity).
pub const AUTHENTICATED_GROUP: &str = "system:authenticated";
/// Who an unauthenticated caller is when the cluster has no authentication configured.
pub const ANONYMOUS_USER: &str = "system:anonymous";
/// The group of [`ANONYMOUS_USER`].
pub const UNAUTHENTICATED_GROUP: &str = "system:unauthenticated";
/// The user name a `require_bearer_token` token stands for.
pub const REQUIRED_TOKEN_USER: &str = "sim-user";

/// A user as kube-apiserver's `user.Info` describes it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SimIdentity {
    pub name: String,
    pub groups: Vec<String>,
    /// Extra attributes (keys lowercase), e.g. from `X-Remote-Extra-*` or
    /// `Impersonate-Extra-*` headers.
    pub extra: BTreeMap<String, Vec<String>>,
}

impl SimIdentity {
    /// An identity with these groups plus [`AUTHENTICATED_GROUP`] (added once).
    pub fn authenticated(
        name: impl Into<String>,
        groups: impl IntoIterator<Item = String>,
        extra: BTreeMap<String, Vec<String>>,
    ) -> SimIdentity {
        let mut groups: Vec<String> = groups.into_iter().collect();
        if !groups.iter().any(|g| g == AUTHENTICATED_GROUP) {
            groups.push(AUTHENTICATED_GROUP.to_owned());
        }
        SimIdentity {
            name: name.into(),
            groups,
            extra,
        }
    }

    /// `system:anonymous` in `system:unauthenticated`.
    pub fn anonymous() -> SimIdentity {
        SimIdentity {
            name: ANONYMOUS_USER.to_owned(),
            groups: vec![UNAUTHENTICATED_GROUP.to_owned()],
            extra: BTreeMap::new(),
        }
    }

    /// The `user.Info` JSON of TokenReview and SelfSubjectReview (`extra` left out when empty,
    /// as Go's `omitempty` does).
    pub(crate) fn to_user_info(&self) -> serde_json::Value {
        let mut info = serde_json::Map::new();
        info.insert("username".to_owned(), self.name.clone().into());
        info.insert("groups".to_owned(), self.groups.clone().into());
        if !self.extra.is_empty() {
            info.insert(
                "extra".to_owned(),
                serde_json::to_value(&self.extra).unwrap_or_default(),
            );
        }
        serde_json::Value::Object(info)
    }
}

/// Which authenticator accepted a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AuthenticatedBy {
    /// A bearer token (`Authorization` header or the WebSocket bearer subprotocol entry).
    Token,
    /// A client certificate signed by the client CA: user = CN, groups = O.
    ClientCert,
    /// A front proxy's certificate plus its `X-Remote-*` headers.
    FrontProxy,
    /// Nobody: the cluster has no authentication configured, so everyone is let in as
    /// `system:anonymous`.
    Anonymous,
}

/// A bearer token the cluster accepts and the user it stands for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimUser {
    pub token: String,
    pub name: String,
    /// Groups besides `system:authenticated` (which is always added).
    pub groups: Vec<String>,
}

/// Why a `TOKEN=NAME[:GROUP,GROUP…]` flag value is malformed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SimUserParseError {
    #[error("expected TOKEN=NAME[:GROUP,GROUP...], got {0:?}")]
    Shape(String),
    #[error("the token of {0:?} is empty")]
    EmptyToken(String),
    #[error("the user name of {0:?} is empty")]
    EmptyName(String),
}

impl FromStr for SimUser {
    type Err = SimUserParseError;

    /// `TOKEN=NAME[:GROUP,GROUP…]`; the token is everything before the first `=`, the name
    /// everything up to the first `:` after it (so names may not contain `:`).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (token, rest) = s
            .split_once('=')
            .ok_or_else(|| SimUserParseError::Shape(s.to_owned()))?;
        if token.is_empty() {
            return Err(SimUserParseError::EmptyToken(s.to_owned()));
        }
        let (name, groups) = match rest.split_once(':') {
            Some((name, groups)) => (name, groups),
            None => (rest, ""),
        };
        if name.is_empty() {
            return Err(SimUserParseError::EmptyName(s.to_owned()));
        }
        Ok(SimUser {
            token: token.to_owned(),
            name: name.to_owned(),
            groups: groups
                .split(',')
                .map(str::trim)
                .filter(|g| !g.is_empty())
                .map(str::to_owned)
                .collect(),
        })
    }
}

/// Header maps for the simulated cluster's unit tests.
#[cfg(test)]
pub(crate) mod test_support {
    use http::HeaderMap;

    /// A header map with `pairs` appended in order.
    pub(crate) fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (n, v) in pairs {
            h.append(
                http::HeaderName::from_bytes(n.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        h
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_user_flag() {
        let u: SimUser = "t0k=alice:dev,ops".parse().unwrap();
        assert_eq!(
            u,
            SimUser {
                token: "t0k".into(),
                name: "alice".into(),
                groups: vec!["dev".into(), "ops".into()],
            }
        );
        let u: SimUser = "a=b=c".parse().unwrap();
        assert_eq!((u.token.as_str(), u.name.as_str()), ("a", "b=c"));
        assert!(u.groups.is_empty());
        assert!("nobody".parse::<SimUser>().is_err());
        assert!("=bob".parse::<SimUser>().is_err());
        assert!("tok=".parse::<SimUser>().is_err());
        assert!("tok=:g".parse::<SimUser>().is_err());
    }

    #[test]
    fn authenticated_group_added_once() {
        let id = SimIdentity::authenticated(
            "bob",
            ["a".to_owned(), AUTHENTICATED_GROUP.to_owned()],
            BTreeMap::new(),
        );
        assert_eq!(id.groups, ["a", AUTHENTICATED_GROUP]);
        let id = SimIdentity::authenticated("bob", Vec::new(), BTreeMap::new());
        assert_eq!(id.groups, [AUTHENTICATED_GROUP]);
    }
}
