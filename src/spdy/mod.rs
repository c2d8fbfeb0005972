//! SPDY/3.1 as Kubernetes uses it (see `shared/PROTOCOL.md` §3), split like the `h2` crate:
//!
//! - [`frame`]: one file per frame type, pure encode/decode of frame bodies.
//! - [`header_block`]: SPDY/3 name/value blocks and their zlib contexts.
//! - [`codec`]: turning a byte buffer into frames and frames into bytes, owning the zlib contexts.
//! - [`proto`]: the session — streams, pings, GOAWAY, backpressure.
//! - [`upgrade`]: the HTTP/1.1 `Upgrade: SPDY/3.1` handshake.
//! - [`kube_headers`]: the Kubernetes headers of a stream (`streamtype`, `port`, `requestid`),
//!   read as the kubelet reads them.

pub mod codec;
pub mod frame;
pub mod header_block;
pub mod kube_headers;
pub mod proto;
pub mod upgrade;
