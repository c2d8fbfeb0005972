//! The proxy's own bearer token: fixed (from a kubeconfig) or read from a file that may be
//! rotated underneath it (a projected service-account token, `--upstream-token-file`).

use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};

use tracing::warn;

/// How often a token file is checked for a new token. Projected service-account tokens are
/// refreshed well before they expire, so a second is plenty and costs one `stat` at most.
const RECHECK: Duration = Duration::from_secs(1);

/// Where the proxy's own token comes from.
pub enum TokenSource {
    /// A token given inline.
    Fixed(String),
    /// A token file, re-read when it changes.
    File(TokenFile),
}

impl TokenSource {
    /// A source reading `path`; fails if the file cannot be read now.
    pub fn file(path: PathBuf) -> std::io::Result<TokenSource> {
        let file = TokenFile {
            path,
            state: Mutex::new(None),
        };
        file.load()?;
        Ok(TokenSource::File(file))
    }

    /// The current token, if any.
    pub fn current(&self) -> Option<String> {
        match self {
            TokenSource::Fixed(t) => Some(t.clone()),
            TokenSource::File(f) => f.current(),
        }
    }
}

impl std::fmt::Debug for TokenSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TokenSource::Fixed(_) => f.write_str("TokenSource::Fixed(<redacted>)"),
            TokenSource::File(file) => write!(f, "TokenSource::File({})", file.path.display()),
        }
    }
}

/// A token file and what was last read from it.
pub struct TokenFile {
    path: PathBuf,
    state: Mutex<Option<Loaded>>,
}

struct Loaded {
    token: String,
    modified: Option<SystemTime>,
    checked: Instant,
}

impl TokenFile {
    fn load(&self) -> std::io::Result<String> {
        let modified = std::fs::metadata(&self.path)
            .and_then(|m| m.modified())
            .ok();
        let token = std::fs::read_to_string(&self.path)?.trim().to_owned();
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        *state = Some(Loaded {
            token: token.clone(),
            modified,
            checked: Instant::now(),
        });
        Ok(token)
    }

    fn current(&self) -> Option<String> {
        {
            let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(loaded) = state.as_mut() {
                if loaded.checked.elapsed() < RECHECK {
                    return Some(loaded.token.clone());
                }
                loaded.checked = Instant::now();
                let modified = std::fs::metadata(&self.path)
                    .and_then(|m| m.modified())
                    .ok();
                if modified.is_some() && modified == loaded.modified {
                    return Some(loaded.token.clone());
                }
            }
        }
        // Changed (or atomically replaced, as the kubelet does with a symlink swap): re-read.
        match self.load() {
            Ok(token) => Some(token),
            Err(e) => {
                warn!(path = %self.path.display(), error = %e, "cannot re-read the token file; using the last token");
                let state = self.state.lock().unwrap_or_else(|p| p.into_inner());
                state.as_ref().map(|l| l.token.clone())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_token_follows_rotation() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        std::fs::write(&path, "first\n").unwrap();
        let source = TokenSource::file(path.clone()).unwrap();
        assert_eq!(source.current().as_deref(), Some("first"));
        // Replace the file the way the kubelet does: write elsewhere, rename over.
        let next = dir.path().join("token.new");
        std::fs::write(&next, "second").unwrap();
        let later = SystemTime::now() + Duration::from_secs(5);
        std::fs::File::options()
            .write(true)
            .open(&next)
            .unwrap()
            .set_modified(later)
            .unwrap();
        std::fs::rename(&next, &path).unwrap();
        if let TokenSource::File(f) = &source {
            f.state.lock().unwrap().as_mut().unwrap().checked -= RECHECK;
        }
        assert_eq!(source.current().as_deref(), Some("second"));
        assert!(!format!("{source:?}").contains("second"));
    }

    #[test]
    fn missing_file_is_an_error_at_start() {
        assert!(TokenSource::file("/nonexistent/token".into()).is_err());
        assert_eq!(
            format!("{:?}", TokenSource::Fixed("secret".into())),
            "TokenSource::Fixed(<redacted>)"
        );
    }
}
