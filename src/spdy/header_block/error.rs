//! Errors of header blocks and their zlib contexts.

use super::BlockKind;

/// A header block could not be encoded or decoded, or spdystream refuses it.
///
/// On read, every one of these but [`TrailingBytes`](Self::TrailingBytes) (which spdystream
/// reads as the start of the next block) ends the session in spdystream (PROTOCOL.md §3.3).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HeaderBlockError {
    /// A count or length points past the end of the decompressed block.
    #[error("header block is truncated")]
    Truncated,
    /// Bytes remain after the last pair the count announced.
    #[error("{0} bytes after the last header pair")]
    TrailingBytes(usize),
    /// A header with an empty name, which we never send (spdystream reads one).
    #[error("empty header name")]
    EmptyName,
    /// A name that Go's `strings.ToLower` changes: uppercase letters, or bytes that are not
    /// UTF-8 (names travel lowercased). Carries the name lowercased.
    #[error("header name {0:?} is not lowercase")]
    UppercaseName(String),
    /// A name repeated where spdystream's duplicate check sees it: only names that are their
    /// own canonical `http.Header` key (`8080`, `x y`); a repeated `streamtype` is accepted.
    #[error("header name {0:?} appears twice")]
    DuplicateName(String),
    /// A hop-by-hop name that this frame type must not carry.
    #[error("header {name:?} is not allowed in {kind:?}")]
    ForbiddenName {
        /// The offending name.
        name: String,
        /// The frame type that carried it.
        kind: BlockKind,
    },
    /// The block inflates to more than the decoder's limit (a header bomb).
    #[error("header block inflates to more than {limit} bytes")]
    DecompressedTooLarge {
        /// The configured limit.
        limit: usize,
    },
    /// A block too large to send (its raw size, in bytes).
    #[error("header block of {0} bytes is too large to send")]
    BlockTooLarge(usize),
    /// The peer's zlib stream asks for a dictionary other than SPDY/3's.
    #[error("zlib stream wants dictionary {0:#010x}, not the SPDY/3 one")]
    WrongDictionary(u32),
    /// The compressed bytes are not valid zlib/deflate data.
    #[error("corrupt compressed header block: {0}")]
    Corrupt(String),
    /// The frame's block was not entirely consumed by the inflater (spdystream:
    /// "compressed payload size was incorrect").
    #[error("{0} compressed bytes left over after the header block")]
    UnconsumedInput(usize),
    /// The peer ended its zlib stream; no later block could be inflated.
    #[error("peer finished its zlib stream")]
    StreamEnded,
    /// A previous error left this zlib context unusable.
    #[error("compression context is unusable after an earlier error")]
    Poisoned,
}
