//! Finding a finished session's recording on disk by its session id, for one the proxy no
//! longer remembers (it ended long ago, or before a restart): in `--record-dir` or its
//! cluster's folder, by the name the recorder gives files (`<UTC start>_<session id>.cast`),
//! and only if the file's header says it is that session's, in that namespace and cluster.
//! Never through a symbolic link, never outside that folder.

use std::fs::File;
use std::io::Read;
use std::path::Path;

use serde::Deserialize;

use super::asciicast::HeaderSession;
use super::follow::{open_regular, RecordingFeed};
use super::Recordings;

/// How much of a file is read for its header line: the header's command and title are cut to
/// a few KiB, so a longer first line is no header of ours.
const HEADER_MAX: usize = 64 * 1024;

/// The one field of a header the lookup checks.
#[derive(Deserialize)]
struct Owner {
    kube_ws_proxy: Option<HeaderSession>,
}

/// Whose session a file is to be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionKey<'a> {
    pub session_id: &'a str,
    pub namespace: &'a str,
    /// The session's named cluster (its folder); `None` for the unnamed upstream.
    pub cluster: Option<&'a str>,
}

impl Recordings {
    /// The recording of the session `key` names, if one is on disk: the file, opened, and
    /// its feed (complete at the length it has now). Reads the folder's names, so it runs
    /// on a blocking thread.
    pub async fn find(&self, key: &SessionKey<'_>) -> Option<(File, RecordingFeed)> {
        let dir = self.folder(key.cluster).ok()?;
        let nested = key.cluster.is_some();
        let want = HeaderSession {
            session_id: key.session_id.to_owned(),
            namespace: key.namespace.to_owned(),
            cluster: key.cluster.map(str::to_owned),
        };
        tokio::task::spawn_blocking(move || find_in(&dir, nested, &want))
            .await
            .ok()
            .flatten()
    }
}

/// [`Recordings::find`] in `dir` (a cluster's folder when `nested`, which must then be a
/// directory itself, not a link to one).
fn find_in(dir: &Path, nested: bool, want: &HeaderSession) -> Option<(File, RecordingFeed)> {
    if nested && !std::fs::symlink_metadata(dir).ok()?.is_dir() {
        return None;
    }
    let suffix = format!("_{}.cast", want.session_id);
    for entry in std::fs::read_dir(dir).ok()?.flatten() {
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if !is_recording_name(name, &suffix) {
            continue;
        }
        // The entry's own type: a symbolic link is not followed, even to a file.
        if !entry.file_type().is_ok_and(|t| t.is_file()) {
            continue;
        }
        let path = dir.join(name);
        let Ok((file, len)) = open_regular(&path) else {
            continue;
        };
        if header_owner(&file).as_ref() == Some(want) {
            return Some((file, RecordingFeed::finished(path, len)));
        }
    }
    None
}

/// Whether `name` is a recording's name as the recorder gives it, ending in `suffix`
/// (`_<session id>.cast`): a timestamp of letters and digits, then the suffix.
fn is_recording_name(name: &str, suffix: &str) -> bool {
    name.strip_suffix(suffix)
        .is_some_and(|stamp| !stamp.is_empty() && stamp.bytes().all(|b| b.is_ascii_alphanumeric()))
}

/// The session a file's header line names, if it is a header of ours.
fn header_owner(file: &File) -> Option<HeaderSession> {
    let mut head = Vec::with_capacity(4096);
    file.take(HEADER_MAX as u64).read_to_end(&mut head).ok()?;
    let end = head.iter().position(|&b| b == b'\n')?;
    let owner: Owner = serde_json::from_slice(&head[..end]).ok()?;
    owner.kube_ws_proxy
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(id: &str, ns: &str, cluster: Option<&str>) -> String {
        let owner = HeaderSession {
            session_id: id.into(),
            namespace: ns.into(),
            cluster: cluster.map(str::to_owned),
        };
        format!(
            "{}\n[0.1, \"o\", \"hi\"]\n",
            serde_json::json!({"version": 2, "width": 80, "height": 24, "kube_ws_proxy": owner})
        )
    }

    fn want(id: &str, ns: &str, cluster: Option<&str>) -> HeaderSession {
        HeaderSession {
            session_id: id.into(),
            namespace: ns.into(),
            cluster: cluster.map(str::to_owned),
        }
    }

    #[test]
    fn a_file_is_found_by_its_name_and_only_if_its_header_is_that_sessions() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::write(
            d.join("20261128T101010Z_r-1.cast"),
            header("r-1", "a", None),
        )
        .unwrap();
        // Named as another session's, or with another namespace in its header.
        std::fs::write(
            d.join("20261128T101010Z_r-2.cast"),
            header("r-1", "a", None),
        )
        .unwrap();
        std::fs::write(
            d.join("20261128T101010Z_r-3.cast"),
            header("r-3", "b", None),
        )
        .unwrap();
        std::fs::write(d.join("x_y_r-4.cast"), header("r-4", "a", None)).unwrap();
        let (_, feed) = find_in(d, false, &want("r-1", "a", None)).unwrap();
        assert!(feed.path().ends_with("20261128T101010Z_r-1.cast"));
        let p = feed.progress();
        assert!(p.closed);
        assert_eq!(p.written, header("r-1", "a", None).len() as u64);
        assert!(find_in(d, false, &want("r-2", "a", None)).is_none());
        assert!(find_in(d, false, &want("r-3", "a", None)).is_none());
        assert!(find_in(d, false, &want("r-3", "b", Some("prod"))).is_none());
        assert!(find_in(d, false, &want("r-4", "a", None)).is_none());
        assert!(find_in(d, false, &want("r-9", "a", None)).is_none());
    }

    #[test]
    fn links_are_never_followed() {
        let dir = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        let real = outside.path().join("20261128T101010Z_r-1.cast");
        std::fs::write(&real, header("r-1", "a", Some("prod"))).unwrap();
        // A file that links out of the folder, and a cluster folder that is a link.
        std::fs::create_dir(dir.path().join("prod")).unwrap();
        std::os::unix::fs::symlink(&real, dir.path().join("prod/20261128T101010Z_r-1.cast"))
            .unwrap();
        std::os::unix::fs::symlink(outside.path(), dir.path().join("dev")).unwrap();
        let prod = dir.path().join("prod");
        assert!(find_in(&prod, true, &want("r-1", "a", Some("prod"))).is_none());
        assert!(find_in(
            &dir.path().join("dev"),
            true,
            &want("r-1", "a", Some("prod"))
        )
        .is_none());
        assert!(open_regular(&prod.join("20261128T101010Z_r-1.cast")).is_err());
    }

    #[test]
    fn only_a_timestamp_may_come_before_the_id() {
        let suffix = "_r-1.cast";
        assert!(is_recording_name("20261128T101010Z_r-1.cast", suffix));
        assert!(!is_recording_name("_r-1.cast", suffix));
        assert!(!is_recording_name("a/b_r-1.cast", suffix));
        assert!(!is_recording_name("20261128T101010Z_r-11.cast", suffix));
    }
}
