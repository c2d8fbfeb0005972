//! TCP services "inside the pod" for port-forward tests: the simulated cluster dials
//! `127.0.0.1:<port>`, so these listen there. Every connection starts with a one-byte command:
//!
//! * `E`: echo everything until EOF, then close.
//! * `D` + u64 LE length: send that many bytes of [`pattern`], then close.
//! * `U` + u64 LE length: read that many bytes, compare them with [`pattern`], answer `OK` or
//!   `BAD <offset>`, then close.
//!
//! A connection without a command byte (the Python client's echo test) is an echo too: the
//! server is started with [`PodServer::echo`].

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Chunk size for generated and verified data.
pub const CHUNK: usize = 256 * 1024;

/// A running pod service.
pub struct PodServer {
    pub port: u16,
    accepted: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for PodServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl PodServer {
    /// The command-driven service described in the module docs.
    pub async fn commands() -> PodServer {
        Self::start(false).await
    }

    /// A plain echo service.
    pub async fn echo() -> PodServer {
        Self::start(true).await
    }

    async fn start(echo_only: bool) -> PodServer {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = accepted.clone();
        let task = tokio::spawn(async move {
            while let Ok((conn, _)) = listener.accept().await {
                count.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    let _ = if echo_only {
                        echo(conn).await
                    } else {
                        serve(conn).await
                    };
                });
            }
        });
        PodServer {
            port,
            accepted,
            task,
        }
    }

    /// Connections accepted so far.
    pub fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }
}

async fn serve(mut conn: TcpStream) -> std::io::Result<()> {
    let cmd = conn.read_u8().await?;
    match cmd {
        b'E' => echo(conn).await,
        b'D' => {
            let len = conn.read_u64_le().await?;
            send_pattern(&mut conn, len).await?;
            conn.shutdown().await
        }
        b'U' => {
            let len = conn.read_u64_le().await?;
            let answer = match verify_pattern(&mut conn, len).await? {
                None => b"OK".to_vec(),
                Some(at) => format!("BAD {at}").into_bytes(),
            };
            conn.write_all(&answer).await?;
            conn.shutdown().await
        }
        _ => Ok(()),
    }
}

async fn echo(conn: TcpStream) -> std::io::Result<()> {
    let (mut r, mut w) = conn.into_split();
    tokio::io::copy(&mut r, &mut w).await?;
    w.shutdown().await
}

/// Fills `buf` with the pattern bytes for stream offsets `offset..offset+buf.len()`: each
/// 8-byte word is a hash of its index, so any slice can be regenerated independently.
pub fn pattern(offset: u64, buf: &mut [u8]) {
    let mut word_index = offset / 8;
    let mut word = splitmix(word_index).to_le_bytes();
    let mut in_word = (offset % 8) as usize;
    for b in buf.iter_mut() {
        if in_word == 8 {
            word_index += 1;
            word = splitmix(word_index).to_le_bytes();
            in_word = 0;
        }
        *b = word[in_word];
        in_word += 1;
    }
}

fn splitmix(i: u64) -> u64 {
    let mut z = i.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Writes `len` bytes of the pattern.
pub async fn send_pattern<W: AsyncWriteExt + Unpin>(w: &mut W, len: u64) -> std::io::Result<()> {
    let mut buf = vec![0u8; CHUNK];
    let mut sent = 0u64;
    while sent < len {
        let n = (len - sent).min(CHUNK as u64) as usize;
        pattern(sent, &mut buf[..n]);
        w.write_all(&buf[..n]).await?;
        sent += n as u64;
    }
    w.flush().await
}

/// Reads exactly `len` bytes and checks them against the pattern; `Some(offset)` of the first
/// mismatch (or of a premature EOF).
pub async fn verify_pattern<R: AsyncReadExt + Unpin>(
    r: &mut R,
    len: u64,
) -> std::io::Result<Option<u64>> {
    let mut buf = vec![0u8; CHUNK];
    let mut expected = vec![0u8; CHUNK];
    let mut got = 0u64;
    while got < len {
        let want = (len - got).min(CHUNK as u64) as usize;
        let n = r.read(&mut buf[..want]).await?;
        if n == 0 {
            return Ok(Some(got));
        }
        pattern(got, &mut expected[..n]);
        if buf[..n] != expected[..n] {
            let at = buf[..n]
                .iter()
                .zip(&expected[..n])
                .position(|(a, b)| a != b)
                .unwrap();
            return Ok(Some(got + at as u64));
        }
        got += n as u64;
    }
    Ok(None)
}
