//! Reading a segment front to back, one record at a time: a scan and a replay each read every
//! byte once, and neither holds a whole segment in memory (a fresh buffer the size of a
//! segment costs more to fault in than to fill).

use std::fs::File;
use std::io::{self, BufReader, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use super::scan::{LogRecord, SegmentScan};
use super::segment::Damage;
use super::segment::{
    intact, parse_header, payload_len, position_at, read_header, tail_damage, torn_header, Header,
    SegmentHeaderError,
};
use super::{LogError, LogPosition, RECORD_HEADER_LEN, SEGMENT_HEADER_LEN};

/// Read-ahead for records smaller than it; larger payloads are read straight into their own
/// buffers.
const READ_AHEAD: usize = 256 << 10;

/// A segment open for reading its records in order.
pub(super) struct SegmentReader {
    file: BufReader<File>,
    path: PathBuf,
    /// The file's size when it was opened.
    len: u64,
    /// Where the next record starts.
    at: u64,
    /// The position the next record must have.
    next: LogPosition,
}

/// A segment whose header is not one.
pub(super) struct BadHeader {
    /// Its first bytes, at most a header's worth.
    bytes: Vec<u8>,
    reason: SegmentHeaderError,
    /// The file's size.
    len: u64,
}

impl SegmentReader {
    /// Opens the segment at `path`, named for position `first`, and checks its header.
    ///
    /// # Errors
    /// The file cannot be opened or read.
    pub(super) fn open(
        path: &Path,
        first: LogPosition,
    ) -> Result<Result<(Self, Header), BadHeader>, LogError> {
        let io = |e| LogError::io("read", path, e);
        let mut file = File::open(path).map_err(io)?;
        let len = file.metadata().map_err(io)?.len();
        let mut head = Vec::with_capacity(SEGMENT_HEADER_LEN);
        (&mut file)
            .take(SEGMENT_HEADER_LEN as u64)
            .read_to_end(&mut head)
            .map_err(io)?;
        let header = match parse_header(&head, first) {
            Ok(header) => header,
            Err(reason) => {
                let bytes = head;
                return Ok(Err(BadHeader { bytes, reason, len }));
            }
        };
        let at = header.len as u64;
        file.seek(SeekFrom::Start(at)).map_err(io)?;
        let reader = Self {
            file: BufReader::with_capacity(READ_AHEAD, file),
            path: path.to_owned(),
            len,
            at,
            next: first,
        };
        Ok(Ok((reader, header)))
    }

    /// The next record, `None` when no intact record with the next position starts where the
    /// last one ended: the end of the segment, or damage ([`SegmentReader::ended`] tells which).
    ///
    /// # Errors
    /// The file cannot be read.
    pub(super) fn next_record(&mut self) -> Result<Option<LogRecord>, LogError> {
        let left = self.len - self.at;
        if left < RECORD_HEADER_LEN as u64 {
            return Ok(None);
        }
        let mut head = [0u8; RECORD_HEADER_LEN];
        match self.file.read_exact(&mut head) {
            Ok(()) => {}
            // The file shrank under us: what is not there is not intact.
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
            Err(e) => return Err(LogError::io("read", &self.path, e)),
        }
        let Some(payload_len) = payload_len(&head) else {
            return Ok(None);
        };
        let frame_len = (RECORD_HEADER_LEN + payload_len) as u64;
        if frame_len > left {
            return Ok(None);
        }
        let mut payload = Vec::with_capacity(payload_len);
        let io = |e| LogError::io("read", &self.path, e);
        let read = (&mut self.file)
            .take(payload_len as u64)
            .read_to_end(&mut payload)
            .map_err(io)?;
        if read != payload_len {
            // The file shrank under us: what is not there is not intact.
            return Ok(None);
        }
        let position = self.next;
        if !intact(&head, &payload) || position_at(&head, 8) != position {
            return Ok(None);
        }
        self.at += frame_len;
        self.next = self.next.next();
        Ok(Some(LogRecord { position, payload }))
    }

    /// Whether the records read so far end exactly at the end of the file.
    pub(super) fn ended(&self) -> bool {
        self.at == self.len
    }

    /// Where the next record would start (after the last intact one read).
    pub(super) fn at(&self) -> u64 {
        self.at
    }

    /// The bytes after the last intact record read, to the end of the file.
    ///
    /// # Errors
    /// The file cannot be read.
    fn rest(&mut self) -> Result<Vec<u8>, LogError> {
        let io = |e| LogError::io("read", &self.path, e);
        self.file.seek(SeekFrom::Start(self.at)).map_err(io)?;
        let mut rest = Vec::new();
        self.file.read_to_end(&mut rest).map_err(io)?;
        Ok(rest)
    }
}

/// Checks one segment: reads every record and reports what is intact and what is damaged.
///
/// # Errors
/// The file cannot be read.
pub(super) fn scan_segment(path: PathBuf, first: LogPosition) -> Result<SegmentScan, LogError> {
    let (mut reader, header) = match SegmentReader::open(&path, first)? {
        Ok(opened) => opened,
        Err(BadHeader { bytes, reason, len }) => {
            // A new segment whose header never reached the disk whole holds no record yet.
            let damage = if torn_header(&bytes, first) {
                Damage::TornTail { valid_len: 0 }
            } else {
                Damage::Corrupt {
                    offset: 0,
                    reason: reason.to_string(),
                    intact_after: None,
                }
            };
            // A header that checks out under another name still says whose segment it is: a
            // segment of another history is foreign, whatever it is named.
            let header = read_header(&bytes).ok();
            return Ok(SegmentScan {
                path,
                first,
                records: 0,
                len,
                damage: Some(damage),
                version: header.as_ref().map_or(0, |h| h.version),
                history: header.as_ref().and_then(|h| h.history),
                epoch: header.as_ref().and_then(|h| h.epoch),
            });
        }
    };
    let mut records = 0;
    while reader.next_record()?.is_some() {
        records += 1;
    }
    let damage = match reader.ended() {
        true => None,
        false => Some(tail_damage(&reader.rest()?, reader.at())),
    };
    Ok(SegmentScan {
        path,
        first,
        records,
        len: reader.len,
        damage,
        version: header.version,
        history: header.history,
        epoch: header.epoch,
    })
}
