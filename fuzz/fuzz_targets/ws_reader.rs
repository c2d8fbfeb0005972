//! Arbitrary bytes from a "client" into the WebSocket reader, arriving in two pieces.
//!
//! Checks, besides "never panics": no message exceeds the size limit, text messages are UTF-8,
//! once the reader has ended (close frame, error or end of input) it stays ended, and every
//! byte of the session's memory it took is given back once it and its messages are dropped.

#![no_main]

use kube_ws_proxy::session_memory::{LaneLimits, MemoryBudget};
use kube_ws_proxy::translate::ws::{Config, Incoming, WebSocket};
use libfuzzer_sys::fuzz_target;
use tokio::io::AsyncReadExt;

/// Small, so the fuzzer reaches the size checks with small inputs.
const MAX_MESSAGE: usize = 1024;

fuzz_target!(|data: &[u8]| {
    let Some((&split, data)) = data.split_first() else {
        return;
    };
    let split = usize::from(split) * data.len() / 255;
    let client = data[..split].chain(&data[split..]);
    let io = tokio::io::join(client, tokio::io::sink());
    // A small floor and budget, so that frames past the floor are taken whole (and sometimes
    // refused).
    let budget = MemoryBudget::new(
        2 * MAX_MESSAGE,
        LaneLimits {
            floor: MAX_MESSAGE / 4,
            cap: 2 * MAX_MESSAGE,
        },
    );
    let (mut reader, _writer) = WebSocket::new(
        io,
        Config {
            max_message_size: MAX_MESSAGE,
            keepalive: None,
            memory: Some(budget.clone()),
        },
    )
    .split();
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    rt.block_on(async {
        while let Some(msg) = reader.next().await {
            match msg {
                Ok(Incoming::Binary(b)) => assert!(b.len() <= MAX_MESSAGE),
                Ok(Incoming::Text(t)) => {
                    assert!(t.len() <= MAX_MESSAGE);
                    assert!(std::str::from_utf8(&t).is_ok());
                }
                Ok(Incoming::Close(_)) | Err(_) => break,
            }
        }
        assert!(reader.next().await.is_none(), "an ended reader stays ended");
    });
    drop(reader);
    assert_eq!((budget.held(), budget.in_use()), (0, 0), "memory given back");
});
