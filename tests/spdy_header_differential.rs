//! The proxy's one reading of a SPDY stream's headers against Go's spdystream, as the kubelet
//! runs it (issue 35, finding 2). Generated header blocks (names in mixed case, repeated,
//! empty, with bytes that are not token characters or not UTF-8; values with NULs inside and
//! at the end, empty parts, several values, any bytes) each go as a SYN_STREAM to a fresh
//! spdystream server connection (tests/interop/spdy_peer in `headers` mode, built in the test
//! run), which says whether it accepted the stream and what `Headers().Get` and `Values`
//! returned for `streamType`, `port` and `requestID`. Our decoders read the same frame bytes:
//! a session of ours ([`FrameDecoder::new`]) must accept exactly what spdystream accepts, and
//! what it reads — and what an observer reads ([`FrameDecoder::following`]) — must be what Go
//! read. The blocks come from a seeded generator, so every run checks the same ones.
//!
//! Without `go` or the spdystream sources the test is skipped with a note, unless `CI` is set,
//! where that is a failure.

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};

use bytes::BytesMut;
use kube_ws_proxy::spdy::codec::FrameDecoder;
use kube_ws_proxy::spdy::frame::{Frame, HeaderBlock};
use kube_ws_proxy::spdy::header_block::DICTIONARY;
use kube_ws_proxy::spdy::kube_headers::StreamHeaders;
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
use serde_json::Value;

use crate::spdy_interop::peer_binary;

/// Generated blocks per run.
const BLOCKS: usize = 600;

/// Names: those the kubelet reads in every case, ones Go's lowercasing changes (the Kelvin
/// sign, `İ`), ones that are their own canonical key (digits, spaces, the empty name), a NUL,
/// bytes that are not UTF-8, hop-by-hop names.
const NAMES: &[&[u8]] = &[
    b"streamtype",
    b"streamtype",
    b"StreamType",
    b"STREAMTYPE",
    b"streamType",
    b"port",
    b"port",
    b"Port",
    b"requestid",
    b"requestid",
    b"requestID",
    b"streamtype\0",
    b"stream type",
    b"streamtype ",
    b"",
    b"x",
    b"8080",
    b"x y",
    b"1a",
    b"a-b",
    b"-",
    b"host",
    b"connection",
    b"transfer-encoding",
    "ä".as_bytes(),
    "Ä".as_bytes(),
    "requestİd".as_bytes(),
    "\u{212A}".as_bytes(),
    "ſtreamtype".as_bytes(),
    "\u{FFFD}".as_bytes(),
    b"\xff",
    b"port\xe2\x82",
    b"\x7f",
];

/// Pieces values are made of.
const PIECES: &[&[u8]] = &[
    b"stdout", b"stderr", b"stdin", b"error", b"resize", b"data", b"8080", b"08080", b"0",
    b"65535", b"65536", b"+80", b"7", b"", b"\0", b"\0", b"\xff", b"junk", b" ", b"Stdout",
];

fn name() -> impl Strategy<Value = Vec<u8>> {
    prop::sample::select(NAMES).prop_map(<[u8]>::to_vec)
}

fn value() -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(prop::sample::select(PIECES), 0..5).prop_map(|p| p.concat())
}

fn block() -> impl Strategy<Value = Vec<(Vec<u8>, Vec<u8>)>> {
    prop::collection::vec((name(), value()), 0..7)
}

/// The raw layout of `pairs`, as they are: any names, repeated ones too.
fn raw(pairs: &[(Vec<u8>, Vec<u8>)]) -> Vec<u8> {
    let mut out = (pairs.len() as u32).to_be_bytes().to_vec();
    for (n, v) in pairs {
        for part in [n, v] {
            out.extend_from_slice(&(part.len() as u32).to_be_bytes());
            out.extend_from_slice(part);
        }
    }
    out
}

/// A SYN_STREAM for stream 1 carrying `raw`, compressed on a fresh zlib stream.
fn syn_stream(raw: &[u8]) -> Vec<u8> {
    let mut deflate = flate2::Compress::new(flate2::Compression::default(), true);
    deflate.set_dictionary(DICTIONARY).unwrap();
    let mut block = Vec::with_capacity(raw.len() + 64);
    deflate
        .compress_vec(raw, &mut block, flate2::FlushCompress::Sync)
        .unwrap();
    let len = 10 + block.len();
    let mut frame = vec![0x80, 3, 0, 1, 0];
    frame.extend_from_slice(&(len as u32).to_be_bytes()[1..]);
    frame.extend_from_slice(&[0, 0, 0, 1, 0, 0, 0, 0, 0, 0]);
    frame.extend_from_slice(&block);
    frame
}

/// A block as `{"name": "value", ...}`, bytes escaped.
fn show(pairs: &[(Vec<u8>, Vec<u8>)]) -> String {
    let pairs: Vec<String> = pairs
        .iter()
        .map(|(n, v)| format!("\"{}\": \"{}\"", n.escape_ascii(), v.escape_ascii()))
        .collect();
    format!("{{{}}}", pairs.join(", "))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// What Go read of each frame, in order.
fn go_readings(frames: &[Vec<u8>]) -> Option<Vec<Value>> {
    let binary = peer_binary()?;
    let mut child = Command::new(binary)
        .arg("headers")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("starting spdy_peer headers");
    let mut stdin = child.stdin.take().unwrap();
    let input: String = frames.iter().map(|f| hex(f) + "\n").collect();
    let writer = std::thread::spawn(move || stdin.write_all(input.as_bytes()));
    let readings: Vec<Value> = BufReader::new(child.stdout.take().unwrap())
        .lines()
        .map(|l| serde_json::from_str(&l.unwrap()).unwrap())
        .collect();
    writer.join().unwrap().unwrap();
    assert!(child.wait().unwrap().success());
    assert_eq!(readings.len(), frames.len(), "one reading per frame");
    Some(readings)
}

/// The SYN_STREAM's headers as one of our decoders reads `frame`; `None` where it refuses it.
fn ours(mut decoder: FrameDecoder, frame: &[u8]) -> Option<HeaderBlock> {
    match decoder.decode(&mut BytesMut::from(frame)) {
        Ok(Some(Frame::SynStream(syn))) => Some(syn.headers),
        Ok(other) => panic!("decoded {other:?}"),
        Err(_) => None,
    }
}

/// Checks our reading of one frame against Go's; `Err` says how they differ.
fn compare(frame: &[u8], go: &Value) -> Result<(), String> {
    let session = ours(FrameDecoder::new(), frame);
    let observer = ours(FrameDecoder::following(1 << 20, 1 << 16), frame);
    let accepted = go["accepted"].as_bool().unwrap();
    let observed = observer.ok_or("the observer could not read a block")?;
    let Some(session) = session else {
        return match accepted {
            true => Err("spdystream accepted what our session refused".into()),
            false => Ok(()),
        };
    };
    if !accepted {
        return Err("our session accepted what spdystream refused".into());
    }
    if session != observed {
        return Err(format!("session read {session:?}, observer {observed:?}"));
    }
    for (go_name, ours_name) in [
        ("streamType", "streamtype"),
        ("port", "port"),
        ("requestID", "requestid"),
    ] {
        // Looked up under Go's spelling: the canonical key makes the case irrelevant.
        let get = hex(session.get(go_name).unwrap_or_default());
        if go["get"][go_name] != get.as_str() {
            return Err(format!(
                "Get({go_name}): Go {}, ours {get}",
                go["get"][go_name]
            ));
        }
        let values: Vec<String> = session.get_all(ours_name).map(hex).collect();
        if go["values"][go_name] != serde_json::json!(values) {
            return Err(format!(
                "Values({go_name}): Go {}, ours {values:?}",
                go["values"][go_name]
            ));
        }
    }
    let port = StreamHeaders::read(&session).port().map_or(0, u64::from);
    if go["port"] != port {
        return Err(format!("port: Go {}, ours {port}", go["port"]));
    }
    Ok(())
}

/// Blocks written out: the cases of finding 2 and the edges of Go's reading.
fn known_blocks() -> Vec<Vec<(Vec<u8>, Vec<u8>)>> {
    let b = |pairs: &[(&[u8], &[u8])]| {
        pairs
            .iter()
            .map(|(n, v)| (n.to_vec(), v.to_vec()))
            .collect::<Vec<_>>()
    };
    vec![
        b(&[(b"streamtype", b"stdout\0")]),
        b(&[(b"streamtype", b"stderr\0junk")]),
        b(&[(b"streamtype", b"\0stdout")]),
        b(&[(b"port", b"8080\0junk"), (b"streamtype", b"data")]),
        b(&[(b"streamtype", b"error"), (b"streamtype", b"stdout")]),
        b(&[(b"8080", b""), (b"8080", b"")]),
        b(&[(b"", b"")]),
        b(&[(b"", b""), (b"", b"")]),
        b(&[(b"StreamType", b"stdout")]),
        b(&[(b"host", b"x")]),
        b(&[(b"host ", b"x")]),
        b(&[(b"requestid", b"\xff\0"), (b"port", b"+80")]),
        b(&[]),
    ]
}

#[test]
fn the_kubelets_reading_of_generated_blocks_is_ours() {
    let mut runner = TestRunner::new_with_rng(
        Config::default(),
        TestRng::from_seed(RngAlgorithm::ChaCha, &[35; 32]),
    );
    let mut blocks = known_blocks();
    let strategy = block();
    while blocks.len() < BLOCKS {
        blocks.push(strategy.new_tree(&mut runner).unwrap().current());
    }
    let frames: Vec<Vec<u8>> = blocks.iter().map(|b| syn_stream(&raw(b))).collect();
    let Some(go) = go_readings(&frames) else {
        return;
    };
    let mut accepted = 0;
    let mut failures = Vec::new();
    for ((pairs, frame), go) in blocks.iter().zip(&frames).zip(&go) {
        accepted += usize::from(go["accepted"] == true);
        if let Err(why) = compare(frame, go) {
            failures.push(format!("{}: {why}", show(pairs)));
        }
    }
    eprintln!(
        "{accepted} of {} blocks accepted by spdystream",
        blocks.len()
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    // The generator reaches both sides of Go's verdict.
    assert!(
        accepted > BLOCKS / 5 && accepted < BLOCKS * 4 / 5,
        "{accepted} of {BLOCKS} accepted"
    );
}
