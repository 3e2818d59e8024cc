//! The fixed-size header at the start of every snapshot file.
//!
//! Layout (all integers little-endian), [`HEADER_LEN`] = 52 bytes (version 2):
//!
//! | bytes    | field          | notes                                                   |
//! |----------|----------------|---------------------------------------------------------|
//! | `0..8`   | magic          | [`MAGIC`]; stable across every format version           |
//! | `8..10`  | version `u16`  | [`FORMAT_VERSION`]; stable position across versions     |
//! | `10..12` | flags `u16`    | bit 0: [`FLAG_EXACT`]; other bits must be zero          |
//! | `12..20` | created-at `u64` | unix milliseconds                                     |
//! | `20..28` | body length `u64` | bytes of MessagePack body after the header           |
//! | `28..32` | body crc32c `u32` | CRC-32C (Castagnoli) of the body                     |
//! | `32..48` | history id     | the data directory's [`HistoryId`]; zeros for none      |
//! | `48..52` | header crc32c `u32` | CRC-32C of bytes `0..48`                           |
//!
//! Version 1 (still read) is the same without the history id: 36 bytes, its header checksum at
//! `32..36` over bytes `0..32`. Its history is unknown: a data directory accepts it only as a
//! file it held before it had a history (see [`crate::history`]).

use crate::error::FormatError;
use crate::history::HistoryId;
use std::time::{SystemTime, UNIX_EPOCH};

/// The first eight bytes of every snapshot file.
///
/// PNG-style: the non-ASCII first byte catches 7-bit transfers and text sniffing, the trailing
/// `\n` catches newline conversion.
pub const MAGIC: [u8; 8] = *b"\x89VTSNAP\n";

/// The format version this build writes, and the newest it reads.
pub const FORMAT_VERSION: u16 = 2;

/// Length of the header this build writes, in bytes (the longest it reads). The body starts
/// right after it; [`SnapshotHeader::len`] is the length of a parsed one.
pub const HEADER_LEN: usize = 52;
/// Length of a version-1 header.
const HEADER_LEN_V1: usize = 36;

/// Header flag: the snapshot was taken at a graceful shutdown, under the consistency cut, after
/// `seal` — its epoch and offsets may be adopted (once: see the crate docs).
pub const FLAG_EXACT: u16 = 0x0001;

const KNOWN_FLAGS: u16 = FLAG_EXACT;
const VERSION_END: usize = 10;

/// What the writer states about a snapshot: kind and creation time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SnapshotMeta {
    /// Taken at a graceful shutdown under the consistency cut, after `seal`.
    pub exact: bool,
    /// Creation time, unix milliseconds.
    pub created_at_ms: u64,
    /// Taken because an operator asked for it, not by a timer (never exact): its file is named
    /// `manual`, and it loads and is retained as a periodic one. Only the name says so.
    pub manual: bool,
}

impl SnapshotMeta {
    /// An exact snapshot created now.
    pub fn exact_now() -> Self {
        SnapshotMeta {
            exact: true,
            created_at_ms: unix_ms_now(),
            manual: false,
        }
    }

    /// A periodic snapshot created now.
    pub fn periodic_now() -> Self {
        SnapshotMeta {
            exact: false,
            created_at_ms: unix_ms_now(),
            manual: false,
        }
    }

    /// A snapshot an operator asked for, created now: periodic, named `manual`.
    pub fn manual_now() -> Self {
        SnapshotMeta {
            manual: true,
            ..Self::periodic_now()
        }
    }
}

/// A parsed, validated snapshot header.
///
/// Invariant: only built by [`SnapshotHeader::parse`] (magic, version, header checksum and flags
/// verified) or by the encoder; it says nothing yet about the body unless it came from
/// [`crate::verify`], [`crate::decode`] or a directory load.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SnapshotHeader {
    version: u16,
    flags: u16,
    created_at_ms: u64,
    body_len: u64,
    body_crc32c: u32,
    history: Option<HistoryId>,
}

impl SnapshotHeader {
    pub(crate) fn new(
        meta: &SnapshotMeta,
        history: Option<HistoryId>,
        body_len: u64,
        body_crc32c: u32,
    ) -> Self {
        SnapshotHeader {
            version: FORMAT_VERSION,
            flags: if meta.exact { FLAG_EXACT } else { 0 },
            created_at_ms: meta.created_at_ms,
            body_len,
            body_crc32c,
            history,
        }
    }

    /// The history id of the data directory that wrote it (`None`: written without one, or
    /// in format version 1).
    pub fn history(&self) -> Option<HistoryId> {
        self.history
    }

    /// The header's length in bytes: where the body starts.
    #[allow(clippy::len_without_is_empty)]
    pub fn len(&self) -> usize {
        header_len(self.version)
    }

    /// The format version the file was written with.
    pub fn version(&self) -> u16 {
        self.version
    }

    /// The raw flags.
    pub fn flags(&self) -> u16 {
        self.flags
    }

    /// Whether the writer marked the snapshot exact. A directory may still treat it as
    /// periodic once consumed: see [`crate::SnapshotInfo::is_exact`].
    pub fn is_exact(&self) -> bool {
        self.flags & FLAG_EXACT != 0
    }

    /// Creation time, unix milliseconds.
    pub fn created_at_ms(&self) -> u64 {
        self.created_at_ms
    }

    /// Length of the body in bytes.
    pub fn body_len(&self) -> u64 {
        self.body_len
    }

    /// Total file length: header plus body.
    pub fn file_len(&self) -> u64 {
        self.len() as u64 + self.body_len
    }

    /// CRC-32C of the body, as stored.
    pub fn body_crc32c(&self) -> u32 {
        self.body_crc32c
    }

    /// The header's on-disk bytes (its version's length).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = vec![0u8; self.len()];
        out[0..8].copy_from_slice(&MAGIC);
        out[8..10].copy_from_slice(&self.version.to_le_bytes());
        out[10..12].copy_from_slice(&self.flags.to_le_bytes());
        out[12..20].copy_from_slice(&self.created_at_ms.to_le_bytes());
        out[20..28].copy_from_slice(&self.body_len.to_le_bytes());
        out[28..32].copy_from_slice(&self.body_crc32c.to_le_bytes());
        let crc_at = self.len() - 4;
        if self.version >= 2 {
            out[32..48].copy_from_slice(&HistoryId::bytes_of(self.history));
        }
        let crc = crc32c::crc32c(&out[..crc_at]);
        out[crc_at..].copy_from_slice(&crc.to_le_bytes());
        out
    }

    /// Parses and validates the header at the start of `bytes` (which may be just the header,
    /// or a whole file). Checks, in order: magic, version, length, header checksum, flags.
    /// The body is not looked at.
    ///
    /// # Errors
    /// [`FormatError::Short`], [`FormatError::ForeignMagic`], [`FormatError::UnsupportedVersion`],
    /// [`FormatError::HeaderChecksum`] or [`FormatError::UnknownFlags`].
    pub fn parse(bytes: &[u8]) -> Result<Self, FormatError> {
        let short = || FormatError::Short {
            len: bytes.len() as u64,
            needed: HEADER_LEN as u64,
        };
        let magic_len = bytes.len().min(MAGIC.len());
        if bytes[..magic_len] != MAGIC[..magic_len] {
            return Err(FormatError::ForeignMagic {
                found: bytes[..magic_len].to_vec(),
            });
        }
        if bytes.len() < VERSION_END {
            return Err(short());
        }
        let version = u16::from_le_bytes([bytes[8], bytes[9]]);
        if version == 0 || version > FORMAT_VERSION {
            return Err(FormatError::UnsupportedVersion {
                found: version,
                supported: FORMAT_VERSION,
            });
        }
        let len = header_len(version);
        let Some(raw) = bytes.get(..len) else {
            return Err(FormatError::Short {
                len: bytes.len() as u64,
                needed: len as u64,
            });
        };
        let crc_at = len - 4;
        let stored = u32::from_le_bytes([
            raw[crc_at],
            raw[crc_at + 1],
            raw[crc_at + 2],
            raw[crc_at + 3],
        ]);
        let computed = crc32c::crc32c(&raw[..crc_at]);
        if stored != computed {
            return Err(FormatError::HeaderChecksum { stored, computed });
        }
        let flags = u16::from_le_bytes([raw[10], raw[11]]);
        if flags & !KNOWN_FLAGS != 0 {
            return Err(FormatError::UnknownFlags { flags });
        }
        let u64_at = |at: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&raw[at..at + 8]);
            u64::from_le_bytes(b)
        };
        Ok(SnapshotHeader {
            version,
            flags,
            created_at_ms: u64_at(12),
            body_len: u64_at(20),
            body_crc32c: u32::from_le_bytes([raw[28], raw[29], raw[30], raw[31]]),
            history: match version {
                1 => None,
                _ => {
                    let mut id = [0u8; 16];
                    id.copy_from_slice(&raw[32..48]);
                    HistoryId::from_bytes(id)
                }
            },
        })
    }

    /// Checks that `actual` body bytes are exactly what the header announces.
    ///
    /// # Errors
    /// [`FormatError::Truncated`] or [`FormatError::TrailingBytes`].
    pub(crate) fn check_body_len(&self, actual: u64) -> Result<(), FormatError> {
        if actual < self.body_len {
            Err(FormatError::Truncated {
                expected: self.body_len,
                actual,
            })
        } else if actual > self.body_len {
            Err(FormatError::TrailingBytes {
                expected: self.body_len,
                actual,
            })
        } else {
            Ok(())
        }
    }
}

/// The header length of format `version` (one this build reads).
fn header_len(version: u16) -> usize {
    match version {
        1 => HEADER_LEN_V1,
        _ => HEADER_LEN,
    }
}

/// Current time in unix milliseconds (0 if the clock is before 1970).
pub(crate) fn unix_ms_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}
