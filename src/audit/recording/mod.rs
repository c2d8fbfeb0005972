//! Session recordings (`--record`, `--record-dir`, `--record-stdin`): what an exec or attach
//! session showed (stdout and stderr), its terminal sizes and, if asked, what was typed, as
//! asciicast v2 files that `asciinema play` and `asciinema cat` replay.
//!
//! - [`asciicast`]: the format, and text from output that arrives in chunks.
//! - `json_escape`: recorded text as the inside of a JSON string, the recorder's hot loop.
//! - [`recorder`]: the proxy's recordings and each session's handle, bounded memory.
//! - `writer`: the thread that writes them.
//! - `typing`: while someone types on a recorded terminal, the writer rests after each write.
//! - `queue`: the writer's channel, and the order in which it writes what comes on it (cut-off
//!   output first).
//! - [`follow`]: reading a recording while it is written, at no cost to its session.
//! - [`lookup`]: a finished recording found on disk by its session id.

pub mod asciicast;
pub mod follow;
mod json_escape;
pub mod lookup;
mod queue;
pub mod recorder;
mod state;
mod typing;
mod writer;

pub use follow::{FileProgress, RecordingFeed};
pub use lookup::SessionKey;
pub use recorder::{
    RecordPolicy, Recordable, Recorded, Recorder, RecordingConfig, RecordingCounters,
    RecordingError, RecordingPlace, Recordings,
};
pub use state::{RecordingCap, Truncation};
