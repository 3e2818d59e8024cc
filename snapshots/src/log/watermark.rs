use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;
use std::path::Path;

use super::segment::{position_at, u32_at};
use super::{LogError, LogPosition, WATERMARK_LEN, WATERMARK_MAGIC};
use crate::history::HistoryId;

/// The end of the log as the writer last recorded it, outside the segments (module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Watermark {
    /// The history id of the log that wrote it.
    pub history: Option<HistoryId>,
    /// The first position of the newest segment.
    pub rolled_at: LogPosition,
    /// The last position made durable ([`LogPosition::ZERO`]: none yet).
    pub through: LogPosition,
}

/// Why the watermark file is not a valid watermark ([`super::LogDir::read_watermark`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WatermarkError {
    /// Not the watermark's length or magic bytes.
    #[error("not a viewtape log watermark")]
    NotAWatermark,
    /// A format version this build does not read.
    #[error("unknown watermark version")]
    UnknownVersion,
    /// Its checksum does not match its bytes.
    #[error("watermark checksum mismatch")]
    Checksum,
}

impl Watermark {
    /// The highest position it shows was used: the last one made durable, or the one before
    /// the newest segment's first.
    pub fn last_used(&self) -> LogPosition {
        self.through.max(self.rolled_at.prev())
    }

    pub(super) fn to_bytes(self) -> [u8; WATERMARK_LEN] {
        let mut out = [0u8; WATERMARK_LEN];
        out[..8].copy_from_slice(&WATERMARK_MAGIC);
        out[8..10].copy_from_slice(&1u16.to_le_bytes());
        out[12..28].copy_from_slice(&HistoryId::bytes_of(self.history));
        out[28..36].copy_from_slice(&self.rolled_at.get().to_le_bytes());
        out[36..44].copy_from_slice(&self.through.get().to_le_bytes());
        let crc = crc32c::crc32c(&out[..44]);
        out[44..].copy_from_slice(&crc.to_le_bytes());
        out
    }

    pub(super) fn parse(bytes: &[u8]) -> Result<Self, WatermarkError> {
        if bytes.len() != WATERMARK_LEN || bytes[..8] != WATERMARK_MAGIC {
            return Err(WatermarkError::NotAWatermark);
        }
        if u16::from_le_bytes([bytes[8], bytes[9]]) != 1 {
            return Err(WatermarkError::UnknownVersion);
        }
        if crc32c::crc32c(&bytes[..44]) != u32_at(bytes, 44) {
            return Err(WatermarkError::Checksum);
        }
        let mut id = [0u8; 16];
        id.copy_from_slice(&bytes[12..28]);
        Ok(Self {
            history: HistoryId::from_bytes(id),
            rolled_at: position_at(bytes, 28),
            through: position_at(bytes, 36),
        })
    }

    /// Writes it to `path` and syncs it.
    pub(super) fn write(self, path: &Path) -> Result<(), LogError> {
        OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(path)
            .and_then(|file| {
                file.write_all_at(&self.to_bytes(), 0)?;
                file.set_len(WATERMARK_LEN as u64)?;
                file.sync_all()
            })
            .map_err(|e| LogError::io("write", path, e))
    }
}
