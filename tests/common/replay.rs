//! Replaying a session recording as a person would see it: Debian's `asciinema cat`.

use std::path::Path;
use std::time::Duration;

use super::pty::run_script_on_pty;

/// What `asciinema cat` replays of a recording. It reads keys from `/dev/tty` (and sets it
/// raw, so nothing is translated on the way out), so it runs on a terminal of its own.
pub fn replay(asciinema: &Path, recording: &Path) -> String {
    let mut c = std::process::Command::new(asciinema);
    c.arg("cat")
        .arg(recording)
        .env("HOME", recording.parent().unwrap());
    let run = run_script_on_pty(c, 200, 50, &[], Duration::from_secs(60));
    assert!(
        run.status.success(),
        "asciinema cat {}: {}",
        recording.display(),
        run.output
    );
    run.output
}

/// The `ended` audit event of the session on `pod` that took `protocol_path`, in the audit
/// log at `path`, once written.
pub async fn ended_event(path: &Path, pod: &str, protocol_path: &str) -> serde_json::Value {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        if let Some(e) = text
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .find(|e| {
                e["stage"] == "ended" && e["pod"] == pod && e["protocol_path"] == protocol_path
            })
        {
            return e;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no ended event for {pod} over {protocol_path}: {text}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The recording an audit `ended` event names, read the moment the event is seen: the
/// session's end waits for its recording's file to be complete before the event is written
/// (evidence before the word that it ended), so the file must already be whole: a header,
/// then events, every line complete. Its path and text.
pub fn complete_recording(ended: &serde_json::Value) -> (std::path::PathBuf, String) {
    let path = std::path::PathBuf::from(
        ended["recording"]
            .as_str()
            .unwrap_or_else(|| panic!("a recording: {ended}")),
    );
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (event {ended})", path.display()));
    assert!(
        text.starts_with('{') && text.ends_with('\n'),
        "{} is not complete when its session's ended event is written: {:?}",
        path.display(),
        &text[text.len().saturating_sub(200)..]
    );
    for line in text.lines() {
        serde_json::from_str::<serde_json::Value>(line)
            .unwrap_or_else(|e| panic!("{}: {e}: {line:?}", path.display()));
    }
    (path, text)
}

/// Asserts that `replayed` holds exactly the lines of `expected`, each once, in any order.
///
/// For commands writing to stdout and stderr back to back: they are separate pipes in the pod,
/// so which line reaches the client (and the recording) first depends on which pipe the cluster
/// read first.
pub fn assert_same_lines(replayed: &str, expected: &str, context: &str) {
    let sorted = |s: &str| {
        let mut lines: Vec<String> = s.split_inclusive('\n').map(str::to_owned).collect();
        lines.sort_unstable();
        lines
    };
    assert_eq!(
        sorted(replayed),
        sorted(expected),
        "{context}: replayed {replayed:?}, expected {expected:?}"
    );
}

/// What kubectl (1.31 and later, over WebSocket) showed on its terminal, less the one log line
/// it may print there on its own account: `Unknown stream id 1, discarding message`. Every
/// WebSocket exec server (kube-apiserver, and this proxy as it does) first sends the "ready"
/// message, an empty payload on stdout; kubectl's reader starts before it has set up its
/// stdout stream, and when that empty message wins the race it is logged and dropped. Nothing
/// is lost (the message is empty), but the log line shares the terminal, and no recording holds
/// it. Only that line, for stream 1, is taken out: output that kubectl really dropped would still
/// be missing from what it showed, and the comparison would still fail.
pub fn without_ready_message_race(shown: &str) -> String {
    shown
        .split_inclusive('\n')
        .filter(|line| {
            !(line.starts_with('E')
                && line.contains(" websocket.go:")
                && line
                    .trim_end()
                    .ends_with("] Unknown stream id 1, discarding message"))
        })
        .collect()
}
