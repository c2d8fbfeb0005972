//! The body type of every response the proxy sends (streamed, never buffered): shared by the
//! handlers, the status responses and the upstream client, so it has a file of its own.

use bytes::Bytes;
use http_body_util::combinators::BoxBody;

/// The body type of every response the proxy sends.
pub type ProxyBody = BoxBody<Bytes, hyper::Error>;
