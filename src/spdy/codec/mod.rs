//! Byte stream ⇄ frames. The codec owns the connection's two zlib contexts (one per direction,
//! for the connection's whole life) and can release them once no more streams will be opened.

mod decoder;
mod encoder;

#[cfg(test)]
mod proptests;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod vectors;

pub use decoder::{FrameDecoder, COPY_UP_TO, DEFAULT_MAX_CONTROL_FRAME};
pub use encoder::FrameEncoder;
