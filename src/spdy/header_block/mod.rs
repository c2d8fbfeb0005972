//! SPDY/3 name/value header blocks (PROTOCOL.md §3.3): the uncompressed layout, and the
//! per-direction zlib contexts that use the SPDY/3 preset dictionary.
//!
//! Every block a peer sends is read one way, as Go's spdystream and `http.Header` read it
//! (every kubelet and kube-apiserver): [`HeaderBlock::read_raw`] gives the headers and whether
//! spdystream refuses the frame, and [`HeaderBlock::get`] is `Header.Get` (the first of a
//! value's NUL-separated parts). Our own sessions refuse what spdystream refuses
//! ([`HeaderDecoder::decode`]); an observer of someone else's session reads what spdystream
//! would read and never refuses ([`HeaderDecoder::read`]).

mod block;
mod decoder;
mod dictionary;
mod encoder;
mod error;
mod go_names;
mod raw;

pub use block::{BlockKind, HeaderBlock};
pub use decoder::{HeaderDecoder, DEFAULT_MAX_DECOMPRESSED};
pub use dictionary::{DICTIONARY, DICTIONARY_ADLER32};
pub use encoder::HeaderEncoder;
pub use error::HeaderBlockError;
pub use raw::Reading;
