//! Recording a relayed exec/attach session: the relay's copy loops hand every piece of bytes
//! they move to a [`RelayTap`], which follows the protocol passively
//! ([`crate::translate::observe`]) and feeds what it saw to the session's recorder. The bytes
//! on the wire are never changed; the tap only reads them (and, by awaiting the recorder,
//! slows the relay down when recordings fall behind, as the translated path does).

use std::sync::{Mutex, MutexGuard};

use tokio_util::sync::CancellationToken;
use tracing::warn;

use crate::audit::recording::{Recordable, Recorded, Recorder};
use crate::translate::observe::{Direction, ErrorStream, Observed, Observer};

/// What the two directions of one relay share. Both run in one task, so the lock is never
/// contended; it is a `Mutex` rather than a `RefCell` only because that task may move between
/// threads (it must be `Sync` to be borrowed across awaits). It is never held across one.
#[derive(Debug)]
struct Shared {
    observer: Observer,
    errors: ErrorStream,
    /// Why observing stopped, if it did.
    failure: Option<String>,
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
            }),
            unobservable: CancellationToken::new(),
        }
    }

    /// The recording's file, if it records.
    pub fn path(&self) -> Option<&std::path::Path> {
        self.recorder.as_ref().map(Recorder::path)
    }

    /// Follows bytes the relay is about to pass on in `direction` and records what they
    /// carried. Returns `false` when the session must end instead (observing failed under
    /// `--record=required`): those bytes are then not passed on.
    pub async fn relayed(&self, direction: Direction, bytes: &[u8]) -> bool {
        let mut events = Vec::new();
        let held;
        {
            let mut shared = self.lock();
            if shared.failure.is_some() {
                // It cannot follow the stream any further: the bytes still go on unless the
                // session has to end for it.
                return !self.required;
            }
            if let Err(e) = shared.observer.feed(direction, bytes, &mut events) {
                match &self.recorder {
                    Some(recorder) => warn!(
                        recording = %recorder.path().display(),
                        error = %e,
                        "stopped recording a relayed session"
                    ),
                    None => {
                        warn!(error = %e, "stopped following a relayed session for its exit code")
                    }
                }
                shared.failure = Some(e.to_string());
                if self.required {
                    self.unobservable.cancel();
                    return false;
                }
            }
            for event in &events {
                if let Observed::Error(data) = event {
                    shared.errors.push(data);
                }
            }
            // The start of an unfinished frame towards the client has been passed on already
            // (a WebSocket client can read it before the frame's end).
            held = match direction {
                Direction::UpstreamToClient => shared.observer.held(direction),
                Direction::ClientToUpstream => 0,
            };
        }
        let Some(recorder) = &self.recorder else {
            return true;
        };
        // What one read carried waits for the recording budget once; under
        // `--record=required` it goes on only within the bound of what is written, and never
        // once the recording failed (must_end then ends the session).
        recorder.record_within(&events, held as u64).await
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

    /// The end of the session as the tap saw it; dropping the tap completes the recording.
    pub fn finish(self) -> TapEnd {
        let shared = self.shared.into_inner().unwrap_or_else(|e| e.into_inner());
        let (exit_code, status) = shared.errors.outcome();
        // Without a recording there is nothing to be incomplete: a stream it could not
        // follow only leaves the exit code unknown.
        let recording_error = self
            .recorder
            .as_ref()
            .and_then(|r| shared.failure.or_else(|| r.error()));
        TapEnd {
            exit_code,
            status,
            recording_error,
        }
    }
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
            Observed::Error(_) => return None,
        })
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use bytes::{Bytes, BytesMut};
    use prometheus::IntCounter;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;
    use crate::activity_clock::ActivityClock;
    use crate::audit::recording::{RecordPolicy, RecordingConfig, RecordingCounters, Recordings};
    use crate::proxy::sessions::relay::{pump, RelayCounters, RelayHooks};
    use crate::spdy::codec::FrameEncoder;
    use crate::spdy::frame::{Data, Frame, HeaderBlock, StreamId, SynStream};

    fn recordings(dir: &std::path::Path, policy: RecordPolicy) -> Recordings {
        Recordings::start(
            RecordingConfig {
                dir: dir.to_owned(),
                policy,
                record_stdin: false,
                min_free: 0,
            },
            RecordingCounters {
                recorded_bytes: IntCounter::new("recorded", "recorded").unwrap(),
                failures: IntCounter::new("failures", "failures").unwrap(),
            },
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
            .open("s1", &[], "ns/pod".into())
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
        assert!(tap.finish().recording_error.is_some());
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
        let end = tap.finish();
        assert!(end.recording_error.unwrap().contains("SPDY"));
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
                &Frame::SynStream(SynStream {
                    stream_id: StreamId::new(1),
                    associated_stream_id: StreamId::ZERO,
                    priority: 0,
                    slot: 0,
                    fin: false,
                    unidirectional: false,
                    headers,
                }),
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
        let counters = RelayCounters::default();
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
        let end = tap.finish();
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
        let end = tap.finish();
        assert_eq!(end.exit_code, Some(3));
        assert_eq!(end.recording_error, None);
        let _ = WebSocketFraming::Binary;
    }
}
