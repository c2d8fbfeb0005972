//! What a recording's user-space encoding costs, without the session or the file: exec output
//! fed in 32 KiB chunks through `Utf8Carry::decode_json_into`, one asciicast event line per
//! chunk into a reused buffer, as the recording writer does. Three kinds of output: terminal
//! text (the `recording` bench's `ls -l` line: a newline to escape every 63 bytes), text with
//! box drawing and accents (UTF-8 beyond ASCII in every line), NUL bytes (every byte a
//! six-character escape) and random bytes (binary: most bytes above 0x7f are not UTF-8 and
//! become U+FFFD).
//!
//! Run with `cargo bench --bench asciicast_encode`. For instruction counts, which a busy
//! machine does not blur, one pass of one case under callgrind:
//!
//!     ENCODE_ONCE=text valgrind --tool=callgrind --toggle-collect='*decode_json_into*' \
//!         target/release/deps/asciicast_encode-<hash>

use criterion::{black_box, criterion_group, criterion_main, Criterion, Throughput};
use kube_ws_proxy::audit::recording::asciicast::{begin_event, end_event, EventCode, Utf8Carry};
use std::time::Duration;

const OUTPUT: usize = 64 << 20;
const CHUNK: usize = 32 * 1024;

fn output(kind: &str) -> Vec<u8> {
    let line: &[u8] = match kind {
        "text" => b"drwxr-xr-x  2 kube kube  4096 Nov 25 01:02 a-directory-listing-line\n",
        "utf8" => "\u{1b}[0m\u{2502}   \u{251c}\u{2500}\u{2500} r\u{e9}sum\u{e9}-\u{fc}bersicht.txt  4096 \u{2714}\r\n".as_bytes(),
        "NUL" => b"\0",
        "random" => {
            // xorshift: bytes a binary `kubectl cp` or a compressed file shows.
            let mut x = 0x9e37_79b9_7f4a_7c15u64;
            return (0..OUTPUT)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    (x >> 24) as u8
                })
                .collect();
        }
        other => panic!("unknown output {other}"),
    };
    line.iter().cycle().take(OUTPUT).copied().collect()
}

/// One pass: every chunk an output event line, the buffer cleared as the writer's is after a
/// write.
fn encode(output: &[u8], line: &mut Vec<u8>) -> usize {
    let mut carry = Utf8Carry::default();
    let mut written = 0;
    for (i, chunk) in output.chunks(CHUNK).enumerate() {
        line.clear();
        begin_event(i as f64 * 0.001, EventCode::Output, line);
        carry.decode_json_into(chunk, line);
        end_event(line);
        written += line.len();
    }
    written
}

fn bench(c: &mut Criterion) {
    if let Ok(kind) = std::env::var("ENCODE_ONCE") {
        let out = output(&kind);
        let mut line = Vec::new();
        println!("{kind}: {} bytes of events", encode(&out, &mut line));
        return;
    }
    let mut group = c.benchmark_group("asciicast_encode");
    group.throughput(Throughput::Bytes(OUTPUT as u64));
    group.sample_size(10);
    group.measurement_time(Duration::from_secs(5));
    for kind in ["text", "utf8", "NUL", "random"] {
        let out = output(kind);
        let mut line = Vec::new();
        group.bench_function(kind, |b| b.iter(|| encode(black_box(&out), &mut line)));
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
