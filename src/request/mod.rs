//! How the API server reads a request: Go's URL rules ([`go_url`]) and the one reading of a
//! request target every part of the proxy acts on ([`target`]): a pod's streaming subresource
//! ([`pod`]), or a kubelet call through `nodes/{node}/proxy` ([`node`]); and which cluster a target
//! names when one proxy fronts many ([`cluster_prefix`]). Pure; depends on nothing else
//! in the crate, so that `translate` and `proxy` can both use it.

pub mod cluster_prefix;
pub mod go_url;
pub mod host;
pub mod node;
pub mod pod;
pub mod target;
