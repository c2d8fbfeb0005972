//! TCP keepalive on the proxy's sockets (`--tcp-keepalive`): the one liveness check that also
//! covers byte relays, which cannot inject pings into a protocol they do not parse. It finds
//! peers that vanished without a word (a node gone, a NAT entry dropped) once the connection
//! has been quiet for a while, and its probes keep such NAT entries and idle-cutting firewalls
//! from forgetting a quiet connection.

use std::time::Duration;

use socket2::{SockRef, TcpKeepalive};
use tokio::net::TcpStream;

/// Probes a peer that answers none is given, as Linux' default (9) is far too patient here.
const PROBES: u32 = 3;

/// Turns keepalive on for `tcp`: the first probe after `idle` of silence, then one every third
/// of it (at least a second); a peer that answers none of three is dropped, about twice
/// `idle` after it went quiet. Errors are ignored: keepalive is a safety net, not a condition
/// for serving.
pub fn enable(tcp: &TcpStream, idle: Duration) {
    let interval = (idle / PROBES).max(Duration::from_secs(1));
    let params = TcpKeepalive::new()
        .with_time(idle)
        .with_interval(interval)
        .with_retries(PROBES);
    let _ = SockRef::from(tcp).set_tcp_keepalive(&params);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_socket_carries_the_settings() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let tcp = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        enable(&tcp, Duration::from_secs(30));
        let sock = SockRef::from(&tcp);
        assert!(sock.keepalive().unwrap());
        assert_eq!(sock.tcp_keepalive_time().unwrap(), Duration::from_secs(30));
        assert_eq!(
            sock.tcp_keepalive_interval().unwrap(),
            Duration::from_secs(10)
        );
        assert_eq!(sock.tcp_keepalive_retries().unwrap(), PROBES);
    }
}
