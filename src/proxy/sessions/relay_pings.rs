//! Keepalive pings to the client of a relayed WebSocket (the v5 / tunnel pass-through and the
//! legacy WebSocket relays), which the relay copies without parsing: the server-to-client
//! bytes are followed frame by frame from their headers ([`FrameBoundaries`]), and every
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

use crate::translate::ws::{FrameBoundaries, SERVER_PING};

/// Slips pings into a relayed server-to-client WebSocket byte stream.
#[derive(Debug)]
pub struct PingInjector {
    frames: FrameBoundaries,
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
            frames: FrameBoundaries::new(),
            ticker,
            owed: false,
        }
    }

    /// Resolves when a ping is due and the stream is between frames, so that it can go at
    /// once ([`PingInjector::send`]); one due inside a frame is owed to the next boundary
    /// ([`PingInjector::write_through`]). Cancel-safe: to be selected on beside the read.
    pub async fn due(&mut self) {
        loop {
            self.ticker.tick().await;
            if self.frames.stopped() {
                return std::future::pending().await;
            }
            if self.frames.at_boundary() {
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

    /// Writes the server's `bytes` to the client, with an owed ping at the last frame boundary
    /// among them.
    pub async fn write_through<W: AsyncWrite + Unpin>(
        &mut self,
        w: &mut W,
        bytes: &[u8],
    ) -> std::io::Result<()> {
        match self.frames.follow(bytes) {
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

    #[tokio::test(start_paused = true)]
    async fn a_ping_goes_between_frames_when_due() {
        let mut p = PingInjector::new(Duration::from_secs(30));
        let mut out = Vec::new();
        p.write_through(&mut out, b"\x82\x02\x01a").await.unwrap();
        let start = tokio::time::Instant::now();
        p.due().await;
        assert_eq!(start.elapsed(), Duration::from_secs(30));
        p.send(&mut out).await.unwrap();
        assert_eq!(out, b"\x82\x02\x01a\x89\x00");
    }

    #[tokio::test(start_paused = true)]
    async fn a_ping_due_inside_a_frame_waits_for_its_end() {
        let mut p = PingInjector::new(Duration::from_secs(30));
        let mut out = Vec::new();
        // A 200-byte frame, of which only the head and 10 bytes came.
        let mut frame = vec![0x82, 126, 0, 200];
        frame.extend_from_slice(&[7u8; 200]);
        frame.extend_from_slice(b"\x82\x01z");
        p.write_through(&mut out, &frame[..14]).await.unwrap();
        // Due now, but mid-frame: owed, and `due` stays pending.
        let due = tokio::time::timeout(Duration::from_secs(31), p.due()).await;
        assert!(due.is_err());
        // The rest of the frame and the next one: the ping goes right after the frame's end,
        // the last boundary of this write being after the next frame.
        p.write_through(&mut out, &frame[14..]).await.unwrap();
        let mut expected = frame.clone();
        expected.extend_from_slice(&SERVER_PING);
        assert_eq!(out, expected);
    }

    #[tokio::test(start_paused = true)]
    async fn no_ping_after_the_servers_close() {
        let mut p = PingInjector::new(Duration::from_secs(1));
        let mut out = Vec::new();
        p.write_through(&mut out, b"\x88\x02\x03\xe8")
            .await
            .unwrap();
        let due = tokio::time::timeout(Duration::from_secs(60), p.due()).await;
        assert!(due.is_err());
        assert_eq!(out, b"\x88\x02\x03\xe8");
    }
}
