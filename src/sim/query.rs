//! Query parameters as the API server reads them.

/// Parsed query parameters, in order.
#[derive(Debug, Default, Clone)]
pub(crate) struct Query(Vec<(String, String)>);

impl Query {
    pub(crate) fn parse(query: Option<&str>) -> Query {
        Query(
            query
                .map(|q| {
                    url::form_urlencoded::parse(q.as_bytes())
                        .into_owned()
                        .collect()
                })
                .unwrap_or_default(),
        )
    }

    /// Pairs made here (a kubelet's options under the API server's names).
    pub(crate) fn from_pairs(pairs: impl IntoIterator<Item = (String, String)>) -> Query {
        Query(pairs.into_iter().collect())
    }

    pub(crate) fn first(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    pub(crate) fn all<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a str> + 'a {
        self.0
            .iter()
            .filter(move |(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// API boolean: absent, `0` or `false` (any case) is false; anything else is true.
    pub(crate) fn flag(&self, name: &str) -> bool {
        match self.first(name) {
            None => false,
            Some(v) => !(v == "0" || v.eq_ignore_ascii_case("false")),
        }
    }
}
