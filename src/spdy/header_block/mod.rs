//! SPDY/3 name/value header blocks (PROTOCOL.md §3.3): the uncompressed layout, validation, and
//! the per-direction zlib contexts that use the SPDY/3 preset dictionary.

mod block;
mod decoder;
mod dictionary;
mod encoder;
mod error;
mod raw;

pub use block::{BlockKind, HeaderBlock};
pub use decoder::{HeaderDecoder, DEFAULT_MAX_DECOMPRESSED};
pub use dictionary::{DICTIONARY, DICTIONARY_ADLER32};
pub use encoder::HeaderEncoder;
pub use error::HeaderBlockError;
