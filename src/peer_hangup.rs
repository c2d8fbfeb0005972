//! Seeing that a connection's peer has hung up (sent its FIN, or reset the connection) while
//! bytes it sent before that are still unread.
//!
//! A reader held back (its session's output waiting for the recording writer) leaves what the
//! peer sent in the kernel, and a read sees the FIN or the reset only after all of it. The
//! socket's state says it at once: `poll(2)` reports `POLLRDHUP` once the FIN has arrived and
//! `POLLHUP`/`POLLERR` after a reset, whatever is still queued ahead of them. Under TLS the
//! watch is on the TCP socket underneath, which is where the peer's end arrives.
//!
//! A held-back reader looks every [`CHECK_EVERY`]: one `poll(2)` call, and only while it is
//! held back; a reader that keeps up never looks.

use std::os::fd::{AsRawFd, RawFd};
use std::time::Duration;

/// How often a held-back reader looks at its socket.
pub const CHECK_EVERY: Duration = Duration::from_millis(100);

/// The peer's half-close, seen by `poll(2)` (Linux); elsewhere only a reset is seen early.
#[cfg(any(target_os = "linux", target_os = "android"))]
const READ_HANGUP: libc::c_short = libc::POLLRDHUP;
#[cfg(not(any(target_os = "linux", target_os = "android")))]
const READ_HANGUP: libc::c_short = 0;

/// A socket watched for its peer's hang-up.
///
/// It holds the socket's descriptor number, not the socket: keep it beside the socket's reader
/// and use it only while that reader (and so the socket) lives, as the SPDY session's reader
/// and the relay's copy loop do.
#[derive(Debug, Clone, Copy)]
pub struct PeerHangup {
    fd: RawFd,
}

impl PeerHangup {
    /// A watch on `socket` (a TCP socket; under TLS, the one underneath).
    pub fn of(socket: &impl AsRawFd) -> PeerHangup {
        PeerHangup {
            fd: socket.as_raw_fd(),
        }
    }

    /// Whether the peer has closed its side or reset the connection, bytes still unread or
    /// not. Never waits.
    pub fn has_hung_up(&self) -> bool {
        let mut watched = libc::pollfd {
            fd: self.fd,
            events: READ_HANGUP,
            revents: 0,
        };
        // SAFETY: poll(2) on one pollfd that lives for the call, with no timeout; it only
        // reads the descriptor's state.
        let ready = unsafe { libc::poll(&mut watched, 1, 0) };
        // A descriptor no longer open (POLLNVAL) cannot bring more either.
        let ended = READ_HANGUP | libc::POLLHUP | libc::POLLERR | libc::POLLNVAL;
        ready > 0 && watched.revents & ended != 0
    }

    /// Resolves once the peer has hung up, looking every [`CHECK_EVERY`] (the first time after
    /// one interval: a reader held back that briefly does not look at all).
    pub async fn hung_up(&self) {
        loop {
            tokio::time::sleep(CHECK_EVERY).await;
            if self.has_hung_up() {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};

    use super::*;

    async fn pair() -> (TcpStream, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (ours, theirs) = tokio::join!(TcpStream::connect(addr), listener.accept());
        (ours.unwrap(), theirs.unwrap().0)
    }

    #[tokio::test]
    async fn a_fin_behind_unread_bytes_is_seen_and_the_bytes_still_read() {
        let (mut ours, mut theirs) = pair().await;
        let watch = PeerHangup::of(&ours);
        theirs.write_all(&[7; 100_000]).await.unwrap();
        assert!(!watch.has_hung_up(), "bytes alone are no hang-up");
        theirs.shutdown().await.unwrap();
        tokio::time::timeout(Duration::from_secs(5), watch.hung_up())
            .await
            .expect("the FIN is seen before the bytes are read");
        let mut got = Vec::new();
        ours.read_to_end(&mut got).await.unwrap();
        assert_eq!(got.len(), 100_000, "nothing read is lost");
    }

    #[tokio::test]
    async fn a_reset_behind_unread_bytes_is_seen() {
        let (ours, mut theirs) = pair().await;
        let watch = PeerHangup::of(&ours);
        theirs.write_all(&[7; 100_000]).await.unwrap();
        // Closing with a zero linger sends RST instead of FIN.
        theirs.set_zero_linger().unwrap();
        drop(theirs);
        tokio::time::timeout(Duration::from_secs(5), watch.hung_up())
            .await
            .expect("the reset is seen before the bytes are read");
        drop(ours);
    }

    #[tokio::test]
    async fn a_live_peer_has_not_hung_up() {
        let (ours, mut theirs) = pair().await;
        let watch = PeerHangup::of(&ours);
        theirs.write_all(b"still here").await.unwrap();
        let waited = tokio::time::timeout(CHECK_EVERY * 3, watch.hung_up()).await;
        assert!(waited.is_err());
        drop(ours);
    }
}
