//! The restart scan: recordings left in the spool by an earlier run (its store was down, or
//! the proxy was killed before their upload) are found at start and queued before any new
//! session's, oldest first. At least once: an object whose upload was done but whose file
//! had not yet been removed is stored again, never lost.

use std::path::{Path, PathBuf};
use std::time::SystemTime;

use super::target::UploadTarget;
use super::uploader::UploadJob;

/// A recording found in the spool: its file, and its job's key from its name and folder.
#[derive(Debug, Clone)]
pub struct Leftover {
    /// When its session started (from its name), by which leftovers are queued.
    pub started: SystemTime,
    /// Its upload.
    pub job: UploadJob,
}

/// The recordings in `spool` (`--record-dir`) and its clusters' folders, oldest first, with
/// their keys under `target`. Files whose names the recorder did not make are left alone.
pub fn scan(spool: &Path, target: &UploadTarget) -> std::io::Result<Vec<Leftover>> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(spool)? {
        let entry = entry?;
        let kind = entry.file_type()?;
        if kind.is_file() {
            found.extend(leftover(&entry.path(), None, target));
        } else if kind.is_dir() {
            let folder = entry.file_name();
            let Some(cluster) = folder.to_str() else {
                continue;
            };
            for inner in std::fs::read_dir(entry.path())? {
                let inner = inner?;
                if inner.file_type()?.is_file() {
                    found.extend(leftover(&inner.path(), Some(cluster), target));
                }
            }
        }
    }
    found.sort_by(|a, b| (a.started, &a.job.key).cmp(&(b.started, &b.job.key)));
    Ok(found)
}

/// The leftover at `path` (in the folder of `cluster`), if its name is a recording's:
/// `<YYYYMMDDTHHMMSSZ>_<session id>.cast`.
fn leftover(path: &Path, cluster: Option<&str>, target: &UploadTarget) -> Option<Leftover> {
    let name = path.file_name()?.to_str()?;
    let (stamp, session_id) = name.strip_suffix(".cast")?.split_once('_')?;
    let started = crate::timestamp::parse_compact(stamp)?;
    if session_id.is_empty()
        || !session_id
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || c == b'-')
    {
        return None;
    }
    Some(Leftover {
        started,
        job: UploadJob {
            path: PathBuf::from(path),
            key: target.recording_key(cluster, started, session_id),
            session_id: session_id.to_owned(),
            after_restart: true,
            stored: None,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_scan_finds_recordings_oldest_first_with_their_keys() {
        let spool = tempfile::tempdir().unwrap();
        let write = |rel: &str| {
            let p = spool.path().join(rel);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(&p, b"{}\n").unwrap();
        };
        write("20261129T010000Z_ab12-3.cast");
        write("20261128T235959Z_ab12-2.cast");
        write("prod/20261129T000001Z_cd34-1.cast");
        // Not recordings: left alone.
        write("notes.txt");
        write("20261129T010000Z_.cast");
        write("2026_x.cast");
        write("prod/deeper/20261129T000001Z_ef-1.cast");
        let target: UploadTarget = "s3://evidence/rec".parse().unwrap();
        let found = scan(spool.path(), &target).unwrap();
        let keys: Vec<(&str, &str, bool)> = found
            .iter()
            .map(|l| {
                (
                    l.job.key.as_str(),
                    l.job.session_id.as_str(),
                    l.job.after_restart,
                )
            })
            .collect();
        assert_eq!(
            keys,
            vec![
                ("rec/2026/11/28/ab12-2.cast", "ab12-2", true),
                ("rec/prod/2026/11/29/cd34-1.cast", "cd34-1", true),
                ("rec/2026/11/29/ab12-3.cast", "ab12-3", true),
            ]
        );
        assert_eq!(
            found[1].job.path,
            spool.path().join("prod/20261129T000001Z_cd34-1.cast")
        );
    }
}
