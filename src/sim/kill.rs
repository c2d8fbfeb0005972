//! Abrupt connection teardown for the `dying-*` pods: a duplicate of the accepted socket's
//! descriptor, so the connection can be shut down from outside whatever task owns it.

use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::Arc;

use tokio::net::TcpStream;

/// Can shut one TCP connection down (both directions) at any time.
#[derive(Debug, Clone, Default)]
pub(crate) struct KillSwitch {
    fd: Option<Arc<OwnedFd>>,
}

impl KillSwitch {
    /// A switch for `tcp` (inert if the descriptor cannot be duplicated).
    pub(crate) fn for_stream(tcp: &TcpStream) -> Self {
        KillSwitch {
            fd: tcp.as_fd().try_clone_to_owned().ok().map(Arc::new),
        }
    }

    /// Drops the connection: both directions shut down, no goodbye of any protocol. The
    /// duplicate keeps the socket itself open, so this cannot hit an unrelated descriptor.
    pub(crate) fn kill(&self) {
        if let Some(fd) = &self.fd {
            // SAFETY: shutdown on a descriptor we own.
            unsafe {
                libc::shutdown(fd.as_raw_fd(), libc::SHUT_RDWR);
            }
        }
    }
}
