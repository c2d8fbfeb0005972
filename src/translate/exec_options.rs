//! Exec/attach options from the client's query (PROTOCOL.md §1.1) and the SPDY streams they
//! call for (§3.5).

use super::channel::Channel;
use super::protocol::UpstreamVersion;
use crate::request::go_url::slice_to_bool;
pub use crate::request::pod::{PodTarget, Subresource};
use crate::request::target::RequestTarget;

/// The `streamtype` of an SPDY stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StreamKind {
    Error,
    Stdin,
    Stdout,
    Stderr,
    Resize,
    /// Port-forward data.
    Data,
}

impl StreamKind {
    /// The header value on the wire.
    pub fn wire_name(self) -> &'static str {
        match self {
            StreamKind::Error => "error",
            StreamKind::Stdin => "stdin",
            StreamKind::Stdout => "stdout",
            StreamKind::Stderr => "stderr",
            StreamKind::Resize => "resize",
            StreamKind::Data => "data",
        }
    }

    /// The kind for a header value.
    pub fn from_wire(name: &str) -> Option<StreamKind> {
        [
            StreamKind::Error,
            StreamKind::Stdin,
            StreamKind::Stdout,
            StreamKind::Stderr,
            StreamKind::Resize,
            StreamKind::Data,
        ]
        .into_iter()
        .find(|k| k.wire_name() == name)
    }
}

/// What an exec or attach asks for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExecOptions {
    pub stdin: bool,
    pub stdout: bool,
    pub stderr: bool,
    pub tty: bool,
    pub container: Option<String>,
    pub command: Vec<String>,
}

impl ExecOptions {
    /// Reads the query string (without `?`) as kube-apiserver reads `PodExecOptions`: pairs as
    /// Go's `url.ParseQuery` keeps them, the first value of each single-valued option,
    /// every `command` in order. The proxy reads a request once ([`from_target`](Self::from_target));
    /// this is for clients and tests that hold only a query string.
    pub fn from_query(query: &str) -> ExecOptions {
        let target =
            RequestTarget::parse("/", Some(query)).expect("a path without escapes always reads");
        ExecOptions::from_target(&target)
    }

    /// Reads the options of a request target already read ([`RequestTarget`]), as
    /// [`from_query`](Self::from_query) reads its query.
    pub fn from_target(target: &RequestTarget) -> ExecOptions {
        let flag = |key: &str| slice_to_bool(target.first(key));
        ExecOptions {
            stdin: flag("stdin"),
            stdout: flag("stdout"),
            stderr: flag("stderr"),
            tty: flag("tty"),
            container: target.first("container").map(str::to_owned),
            command: target.all("command").map(str::to_owned).collect(),
        }
    }

    /// The streams to open upstream, in the order kubelets expect: error; stdin; stdout;
    /// stderr unless tty; resize if tty and the version has one.
    pub fn upstream_streams(&self, version: UpstreamVersion) -> Vec<StreamKind> {
        let mut kinds = vec![StreamKind::Error];
        if self.stdin {
            kinds.push(StreamKind::Stdin);
        }
        if self.stdout {
            kinds.push(StreamKind::Stdout);
        }
        if self.stderr && !self.tty {
            kinds.push(StreamKind::Stderr);
        }
        if self.tty && version.has_resize_stream() {
            kinds.push(StreamKind::Resize);
        }
        kinds
    }

    /// The channel of the empty "ready" message: the lowest writable one.
    pub fn ready_channel(&self) -> Channel {
        if self.stdout {
            Channel::Stdout
        } else if self.stderr {
            Channel::Stderr
        } else {
            Channel::Error
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_booleans_follow_go() {
        let o = ExecOptions::from_query(
            "command=sh&command=-c&command=echo%20hi&stdin=1&stdout=true&stderr=FALSE&tty=&container=main",
        );
        assert!(o.stdin && o.stdout && !o.stderr && o.tty);
        assert_eq!(o.command, ["sh", "-c", "echo hi"]);
        assert_eq!(o.container.as_deref(), Some("main"));
        let o = ExecOptions::from_query("stdout=0");
        assert!(!o.stdout);
    }

    #[test]
    fn the_first_value_wins_and_go_drops_what_it_drops() {
        let o = ExecOptions::from_query(
            "container=sidecar&container=main&tty=false&tty=true&command=echo;id&command=%zz&command=ls",
        );
        assert_eq!(o.container.as_deref(), Some("sidecar"));
        assert!(!o.tty);
        assert_eq!(o.command, ["ls"]);
        assert!(ExecOptions::from_query("stdin=&stdout=yes").stdin);
    }

    #[test]
    fn stream_order() {
        let o = ExecOptions::from_query("stdin=true&stdout=true&stderr=true");
        assert_eq!(
            o.upstream_streams(UpstreamVersion::V4),
            [
                StreamKind::Error,
                StreamKind::Stdin,
                StreamKind::Stdout,
                StreamKind::Stderr
            ]
        );
        let tty = ExecOptions::from_query("stdin=true&stdout=true&stderr=true&tty=true");
        assert_eq!(
            tty.upstream_streams(UpstreamVersion::V4),
            [
                StreamKind::Error,
                StreamKind::Stdin,
                StreamKind::Stdout,
                StreamKind::Resize
            ]
        );
        assert_eq!(
            tty.upstream_streams(UpstreamVersion::V2),
            [StreamKind::Error, StreamKind::Stdin, StreamKind::Stdout]
        );
    }

    #[test]
    fn ready_channel() {
        assert_eq!(
            ExecOptions::from_query("stdout=1").ready_channel(),
            Channel::Stdout
        );
        assert_eq!(
            ExecOptions::from_query("stderr=1").ready_channel(),
            Channel::Stderr
        );
        assert_eq!(
            ExecOptions::from_query("stdin=1").ready_channel(),
            Channel::Error
        );
    }
}
