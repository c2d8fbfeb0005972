//! The byte copy of a relay, both ways at once: what the upstream sends goes to the client and
//! what the client sends to the upstream, unchanged, each direction with one bounded buffer.
//! Towards the client the upstream's frames are followed by one [`FrameCursor`] when anything
//! adds frames of the proxy's own (keepalive pings, the Status that ends a session whose
//! recording failed under `--record=required`); a recording tap sees every read before it is
//! passed on, and a port-forward's audit watch too.
//!
//! While the tap holds a read from the upstream back (waiting for the recording writer),
//! nothing reads the upstream, and its FIN or reset waits in the kernel behind what it sent
//! before: with the upstream's socket watched ([`RelayHooks::upstream_hangup`]) the hang-up is
//! seen meanwhile. After a reset the connection was cut off, and from then on the tap drains
//! what is left through the recorder's cut lane instead of waiting its turn; a FIN is how an
//! upstream ends a session that ended well too, so what is left then waits its turn.

use std::sync::atomic::{AtomicU8, Ordering};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::frames::{Followed, FrameCursor, Framing};
use super::pings::PingInjector;
use super::recording::RelayTap;
use crate::activity_clock::ActivityClock;
use crate::peer_hangup::{Hangup, PeerHangup};
use crate::session_stop::SessionStop;
use crate::session_traffic::SessionTraffic;
use crate::translate::observe::{Direction, PortForwardWatch};
use crate::translate::ws::Liveness;

/// Keepalive of a relayed WebSocket's client: pings slipped in between the upstream's frames,
/// and whether the client is still heard from.
pub struct RelayKeepalive {
    pub pings: PingInjector,
    pub liveness: Liveness,
}

/// What a relay does besides copying: the session's recording (`tap`), a port-forward's audit
/// (`watch`), client keepalive, and how long one direction may outlive the other (`linger`).
#[derive(Default)]
pub struct RelayHooks<'a> {
    pub tap: Option<&'a RelayTap>,
    pub watch: Option<&'a PortForwardWatch>,
    pub keepalive: Option<RelayKeepalive>,
    /// Once one direction has ended, how long the other may go on (to deliver a last Status,
    /// to answer a Close) before the relay ends anyway. `None`: until it ends by itself.
    pub linger: Option<std::time::Duration>,
    /// The TCP socket under the upstream given to [`pump`], watched for its hang-up while the
    /// tap holds a read back.
    pub upstream_hangup: Option<PeerHangup>,
    /// The session's stop signal: an operator's termination ends the session towards the
    /// client with a Status between two frames, where the tap can say one
    /// ([`RelayTap::terminable`]).
    pub stop: Option<SessionStop>,
}

/// The upstream's hang-up, looked for while the tap holds a read back; once seen, known.
struct UpstreamHangup {
    watch: PeerHangup,
    /// 0 while not seen, else [`SEEN_CLOSED`] or [`SEEN_RESET`].
    seen: AtomicU8,
}

const SEEN_CLOSED: u8 = 1;
const SEEN_RESET: u8 = 2;

impl UpstreamHangup {
    /// Resolves once the upstream has reset the connection (at once when that was seen
    /// before); never once it was seen to close it (FIN) instead.
    async fn reset(&self) {
        let seen = match self.seen.load(Ordering::Relaxed) {
            0 => {
                let seen = match self.watch.hung_up().await {
                    Hangup::Closed => SEEN_CLOSED,
                    Hangup::Reset => SEEN_RESET,
                };
                self.seen.store(seen, Ordering::Relaxed);
                seen
            }
            seen => seen,
        };
        if seen != SEEN_RESET {
            std::future::pending::<()>().await;
        }
    }
}

/// Copies both ways until both directions end (or, with a linger, until it is over after the
/// first ended); a finished direction half-closes the other side.
/// Bytes are counted on `traffic` (the session's, which the sessions API shows and its end
/// reports; readable even when the relay was cut short) as they are written on, and every
/// read is noted on `activity`; with a tap, every
/// read is shown to it (the session's recording) before it is passed on, and with a watch
/// (a port-forward's audit) too. With keepalive, pings go to the client between the
/// upstream's frames, and every read from the client counts as hearing from it.
pub async fn pump<C, U>(
    client: C,
    upstream: U,
    traffic: &SessionTraffic,
    activity: &ActivityClock,
    hooks: RelayHooks<'_>,
) where
    C: AsyncRead + AsyncWrite + Unpin,
    U: AsyncRead + AsyncWrite + Unpin,
{
    let (mut cr, mut cw) = tokio::io::split(client);
    let (mut ur, mut uw) = tokio::io::split(upstream);
    let (pings, liveness) = match hooks.keepalive {
        Some(k) => (Some(k.pings), Some(k.liveness)),
        None => (None, None),
    };
    let hangup = hooks.upstream_hangup.map(|watch| UpstreamHangup {
        watch,
        seen: AtomicU8::new(0),
    });
    let terminated = hooks
        .stop
        .filter(|_| hooks.tap.is_some_and(RelayTap::terminable));
    let down = async {
        let side = Side {
            direction: Direction::UpstreamToClient,
            traffic,
            terminated: terminated.as_ref(),
            tap: hooks.tap,
            watch: hooks.watch,
            frames: DownFrames::needed(hooks.tap, pings),
            liveness: None,
            held: liveness.as_ref(),
            hangup: hangup.as_ref(),
        };
        let copied = copy(&mut ur, &mut cw, activity, side).await;
        // After the proxy's own last frames on SPDY the client closes: a spdystream that
        // reads the connection's end drops the frames it has not handled yet.
        if copied != (Copied::MustEnd { half_close: false }) {
            let _ = cw.shutdown().await;
        }
    };
    let up = async {
        let side = Side {
            direction: Direction::ClientToUpstream,
            traffic,
            terminated: None,
            tap: hooks.tap,
            watch: hooks.watch,
            frames: None,
            liveness: liveness.as_ref(),
            held: None,
            hangup: None,
        };
        let copied = copy(&mut cr, &mut uw, activity, side).await;
        let _ = uw.shutdown().await;
        if let Copied::MustEnd { .. } = copied {
            // The session is over, nothing more goes upstream; the client is read (and what it
            // sends dropped) until it closes, so that it reads the end the proxy gave it
            // instead of meeting a reset.
            discard(&mut cr).await;
        }
    };
    // Stream protocols close both ways at once; a peer that keeps its half open after the other
    // ended (an HTTP/2 client that never ends its stream, a client that never closes its
    // socket) must not hold the session, its slot and its upstream connection until the idle
    // timeout. kube-apiserver's own relay ends at the first direction's end; the linger
    // leaves the other the time a close handshake needs.
    tokio::pin!(down, up);
    let down_ended_first = tokio::select! {
        () = &mut down => true,
        () = &mut up => false,
    };
    let rest = async {
        if down_ended_first {
            up.await
        } else {
            down.await
        }
    };
    match hooks.linger {
        Some(linger) => {
            let _ = tokio::time::timeout(linger, rest).await;
        }
        None => rest.await,
    }
}

/// Towards the client: the upstream's frames as the client has them, and the pings slipped in
/// between them.
struct DownFrames {
    cursor: FrameCursor,
    pings: Option<PingInjector>,
}

impl DownFrames {
    /// The frames followed towards the client, where anything adds frames of its own: the
    /// tap's cursor when it ends a session between two frames (it holds heads back), or one
    /// that passes every byte on for pings alone.
    fn needed(tap: Option<&RelayTap>, pings: Option<PingInjector>) -> Option<DownFrames> {
        let cursor = tap
            .and_then(RelayTap::frame_cursor)
            .or_else(|| pings.as_ref().map(|_| FrameCursor::new(Framing::WebSocket)))?;
        // Keepalive is only ever set up for a relayed WebSocket: never a ping into SPDY.
        let pings = pings.filter(|_| cursor.framing() == Framing::WebSocket);
        Some(DownFrames { cursor, pings })
    }
}

/// One direction of a relay: where its bytes are counted and who else sees them.
struct Side<'a> {
    direction: Direction,
    traffic: &'a SessionTraffic,
    /// Towards the client, when a termination ends it with a Status: the session's stop.
    terminated: Option<&'a SessionStop>,
    tap: Option<&'a RelayTap>,
    watch: Option<&'a PortForwardWatch>,
    /// Towards the client, when followed.
    frames: Option<DownFrames>,
    /// From the client: its reads are what proves it is there.
    liveness: Option<&'a Liveness>,
    /// Towards the client: its liveness, held while the tap keeps the output back (no ping can
    /// go out then, so the client's silence is not its fault).
    held: Option<&'a Liveness>,
    /// From the upstream: its socket, watched while the tap keeps a read back.
    hangup: Option<&'a UpstreamHangup>,
}

impl Side<'_> {
    /// `n` bytes went on this way.
    fn count(&self, n: usize) {
        match self.direction {
            Direction::ClientToUpstream => self.traffic.from_client(n),
            Direction::UpstreamToClient => self.traffic.to_client(n),
        }
    }

    /// Follows a read and shows it to the tap: how much of it goes on now and where a ping
    /// may go, or `None` when the session must end instead (none of it goes).
    async fn admit(&mut self, bytes: &[u8]) -> Option<Followed> {
        match self.direction {
            Direction::UpstreamToClient => {
                let frames = self.frames.as_mut().map(|f| &mut f.cursor);
                // Pinned here and passed down as a pointer: each layer of the tap would
                // otherwise move it again, on every read.
                let cut = std::pin::pin!(async {
                    match self.hangup {
                        Some(hangup) => hangup.reset().await,
                        None => std::future::pending().await,
                    }
                });
                admit_down(bytes, frames, self.tap, self.held, cut).await
            }
            Direction::ClientToUpstream => match self.tap {
                Some(tap) if !tap.relayed(self.direction, bytes).await => None,
                _ => Some(Followed::whole(bytes.len())),
            },
        }
    }
}

/// How one direction's copy ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Copied {
    /// End of stream or an error, on either side.
    Ended,
    /// The tap ended the session (`--record=required`). Towards the client, whether the
    /// connection may be half-closed now: `false` once the proxy's last frames went on SPDY.
    MustEnd { half_close: bool },
}

/// What waiting for the next read gave.
enum Next {
    Read(usize),
    Ended,
    MustEnd,
}

/// Copies until EOF or an error, with one bounded buffer, adding what was copied to the side's
/// total; stops early when the tap says the session must end. Towards the client a holding
/// cursor may pass on less than a read (the start of a frame head waits at the buffer's front
/// for the rest of it), and a session that must end is ended between two frames with the
/// proxy's Status ([`end_down`]).
async fn copy<R, W>(r: &mut R, w: &mut W, activity: &ActivityClock, mut side: Side<'_>) -> Copied
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut buf = vec![0u8; 32 * 1024];
    // Bytes at the front of `buf` kept back from the last read.
    let mut kept = 0;
    loop {
        let n = match next_read(r, w, &mut buf[kept..], &mut side).await {
            Next::Read(n) => n,
            Next::Ended => {
                // The start of a head the upstream never finished: passed on as it came.
                if kept > 0 && w.write_all(&buf[..kept]).await.is_ok() {
                    side.count(kept);
                }
                return Copied::Ended;
            }
            Next::MustEnd => return end_down(r, w, &mut buf, kept, &mut side).await,
        };
        activity.touch();
        if let Some(liveness) = side.liveness {
            liveness.heard();
        }
        let have = kept + n;
        let Some(followed) = side.admit(&buf[..have]).await else {
            return end_down(r, w, &mut buf, have, &mut side).await;
        };
        let pass = followed.pass;
        if let Some(watch) = side.watch {
            watch.relayed(side.direction, &buf[..pass]);
        }
        let pings = side.frames.as_mut().and_then(|f| f.pings.as_mut());
        let written = match pings {
            Some(pings) => {
                pings
                    .write_through(w, &buf[..pass], followed.boundary)
                    .await
            }
            None => w.write_all(&buf[..pass]).await,
        };
        if written.is_err() {
            return Copied::Ended;
        }
        side.count(pass);
        buf.copy_within(pass..have, 0);
        kept = have - pass;
    }
}

/// Follows a read from the upstream with `frames` (the upstream's frames as the client has
/// them) and shows the tap what may go: how much of it goes to the client now and where a
/// ping may go, or `None` when the session must end instead. None of it goes then, and
/// `frames` stays where the client is. `cut`: resolves once the upstream hung up.
pub(super) async fn admit_down(
    bytes: &[u8],
    mut frames: Option<&mut FrameCursor>,
    tap: Option<&RelayTap>,
    held: Option<&Liveness>,
    cut: impl std::future::Future<Output = ()>,
) -> Option<Followed> {
    // Kept only where the tap may refuse the read (`--record=required`): a copy, no
    // allocation, but one per read that nothing else needs.
    let sent = tap
        .filter(|t| t.may_refuse())
        .and(frames.as_deref().copied());
    let followed = match frames.as_deref_mut() {
        Some(cursor) => cursor.follow(bytes),
        None => Followed::whole(bytes.len()),
    };
    let Some(tap) = tap else {
        return Some(followed);
    };
    let passed = {
        let pass_down =
            std::pin::pin!(tap.pass_down(&bytes[..followed.pass], frames.as_deref(), cut));
        held_meanwhile(held, pass_down).await
    };
    if passed {
        return Some(followed);
    }
    if let (Some(cursor), Some(sent)) = (frames, sent) {
        *cursor = sent;
    }
    None
}

/// Waits for `fut` (the tap, which may wait for the recording) with the client's liveness
/// held: a relay cannot ping inside a frame, so while its output is held back the client has
/// nothing to answer and its silence must not end the session as unresponsive.
async fn held_meanwhile<F: std::future::Future>(client: Option<&Liveness>, fut: F) -> F::Output {
    let _held = client.map(Liveness::hold);
    fut.await
}

/// Waits for the next read into `buf`, sending the client's pings as they fall due; towards
/// the client, gives up waiting once the tap says the session must end.
async fn next_read<R, W>(r: &mut R, w: &mut W, buf: &mut [u8], side: &mut Side<'_>) -> Next
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let ender = side
        .tap
        .filter(|_| side.direction == Direction::UpstreamToClient);
    let terminated = side.terminated;
    loop {
        let must_end = async {
            let recording = async {
                match ender {
                    Some(tap) => {
                        tap.must_end().await;
                    }
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = recording => {}
                () = operator_ended(terminated) => {}
            }
        };
        let pings = side
            .frames
            .as_mut()
            .and_then(|f| f.pings.as_mut().map(|pings| (pings, &f.cursor)));
        let read = match pings {
            None => {
                let _listening = side.liveness.map(Liveness::listen);
                tokio::select! {
                    read = r.read(buf) => read,
                    () = must_end => return Next::MustEnd,
                }
            }
            Some((pings, frames)) => tokio::select! {
                read = r.read(buf) => read,
                () = must_end => return Next::MustEnd,
                () = pings.due(frames) => {
                    if pings.send(w).await.is_err() {
                        return Next::Ended;
                    }
                    continue;
                }
            },
        };
        return match read {
            Ok(0) | Err(_) => Next::Ended,
            Ok(n) => Next::Read(n),
        };
    }
}

/// Resolves once an operator terminated the session (never on a drain, which cuts it).
async fn operator_ended(stop: Option<&SessionStop>) {
    match stop {
        Some(stop) => {
            stop.stopped().await;
            if stop.termination().is_none() {
                std::future::pending::<()>().await;
            }
        }
        None => std::future::pending().await,
    }
}

/// Ends a session that must end, towards the client: the frame the client has begun is
/// completed (the first bytes of `buf[..have]`, then what more the upstream sends of it),
/// and the proxy's last frames follow, with the Status saying why. Where none can go (the
/// upstream began closing, a stream not understood, the upstream ends inside the frame), the
/// connection is just closed.
async fn end_down<R, W>(
    r: &mut R,
    w: &mut W,
    buf: &mut [u8],
    mut have: usize,
    side: &mut Side<'_>,
) -> Copied
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let closed = Copied::MustEnd { half_close: true };
    let Some(tap) = side
        .tap
        .filter(|_| side.direction == Direction::UpstreamToClient)
    else {
        return closed;
    };
    let termination = side.terminated.and_then(SessionStop::termination);
    if termination.is_none() {
        tap.note_ended();
    }
    let with_status = termination.is_some() || tap.ends_with_status();
    let Some(frames) = side.frames.as_mut().filter(|_| with_status) else {
        return closed;
    };
    let cursor = &mut frames.cursor;
    let why = match termination {
        Some(t) => Why::Terminated(t),
        None => Why::Recording(tap.must_end().await),
    };
    loop {
        let done = cursor.complete(&buf[..have]);
        if done > 0 {
            if w.write_all(&buf[..done]).await.is_err() {
                return closed;
            }
            // Towards the client (the tap ends only that direction).
            side.traffic.to_client(done);
        }
        if cursor.owed() == 0 {
            break;
        }
        have = match r.read(buf).await {
            Ok(0) | Err(_) => return closed,
            Ok(n) => n,
        };
    }
    let end = match why {
        Why::Terminated(t) => tap.terminate_frames(t, cursor),
        Why::Recording(why) => tap.end_frames(&why, cursor),
    };
    let Some(end) = end else {
        return closed;
    };
    if w.write_all(&end.bytes).await.is_err() || w.flush().await.is_err() {
        return closed;
    }
    Copied::MustEnd {
        half_close: end.half_close,
    }
}

/// Why the relay ends a session itself.
enum Why<'a> {
    /// An operator terminated it.
    Terminated(&'a crate::session_stop::Termination),
    /// Its required recording failed, for this reason.
    Recording(String),
}

/// Reads and drops until the end of the stream.
async fn discard<R: AsyncRead + Unpin>(r: &mut R) {
    let mut buf = [0u8; 4096];
    while matches!(r.read(&mut buf).await, Ok(n) if n > 0) {}
}
#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::io::{duplex, AsyncReadExt, AsyncWriteExt, DuplexStream};

    use super::*;

    /// Relays with a 10 s linger; how long the relay took.
    async fn lingering_pump(
        client: DuplexStream,
        upstream: DuplexStream,
        counters: &SessionTraffic,
    ) -> Duration {
        let started = tokio::time::Instant::now();
        let hooks = RelayHooks {
            linger: Some(Duration::from_secs(10)),
            ..RelayHooks::default()
        };
        pump(client, upstream, counters, &ActivityClock::new(), hooks).await;
        started.elapsed()
    }

    #[tokio::test(start_paused = true)]
    async fn a_client_that_keeps_its_side_open_is_cut_after_the_linger() {
        let (client_near, mut client_far) = duplex(1024);
        let (upstream_near, mut upstream_far) = duplex(1024);
        let counters = SessionTraffic::new();
        let upstream = async move {
            upstream_far.write_all(b"last words").await.unwrap();
            // The upstream is done: its connection closes.
        };
        let relay = lingering_pump(client_near, upstream_near, &counters);
        let (took, ()) = tokio::join!(relay, upstream);
        assert!(
            took >= Duration::from_secs(10) && took < Duration::from_secs(11),
            "{took:?}"
        );
        // The client got everything and then the end, though it never closed its own side.
        let mut got = Vec::new();
        client_far.read_to_end(&mut got).await.unwrap();
        assert_eq!(got, b"last words");
        assert_eq!(counters.bytes_to_client(), 10);
    }

    #[tokio::test(start_paused = true)]
    async fn the_other_direction_finishes_within_the_linger() {
        let (client_near, mut client_far) = duplex(1024);
        let (upstream_near, mut upstream_far) = duplex(1024);
        let counters = SessionTraffic::new();
        let client = async move {
            client_far.write_all(b"bye").await.unwrap();
            client_far.shutdown().await.unwrap();
            let mut got = Vec::new();
            client_far.read_to_end(&mut got).await.unwrap();
            got
        };
        let upstream = async move {
            let mut got = [0; 3];
            upstream_far.read_exact(&mut got).await.unwrap();
            assert_eq!(
                upstream_far.read(&mut [0; 1]).await.unwrap(),
                0,
                "the client's end"
            );
            // A last answer, a while after the client's side ended.
            tokio::time::sleep(Duration::from_secs(3)).await;
            upstream_far.write_all(b"status").await.unwrap();
        };
        let relay = lingering_pump(client_near, upstream_near, &counters);
        let (took, got, ()) = tokio::join!(relay, client, upstream);
        assert_eq!(got, b"status");
        assert!(
            took < Duration::from_secs(4),
            "ended when the upstream did: {took:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn without_a_linger_a_half_open_relay_goes_on() {
        let (client_near, _client_far) = duplex(1024);
        let (upstream_near, upstream_far) = duplex(1024);
        drop(upstream_far);
        let (counters, activity) = (SessionTraffic::new(), ActivityClock::new());
        let relay = pump(
            client_near,
            upstream_near,
            &counters,
            &activity,
            RelayHooks::default(),
        );
        assert!(tokio::time::timeout(Duration::from_secs(3600), relay)
            .await
            .is_err());
    }
}
