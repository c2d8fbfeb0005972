//! The process itself: where its settings come from, how it logs, how it shuts down, how it
//! gives memory back.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, ValueEnum};

use super::values::parse_duration;

/// Process and logging.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Process and logging")]
pub struct ProcessArgs {
    /// YAML file with any of these flags as `flag-name: value`.
    ///
    /// A list sets a repeated flag, `true` a switch. Precedence: the command line, then the
    /// environment, then this file, then the defaults.
    #[arg(long, env = "KUBE_WS_PROXY_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,

    /// How the `--config` file was read, to read it again when it changes.
    #[arg(skip)]
    pub config_origin: Option<ConfigOrigin>,

    /// Log format (log lines go to stderr; RUST_LOG sets the level).
    #[arg(long, env = "KUBE_WS_PROXY_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,

    /// On SIGTERM: how long running sessions may go on.
    ///
    /// The listener is closed and /readyz unready at once; after it, each session is ended
    /// with a Status on its error channel and Close, relays are cut, and the process exits 0.
    /// Keep it below the pod's terminationGracePeriodSeconds.
    #[arg(
        long,
        env = "KUBE_WS_PROXY_DRAIN_TIMEOUT",
        default_value = "30s",
        value_parser = parse_duration,
        value_name = "DURATION"
    )]
    pub drain_timeout: Duration,

    /// How often freed memory is given back to the operating system (0: never).
    ///
    /// With glibc's `malloc_trim`, so RSS follows the sessions running rather than the last
    /// burst of them. With 0 the allocator gives memory back only when it sees fit.
    #[arg(
        long,
        env = "KUBE_WS_PROXY_MEMORY_TRIM_INTERVAL",
        default_value = "10s",
        value_parser = parse_duration,
        value_name = "DURATION"
    )]
    pub memory_trim_interval: Duration,
}

/// Settings a config file gave: each key (a long flag name) with its values as given.
pub type FileSettings = BTreeMap<String, Vec<String>>;

/// What reading the configuration again needs, and what the file said (filled by
/// [`crate::config_file`] beside the flags it read).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConfigOrigin {
    /// The command line the proxy started with (it wins over the file, read again or not).
    pub argv: Vec<OsString>,
    /// The settings the file gave, other than its clusters (`cluster:`, `clusters:`): each key
    /// the file set and no flag above it overrode, with its values as given.
    pub file_settings: FileSettings,
    /// A digest of the file as it was read (`config_file::digest`), to tell when it changes.
    pub file_digest: u64,
}

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}
