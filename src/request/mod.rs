//! How the API server reads a request: Go's URL rules ([`go_url`]) and the one reading of a
//! request target every part of the proxy acts on ([`target`]). Pure; depends on nothing else
//! in the crate, so that `translate` and `proxy` can both use it.

pub mod go_url;
pub mod pod;
pub mod target;
