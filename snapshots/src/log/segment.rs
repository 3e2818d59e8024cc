use super::LogPosition;
use super::{
    LOG_MAGIC, LOG_VERSION, MAX_RECORD_BYTES, RECORD_HEADER_LEN, SEGMENT_HEADER_LEN,
    SEGMENT_HEADER_LEN_V1,
};
use crate::history::HistoryId;

/// Damage a scan found in one segment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Damage {
    /// The last record is partly written: safe to cut at `valid_len`.
    TornTail {
        /// Bytes of the segment that hold intact records.
        valid_len: u64,
    },
    /// Damage that cannot be repaired silently, at `offset`.
    Corrupt {
        /// Where the first bad byte range starts (0: the header; records start after it).
        offset: u64,
        /// What is wrong.
        reason: String,
        /// The highest position of an intact record found after the damage (`None`: none).
        intact_after: Option<LogPosition>,
    },
}

/// What `rest`, the bytes from offset `at` (after the last intact record) to the end of the
/// file, are: a torn tail only when the file ends inside a record or they are all zeros, and no
/// intact record follows (module docs).
pub(super) fn tail_damage(rest: &[u8], at: u64) -> Damage {
    let intact_after = last_intact(rest);
    if intact_after.is_some() {
        return Damage::Corrupt {
            offset: at,
            reason: "a bad record with intact records after it".to_owned(),
            intact_after,
        };
    }
    // Zeros at the very end are what a file system leaves where data never reached the disk.
    let written = rest
        .iter()
        .rposition(|&b| b != 0)
        .map_or(0, |last| last + 1);
    let ends_inside = written < RECORD_HEADER_LEN || {
        let announced = u32_at(rest, 0) as usize;
        announced <= MAX_RECORD_BYTES && written < RECORD_HEADER_LEN + announced
    };
    if ends_inside {
        return Damage::TornTail { valid_len: at };
    }
    Damage::Corrupt {
        offset: at,
        reason: "a complete record fails its checksum or is out of sequence (damage, not a torn write: it was written whole)".to_owned(),
        intact_after: None,
    }
}

/// The highest position of an intact record frame anywhere in `rest` after its first byte
/// (where the damage is): walks from frame to frame, and byte by byte where there is none.
fn last_intact(rest: &[u8]) -> Option<LogPosition> {
    let mut highest = None;
    let mut from = 1;
    while from < rest.len() {
        match frame_at(rest, from) {
            Some((position, _, len)) => {
                highest = highest.max(Some(position));
                from += len;
            }
            None => from += 1,
        }
    }
    highest
}

/// Whether `bytes`, shorter than a header, are what a crash while creating the segment leaves:
/// zeros, or the start of the header this build writes for `first`.
pub(super) fn torn_header(bytes: &[u8], first: LogPosition) -> bool {
    if bytes.len() >= SEGMENT_HEADER_LEN {
        return false;
    }
    let known = segment_header(first, &Lineage::default());
    let fixed = bytes.len().min(20); // magic, version, zero, first: what does not vary
    bytes.iter().all(|&b| b == 0) || bytes[..fixed] == known[..fixed]
}

/// A parsed segment header.
pub(super) struct Header {
    /// The position of its first record, as the header says it.
    pub(super) first: LogPosition,
    pub(super) version: u16,
    pub(super) history: Option<HistoryId>,
    pub(super) epoch: Option<u64>,
    /// Where its first record starts.
    pub(super) len: usize,
}

/// Why a segment's first bytes are not a header this build reads (a scan reports it as
/// [`Damage::Corrupt`], in these words).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub(super) enum SegmentHeaderError {
    /// It does not start with [`LOG_MAGIC`].
    #[error("not a viewtape log segment (bad magic)")]
    BadMagic,
    /// The file ends before the header does.
    #[error("shorter than a segment header")]
    Short,
    /// A format version other than 1 and [`LOG_VERSION`].
    #[error("segment format version {0}; this build reads 1 and {LOG_VERSION}")]
    UnknownVersion(u16),
    /// The header's checksum does not match its bytes.
    #[error("segment header checksum mismatch")]
    Checksum,
    /// An intact header that names another first position than the file name.
    #[error("header says first position {header}, the name says {name}")]
    WrongFirst {
        /// The first position the header holds.
        header: LogPosition,
        /// The first position the file name gives.
        name: LogPosition,
    },
}

/// Parses and checks a segment header — magic, version (1 or 2), length, checksum — and that it
/// names `first`, as the file name does.
pub(super) fn parse_header(bytes: &[u8], first: LogPosition) -> Result<Header, SegmentHeaderError> {
    let header = read_header(bytes)?;
    if header.first != first {
        return Err(SegmentHeaderError::WrongFirst {
            header: header.first,
            name: first,
        });
    }
    Ok(header)
}

/// Parses and checks a segment header: magic, version (1 or 2), length and checksum; not the
/// file name (a header that checks out says whose segment it is, under any name).
pub(super) fn read_header(bytes: &[u8]) -> Result<Header, SegmentHeaderError> {
    let magic = bytes.len().min(LOG_MAGIC.len());
    if bytes[..magic] != LOG_MAGIC[..magic] {
        return Err(SegmentHeaderError::BadMagic);
    }
    let Some(version) = bytes.get(8..10).map(|v| u16::from_le_bytes([v[0], v[1]])) else {
        return Err(SegmentHeaderError::Short);
    };
    let len = match version {
        1 => SEGMENT_HEADER_LEN_V1,
        LOG_VERSION => SEGMENT_HEADER_LEN,
        _ => return Err(SegmentHeaderError::UnknownVersion(version)),
    };
    let Some(header) = bytes.get(..len) else {
        return Err(SegmentHeaderError::Short);
    };
    if crc32c::crc32c(&header[..len - 4]) != u32_at(header, len - 4) {
        return Err(SegmentHeaderError::Checksum);
    }
    let (history, epoch) = match version {
        1 => (None, None),
        _ => {
            let mut id = [0u8; 16];
            id.copy_from_slice(&header[20..36]);
            (HistoryId::from_bytes(id), Some(u64_at(header, 36)))
        }
    };
    Ok(Header {
        first: position_at(header, 12),
        version,
        history,
        epoch,
        len,
    })
}

/// An intact record frame at `at`: its position, payload and length.
pub(super) fn frame_at(bytes: &[u8], at: usize) -> Option<(LogPosition, &[u8], usize)> {
    let head = bytes.get(at..at.checked_add(RECORD_HEADER_LEN)?)?;
    let end = at + RECORD_HEADER_LEN + payload_len(head)?;
    let payload = bytes.get(at + RECORD_HEADER_LEN..end)?;
    intact(head, payload).then(|| (position_at(head, 8), payload, end - at))
}

/// The payload length a record header announces, if it is within [`MAX_RECORD_BYTES`].
pub(super) fn payload_len(head: &[u8]) -> Option<usize> {
    let len = u32_at(head, 0) as usize;
    (len <= MAX_RECORD_BYTES).then_some(len)
}

/// Whether a record's checksum holds over its position (in `head`) and `payload`.
pub(super) fn intact(head: &[u8], payload: &[u8]) -> bool {
    let crc = crc32c::crc32c_append(crc32c::crc32c(&head[8..RECORD_HEADER_LEN]), payload);
    crc == u32_at(head, 4)
}

/// The intact record at `at` if it has position `position`.
pub(super) fn record_at(bytes: &[u8], at: usize, position: LogPosition) -> Option<(&[u8], usize)> {
    frame_at(bytes, at)
        .filter(|(found, _, _)| *found == position)
        .map(|(_, payload, len)| (payload, len))
}

pub(super) fn u32_at(bytes: &[u8], at: usize) -> u32 {
    let mut b = [0u8; 4];
    b.copy_from_slice(&bytes[at..at + 4]);
    u32::from_le_bytes(b)
}

pub(super) fn u64_at(bytes: &[u8], at: usize) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&bytes[at..at + 8]);
    u64::from_le_bytes(b)
}

/// The position stored at `at`, a `u64` LE as in every file of the log.
pub(super) fn position_at(bytes: &[u8], at: usize) -> LogPosition {
    LogPosition::new(u64_at(bytes, at))
}

/// Appends `position` and `payload` as one record frame to `out`.
pub(super) fn put_record(out: &mut Vec<u8>, position: LogPosition, payload: &[u8]) {
    let start = out.len();
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    out.extend_from_slice(&[0; 4]);
    out.extend_from_slice(&position.get().to_le_bytes());
    out.extend_from_slice(payload);
    let crc = crc32c::crc32c(&out[start + 8..]);
    out[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
}

/// The header of the segment whose first record has position `first`.
pub(super) fn segment_header(first: LogPosition, lineage: &Lineage) -> Vec<u8> {
    let mut header = Vec::with_capacity(SEGMENT_HEADER_LEN);
    header.extend_from_slice(&LOG_MAGIC);
    header.extend_from_slice(&LOG_VERSION.to_le_bytes());
    header.extend_from_slice(&[0, 0]);
    header.extend_from_slice(&first.get().to_le_bytes());
    header.extend_from_slice(&HistoryId::bytes_of(lineage.history));
    header.extend_from_slice(&lineage.epoch.to_le_bytes());
    let crc = crc32c::crc32c(&header);
    header.extend_from_slice(&crc.to_le_bytes());
    header
}

/// What a segment header says about where its records come from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Lineage {
    /// The data directory's history id.
    pub history: Option<HistoryId>,
    /// The journal epoch when the segment is made, as its bits (`JournalEpoch::to_bits`): this
    /// crate knows nothing of the journal, and the header holds the `u64`.
    pub epoch: u64,
}
