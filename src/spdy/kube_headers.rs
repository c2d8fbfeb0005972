//! The headers Kubernetes puts on a SPDY stream's SYN_STREAM (PROTOCOL.md §3.5, §3.6), read as
//! the kubelet reads them: `streamtype`, `port` and `requestid`, each with Go's `Header.Get`
//! ([`HeaderBlock::get`]: the first NUL-separated part of the value, so `stdout\0` is
//! `stdout`), the port and the request id then by the kubelet's own rules. This is the one
//! reading of them: the observer of relayed sessions, the reverse translator and the simulated
//! cluster all read a stream through it.

use std::borrow::Cow;

use super::frame::{HeaderBlock, StreamId};

/// What a port-forward stream is, by its `streamtype`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PortForwardStream {
    /// `data`: the forwarded connection's bytes.
    Data,
    /// `error`: the kubelet's error text for that connection.
    Error,
}

/// The Kubernetes headers of one stream, as the kubelet reads them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamHeaders<'a> {
    /// `streamtype`, empty when absent (Go's `Get` returns `""`): what the kubelet switches on,
    /// byte for byte.
    pub stream_type: &'a [u8],
    port: &'a [u8],
    request_id: &'a [u8],
}

impl<'a> StreamHeaders<'a> {
    /// Reads `headers` (a SYN_STREAM's).
    pub fn read(headers: &'a HeaderBlock) -> StreamHeaders<'a> {
        let get = |name| headers.get(name).unwrap_or_default();
        StreamHeaders {
            stream_type: get("streamtype"),
            port: get("port"),
            request_id: get("requestid"),
        }
    }

    /// Whether the stream's type is `name` (`stdout`, `error`, ...).
    pub fn is(&self, name: &str) -> bool {
        self.stream_type == name.as_bytes()
    }

    /// The stream's type as text, when it is UTF-8.
    pub fn stream_type_str(&self) -> Option<&'a str> {
        std::str::from_utf8(self.stream_type).ok()
    }

    /// The port, by the kubelet's rule (`strconv.ParseUint(port, 10, 16)`, then not 0):
    /// decimal digits only, no sign, leading zeros allowed, at most 65535. `None` where the
    /// kubelet refuses the stream.
    pub fn port(&self) -> Option<u16> {
        if self.port.is_empty() || !self.port.iter().all(u8::is_ascii_digit) {
            return None;
        }
        let mut value: u32 = 0;
        for &digit in self.port {
            value = value * 10 + u32::from(digit - b'0');
            if value > u32::from(u16::MAX) {
                return None;
            }
        }
        u16::try_from(value).ok().filter(|&port| port > 0)
    }

    /// What the kubelet accepts this stream as in a port-forward session: a `data` or `error`
    /// stream with a valid port; `None` for a stream it refuses.
    pub fn port_forward(&self) -> Option<PortForwardStream> {
        self.port()?;
        match self.stream_type {
            b"data" => Some(PortForwardStream::Data),
            b"error" => Some(PortForwardStream::Error),
            _ => None,
        }
    }

    /// The request that pairs a port-forward connection's `data` and `error` streams, as the
    /// kubelet takes it: `requestid`, or where that is empty (clients that sent none), one
    /// derived from the stream id: the error stream's id, the data stream's id minus 2.
    pub fn port_forward_request(&self, id: StreamId) -> Cow<'a, [u8]> {
        if !self.request_id.is_empty() {
            return Cow::Borrowed(self.request_id);
        }
        let id = i64::from(id.get());
        let derived = match self.stream_type {
            b"error" => id.to_string(),
            b"data" => (id - 2).to_string(),
            _ => String::new(),
        };
        Cow::Owned(derived.into_bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block(pairs: &[(&str, &[u8])]) -> HeaderBlock {
        pairs.iter().map(|(n, v)| (*n, *v)).collect()
    }

    #[test]
    fn reads_the_first_part_of_each_value() {
        let h = block(&[
            ("streamtype", b"stdout\0"),
            ("port", b"8080\0junk"),
            ("requestid", b"7\08"),
        ]);
        let s = StreamHeaders::read(&h);
        assert!(s.is("stdout"));
        assert_eq!(s.port(), Some(8080));
        assert_eq!(s.port_forward_request(StreamId::new(1)), &b"7"[..]);
        let none = HeaderBlock::new();
        let s = StreamHeaders::read(&none);
        assert_eq!(s.stream_type, b"");
        assert_eq!(s.stream_type_str(), Some(""));
        assert_eq!(s.port(), None);
    }

    #[test]
    fn ports_as_the_kubelet_parses_them() {
        for (value, port) in [
            (&b"8080"[..], Some(8080)),
            (b"08080", Some(8080)),
            (b"65535", Some(65535)),
            (b"0000000000000000000001", Some(1)),
            (b"65536", None),
            (b"99999999999999999999", None),
            (b"0", None),
            (b"", None),
            (b"+80", None),
            (b"-80", None),
            (b" 80", None),
            (b"80 ", None),
            (b"0x50", None),
            (b"8_0", None),
            ("٨٠".as_bytes(), None),
            (b"\080", None),
        ] {
            let h = block(&[("port", value), ("streamtype", b"data")]);
            let s = StreamHeaders::read(&h);
            assert_eq!(s.port(), port, "{value:?}");
            assert_eq!(
                s.port_forward(),
                port.map(|_| PortForwardStream::Data),
                "{value:?}"
            );
        }
    }

    #[test]
    fn only_data_and_error_streams_forward() {
        for (ty, kind) in [
            (&b"data"[..], Some(PortForwardStream::Data)),
            (b"error", Some(PortForwardStream::Error)),
            (b"data\0", Some(PortForwardStream::Data)),
            (b"Data", None),
            (b"", None),
            (b"stdout", None),
        ] {
            let h = block(&[("port", b"80"), ("streamtype", ty)]);
            assert_eq!(StreamHeaders::read(&h).port_forward(), kind, "{ty:?}");
        }
    }

    #[test]
    fn an_empty_request_id_is_derived_from_the_stream_id() {
        let derived = |ty: &[u8], request: &[u8], id: u32| {
            let h = block(&[("streamtype", ty), ("requestid", request)]);
            StreamHeaders::read(&h)
                .port_forward_request(StreamId::new(id))
                .into_owned()
        };
        assert_eq!(derived(b"error", b"", 5), b"5");
        assert_eq!(derived(b"data", b"", 7), b"5");
        assert_eq!(derived(b"data", b"", 1), b"-1");
        // `\0x` reads as empty: derived too.
        assert_eq!(derived(b"error", b"\0x", 9), b"9");
        assert_eq!(derived(b"data", b"x\xff", 9), b"x\xff");
        let none = block(&[("streamtype", b"error")]);
        assert_eq!(
            StreamHeaders::read(&none).port_forward_request(StreamId::new(3)),
            &b"3"[..]
        );
    }
}
