//! Recording a relayed exec/attach session: the relay's copy loops hand every piece of bytes
//! they move to a [`RelayTap`], which follows the protocol passively
//! ([`crate::translate::observe`]) and feeds what it saw to the session's recorder. The bytes
//! on the wire are never changed; the tap only reads them (and, by awaiting the recorder,
//! slows the relay down when recordings fall behind, as the translated path does).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard};

use tokio_util::sync::CancellationToken;
use tracing::warn;

use super::ending::{recording_failed, terminated, EndFrames, Ending};
use super::frames::FrameCursor;
use crate::audit::recording::{Recordable, Recorded, Recorder};
use crate::session_stop::Termination;
use crate::translate::observe::{Direction, ErrorStream, Observed, Observer, RemoteCommandStreams};

/// What the two directions of one relay share. Both run in one task, so the lock is never
/// contended; it is a `Mutex` rather than a `RefCell` only because that task may move between
/// threads (it must be `Sync` to be borrowed across awaits). It is never held across one.
#[derive(Debug)]
struct Shared {
    observer: Observer,
    errors: ErrorStream,
    /// Why observing stopped, if it did.
    failure: Option<String>,
    /// Best-effort: the first stream the client opened that could not be recorded (one of a
    /// type the proxy does not know), while the rest of the session still is.
    unrecorded: Option<String>,
    /// SPDY: the streams the upstream writes on, as last seen (kept should the observer stop).
    streams: RemoteCommandStreams,
}

/// The recording of one relayed session, or (without a recording) only what its audit event
/// needs from the stream: the exit code.
#[derive(Debug)]
pub struct RelayTap {
    /// `None`: following the session for its exit code only.
    recorder: Option<Recorder>,
    /// `--record=required`: a session that can no longer be recorded must end.
    required: bool,
    shared: Mutex<Shared>,
    /// Cancelled once observing failed under `--record=required`.
    unobservable: CancellationToken,
    /// How the session is ended with a Status when it must end (`--record=required`).
    ending: Option<Ending>,
    /// How the session is ended with a Status when an operator terminates it: any
    /// remote-command protocol the tap follows, recorded or not.
    terminable: Option<Ending>,
    /// Set once the relay stopped passing bytes on because the session must end.
    ended: AtomicBool,
}

/// How a recorded relay ended, for its audit event.
#[derive(Debug, Default)]
pub struct TapEnd {
    /// From the error stream's Status, if it sent one.
    pub exit_code: Option<i32>,
    /// `Success`, `exit N`, a reason or the text the error stream carried.
    pub status: Option<String>,
    /// Why the recording is incomplete, if it is.
    pub recording_error: Option<String>,
}

impl RelayTap {
    /// A tap recording to `recorder` what `observer` follows.
    pub fn new(recorder: Recorder, observer: Observer, required: bool) -> RelayTap {
        RelayTap::with(Some(recorder), observer, required)
    }

    /// A tap that follows what `observer` follows for the session's exit code, recording
    /// nothing (the audit log is on, recordings are not).
    pub fn observing(observer: Observer) -> RelayTap {
        RelayTap::with(None, observer, false)
    }

    fn with(recorder: Option<Recorder>, observer: Observer, required: bool) -> RelayTap {
        RelayTap {
            recorder,
            required,
            shared: Mutex::new(Shared {
                observer,
                errors: ErrorStream::default(),
                failure: None,
                unrecorded: None,
                streams: RemoteCommandStreams::default(),
            }),
            unobservable: CancellationToken::new(),
            ending: None,
            terminable: None,
            ended: AtomicBool::new(false),
        }
    }

    /// Under `--record=required`, a session that must end is ended as `ending` says, between
    /// two of the upstream's frames: the relay then follows the upstream's frames
    /// ([`RelayTap::frame_cursor`]), and the whole declared length of a frame whose head has
    /// been passed on counts against the bound (see [`RelayTap::pass_down`]). Without
    /// `required`, only an operator's termination ends it so ([`RelayTap::terminable`]).
    pub fn ending_with(mut self, ending: Option<Ending>) -> RelayTap {
        self.terminable = ending;
        if let (true, Some(_), Some(ending)) = (self.required, &self.recorder, ending) {
            self.ending = Some(ending);
        }
        self
    }

    /// The cursor the relay follows the upstream's frames with for this tap, when it ends the
    /// session between two of them: one that never lets a read end inside a head.
    pub fn frame_cursor(&self) -> Option<FrameCursor> {
        self.ending
            .or(self.terminable)
            .map(|ending| FrameCursor::holding_heads(ending.framing()))
    }

    /// The recording's file, if it records.
    pub fn path(&self) -> Option<&std::path::Path> {
        self.recorder.as_ref().map(Recorder::path)
    }

    /// Follows bytes the relay is about to pass on in `direction` and records what they
    /// carried. Returns `false` when the session must end instead (observing failed under
    /// `--record=required`): those bytes are then not passed on.
    pub async fn relayed(&self, direction: Direction, bytes: &[u8]) -> bool {
        self.follow(direction, bytes, 0, std::future::pending())
            .await
    }

    /// Follows bytes read from the upstream and records what they carried; returns whether
    /// they may go to the client now (`false`: the session must end instead, and they do not
    /// go). `frames` are the upstream's frames as the client will have them once these bytes
    /// went.
    ///
    /// Under `--record=required` with an ending, the relay never passes a read on to its end
    /// when that is inside a frame head (its [`RelayTap::frame_cursor`] keeps the start of
    /// the head back for the rest of it), and the bytes go only once all but
    /// [`AHEAD_BYTES`](crate::audit::recording::AHEAD_BYTES) of what the session recorded is
    /// written, counting as not yet recorded the whole declared length of the frame left
    /// unfinished (its message's earlier fragments too). A frame longer than the bound by
    /// itself goes only once everything before it is written.
    ///
    /// Once `cut` resolves (the upstream hung up: what it sent can no longer grow), what is
    /// still waiting for the recording stops waiting its turn and takes the recorder's cut
    /// lane.
    pub async fn pass_down(
        &self,
        bytes: &[u8],
        frames: Option<&FrameCursor>,
        cut: impl std::future::Future<Output = ()>,
    ) -> bool {
        // Only a session ended between two frames counts their declared lengths.
        let owed = frames
            .filter(|_| self.ending.is_some())
            .map_or(0, FrameCursor::owed);
        self.follow(Direction::UpstreamToClient, bytes, owed, cut)
            .await
    }

    /// Follows `bytes` and records what they carried; `owed`: payload bytes the client will
    /// have been sent the head of and not the rest; `cut`: see [`RelayTap::pass_down`].
    /// Whether the bytes may go.
    async fn follow(
        &self,
        direction: Direction,
        bytes: &[u8],
        owed: u64,
        cut: impl std::future::Future<Output = ()>,
    ) -> bool {
        let mut events = Vec::new();
        let unrecorded = {
            let mut shared = self.lock();
            if shared.failure.is_some() {
                // It cannot follow the stream any further: the bytes still go on unless the
                // session has to end for it.
                if self.required {
                    self.note_ended();
                    return false;
                }
                return true;
            }
            if let Err(e) = shared.observer.feed(direction, bytes, &mut events) {
                self.stopped(&e.to_string());
                shared.failure = Some(e.to_string());
                if self.required {
                    self.unobservable.cancel();
                    self.note_ended();
                    return false;
                }
            }
            if let Some(why) = take_events(&mut shared, &events) {
                // A stream it cannot record: a required recording ends the session before
                // the stream reaches the upstream; a best-effort one says so at the end.
                if self.required && self.recorder.is_some() {
                    self.stopped(&why);
                    shared.failure = Some(why);
                    self.unobservable.cancel();
                    self.note_ended();
                    return false;
                }
                shared.unrecorded.get_or_insert(why);
            }
            if direction == Direction::ClientToUpstream && self.terminable.is_some() {
                if let Some(streams) = shared.observer.spdy_streams() {
                    shared.streams = streams;
                }
            }
            // What the client is sent ahead of the observer's events: the unfinished frame's
            // start (a WebSocket client can read it before the frame's end) and, with an
            // ending, the rest of its declared length, which goes on even after a failure.
            match direction {
                Direction::UpstreamToClient => shared.observer.held(direction) as u64 + owed,
                Direction::ClientToUpstream => 0,
            }
        };
        let Some(recorder) = &self.recorder else {
            return true;
        };
        // What one read carried waits for the recording budget once; under
        // `--record=required` it goes on only within the bound of what is written, and never
        // once the recording failed (must_end then ends the session).
        if !recorder
            .record_within_until_cut(&events, unrecorded, cut)
            .await
        {
            self.note_ended();
            return false;
        }
        true
    }

    fn stopped(&self, error: &str) {
        match &self.recorder {
            Some(recorder) => warn!(
                recording = %recorder.path().display(),
                error = %error,
                "stopped recording a relayed session"
            ),
            None => warn!(error = %error, "stopped following a relayed session for its exit code"),
        }
    }

    /// Whether [`RelayTap::pass_down`] can ever refuse a read: only under `--record=required`
    /// (best-effort passes everything on, recorded or not).
    pub fn may_refuse(&self) -> bool {
        self.required
    }

    /// Whether a session that must end is ended with a Status of the proxy's (see
    /// [`RelayTap::ending_with`]).
    pub fn ends_with_status(&self) -> bool {
        self.ending.is_some()
    }

    /// The frames that end the session with a Status saying its recording failed (`why`),
    /// where the client stands now (`frames`: the upstream's frames as the client has them;
    /// the rest of a frame it has begun is within the bound, counted when the frame's head
    /// went); `None` where none can go.
    pub fn end_frames(&self, why: &str, frames: &FrameCursor) -> Option<EndFrames> {
        let ending = self.ending?;
        let shared = self.lock();
        let streams = shared.observer.spdy_streams().unwrap_or(shared.streams);
        ending.frames(&recording_failed(why), frames, streams)
    }

    /// Whether an operator's termination ends the session with a Status of the proxy's (a
    /// remote-command protocol the tap follows, whose frames the relay follows too).
    pub fn terminable(&self) -> bool {
        self.terminable.is_some()
    }

    /// The frames that end the session with a Status saying who terminated it and why
    /// (`termination`), where the client stands now (`frames`); `None` where none can go.
    pub fn terminate_frames(
        &self,
        termination: &Termination,
        frames: &FrameCursor,
    ) -> Option<EndFrames> {
        let ending = self.terminable?;
        let shared = self.lock();
        let streams = shared.observer.spdy_streams().unwrap_or(shared.streams);
        ending.frames(&terminated(termination), frames, streams)
    }

    /// Notes that the relay stopped passing bytes on because the session must end.
    pub fn note_ended(&self) {
        self.ended.store(true, Ordering::Relaxed);
    }

    /// Why the relay ended the session for its recording (`--record=required`), if it did.
    pub fn must_have_ended(&self) -> Option<String> {
        if !self.ended.load(Ordering::Relaxed) {
            return None;
        }
        let recorder = self.recorder.as_ref()?;
        self.lock().failure.clone().or_else(|| recorder.error())
    }

    /// Resolves, with the reason, once the session can no longer be recorded and recordings
    /// are required; never otherwise.
    pub async fn must_end(&self) -> String {
        if !self.required {
            return std::future::pending().await;
        }
        let Some(recorder) = &self.recorder else {
            return std::future::pending().await;
        };
        tokio::select! {
            () = self.unobservable.cancelled() => self
                .lock()
                .failure
                .clone()
                .unwrap_or_else(|| "the session could not be followed".to_owned()),
            error = recorder.failed() => error,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Shared> {
        // A panic while it was held cannot leave the observer half-updated in a way that
        // matters more than losing the recording's tail.
        self.shared.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The end of the session as the tap saw it, once its recording's file is complete
    /// ([`Recorder::close`]): the session's `ended` event comes after its evidence.
    pub async fn finish(self) -> TapEnd {
        let shared = self.shared.into_inner().unwrap_or_else(|e| e.into_inner());
        let (exit_code, status) = shared.errors.outcome();
        // Without a recording there is nothing to be incomplete: a stream it could not
        // follow only leaves the exit code unknown.
        let recording_error = match self.recorder {
            Some(recorder) => match shared.failure.or(shared.unrecorded) {
                Some(why) => {
                    drop(recorder);
                    Some(why)
                }
                None => recorder.close().await,
            },
            None => None,
        };
        TapEnd {
            exit_code,
            status,
            recording_error,
        }
    }
}

/// Keeps the error stream's bytes of `events`; returns why a stream in them cannot be
/// recorded, if one cannot.
fn take_events(shared: &mut Shared, events: &[Observed]) -> Option<String> {
    let mut unrecordable = None;
    for event in events {
        match event {
            Observed::Error(data) => shared.errors.push(data),
            Observed::UnknownStream(why) => {
                unrecordable.get_or_insert_with(|| why.clone());
            }
            _ => {}
        }
    }
    unrecordable
}

impl Recordable for Observed {
    fn recorded(&self) -> Option<Recorded<'_>> {
        Some(match self {
            Observed::Stdout(data) | Observed::Stderr(data) => Recorded::Output(data),
            Observed::Stdin(data) => Recorded::Input(data),
            Observed::Resize(size) => Recorded::Resize {
                cols: size.width,
                rows: size.height,
            },
            // Its Status is the audit event's business, not the terminal's.
            Observed::Error(_) | Observed::UnknownStream(_) => return None,
        })
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use bytes::{Bytes, BytesMut};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;
    use crate::activity_clock::ActivityClock;
    use crate::audit::recording::{
        RecordPolicy, RecordingConfig, RecordingCounters, RecordingPlace, Recordings,
    };
    use crate::proxy::sessions::relay::ending::{recording_failed, Ending};
    use crate::proxy::sessions::relay::pump::{admit_down, pump, RelayHooks};
    use crate::spdy::codec::FrameEncoder;
    use crate::spdy::frame::{Data, Frame, HeaderBlock, StreamId, SynStream};

    /// Where these tests' recordings go: `--record-dir` itself.
    const TOP: RecordingPlace<'static> = RecordingPlace {
        cluster: "default",
        folder: None,
        namespace: "default",
    };

    fn recordings(dir: &std::path::Path, policy: RecordPolicy) -> Recordings {
        Recordings::start(
            RecordingConfig {
                dir: dir.to_owned(),
                policy,
                record_stdin: false,
                min_free: 0,
                max_bytes: None,
            },
            RecordingCounters::unregistered(),
        )
        .unwrap()
    }

    async fn tap(dir: &std::path::Path, required: bool) -> RelayTap {
        let policy = if required {
            RecordPolicy::Required
        } else {
            RecordPolicy::BestEffort
        };
        let recorder = recordings(dir, policy)
            .open(TOP, "s1", &[], "ns/pod".into(), false)
            .await
            .unwrap();
        let observer = Observer::for_protocol(Some("SPDY/3.1"), None).unwrap();
        RelayTap::new(recorder, observer, required)
    }

    const GARBAGE: &[u8] = &[0x80, 0x02, 0x00, 0x01, 0, 0, 0, 0];

    #[tokio::test]
    async fn under_required_an_unfollowable_session_must_end_and_its_bytes_stay_back() {
        let dir = tempfile::tempdir().unwrap();
        let tap = tap(dir.path(), true).await;
        assert!(!tap.relayed(Direction::ClientToUpstream, GARBAGE).await);
        let why = tokio::time::timeout(Duration::from_secs(5), tap.must_end())
            .await
            .expect("the session is told to end");
        assert!(why.contains("SPDY"), "{why}");
        assert!(tap.finish().await.recording_error.is_some());
    }

    #[tokio::test]
    async fn in_best_effort_an_unfollowable_session_goes_on_unrecorded() {
        let dir = tempfile::tempdir().unwrap();
        let tap = tap(dir.path(), false).await;
        assert!(tap.relayed(Direction::ClientToUpstream, GARBAGE).await);
        assert!(tap.relayed(Direction::UpstreamToClient, b"more").await);
        assert!(
            tokio::time::timeout(Duration::from_millis(100), tap.must_end())
                .await
                .is_err()
        );
        let end = tap.finish().await;
        assert!(end.recording_error.unwrap().contains("SPDY"));
    }

    /// SYN_STREAMs of the given types, on one client zlib stream.
    fn client_syns(types: &[(u32, &[u8])]) -> Vec<u8> {
        let mut client = FrameEncoder::new();
        let mut up = BytesMut::new();
        for &(id, ty) in types {
            let headers: HeaderBlock = [("streamtype", ty)].into_iter().collect();
            let syn = SynStream::new(StreamId::new(id), headers);
            client.encode(&Frame::SynStream(syn), &mut up).unwrap();
        }
        up.to_vec()
    }

    const UNKNOWN: &str = "stream 3 has a type the proxy does not know (streamtype \"bogus\")";

    /// Under `--record=required`, a stream of a type the proxy does not know ends the session
    /// before it reaches the upstream.
    #[tokio::test]
    async fn under_required_a_stream_of_unknown_type_ends_the_session() {
        let dir = tempfile::tempdir().unwrap();
        let tap = tap(dir.path(), true).await;
        let known = client_syns(&[(1, b"error")]);
        assert!(tap.relayed(Direction::ClientToUpstream, &known).await);
        // A stdout\0 stream is stdout: known.
        let up = client_syns(&[(1, b"error"), (5, b"stdout\0"), (3, b"bogus")]);
        assert!(
            !tap.relayed(Direction::ClientToUpstream, &up[known.len()..])
                .await
        );
        let why = tokio::time::timeout(Duration::from_secs(5), tap.must_end())
            .await
            .expect("the session is told to end");
        assert_eq!(why, UNKNOWN);
        assert_eq!(tap.must_have_ended().as_deref(), Some(UNKNOWN));
        assert_eq!(tap.finish().await.recording_error.as_deref(), Some(UNKNOWN));
    }

    /// Best-effort, the session goes on and is recorded; its audit event says which stream
    /// was not.
    #[tokio::test]
    async fn in_best_effort_a_stream_of_unknown_type_is_named_in_the_recording_error() {
        let dir = tempfile::tempdir().unwrap();
        let tap = tap(dir.path(), false).await;
        let up = client_syns(&[(1, b"stdout\0"), (3, b"bogus")]);
        assert!(tap.relayed(Direction::ClientToUpstream, &up).await);
        let mut server = FrameEncoder::new();
        let mut down = BytesMut::new();
        let out = Frame::Data(Data {
            stream_id: StreamId::new(1),
            fin: false,
            payload: Bytes::from_static(b"still recorded\n"),
        });
        server.encode(&out, &mut down).unwrap();
        assert!(tap.relayed(Direction::UpstreamToClient, &down).await);
        let path = tap.path().unwrap().to_owned();
        assert_eq!(tap.finish().await.recording_error.as_deref(), Some(UNKNOWN));
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while !std::fs::read_to_string(&path)
            .unwrap_or_default()
            .contains("still recorded")
        {
            assert!(std::time::Instant::now() < deadline, "output not recorded");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The relay passes every byte on unchanged while the tap records what they carry.
    #[tokio::test]
    async fn a_tapped_pump_relays_bytes_unchanged() {
        let dir = tempfile::tempdir().unwrap();
        let tap = tap(dir.path(), true).await;
        let path = tap.path().expect("a recording tap").to_owned();
        let mut client_enc = FrameEncoder::new();
        let mut server_enc = FrameEncoder::new();
        let mut up = BytesMut::new();
        let mut headers = HeaderBlock::new();
        headers.push("streamtype", "stdout");
        client_enc
            .encode(
                &Frame::SynStream(SynStream::new(StreamId::new(1), headers)),
                &mut up,
            )
            .unwrap();
        let mut down = BytesMut::new();
        server_enc
            .encode(
                &Frame::Data(Data {
                    stream_id: StreamId::new(1),
                    fin: false,
                    payload: Bytes::from_static(b"recorded output\n"),
                }),
                &mut down,
            )
            .unwrap();

        let (client_near, mut client_far) = tokio::io::duplex(1024);
        let (upstream_near, mut upstream_far) = tokio::io::duplex(1024);
        let counters = crate::session_traffic::SessionTraffic::new();
        let activity = ActivityClock::new();
        let (up, down) = (up.freeze(), down.freeze());
        let peers = async {
            client_far.write_all(&up).await.unwrap();
            let mut got = vec![0; up.len()];
            upstream_far.read_exact(&mut got).await.unwrap();
            assert_eq!(got, up);
            upstream_far.write_all(&down).await.unwrap();
            let mut got = vec![0; down.len()];
            client_far.read_exact(&mut got).await.unwrap();
            assert_eq!(got, down);
            drop(client_far);
            drop(upstream_far);
        };
        tokio::time::timeout(Duration::from_secs(5), async {
            tokio::join!(
                pump(
                    client_near,
                    upstream_near,
                    &counters,
                    &activity,
                    RelayHooks {
                        tap: Some(&tap),
                        ..RelayHooks::default()
                    }
                ),
                peers
            )
        })
        .await
        .unwrap();
        let end = tap.finish().await;
        assert_eq!(end.recording_error, None);
        // The writer thread completes the file once the recorder is gone.
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        loop {
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            if text.contains("recorded output") {
                break;
            }
            assert!(std::time::Instant::now() < deadline, "{text:?}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    const V4: &str = "v4.channel.k8s.io";

    /// A required v4 tap that ends its session with a Status, and what its writer did.
    fn v4_tap() -> (RelayTap, crate::audit::recording::recorder::HeldWriter) {
        let (recorder, writer) = Recorder::held(true);
        let observer = Observer::for_protocol(Some("websocket"), Some(V4)).unwrap();
        let ending = Ending::for_protocol(Some("websocket"), Some(V4));
        (
            RelayTap::new(recorder, observer, true).ending_with(ending),
            writer,
        )
    }

    /// An operator's termination of a relayed v4 session that is only audited (no recording):
    /// the frame the client has begun is finished, then the Status on channel 3 and a Close;
    /// nothing of the upstream's after that frame.
    #[tokio::test]
    async fn a_termination_ends_an_audited_relay_between_two_frames_with_its_status() {
        use crate::session_stop::{SessionStop, Termination};
        let observer = Observer::with_scope(
            Some("websocket"),
            Some(V4),
            crate::translate::observe::Scope::ErrorStream,
        )
        .unwrap();
        let ending = Ending::for_protocol(Some("websocket"), Some(V4));
        let tap = RelayTap::observing(observer).ending_with(ending);
        assert!(tap.terminable());
        let stop = SessionStop::default();
        let (client_near, mut client_far) = tokio::io::duplex(64 * 1024);
        let (upstream_near, mut upstream_far) = tokio::io::duplex(64 * 1024);
        let (counters, activity) = (
            crate::session_traffic::SessionTraffic::new(),
            ActivityClock::new(),
        );
        let hooks = RelayHooks {
            tap: Some(&tap),
            linger: Some(Duration::from_secs(5)),
            stop: Some(stop.clone()),
            ..RelayHooks::default()
        };
        let message = stdout_message(10);
        let (stopper, sent) = (stop.clone(), message.clone());
        // Moved in: the client and the upstream hang up once done, which ends the relay.
        let peers = async move {
            let message = sent;
            // The upstream is 4 bytes into a message when the session is terminated.
            upstream_far.write_all(&message[..8]).await.unwrap();
            let mut got = vec![0; 8];
            client_far.read_exact(&mut got).await.unwrap();
            stopper.terminate(Termination {
                by: "olga".into(),
                reason: "enough".into(),
            });
            tokio::time::sleep(Duration::from_millis(50)).await;
            upstream_far.write_all(&message[8..]).await.unwrap();
            upstream_far.write_all(&stdout_message(3)).await.unwrap();
            let mut got = Vec::new();
            client_far.read_to_end(&mut got).await.unwrap();
            got
        };
        let ((), got) = tokio::time::timeout(Duration::from_secs(5), async {
            tokio::join!(
                pump(client_near, upstream_near, &counters, &activity, hooks),
                peers
            )
        })
        .await
        .unwrap();
        let status = crate::proxy::sessions::relay::ending::terminated(&Termination {
            by: "olga".into(),
            reason: "enough".into(),
        });
        let cursor =
            FrameCursor::holding_heads(crate::proxy::sessions::relay::frames::Framing::WebSocket);
        let end = ending
            .unwrap()
            .frames(&status, &cursor, Default::default())
            .unwrap();
        assert_eq!(&got[..message.len() - 8], &message[8..]);
        assert_eq!(&got[message.len() - 8..], &end.bytes[..]);
    }

    /// What the relay does with a read from the upstream (`frames`: the tap's cursor): how
    /// much of it went to the client, `None` when the session must end instead.
    async fn pass_down(tap: &RelayTap, frames: &mut FrameCursor, bytes: &[u8]) -> Option<usize> {
        admit_down(bytes, Some(frames), Some(tap), None, std::future::pending())
            .await
            .map(|followed| followed.pass)
    }

    /// A binary message on stdout with `len` bytes of output.
    fn stdout_message(len: usize) -> Vec<u8> {
        let mut m = vec![0x82, 126];
        m.extend_from_slice(&((len + 1) as u16).to_be_bytes());
        m.push(1);
        m.extend(std::iter::repeat_n(b'a', len));
        m
    }

    /// Option (a) of the bound: the moment a frame's head goes, its whole declared length
    /// counts as not yet recorded, so that finishing it after a failure stays within the bound.
    #[tokio::test]
    async fn a_frame_head_goes_only_once_its_whole_length_fits_in_the_bound() {
        let quick = Duration::from_millis(50);
        let (tap, writer) = v4_tap();
        let mut frames = tap
            .frame_cursor()
            .expect("a required v4 tap follows frames");
        // 60,000 bytes of output recorded and not written yet: within the 64 KiB.
        let first = stdout_message(60_000);
        assert_eq!(
            pass_down(&tap, &mut frames, &first).await,
            Some(first.len())
        );
        // A read that ends inside the next head passes nothing of it.
        let second = stdout_message(9_999);
        assert_eq!(pass_down(&tap, &mut frames, &second[..3]).await, Some(0));
        // Its head and 10 bytes: 10,004 bytes declared (head included), so it may go only
        // once no more than 65,536 - 10,004 = 55,532 bytes are unwritten.
        {
            let waiting = pass_down(&tap, &mut frames, &second[..14]);
            tokio::pin!(waiting);
            assert!(tokio::time::timeout(quick, &mut waiting).await.is_err());
            writer.written(4_000);
            assert!(tokio::time::timeout(quick, &mut waiting).await.is_err());
            writer.written(1_000);
            assert_eq!(
                tokio::time::timeout(quick, waiting).await.unwrap(),
                Some(14)
            );
        }
        assert_eq!(frames.owed(), 9_990);
    }

    /// A v4 relay whose recording fails while a message is half passed on: the client gets the
    /// rest of that message (counted in the bound when its head went), then the Status on
    /// channel 3 and a Close, and nothing the upstream sent after it.
    #[tokio::test]
    async fn a_required_relay_ends_a_frame_begun_then_sends_the_status() {
        let (tap, writer) = v4_tap();
        let frame = stdout_message(9_999);
        let next = [0x82, 2, 1, b'b'];
        let (client_near, mut client_far) = tokio::io::duplex(64 * 1024);
        let (upstream_near, mut upstream_far) = tokio::io::duplex(64 * 1024);
        let counters = crate::session_traffic::SessionTraffic::new();
        let activity = ActivityClock::new();
        let peers = async {
            upstream_far.write_all(&frame[..1004]).await.unwrap();
            let mut got = vec![0; 1004];
            client_far.read_exact(&mut got).await.unwrap();
            assert_eq!(got, frame[..1004]);
            writer.fail("No space left on device");
            upstream_far.write_all(&frame[1004..]).await.unwrap();
            upstream_far.write_all(&next).await.unwrap();
            let status = recording_failed("No space left on device").to_json_bytes();
            let mut expected = frame[1004..].to_vec();
            let len = status.len() + 1;
            expected.extend_from_slice(&[0x82, 126, (len >> 8) as u8, len as u8, 3]);
            expected.extend_from_slice(&status);
            expected.extend_from_slice(&[0x88, 2, 0x03, 0xe8]);
            let mut got = Vec::new();
            client_far.read_to_end(&mut got).await.unwrap();
            assert_eq!(got, expected);
            // The client goes; the relay then ends.
            drop(client_far);
            upstream_far
        };
        let (_, upstream_far) = tokio::time::timeout(Duration::from_secs(5), async {
            tokio::join!(
                pump(
                    client_near,
                    upstream_near,
                    &counters,
                    &activity,
                    RelayHooks {
                        tap: Some(&tap),
                        ..RelayHooks::default()
                    }
                ),
                peers
            )
        })
        .await
        .unwrap();
        drop(upstream_far);
        assert_eq!(
            tap.must_have_ended().as_deref(),
            Some("No space left on device")
        );
    }

    /// SPDY: the Status goes on the error stream the client opened, with FIN, and stdout and
    /// stderr are ended; the client's streams come from its own SYN_STREAMs.
    #[tokio::test]
    async fn a_required_spdy_relay_ends_on_the_error_stream() {
        let (recorder, writer) = Recorder::held(true);
        let observer = Observer::for_protocol(Some("SPDY/3.1"), Some(V4)).unwrap();
        let tap = RelayTap::new(recorder, observer, true)
            .ending_with(Ending::for_protocol(Some("SPDY/3.1"), Some(V4)));
        let mut client_enc = FrameEncoder::new();
        let mut up = BytesMut::new();
        for (id, ty) in [(1, "error"), (3, "stdout"), (5, "stderr")] {
            let mut headers = HeaderBlock::new();
            headers.push("streamtype", ty);
            client_enc
                .encode(
                    &Frame::SynStream(SynStream::new(StreamId::new(id), headers)),
                    &mut up,
                )
                .unwrap();
        }
        assert!(tap.relayed(Direction::ClientToUpstream, &up).await);
        let mut frames = tap
            .frame_cursor()
            .expect("a required SPDY tap follows frames");
        // Half of a stdout DATA frame of 100 bytes has gone when the recording fails.
        let mut data = vec![0, 0, 0, 3, 0, 0, 0, 100];
        data.extend_from_slice(&[b'o'; 100]);
        assert_eq!(pass_down(&tap, &mut frames, &data[..58]).await, Some(58));
        writer.fail("No space left on device");
        assert_eq!(pass_down(&tap, &mut frames, &data[58..]).await, None);
        // The refused read left the frames where the client is.
        assert_eq!(frames.owed(), 50);
        assert!(
            tap.end_frames("x", &frames).is_none(),
            "not inside the frame"
        );
        assert_eq!(frames.complete(&data[58..]), 50);
        let end = tap.end_frames("No space left on device", &frames).unwrap();
        let status = recording_failed("No space left on device").to_json_bytes();
        let mut expected = vec![
            0,
            0,
            0,
            1,
            0x01,
            0,
            (status.len() >> 8) as u8,
            status.len() as u8,
        ];
        expected.extend_from_slice(&status);
        expected.extend_from_slice(&[0, 0, 0, 3, 0x01, 0, 0, 0, 0, 0, 0, 5, 0x01, 0, 0, 0]);
        assert_eq!(end.bytes, expected);
        assert!(!end.half_close);
    }

    #[tokio::test]
    async fn an_observing_tap_finds_the_exit_code_and_records_nothing() {
        use crate::translate::observe::WebSocketFraming;
        let observer = Observer::for_protocol(Some("websocket"), Some("v4.channel.k8s.io"))
            .expect("v4 is followed");
        let tap = RelayTap::observing(observer);
        assert!(tap.path().is_none());
        // The upstream's channel-3 message: a Status with exit code 3, in one server frame.
        let status = br#"{"metadata":{},"status":"Failure","message":"exit 3","reason":"NonZeroExitCode","details":{"causes":[{"reason":"ExitCode","message":"3"}]}}"#;
        let mut frame = vec![0x82, 126];
        frame.extend_from_slice(&((status.len() + 1) as u16).to_be_bytes());
        frame.push(3);
        frame.extend_from_slice(status);
        assert!(tap.relayed(Direction::UpstreamToClient, &frame).await);
        let end = tap.finish().await;
        assert_eq!(end.exit_code, Some(3));
        assert_eq!(end.recording_error, None);
        let _ = WebSocketFraming::Binary;
    }

    /// A relayed SPDY exec (the client's SYN_STREAM for stdout already through) whose
    /// recording budget is spent, as behind a busy writer: the upstream, over real TCP, sends a
    /// megabyte of stdout, which the tap holds back in the kernel, then hangs up (a reset, or a
    /// FIN); the budget comes back `budget_back` after the hang-up, if ever. What the client got
    /// and how long after the hang-up its end came; with `watched`, the relay looks at the
    /// upstream's socket meanwhile.
    async fn relay_cut_behind_its_output(
        reset: bool,
        watched: bool,
        budget_back: Option<Duration>,
    ) -> (usize, Duration) {
        const FRAMES: usize = 32;
        let dir = tempfile::tempdir().unwrap();
        let recordings = recordings(dir.path(), RecordPolicy::BestEffort);
        let mut spent = Some(recordings.spend_budget());
        let recorder = recordings
            .open(TOP, "s1", &[], "ns/pod".into(), false)
            .await
            .unwrap();
        let observer = Observer::for_protocol(Some("SPDY/3.1"), None).unwrap();
        let tap = RelayTap::new(recorder, observer, false);
        let mut headers = HeaderBlock::new();
        headers.push("streamtype", "stdout");
        let mut syn = BytesMut::new();
        FrameEncoder::new()
            .encode(
                &Frame::SynStream(SynStream::new(StreamId::new(1), headers)),
                &mut syn,
            )
            .unwrap();
        let mut output = BytesMut::new();
        let mut enc = FrameEncoder::new();
        for _ in 0..FRAMES {
            let payload = Bytes::from(vec![b'o'; 32 * 1024]);
            let data = Frame::Data(Data {
                stream_id: StreamId::new(1),
                fin: false,
                payload,
            });
            enc.encode(&data, &mut output).unwrap();
        }
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.set_recv_buffer_size(4 << 20).unwrap();
        let (ours, theirs) = tokio::join!(
            socket.connect(listener.local_addr().unwrap()),
            listener.accept()
        );
        let (ours, (mut theirs, _)) = (ours.unwrap(), theirs.unwrap());
        let hooks = RelayHooks {
            tap: Some(&tap),
            linger: Some(Duration::from_millis(100)),
            upstream_hangup: watched.then(|| crate::peer_hangup::PeerHangup::of(&ours)),
            ..RelayHooks::default()
        };
        let (client_near, mut client_far) = tokio::io::duplex(64 * 1024);
        let (counters, activity) = (
            crate::session_traffic::SessionTraffic::new(),
            ActivityClock::new(),
        );
        let peers = async {
            client_far.write_all(&syn).await.unwrap();
            let mut got = vec![0; syn.len()];
            theirs.read_exact(&mut got).await.unwrap();
            theirs.write_all(&output).await.unwrap();
            // Everything crosses to the relay's socket while the tap waits for the budget.
            tokio::time::sleep(Duration::from_millis(500)).await;
            if reset {
                theirs.set_zero_linger().unwrap();
            } else {
                theirs.shutdown().await.unwrap();
            }
            drop(theirs);
            let cut = std::time::Instant::now();
            if let Some(after) = budget_back {
                let spent = spent.take();
                tokio::spawn(async move {
                    tokio::time::sleep(after).await;
                    drop(spent);
                });
            }
            let mut got = Vec::new();
            let _ = client_far.read_to_end(&mut got).await;
            (got.len(), cut.elapsed())
        };
        let relay = pump(client_near, ours, &counters, &activity, hooks);
        let ended = tokio::time::timeout(Duration::from_secs(3), async {
            tokio::join!(relay, peers).1
        })
        .await;
        drop(spent);
        let (got, took) = ended.expect("the relay never saw its upstream hang up");
        assert!(got <= output.len());
        (got, took)
    }

    #[tokio::test]
    async fn a_relay_held_back_by_its_recording_sees_its_upstream_reset() {
        let (_got, took) = relay_cut_behind_its_output(true, true, None).await;
        assert!(took < Duration::from_secs(2), "{took:?}");
    }

    /// A FIN is how an upstream ends a session that ended well too: what is left waits its
    /// turn (here until the budget comes back), and all of it reaches the client.
    #[tokio::test]
    async fn a_relay_held_back_by_its_recording_drains_at_its_turn_after_a_fin() {
        let back = Duration::from_millis(700);
        let (got, took) = relay_cut_behind_its_output(false, true, Some(back)).await;
        assert!(took >= back, "ended before its turn: {took:?}");
        assert_eq!(got, 32 * (32 * 1024 + 8), "every byte before the FIN");
    }

    #[tokio::test]
    #[should_panic(expected = "never saw its upstream hang up")]
    async fn without_the_watch_a_held_back_relay_waits_for_its_recording_turn() {
        relay_cut_behind_its_output(true, false, None).await;
    }
}
