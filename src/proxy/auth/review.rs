//! What a TokenReview said about a token: kept in its own file because both the reviewer and
//! the cache of its answers speak of it.

use super::identity::Identity;

/// The outcome of a review.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Review {
    /// The token belongs to this identity.
    Authenticated(Identity),
    /// The API server does not accept the token.
    Rejected,
}
