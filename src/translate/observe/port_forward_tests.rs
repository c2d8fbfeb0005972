use bytes::{Bytes, BytesMut};

use super::*;
use crate::audit::port_forward::ForwardedConnection;
use crate::spdy::codec::FrameEncoder;
use crate::spdy::frame::{
    Data, Frame, HeaderBlock, Ping, PingId, RstStatus, RstStream, StreamId, SynReply, SynStream,
};

const UP: Direction = Direction::ClientToUpstream;
const DOWN: Direction = Direction::UpstreamToClient;

/// A stream of a forwarded connection, as kubectl opens it.
fn syn(id: u32, streamtype: &str, port: &str, request_id: &str) -> Frame {
    let mut headers = HeaderBlock::new();
    headers.push("streamtype", streamtype);
    headers.push("port", port);
    headers.push("requestid", request_id);
    Frame::SynStream(SynStream::new(StreamId::new(id), headers))
}

fn reply(id: u32) -> Frame {
    Frame::SynReply(SynReply {
        stream_id: StreamId::new(id),
        fin: false,
        headers: HeaderBlock::new(),
    })
}

fn data(id: u32, payload: &[u8], fin: bool) -> Frame {
    Frame::Data(Data {
        stream_id: StreamId::new(id),
        fin,
        payload: Bytes::copy_from_slice(payload),
    })
}

fn rst(id: u32) -> Frame {
    Frame::RstStream(RstStream {
        stream_id: StreamId::new(id),
        status: RstStatus::Cancel,
    })
}

fn encode(enc: &mut FrameEncoder, frames: &[Frame]) -> Vec<u8> {
    let mut out = BytesMut::new();
    for f in frames {
        enc.encode(f, &mut out).unwrap();
    }
    out.to_vec()
}

const REFUSED: &str = "error forwarding port 9090 to pod 4f1c, uid : connection refused";

/// Two forwarded connections the way kubectl and a kubelet carry them: port 8080 (request 0)
/// moves `big` bytes to the client, port 9090 (request 1) is refused by the pod. Returns the
/// client's stream openings, the rest of its bytes, and the kubelet's bytes.
pub(super) fn session(big: usize) -> (Vec<u8>, Vec<u8>, Vec<u8>) {
    let mut client = FrameEncoder::new();
    let mut server = FrameEncoder::new();
    let syns = encode(
        &mut client,
        &[
            syn(1, "error", "8080", "0"),
            data(1, b"", true),
            syn(3, "data", "8080", "0"),
            syn(5, "error", "9090", "1"),
            data(5, b"", true),
            syn(7, "data", "9090", "1"),
        ],
    );
    let up = encode(
        &mut client,
        &[
            data(3, &[b'a'; 1000], false),
            Frame::Ping(Ping { id: PingId(1) }),
            data(7, &[b'b'; 300], false),
            data(3, &[b'c'; 24], true),
        ],
    );
    let down = encode(
        &mut server,
        &[
            reply(1),
            reply(3),
            reply(5),
            reply(7),
            data(3, &vec![b'z'; big], false),
            Frame::Ping(Ping { id: PingId(1) }),
            data(5, REFUSED.as_bytes(), false),
            data(5, b"", true),
            data(1, b"", true),
            data(7, b"hello", true),
            data(3, b"", true),
        ],
    );
    (syns, up, down)
}

pub(super) fn want(big: usize) -> PortForwardReport {
    PortForwardReport {
        ports: vec![8080, 9090],
        connections: vec![
            ForwardedConnection {
                port: Some(8080),
                request_id: "0".into(),
                bytes_in: 1024,
                bytes_out: big as u64,
                error: None,
            },
            ForwardedConnection {
                port: Some(9090),
                request_id: "1".into(),
                bytes_in: 300,
                bytes_out: 5,
                error: Some(REFUSED.into()),
            },
        ],
        omitted: 0,
        failure: None,
    }
}

fn feed(o: &mut SpdyObserver, direction: Direction, bytes: &[u8]) {
    let mut events = Vec::new();
    o.feed(direction, bytes, &mut events).unwrap();
    assert!(events.is_empty(), "a port-forward yields no events");
}

#[test]
fn port_forward_connections_in_one_piece() {
    let (syns, up, down) = session(70_000);
    let mut o = SpdyObserver::port_forward();
    feed(&mut o, UP, &[syns, up].concat());
    feed(&mut o, DOWN, &down);
    assert_eq!(o.port_forwards(), Some(want(70_000)));
}

#[test]
fn port_forward_split_at_every_byte_boundary() {
    let (syns, up, down) = session(100);
    let up = [syns, up].concat();
    for at in 0..=up.len() {
        let mut o = SpdyObserver::port_forward();
        feed(&mut o, UP, &up[..at]);
        feed(&mut o, UP, &up[at..]);
        let report = o.port_forwards().unwrap();
        assert_eq!(report.connections[0].bytes_in, 1024, "split at {at}");
        assert_eq!(report.connections[1].bytes_in, 300, "split at {at}");
    }
    for at in 0..=down.len() {
        let mut o = SpdyObserver::port_forward();
        feed(&mut o, UP, &up);
        feed(&mut o, DOWN, &down[..at]);
        feed(&mut o, DOWN, &down[at..]);
        assert_eq!(o.port_forwards(), Some(want(100)), "split at {at}");
    }
}

#[test]
fn port_forward_in_every_chunk_size_interleaved() {
    let (syns, up, down) = session(3_000);
    for chunk in 1..40 {
        let mut o = SpdyObserver::port_forward();
        // The kubelet answers streams it has been sent: the openings go first.
        feed(&mut o, UP, &syns);
        let mut ups = up.chunks(chunk);
        let mut downs = down.chunks(chunk);
        loop {
            let (u, d) = (ups.next(), downs.next());
            if u.is_none() && d.is_none() {
                break;
            }
            if let Some(u) = u {
                feed(&mut o, UP, u);
            }
            if let Some(d) = d {
                feed(&mut o, DOWN, d);
            }
        }
        assert_eq!(o.port_forwards(), Some(want(3_000)), "chunk {chunk}");
    }
}

#[test]
fn port_forward_data_larger_than_the_frame_buffer_is_counted_not_kept() {
    let big = MAX_FRAME * 2;
    let (syns, up, down) = session(big);
    let mut o = SpdyObserver::port_forward();
    feed(&mut o, UP, &[syns, up].concat());
    for piece in down.chunks(64 * 1024) {
        feed(&mut o, DOWN, piece);
    }
    assert_eq!(o.port_forwards(), Some(want(big)));
}

#[test]
fn port_forward_details_stop_at_the_cap_and_the_rest_are_counted() {
    let mut client = FrameEncoder::new();
    let mut server = FrameEncoder::new();
    let mut o = SpdyObserver::port_forward();
    let extra = 7;
    // One after the other, each closed both ways: far more streams than are ever open at once.
    for n in 0..(MAX_CONNECTIONS + extra) as u32 {
        let (error, data_id) = (4 * n + 1, 4 * n + 3);
        let port = if n % 2 == 0 { "8080" } else { "9090" };
        let request = n.to_string();
        let up = encode(
            &mut client,
            &[
                syn(error, "error", port, &request),
                data(error, b"", true),
                syn(data_id, "data", port, &request),
                data(data_id, b"ping", true),
            ],
        );
        let down = encode(
            &mut server,
            &[
                reply(error),
                reply(data_id),
                data(error, b"", true),
                data(data_id, b"pong!", true),
            ],
        );
        feed(&mut o, UP, &up);
        feed(&mut o, DOWN, &down);
    }
    // A connection opened after the cap, on a new port: its port is still seen.
    let up = encode(&mut client, &[syn(100_001, "data", "7000", "late")]);
    feed(&mut o, UP, &up);
    let report = o.port_forwards().unwrap();
    assert_eq!(report.connections.len(), MAX_CONNECTIONS);
    assert_eq!(report.omitted, extra as u64 + 1);
    assert_eq!(report.ports, [7000, 8080, 9090]);
    let last = report.connections.last().unwrap();
    assert_eq!(last.request_id, (MAX_CONNECTIONS - 1).to_string());
    assert_eq!((last.bytes_in, last.bytes_out), (4, 5));
}

#[test]
fn port_forward_reset_streams_carry_nothing_more() {
    let mut client = FrameEncoder::new();
    let mut server = FrameEncoder::new();
    let mut o = SpdyObserver::port_forward();
    let up = encode(
        &mut client,
        &[
            syn(1, "error", "0", "0"),
            syn(3, "data", "0", "0"),
            data(3, b"abc", false),
        ],
    );
    feed(&mut o, UP, &up);
    // The kubelet refuses port 0.
    let down = encode(&mut server, &[rst(1), rst(3), data(3, b"late", false)]);
    feed(&mut o, DOWN, &down);
    let report = o.port_forwards().unwrap();
    assert!(report.ports.is_empty());
    assert_eq!(
        report.connections,
        [ForwardedConnection {
            port: None,
            request_id: "0".into(),
            bytes_in: 3,
            bytes_out: 0,
            error: None,
        }]
    );
}

#[test]
fn port_forward_protocol_gets_the_port_forward_observer() {
    let (syns, up, down) = session(10);
    let mut o = Observer::for_protocol(Some("SPDY/3.1"), Some(PORT_FORWARD)).unwrap();
    let mut events = Vec::new();
    o.feed(UP, &[syns, up].concat(), &mut events).unwrap();
    o.feed(DOWN, &down, &mut events).unwrap();
    assert!(events.is_empty());
}

#[test]
fn port_forward_watch_keeps_what_it_saw_when_it_stops() {
    let (syns, up, down) = session(10);
    let watch = PortForwardWatch::new();
    watch.relayed(UP, &[syns, up].concat());
    watch.relayed(DOWN, &down);
    // A control frame of an unknown version.
    watch.relayed(UP, &[0x80, 0x02, 0x00, 0x01, 0, 0, 0, 0]);
    watch.relayed(UP, b"anything after it is ignored");
    let report = watch.finish();
    assert!(report.failure.is_some());
    assert_eq!(
        PortForwardReport {
            failure: None,
            ..report
        },
        want(10)
    );
}

#[test]
fn port_forward_watch_of_a_quiet_session_is_empty() {
    assert_eq!(
        PortForwardWatch::new().finish(),
        PortForwardReport::default()
    );
}
