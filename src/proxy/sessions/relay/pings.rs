//! Keepalive pings to the client of a relayed WebSocket (the v5 / tunnel pass-through and the
//! legacy WebSocket relays), which the relay copies without parsing: the relay's
//! [`FrameCursor`] follows the server-to-client frames from their headers, and every
//! `--client-ping-interval` an empty ping goes to the client between two frames. The client's
//! pong goes on to the upstream with its other bytes, as an unsolicited pong (RFC 6455 §5.5.3
//! allows them; servers ignore them). That keeps idle gateways from cutting a quiet session,
//! and with `--client-ping-timeout` a client that sends nothing back is gone, as on the
//! translated paths.
//!
//! A ping that falls due in the middle of a frame (the upstream is sending a large message)
//! waits for its end; after the upstream's close frame, or in a stream that does not parse as
//! WebSocket frames, no more pings go out.

use std::time::Duration;

use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::time::{Interval, MissedTickBehavior};

use super::frames::FrameCursor;

/// An empty ping from a server: FIN, opcode 9, unmasked, no payload.
pub const SERVER_PING: [u8; 2] = [0x89, 0x00];

/// Slips pings into a relayed server-to-client WebSocket byte stream, where the stream's
/// [`FrameCursor`] says a frame may go.
#[derive(Debug)]
pub struct PingInjector {
    ticker: Interval,
    /// A ping fell due while the stream was inside a frame: it goes at the next boundary.
    owed: bool,
}

impl PingInjector {
    /// Pings every `interval`, the first one an interval from now.
    pub fn new(interval: Duration) -> PingInjector {
        let mut ticker = tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
        ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
        PingInjector {
            ticker,
            owed: false,
        }
    }

    /// Resolves when a ping is due and the stream (`frames`, as the client has it) is between
    /// frames, so that it can go at once ([`PingInjector::send`]); one due inside a frame is
    /// owed to the next boundary ([`PingInjector::write_through`]). Cancel-safe: to be
    /// selected on beside the read.
    pub async fn due(&mut self, frames: &FrameCursor) {
        loop {
            self.ticker.tick().await;
            if frames.stopped() {
                return std::future::pending().await;
            }
            if frames.at_boundary() {
                return;
            }
            self.owed = true;
        }
    }

    /// Sends a ping now (the stream is between frames).
    pub async fn send<W: AsyncWrite + Unpin>(&mut self, w: &mut W) -> std::io::Result<()> {
        self.owed = false;
        w.write_all(&SERVER_PING).await?;
        w.flush().await
    }

    /// Writes the server's `bytes` to the client, with an owed ping at `boundary`, the last
    /// frame boundary among them ([`Followed::boundary`](super::frames::Followed)).
    pub async fn write_through<W: AsyncWrite + Unpin>(
        &mut self,
        w: &mut W,
        bytes: &[u8],
        boundary: Option<usize>,
    ) -> std::io::Result<()> {
        match boundary {
            Some(at) if self.owed => {
                self.owed = false;
                w.write_all(&bytes[..at]).await?;
                w.write_all(&SERVER_PING).await?;
                w.write_all(&bytes[at..]).await
            }
            _ => w.write_all(bytes).await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proxy::sessions::relay::frames::Framing;
    use crate::translate::ws::frame::{FrameHead, OpCode};

    /// Follows `bytes` as the relay does, and writes them through.
    async fn relay(
        p: &mut PingInjector,
        frames: &mut FrameCursor,
        out: &mut Vec<u8>,
        bytes: &[u8],
    ) {
        let followed = frames.follow(bytes);
        assert_eq!(followed.pass, bytes.len());
        p.write_through(out, bytes, followed.boundary)
            .await
            .unwrap();
    }

    #[test]
    fn the_server_ping_is_a_valid_final_empty_ping() {
        let head = FrameHead::parse(&SERVER_PING).unwrap().unwrap();
        assert_eq!(head.opcode, OpCode::Ping);
        assert!(head.fin);
        assert_eq!((head.len, head.head_len, head.mask), (0, 2, None));
    }

    #[tokio::test(start_paused = true)]
    async fn a_ping_goes_between_frames_when_due() {
        let mut p = PingInjector::new(Duration::from_secs(30));
        let mut frames = FrameCursor::new(Framing::WebSocket);
        let mut out = Vec::new();
        relay(&mut p, &mut frames, &mut out, b"\x82\x02\x01a").await;
        let start = tokio::time::Instant::now();
        p.due(&frames).await;
        assert_eq!(start.elapsed(), Duration::from_secs(30));
        p.send(&mut out).await.unwrap();
        assert_eq!(out, b"\x82\x02\x01a\x89\x00");
    }

    #[tokio::test(start_paused = true)]
    async fn a_ping_due_inside_a_frame_waits_for_its_end() {
        let mut p = PingInjector::new(Duration::from_secs(30));
        let mut frames = FrameCursor::new(Framing::WebSocket);
        let mut out = Vec::new();
        // A 200-byte frame, of which only the head and 10 bytes came.
        let mut frame = vec![0x82, 126, 0, 200];
        frame.extend_from_slice(&[7u8; 200]);
        frame.extend_from_slice(b"\x82\x01z");
        relay(&mut p, &mut frames, &mut out, &frame[..14]).await;
        // Due now, but mid-frame: owed, and `due` stays pending.
        let due = tokio::time::timeout(Duration::from_secs(31), p.due(&frames)).await;
        assert!(due.is_err());
        // The rest of the frame and the next one: the ping goes right after the frame's end,
        // the last boundary of this write being after the next frame.
        relay(&mut p, &mut frames, &mut out, &frame[14..]).await;
        let mut expected = frame.clone();
        expected.extend_from_slice(&SERVER_PING);
        assert_eq!(out, expected);
    }

    #[tokio::test(start_paused = true)]
    async fn no_ping_after_the_servers_close() {
        let mut p = PingInjector::new(Duration::from_secs(1));
        let mut frames = FrameCursor::new(Framing::WebSocket);
        let mut out = Vec::new();
        relay(&mut p, &mut frames, &mut out, b"\x88\x02\x03\xe8").await;
        let due = tokio::time::timeout(Duration::from_secs(60), p.due(&frames)).await;
        assert!(due.is_err());
        assert_eq!(out, b"\x88\x02\x03\xe8");
    }
}
