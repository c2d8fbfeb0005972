//! SETTINGS: session parameters (PROTOCOL.md §3.2). spdystream parses and ignores them and
//! never sends any; they are decoded only so a peer that sends one does not end the session.
//!
//! ```text
//! control head (type 4, flags CLEAR=0x01) | count (4) | count x [flags (1) | id (3) | value (4)]
//! ```

use bytes::BufMut;

use super::wire::read_u32;
use super::{ControlType, FrameError, Head, HEAD_LEN, MAX_FRAME_LEN};

/// `FLAG_SETTINGS_CLEAR_SETTINGS`.
const FLAG_CLEAR: u8 = 0x01;
/// Largest id the 24-bit field can carry.
const MAX_ID: u32 = 0x00FF_FFFF;
/// Bytes per entry.
const ENTRY_LEN: usize = 8;

/// One SETTINGS entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Setting {
    /// Per-entry flags (PERSIST_VALUE 0x01, PERSISTED 0x02).
    pub flags: u8,
    /// The setting's id (24 bits).
    pub id: u32,
    /// Its value.
    pub value: u32,
}

/// A SETTINGS frame.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Settings {
    /// `FLAG_SETTINGS_CLEAR_SETTINGS`: forget persisted settings.
    pub clear: bool,
    /// The entries, in wire order.
    pub entries: Vec<Setting>,
}

impl Settings {
    const NAME: &'static str = "SETTINGS";

    /// Decodes the payload. The length must be exactly 4 + 8 x count; unknown frame flag bits
    /// are ignored.
    pub(crate) fn decode(flags: u8, payload: &[u8]) -> Result<Settings, FrameError> {
        let bad_length = || FrameError::BadLength {
            ty: Self::NAME,
            length: payload.len() as u32,
        };
        let (count, body) = match payload.split_first_chunk::<4>() {
            Some((count, body)) => (u32::from_be_bytes(*count) as usize, body),
            None => return Err(bad_length()),
        };
        // `count` comes from the peer: compare through the body length, which cannot overflow.
        if body.len() % ENTRY_LEN != 0 || body.len() / ENTRY_LEN != count {
            return Err(bad_length());
        }
        let entries = body
            .chunks_exact(ENTRY_LEN)
            .map(|entry| Setting {
                flags: entry[0],
                id: read_u32(entry) & MAX_ID,
                value: read_u32(&entry[4..]),
            })
            .collect();
        Ok(Settings {
            clear: flags & FLAG_CLEAR != 0,
            entries,
        })
    }

    /// Appends the whole frame; ids above 24 bits are refused.
    pub(crate) fn encode(&self, dst: &mut impl BufMut) -> Result<(), FrameError> {
        if let Some(bad) = self.entries.iter().find(|s| s.id > MAX_ID) {
            return Err(FrameError::BadSettingId(bad.id));
        }
        let length = 4 + ENTRY_LEN * self.entries.len();
        if length > MAX_FRAME_LEN {
            return Err(FrameError::FrameTooLarge(HEAD_LEN + length));
        }
        let head = Head::Control {
            ty: ControlType::Settings,
            flags: if self.clear { FLAG_CLEAR } else { 0 },
            length: length as u32,
        };
        head.encode(dst)?;
        dst.put_u32(self.entries.len() as u32);
        for entry in &self.entries {
            dst.put_u32(u32::from(entry.flags) << 24 | entry.id);
            dst.put_u32(entry.value);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_and_decodes_entries() {
        let frame = Settings {
            clear: true,
            entries: vec![
                Setting {
                    flags: 1,
                    id: 7,
                    value: 65536,
                },
                Setting {
                    flags: 0,
                    id: 0x00AB_CDEF,
                    value: 1,
                },
            ],
        };
        let mut out = Vec::new();
        frame.encode(&mut out).unwrap();
        let expected: &[u8] = &[
            0x80, 0x03, 0x00, 0x04, 0x01, 0x00, 0x00, 0x14, // head, length 20
            0x00, 0x00, 0x00, 0x02, // count
            0x01, 0x00, 0x00, 0x07, 0x00, 0x01, 0x00, 0x00, // entry 1
            0x00, 0xAB, 0xCD, 0xEF, 0x00, 0x00, 0x00, 0x01, // entry 2
        ];
        assert_eq!(out, expected);
        assert_eq!(Settings::decode(1, &out[8..]).unwrap(), frame);
    }

    #[test]
    fn decodes_empty_settings() {
        let frame = Settings::decode(0, &[0, 0, 0, 0]).unwrap();
        assert_eq!(frame, Settings::default());
    }

    #[test]
    fn rejects_count_mismatch() {
        let bad = |payload: &[u8]| Settings::decode(0, payload).unwrap_err();
        assert!(matches!(
            bad(&[0, 0, 0]),
            FrameError::BadLength { length: 3, .. }
        ));
        assert!(matches!(bad(&[0, 0, 0, 1]), FrameError::BadLength { .. }));
        assert!(matches!(
            bad(&[0xFF, 0xFF, 0xFF, 0xFF, 0, 0, 0, 0, 0, 0, 0, 0]),
            FrameError::BadLength { .. }
        ));
        assert!(matches!(
            bad(&[0, 0, 0, 0, 1]),
            FrameError::BadLength { .. }
        ));
    }

    #[test]
    fn refuses_wide_ids() {
        let frame = Settings {
            clear: false,
            entries: vec![Setting {
                flags: 0,
                id: 1 << 24,
                value: 0,
            }],
        };
        assert_eq!(
            frame.encode(&mut Vec::new()),
            Err(FrameError::BadSettingId(1 << 24))
        );
    }
}
