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
//!
//! How the peer hung up matters ([`Hangup`]): a FIN is how every upstream ends a session that
//! ended well (its streams' own ends are among the unread bytes), so it says nothing yet about
//! whether a stream was cut; a reset says the connection was lost with whatever it carried.

use std::os::fd::{AsRawFd, RawFd};
use std::time::Duration;

/// How often a held-back reader looks at its socket.
pub const CHECK_EVERY: Duration = Duration::from_millis(100);

/// The peer's half-close, seen by `poll(2)` (Linux); elsewhere only a reset is seen early.
#[cfg(any(target_os = "linux", target_os = "android"))]
const READ_HANGUP: libc::c_short = libc::POLLRDHUP;
#[cfg(not(any(target_os = "linux", target_os = "android")))]
const READ_HANGUP: libc::c_short = 0;

/// How a peer hung up, as first seen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hangup {
    /// It closed its side (FIN): what it sent before is all there is, which may well hold
    /// every stream's own end.
    Closed,
    /// The connection was reset or failed (RST, an error on the socket; a descriptor no longer
    /// open too): it ended without the peer finishing, so what its streams had not finished
    /// by then was cut off.
    Reset,
}

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

    /// Whether, and how, the peer has closed its side or reset the connection, bytes still
    /// unread or not. Never waits.
    pub fn hangup(&self) -> Option<Hangup> {
        let mut watched = libc::pollfd {
            fd: self.fd,
            events: READ_HANGUP,
            revents: 0,
        };
        // SAFETY: poll(2) on one pollfd that lives for the call, with no timeout; it only
        // reads the descriptor's state.
        let ready = unsafe { libc::poll(&mut watched, 1, 0) };
        if ready <= 0 {
            return None;
        }
        // A reset socket is shut both ways (POLLHUP) with its error pending (POLLERR); a
        // descriptor no longer open (POLLNVAL) cannot bring more either. A FIN alone only
        // shuts the reading side.
        if watched.revents & (libc::POLLHUP | libc::POLLERR | libc::POLLNVAL) != 0 {
            Some(Hangup::Reset)
        } else if watched.revents & READ_HANGUP != 0 {
            Some(Hangup::Closed)
        } else {
            None
        }
    }

    /// Resolves once the peer has hung up, looking every [`CHECK_EVERY`] (the first time after
    /// one interval: a reader held back that briefly does not look at all); how, as first seen.
    pub async fn hung_up(&self) -> Hangup {
        loop {
            tokio::time::sleep(CHECK_EVERY).await;
            if let Some(hangup) = self.hangup() {
                return hangup;
            }
        }
    }

    /// Resolves once the peer is seen to have reset the connection, if that is how it hung
    /// up (see [`PeerHangup::hung_up`]); never after a plain close (FIN), which is how a
    /// session that ended well ends too.
    pub async fn reset(&self) {
        if self.hung_up().await == Hangup::Closed {
            std::future::pending::<()>().await;
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
        assert_eq!(watch.hangup(), None, "bytes alone are no hang-up");
        theirs.shutdown().await.unwrap();
        let how = tokio::time::timeout(Duration::from_secs(5), watch.hung_up())
            .await
            .expect("the FIN is seen before the bytes are read");
        // A plain close is no reset: a session that ended well ends so.
        assert_eq!(how, Hangup::Closed);
        let never = tokio::time::timeout(CHECK_EVERY * 3, watch.reset()).await;
        assert!(never.is_err(), "a FIN taken for a reset");
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
        let how = tokio::time::timeout(Duration::from_secs(5), watch.hung_up())
            .await
            .expect("the reset is seen before the bytes are read");
        assert_eq!(how, Hangup::Reset);
        tokio::time::timeout(Duration::from_secs(5), watch.reset())
            .await
            .expect("a reset is a reset");
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
