//! The log: segment files of checksummed records, and a writer with group commit.
//!
//! A log is a directory of *segments*, `log-<first position:020>.vtlog`. A record is opaque
//! bytes (the server's encoded batch) with a *position*: 1, 2, 3, … across segments, dense and
//! never reused, so "everything after position P" is what a restart replays on top of a
//! snapshot taken at P.
//!
//! ## Format
//!
//! A segment starts with a 48-byte header, then records back to back:
//!
//! | bytes | field |
//! |---|---|
//! | `0..8` | magic [`LOG_MAGIC`] |
//! | `8..10` | format version, `u16` LE ([`LOG_VERSION`] = 2) |
//! | `10..12` | zero |
//! | `12..20` | position of its first record, `u64` LE |
//! | `20..36` | the history id of the data directory that wrote it ([`crate::history`]) |
//! | `36..44` | the journal epoch when the segment was made, `u64` LE (for inspection: a live restore changes the epoch within a segment) |
//! | `44..48` | CRC-32C of bytes `0..44` |
//!
//! Version 1 segments (a 24-byte header without history and epoch, its checksum at `20..24`)
//! are still read; a data directory accepts them only as files it held before it had a history.
//! Any other version is damage. A writer never appends to a segment of version 1 or of another
//! history: it starts a new one.
//!
//! | record bytes | field |
//! |---|---|
//! | `0..4` | payload length, `u32` LE (at most [`MAX_RECORD_BYTES`]) |
//! | `4..8` | CRC-32C of bytes `8..` of the record (position and payload) |
//! | `8..16` | position, `u64` LE |
//! | `16..` | payload |
//!
//! ## Damage: torn means torn
//!
//! Records are appended and synced in order, so a crash can only leave the *last* record of the
//! *newest* segment partly written: a **torn tail**. It was never acknowledged, and
//! [`LogDir::repair`] cuts it off. The bytes after the last intact record are a torn tail only
//! when they look like what a crash leaves and nothing else:
//!
//! the file ends *inside* the first of them — fewer bytes than a record header, or a record
//! header whose announced payload the file ends before — once the zeros at the very end are
//! discounted (a file system that extended the file but never wrote its data, as ext4 and XFS
//! may leave after a power loss, leaves zeros: a tail of only zeros is torn too), and no intact
//! record frame follows anywhere after them. Anything else — above all a
//! **complete** record (its whole announced length on disk) whose checksum fails — is
//! **corruption**, like a bad record before the tail, a bad or unknown-version segment header,
//! a position out of sequence or a missing segment. It can never be repaired silently: a complete
//! record was written whole, so it was very likely synced and acknowledged, and cutting it would
//! hand its position — and its offsets — to another batch. (RocksDB's absolute-consistency
//! recovery and etcd's WAL draw the same line.) What a scan cannot tell apart: a flipped bit in
//! the *length* of the last record that makes it announce more bytes than the file holds looks
//! torn; the end-of-log watermark below catches that case when the record was acknowledged.
//! [`LogDir::scan`] only reads; nothing in this module deletes a damaged file
//! ([`LogDir::set_aside`] renames it).
//!
//! ## The end of the log: a watermark outside the segments
//!
//! A segment that is deleted, emptied, or cut — at any byte, or exactly between two records —
//! leaves a log that scans clean. So the writer keeps, in the file `end` beside the segments
//! ([`Watermark`], 48 bytes, checksummed, with the history id), the first position of the
//! newest segment (`rolled_at`) and the last position made durable (`through`):
//!
//! - `rolled_at` is written and synced when the writer starts and at every roll, before any
//!   record of the new segment is written: a missing newest segment is always noticed.
//! - `through` is rewritten in place after each group commit's sync and before its appends are
//!   acknowledged, **without a sync of its own**: one `pwrite` per group, no extra `fsync` on the
//!   hot path. The operating system holds it from that moment, so after a crash of the process
//!   (`kill -9`, a panic) every acknowledged record is at or before `through`; after a power
//!   loss it is whatever the OS had flushed — never ahead of the log, possibly behind it.
//!
//! [`LogScan::end_problem`] says when the log ends before the watermark. What it cannot see: a
//! cut exactly at a record boundary after `through` (only possible after a power loss, for
//! records acknowledged after the OS last flushed the file), and a whole data directory rolled
//! back together (log and watermark from the same older backup).
//!
//! ## Group commit
//!
//! [`LogWriter`] owns the newest segment on a thread of its own. Appends queue up while it
//! writes and syncs; the next round takes every queued record, writes them with one write and
//! makes them durable with one `fdatasync`, then completes them all: a busy server pays one sync
//! for many batches. A failed write or sync *poisons* the writer — what reached the disk is
//! unknown, and retrying `fsync` on the same descriptor cannot be trusted — and every later
//! append fails until the log is reopened and scanned again.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use crate::history::HistoryId;
use std::sync::mpsc;
use std::thread::JoinHandle;

/// The first bytes of every segment.
pub const LOG_MAGIC: [u8; 8] = *b"\x89VTLOG\r\n";
/// The segment format this build writes (it reads this and version 1).
pub const LOG_VERSION: u16 = 2;
/// Largest record payload.
pub const MAX_RECORD_BYTES: usize = 64 << 20;
const SEGMENT_HEADER_LEN: usize = 48;
const SEGMENT_HEADER_LEN_V1: usize = 24;
/// The watermark's file in the log directory.
pub const WATERMARK_FILE: &str = "end";
const WATERMARK_MAGIC: [u8; 8] = *b"\x89VTEND\r\n";
const WATERMARK_LEN: usize = 48;
const RECORD_HEADER_LEN: usize = 16;
const SEGMENT_PREFIX: &str = "log-";
const SEGMENT_SUFFIX: &str = ".vtlog";
/// Most payload bytes one group commit writes.
const GROUP_BYTES: usize = 8 << 20;

/// What went wrong with a log.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LogError {
    /// Reading, writing or syncing a file failed.
    #[error("log I/O failed: {action} {}: {source}", path.display())]
    Io {
        /// What was being done.
        action: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// A payload over [`MAX_RECORD_BYTES`].
    #[error("log record of {0} bytes is over the limit of {MAX_RECORD_BYTES}")]
    TooLarge(usize),
    /// A write or sync failed (this one or an earlier one); nothing more is written until the
    /// log is reopened and scanned.
    #[error("the log is poisoned ({0}); nothing is written until it is reopened")]
    Poisoned(String),
    /// The writer's thread has stopped.
    #[error("the log writer has stopped")]
    Stopped,
}

impl LogError {
    fn io(action: &'static str, path: &Path, source: io::Error) -> Self {
        Self::Io {
            action,
            path: path.to_owned(),
            source,
        }
    }
}

/// How durable an acknowledged append is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Durability {
    /// Synced to the device (`fdatasync`) before it is acknowledged.
    Fsync,
    /// Handed to the operating system: survives a crash of the process, not of the machine.
    Os,
}

/// One record read back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogRecord {
    /// Its position.
    pub position: u64,
    /// Its payload.
    pub payload: Vec<u8>,
}

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
        /// Where the first bad byte range starts.
        offset: u64,
        /// What is wrong.
        reason: String,
    },
}

/// One segment as a scan found it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SegmentScan {
    /// The file.
    pub path: PathBuf,
    /// The position its name and header give for its first record.
    pub first: u64,
    /// Intact records, from `first`.
    pub records: u64,
    /// Its size on disk.
    pub len: u64,
    /// What is wrong with it, if anything.
    pub damage: Option<Damage>,
    /// Its format version (0: the header could not be read).
    pub version: u16,
    /// The history id its header carries (`None`: version 1, or no readable header).
    pub history: Option<HistoryId>,
    /// The journal epoch its header carries (`None`: version 1, or no readable header).
    pub epoch: Option<u64>,
}

impl SegmentScan {
    /// The position after its last intact record.
    pub fn next(&self) -> u64 {
        self.first + self.records
    }
}

/// What [`LogDir::scan`] found, oldest segment first.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LogScan {
    /// Every segment.
    pub segments: Vec<SegmentScan>,
}

impl LogScan {
    /// The position the next record takes, after the last intact one.
    pub fn next(&self) -> u64 {
        self.segments.last().map_or(1, SegmentScan::next)
    }

    /// Why the log ends before `mark` says it does — its newest segment missing, or records
    /// at or before `mark.through` missing — or `None`. See the module docs for what this can
    /// and cannot see.
    pub fn end_problem(&self, mark: &Watermark) -> Option<String> {
        let newest = self.segments.last().map_or(0, |s| s.first);
        if newest < mark.rolled_at {
            return Some(format!(
                "the newest segment started at position {}, but the newest one here starts at {newest} (segments are missing at the end)",
                mark.rolled_at
            ));
        }
        let last = self.next() - 1;
        (last < mark.through).then(|| {
            format!(
                "records through position {} were made durable, but the log ends at {last} (the end of the log is missing)",
                mark.through
            )
        })
    }

    /// The segments that do not belong to `history` (another data directory's, or a version-1
    /// segment it did not hold when it got its id): they must be set aside, never replayed.
    pub fn foreign<'a>(
        &'a self,
        history: &'a crate::history::DataHistory,
    ) -> impl Iterator<Item = &'a SegmentScan> + 'a {
        self.segments.iter().filter(move |segment| {
            segment.version != 0
                && !history.owns(segment.history, segment.first, history.legacy.log_through)
        })
    }

    /// The first damage that is not a torn tail of the newest segment, and where: the point up
    /// to which the log is proven. Segments must also follow each other without a hole.
    pub fn corruption(&self) -> Option<(PathBuf, String)> {
        self.first_damage()
            .map(|damage| (damage.path.clone(), damage.to_string()))
    }

    /// [`LogScan::corruption`], typed: what kind of damage, for a caller that decides by it.
    pub fn first_damage(&self) -> Option<LogDamage> {
        let last = self.segments.len().saturating_sub(1);
        let mut expected = self.segments.first().map(|s| s.first);
        for (i, segment) in self.segments.iter().enumerate() {
            let damage = |kind| {
                Some(LogDamage {
                    path: segment.path.clone(),
                    kind,
                })
            };
            if let Some(expected) = expected.filter(|e| *e != segment.first) {
                return damage(LogDamageKind::Missing {
                    starts: segment.first,
                    expected,
                });
            }
            match &segment.damage {
                Some(Damage::Corrupt { offset, reason }) => {
                    return damage(LogDamageKind::Corrupt {
                        offset: *offset,
                        reason: reason.clone(),
                    })
                }
                Some(Damage::TornTail { valid_len }) if i != last => {
                    return damage(LogDamageKind::TornBeforeTheEnd {
                        valid_len: *valid_len,
                    })
                }
                _ => {}
            }
            expected = Some(segment.next());
        }
        None
    }
}

/// Damage a scan found that no repair may cut: where, and what.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogDamage {
    /// The segment.
    pub path: PathBuf,
    /// What is wrong with it.
    pub kind: LogDamageKind,
}

/// What is wrong with a damaged segment.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum LogDamageKind {
    /// A segment before it is missing: it starts at `starts` where `expected` was next.
    Missing {
        /// Its first position.
        starts: u64,
        /// The position expected.
        expected: u64,
    },
    /// A record or header that fails its checks.
    Corrupt {
        /// Where in the file.
        offset: u64,
        /// What failed.
        reason: String,
    },
    /// It ends inside a record although a newer segment follows it.
    TornBeforeTheEnd {
        /// Its bytes up to the partial record.
        valid_len: u64,
    },
}

impl std::fmt::Display for LogDamage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.kind {
            LogDamageKind::Missing { starts, expected } => write!(
                f,
                "starts at position {starts} where {expected} was expected (a segment is missing)"
            ),
            LogDamageKind::Corrupt { offset, reason } => write!(f, "at byte {offset}: {reason}"),
            LogDamageKind::TornBeforeTheEnd { valid_len } => write!(
                f,
                "ends in a partial record at byte {valid_len}, but is not the newest segment"
            ),
        }
    }
}

/// A log directory.
#[derive(Debug)]
pub struct LogDir {
    dir: PathBuf,
}

impl LogDir {
    /// The log in `dir`, created if missing.
    ///
    /// # Errors
    /// The directory cannot be created.
    pub fn create(dir: impl Into<PathBuf>) -> Result<Self, LogError> {
        let dir = dir.into();
        fs::create_dir_all(&dir).map_err(|e| LogError::io("create directory", &dir, e))?;
        Ok(Self { dir })
    }

    /// The log in `dir`, which must exist; creates nothing (for inspection).
    ///
    /// # Errors
    /// `dir` is not a directory.
    pub fn open_existing(dir: impl Into<PathBuf>) -> Result<Self, LogError> {
        let dir = dir.into();
        let meta = fs::metadata(&dir).map_err(|e| LogError::io("open", &dir, e))?;
        if !meta.is_dir() {
            return Err(LogError::io(
                "open",
                &dir,
                io::ErrorKind::NotADirectory.into(),
            ));
        }
        Ok(Self { dir })
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// Reads every segment and reports what is intact and what is damaged. Changes nothing.
    ///
    /// # Errors
    /// [`LogError::Io`] naming the file that could not be read.
    pub fn scan(&self) -> Result<LogScan, LogError> {
        let mut segments = Vec::new();
        for (first, path) in self.segment_files()? {
            let bytes = fs::read(&path).map_err(|e| LogError::io("read", &path, e))?;
            segments.push(scan_segment(path, first, &bytes));
        }
        Ok(LogScan { segments })
    }

    /// Cuts a torn tail off the newest segment (and syncs it), as `scan` found it. Returns the
    /// bytes cut. Call it only when [`LogScan::corruption`] is `None`.
    ///
    /// # Errors
    /// The file cannot be truncated or synced.
    pub fn repair(&self, scan: &LogScan) -> Result<u64, LogError> {
        let Some(newest) = scan.segments.last() else {
            return Ok(0);
        };
        let Some(Damage::TornTail { valid_len }) = newest.damage else {
            return Ok(0);
        };
        let file = OpenOptions::new()
            .write(true)
            .open(&newest.path)
            .map_err(|e| LogError::io("open", &newest.path, e))?;
        file.set_len(valid_len)
            .map_err(|e| LogError::io("truncate", &newest.path, e))?;
        file.sync_all()
            .map_err(|e| LogError::io("sync", &newest.path, e))?;
        Ok(newest.len - valid_len)
    }

    /// Renames a damaged segment out of the log (`….vtlog.damaged`), keeping it for inspection.
    ///
    /// # Errors
    /// The rename or the directory sync fails.
    pub fn set_aside(&self, segment: &Path) -> Result<PathBuf, LogError> {
        self.set_aside_as(segment, ".damaged")
    }

    /// Renames a file out of the log, appending `suffix` to its name (`.damaged`, `.foreign`),
    /// keeping it for inspection.
    ///
    /// # Errors
    /// The rename or the directory sync fails.
    pub fn set_aside_as(&self, file: &Path, suffix: &str) -> Result<PathBuf, LogError> {
        let mut kept = file.as_os_str().to_owned();
        kept.push(suffix);
        let kept = PathBuf::from(kept);
        fs::rename(file, &kept).map_err(|e| LogError::io("rename", file, e))?;
        sync_dir(&self.dir)?;
        Ok(kept)
    }

    /// The watermark file's path.
    pub fn watermark_path(&self) -> PathBuf {
        self.dir.join(WATERMARK_FILE)
    }

    /// The end-of-log watermark: `Ok(None)` when there is none, `Ok(Some(Err(why)))` when the
    /// file is there but is not a valid watermark.
    ///
    /// # Errors
    /// The file exists and cannot be read.
    pub fn read_watermark(&self) -> Result<Option<Result<Watermark, String>>, LogError> {
        let path = self.watermark_path();
        match fs::read(&path) {
            Ok(bytes) => Ok(Some(Watermark::parse(&bytes))),
            Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(error) => Err(LogError::io("read", &path, error)),
        }
    }

    /// Removes every record after `position`: segments that start after it are deleted, the one
    /// holding it is cut after it (and synced). For records that were written but never made
    /// durable by a writer that then failed: they were never acknowledged. Fails if a segment
    /// up to `position` does not hold its records intact.
    ///
    /// # Errors
    /// A file cannot be read, cut, deleted or synced, or the records up to `position` are not
    /// intact.
    pub fn truncate_after(&self, position: u64) -> Result<(), LogError> {
        let mut newest = None;
        for (first, path) in self.segment_files()?.into_iter().rev() {
            if first > position {
                fs::remove_file(&path).map_err(|e| LogError::io("delete", &path, e))?;
                continue;
            }
            newest = Some(first);
            let bytes = fs::read(&path).map_err(|e| LogError::io("read", &path, e))?;
            let mut at = parse_header(&bytes, first).map_or(bytes.len(), |h| h.len);
            let mut next = first;
            while next <= position {
                let Some((_, len)) = record_at(&bytes, at, next) else {
                    return Err(LogError::io(
                        "cut",
                        &path,
                        io::Error::new(
                            io::ErrorKind::InvalidData,
                            format!("record {next} is not intact"),
                        ),
                    ));
                };
                at += len;
                next += 1;
            }
            let file = OpenOptions::new()
                .write(true)
                .open(&path)
                .map_err(|e| LogError::io("open", &path, e))?;
            file.set_len(at as u64)
                .and_then(|()| file.sync_all())
                .map_err(|e| LogError::io("cut", &path, e))?;
            break;
        }
        sync_dir(&self.dir)?;
        // The watermark follows: what was cut was never acknowledged.
        if let Some(Ok(mut mark)) = self.read_watermark()? {
            mark.rolled_at = mark.rolled_at.min(newest.unwrap_or(position + 1));
            mark.through = mark.through.min(position);
            mark.write(&self.watermark_path())?;
        }
        Ok(())
    }

    /// Sets every segment aside ([`LogDir::set_aside`]): the log starts over, its files kept.
    /// Returns where they went.
    ///
    /// # Errors
    /// Listing, a rename or the directory sync fails.
    pub fn set_aside_all(&self) -> Result<Vec<PathBuf>, LogError> {
        let mut kept: Vec<PathBuf> = self
            .segment_files()?
            .into_iter()
            .map(|(_, path)| self.set_aside(&path))
            .collect::<Result<_, _>>()?;
        let mark = self.watermark_path();
        if mark.exists() {
            kept.push(self.set_aside(&mark)?);
        }
        Ok(kept)
    }

    /// Syncs every segment to the device (what an earlier life wrote without syncing).
    ///
    /// # Errors
    /// A segment cannot be opened or synced.
    pub fn sync_all(&self) -> Result<(), LogError> {
        for (_, path) in self.segment_files()? {
            File::open(&path)
                .and_then(|file| file.sync_all())
                .map_err(|e| LogError::io("sync", &path, e))?;
        }
        sync_dir(&self.dir)
    }

    /// Segment files and their bytes on disk.
    ///
    /// # Errors
    /// Listing or reading a file's size fails.
    pub fn usage(&self) -> Result<(u64, u64), LogError> {
        let mut bytes = 0;
        let files = self.segment_files()?;
        for (_, path) in &files {
            bytes += fs::metadata(path)
                .map_err(|e| LogError::io("stat", path, e))?
                .len();
        }
        Ok((files.len() as u64, bytes))
    }

    /// Calls `visit` with every intact record after position `after`, in order, stopping at the
    /// first damage.
    ///
    /// # Errors
    /// A segment cannot be read, or `visit` fails (its error is returned).
    pub fn read_after<E: From<LogError>>(
        &self,
        after: u64,
        mut visit: impl FnMut(LogRecord) -> Result<(), E>,
    ) -> Result<(), E> {
        let files = self.segment_files()?;
        for (i, (first, path)) in files.iter().enumerate() {
            let next_first = files.get(i + 1).map(|(f, _)| *f);
            if next_first.is_some_and(|n| n <= after + 1) {
                continue; // every record of this segment is at or before `after`
            }
            let bytes = fs::read(path).map_err(|e| LogError::io("read", path, e))?;
            let Ok(header) = parse_header(&bytes, *first) else {
                return Ok(()); // a bad header: nothing in or after this segment is proven
            };
            let mut at = header.len;
            let mut position = *first;
            while let Some((payload, len)) = record_at(&bytes, at, position) {
                if position > after {
                    visit(LogRecord {
                        position,
                        payload: payload.to_vec(),
                    })?;
                }
                at += len;
                position += 1;
            }
            if at != bytes.len() {
                return Ok(()); // damage: nothing after it is proven
            }
        }
        Ok(())
    }

    /// Deletes the segments whose records are all at or before `position` (what the kept
    /// snapshots no longer need). The newest segment is never deleted. Returns how many were.
    ///
    /// # Errors
    /// Listing or deleting fails.
    pub fn delete_before(&self, position: u64) -> Result<usize, LogError> {
        let files = self.segment_files()?;
        let mut deleted = 0;
        for pair in files.windows(2) {
            let [(_, path), (next_first, _)] = pair else {
                continue;
            };
            if *next_first <= position + 1 {
                fs::remove_file(path).map_err(|e| LogError::io("delete", path, e))?;
                deleted += 1;
            }
        }
        if deleted > 0 {
            sync_dir(&self.dir)?;
        }
        Ok(deleted)
    }

    /// The segment files, by first position.
    fn segment_files(&self) -> Result<Vec<(u64, PathBuf)>, LogError> {
        let entries = fs::read_dir(&self.dir).map_err(|e| LogError::io("list", &self.dir, e))?;
        let mut files = Vec::new();
        for entry in entries {
            let entry = entry.map_err(|e| LogError::io("list", &self.dir, e))?;
            let name = entry.file_name();
            let first = name
                .to_str()
                .and_then(|n| n.strip_prefix(SEGMENT_PREFIX)?.strip_suffix(SEGMENT_SUFFIX))
                .filter(|digits| digits.len() == 20)
                .and_then(|digits| digits.parse::<u64>().ok());
            if let Some(first) = first {
                files.push((first, entry.path()));
            }
        }
        files.sort();
        Ok(files)
    }

    fn segment_path(&self, first: u64) -> PathBuf {
        self.dir
            .join(format!("{SEGMENT_PREFIX}{first:020}{SEGMENT_SUFFIX}"))
    }
}

/// Checks one segment's bytes.
fn scan_segment(path: PathBuf, first: u64, bytes: &[u8]) -> SegmentScan {
    let len = bytes.len() as u64;
    let header = match parse_header(bytes, first) {
        Ok(header) => header,
        Err(reason) => {
            // A new segment whose header never reached the disk whole holds no record yet.
            let damage = if torn_header(bytes, first) {
                Damage::TornTail { valid_len: 0 }
            } else {
                Damage::Corrupt { offset: 0, reason }
            };
            return SegmentScan {
                path,
                first,
                records: 0,
                len,
                damage: Some(damage),
                version: 0,
                history: None,
                epoch: None,
            };
        }
    };
    let mut at = header.len;
    let mut records = 0;
    while let Some((_, record_len)) = record_at(bytes, at, first + records) {
        at += record_len;
        records += 1;
    }
    let damage = (at != bytes.len()).then(|| tail_damage(bytes, at));
    SegmentScan {
        path,
        first,
        records,
        len,
        damage,
        version: header.version,
        history: header.history,
        epoch: header.epoch,
    }
}

/// What the bytes from `at` (after the last intact record) are: a torn tail only when the file
/// ends inside a record or they are all zeros, and no intact record follows (module docs).
fn tail_damage(bytes: &[u8], at: usize) -> Damage {
    let rest = &bytes[at..];
    if (at + 1..bytes.len()).any(|from| frame_at(bytes, from).is_some()) {
        return Damage::Corrupt {
            offset: at as u64,
            reason: "a bad record with intact records after it".to_owned(),
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
        return Damage::TornTail {
            valid_len: at as u64,
        };
    }
    Damage::Corrupt {
        offset: at as u64,
        reason: "a complete record fails its checksum or is out of sequence (damage, not a torn write: it was written whole)".to_owned(),
    }
}

/// Whether `bytes`, shorter than a header, are what a crash while creating the segment leaves:
/// zeros, or the start of the header this build writes for `first`.
fn torn_header(bytes: &[u8], first: u64) -> bool {
    if bytes.len() >= SEGMENT_HEADER_LEN {
        return false;
    }
    let known = segment_header(first, &Lineage::default());
    let fixed = bytes.len().min(20); // magic, version, zero, first: what does not vary
    bytes.iter().all(|&b| b == 0) || bytes[..fixed] == known[..fixed]
}

/// A parsed segment header.
struct Header {
    version: u16,
    history: Option<HistoryId>,
    epoch: Option<u64>,
    /// Where its first record starts.
    len: usize,
}

/// Parses and checks a segment header: magic, version (1 or 2), length, checksum, and that it
/// names `first`, as the file name does.
fn parse_header(bytes: &[u8], first: u64) -> Result<Header, String> {
    let magic = bytes.len().min(LOG_MAGIC.len());
    if bytes[..magic] != LOG_MAGIC[..magic] {
        return Err("not a viewtape log segment (bad magic)".to_owned());
    }
    let Some(version) = bytes.get(8..10).map(|v| u16::from_le_bytes([v[0], v[1]])) else {
        return Err("shorter than a segment header".to_owned());
    };
    let len = match version {
        1 => SEGMENT_HEADER_LEN_V1,
        LOG_VERSION => SEGMENT_HEADER_LEN,
        _ => {
            return Err(format!(
                "segment format version {version}; this build reads 1 and {LOG_VERSION}"
            ))
        }
    };
    let Some(header) = bytes.get(..len) else {
        return Err("shorter than a segment header".to_owned());
    };
    if crc32c::crc32c(&header[..len - 4]) != u32_at(header, len - 4) {
        return Err("segment header checksum mismatch".to_owned());
    }
    let named = u64_at(header, 12);
    if named != first {
        return Err(format!(
            "header says first position {named}, the name says {first}"
        ));
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
        version,
        history,
        epoch,
        len,
    })
}

/// An intact record frame at `at`: its position, payload and length.
fn frame_at(bytes: &[u8], at: usize) -> Option<(u64, &[u8], usize)> {
    let head = bytes.get(at..at.checked_add(RECORD_HEADER_LEN)?)?;
    let payload_len = u32_at(head, 0) as usize;
    if payload_len > MAX_RECORD_BYTES {
        return None;
    }
    let end = at + RECORD_HEADER_LEN + payload_len;
    let covered = bytes.get(at + 8..end)?;
    (crc32c::crc32c(covered) == u32_at(head, 4)).then(|| {
        (
            u64_at(head, 8),
            &bytes[at + RECORD_HEADER_LEN..end],
            end - at,
        )
    })
}

/// The intact record at `at` if it has position `position`.
fn record_at(bytes: &[u8], at: usize, position: u64) -> Option<(&[u8], usize)> {
    frame_at(bytes, at)
        .filter(|(found, _, _)| *found == position)
        .map(|(_, payload, len)| (payload, len))
}

fn u32_at(bytes: &[u8], at: usize) -> u32 {
    let mut b = [0u8; 4];
    b.copy_from_slice(&bytes[at..at + 4]);
    u32::from_le_bytes(b)
}

fn u64_at(bytes: &[u8], at: usize) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&bytes[at..at + 8]);
    u64::from_le_bytes(b)
}

fn sync_dir(dir: &Path) -> Result<(), LogError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| LogError::io("sync directory", dir, e))
}

/// Appends `position` and `payload` as one record frame to `out`.
fn put_record(out: &mut Vec<u8>, position: u64, payload: &[u8]) {
    let start = out.len();
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    out.extend_from_slice(&[0; 4]);
    out.extend_from_slice(&position.to_le_bytes());
    out.extend_from_slice(payload);
    let crc = crc32c::crc32c(&out[start + 8..]);
    out[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
}

/// How a [`LogWriter`] writes.
#[derive(Clone, Copy, Debug)]
pub struct WriterOptions {
    /// When an append is acknowledged.
    pub durability: Durability,
    /// A new segment starts once the current one holds this many bytes.
    pub segment_bytes: u64,
    /// What every new segment's header carries.
    pub lineage: Lineage,
    /// Keep the end-of-log [`Watermark`] (module docs). Off only to measure what it costs.
    pub watermark: bool,
}

impl Default for WriterOptions {
    fn default() -> Self {
        Self {
            durability: Durability::Fsync,
            segment_bytes: 64 << 20,
            lineage: Lineage::default(),
            watermark: true,
        }
    }
}

/// What a segment header says about where its records come from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Lineage {
    /// The data directory's history id.
    pub history: Option<HistoryId>,
    /// The journal epoch when the segment is made.
    pub epoch: u64,
}

/// The end of the log as the writer last recorded it, outside the segments (module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Watermark {
    /// The history id of the log that wrote it.
    pub history: Option<HistoryId>,
    /// The first position of the newest segment.
    pub rolled_at: u64,
    /// The last position made durable (0: none yet).
    pub through: u64,
}

impl Watermark {
    fn to_bytes(self) -> [u8; WATERMARK_LEN] {
        let mut out = [0u8; WATERMARK_LEN];
        out[..8].copy_from_slice(&WATERMARK_MAGIC);
        out[8..10].copy_from_slice(&1u16.to_le_bytes());
        out[12..28].copy_from_slice(&HistoryId::bytes_of(self.history));
        out[28..36].copy_from_slice(&self.rolled_at.to_le_bytes());
        out[36..44].copy_from_slice(&self.through.to_le_bytes());
        let crc = crc32c::crc32c(&out[..44]);
        out[44..].copy_from_slice(&crc.to_le_bytes());
        out
    }

    fn parse(bytes: &[u8]) -> Result<Self, String> {
        if bytes.len() != WATERMARK_LEN || bytes[..8] != WATERMARK_MAGIC {
            return Err("not a viewtape log watermark".to_owned());
        }
        if u16::from_le_bytes([bytes[8], bytes[9]]) != 1 {
            return Err("unknown watermark version".to_owned());
        }
        if crc32c::crc32c(&bytes[..44]) != u32_at(bytes, 44) {
            return Err("watermark checksum mismatch".to_owned());
        }
        let mut id = [0u8; 16];
        id.copy_from_slice(&bytes[12..28]);
        Ok(Self {
            history: HistoryId::from_bytes(id),
            rolled_at: u64_at(bytes, 28),
            through: u64_at(bytes, 36),
        })
    }

    /// Writes it to `path` and syncs it.
    fn write(self, path: &Path) -> Result<(), LogError> {
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

/// Called once an append is durable (with the position of its first record) or has failed.
pub type Completion = Box<dyn FnOnce(Result<u64, LogError>) + Send>;

/// What one group commit did, for the writer's observer (metrics).
#[derive(Clone, Copy, Debug)]
pub struct GroupWritten {
    /// Records written.
    pub records: u64,
    /// Bytes written (record framing included).
    pub bytes: u64,
    /// How long the `fdatasync` took, when there was one.
    pub sync: Option<std::time::Duration>,
    /// The position after the last record written.
    pub next: u64,
    /// Whether the group started a new segment.
    pub new_segment: bool,
}

/// Told about every group the writer made durable (on the writer's thread; keep it short).
pub type Observer = Box<dyn FnMut(GroupWritten) + Send>;

struct Append {
    payloads: Vec<Vec<u8>>,
    done: Completion,
}

/// Appends records to a log with group commit; see the module docs. Dropping it stops the
/// writer after the queued appends.
pub struct LogWriter {
    queue: Option<mpsc::Sender<Append>>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for LogWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogWriter").finish_non_exhaustive()
    }
}

impl LogWriter {
    /// Starts writing `log` at position `next` (what a scan, and a repair, left), in its newest
    /// segment or a new one.
    ///
    /// # Errors
    /// The segment cannot be opened or created.
    pub fn start(
        log: &LogDir,
        next: u64,
        options: WriterOptions,
        observer: Observer,
    ) -> Result<Self, LogError> {
        let files = log.segment_files()?;
        let lineage = options.lineage;
        let (file, path, len, rolled_at) = match files.last() {
            Some((first, path)) => {
                let mut file = OpenOptions::new()
                    .append(true)
                    .read(true)
                    .open(path)
                    .map_err(|e| LogError::io("open", path, e))?;
                let mut head = Vec::with_capacity(SEGMENT_HEADER_LEN);
                (&mut file)
                    .take(SEGMENT_HEADER_LEN as u64)
                    .read_to_end(&mut head)
                    .map_err(|e| LogError::io("read", path, e))?;
                let len = file
                    .seek(SeekFrom::End(0))
                    .map_err(|e| LogError::io("seek", path, e))?;
                // Appended to only when it is of this format and history.
                let continues = parse_header(&head, *first).is_ok_and(|header| {
                    header.version == LOG_VERSION && header.history == lineage.history
                });
                if continues {
                    (file, path.clone(), len, *first)
                } else {
                    let (file, path, len) = new_segment_file(log, next, &lineage)?;
                    (file, path, len, next)
                }
            }
            None => {
                let (file, path, len) = new_segment_file(log, next, &lineage)?;
                (file, path, len, next)
            }
        };
        let mark = match options.watermark {
            true => {
                let mark = Watermark {
                    history: lineage.history,
                    rolled_at,
                    through: next.saturating_sub(1),
                };
                let path = log.watermark_path();
                mark.write(&path)?;
                sync_dir(&log.dir)?;
                Some(
                    OpenOptions::new()
                        .write(true)
                        .open(&path)
                        .map_err(|e| LogError::io("open", &path, e))?,
                )
            }
            false => None,
        };
        let (queue, appends) = mpsc::channel::<Append>();
        let mut state = WriterState {
            dir: LogDir {
                dir: log.dir.clone(),
            },
            file,
            path,
            len,
            next,
            options,
            poisoned: None,
            observer,
            mark,
            rolled_at,
        };
        let thread = std::thread::Builder::new()
            .name("viewtape-log".into())
            .spawn(move || state.run(&appends))
            .map_err(|e| LogError::io("start the writer for", &log.dir, e))?;
        Ok(Self {
            queue: Some(queue),
            thread: Some(thread),
        })
    }

    /// Queues `payload`; `done` is called, on the writer's thread, once it is durable (with its
    /// position) or has failed. Keep `done` short: it delays the next group.
    pub fn append(&self, payload: Vec<u8>, done: Completion) {
        self.append_all(vec![payload], done);
    }

    /// Queues `payloads` as consecutive records, made durable together; `done` is called with
    /// the position of the first once all are durable, or with the failure.
    pub fn append_all(&self, payloads: Vec<Vec<u8>>, done: Completion) {
        if let Some(big) = payloads.iter().find(|p| p.len() > MAX_RECORD_BYTES) {
            return done(Err(LogError::TooLarge(big.len())));
        }
        let Some(queue) = &self.queue else {
            return done(Err(LogError::Stopped));
        };
        if let Err(mpsc::SendError(append)) = queue.send(Append { payloads, done }) {
            (append.done)(Err(LogError::Stopped));
        }
    }
}

impl Drop for LogWriter {
    fn drop(&mut self) {
        self.queue = None;
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The header of the segment whose first record has position `first`.
fn segment_header(first: u64, lineage: &Lineage) -> Vec<u8> {
    let mut header = Vec::with_capacity(SEGMENT_HEADER_LEN);
    header.extend_from_slice(&LOG_MAGIC);
    header.extend_from_slice(&LOG_VERSION.to_le_bytes());
    header.extend_from_slice(&[0, 0]);
    header.extend_from_slice(&first.to_le_bytes());
    header.extend_from_slice(&HistoryId::bytes_of(lineage.history));
    header.extend_from_slice(&lineage.epoch.to_le_bytes());
    let crc = crc32c::crc32c(&header);
    header.extend_from_slice(&crc.to_le_bytes());
    header
}

fn new_segment_file(
    log: &LogDir,
    first: u64,
    lineage: &Lineage,
) -> Result<(File, PathBuf, u64), LogError> {
    let path = log.segment_path(first);
    let header = segment_header(first, lineage);
    let mut file = OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .read(true)
        .open(&path)
        .map_err(|e| LogError::io("create", &path, e))?;
    file.write_all(&header)
        .and_then(|()| file.sync_all())
        .map_err(|e| LogError::io("write", &path, e))?;
    sync_dir(&log.dir)?;
    Ok((file, path, SEGMENT_HEADER_LEN as u64))
}

struct WriterState {
    dir: LogDir,
    file: File,
    path: PathBuf,
    len: u64,
    next: u64,
    options: WriterOptions,
    /// Why writing stopped for good, once it has.
    poisoned: Option<String>,
    observer: Observer,
    /// The watermark's file, when kept.
    mark: Option<File>,
    /// The first position of the segment being written.
    rolled_at: u64,
}

impl WriterState {
    fn run(&mut self, appends: &mpsc::Receiver<Append>) {
        let mut group = Vec::new();
        let mut bytes = Vec::new();
        let size = |append: &Append| append.payloads.iter().map(Vec::len).sum::<usize>();
        while let Ok(first) = appends.recv() {
            let mut queued = size(&first);
            group.push(first);
            // Everything queued meanwhile shares this round's write and sync (up to 8 MiB).
            while queued < GROUP_BYTES {
                let Ok(append) = appends.try_recv() else {
                    break;
                };
                queued += size(&append);
                group.push(append);
            }
            bytes.clear();
            let mut position = self.next;
            let result = self.write_group(&group, &mut bytes);
            for append in group.drain(..) {
                let outcome = match &result {
                    Ok(()) => Ok(position),
                    Err(reason) => Err(LogError::Poisoned(reason.clone())),
                };
                position += append.payloads.len() as u64;
                (append.done)(outcome);
            }
        }
        // Stopping: the watermark goes to the device with the rest (best effort: a later start
        // needs it only to be no further than the log, which it never is).
        if let Some(mark) = &self.mark {
            let _ = mark.sync_data();
        }
    }

    /// Rewrites the watermark in place, when kept: the newest segment's first position and the
    /// last position written; synced when `sync`.
    fn mark_end(&mut self, sync: bool) -> Result<(), LogError> {
        let Some(file) = &self.mark else {
            return Ok(());
        };
        let mark = Watermark {
            history: self.options.lineage.history,
            rolled_at: self.rolled_at,
            through: self.next - 1,
        };
        file.write_all_at(&mark.to_bytes(), 0)
            .and_then(|()| if sync { file.sync_data() } else { Ok(()) })
            .map_err(|e| LogError::io("write", &self.dir.watermark_path(), e))
    }

    /// Writes and (with [`Durability::Fsync`]) syncs one group; the first failure poisons.
    fn write_group(&mut self, group: &[Append], bytes: &mut Vec<u8>) -> Result<(), String> {
        if let Some(reason) = &self.poisoned {
            return Err(reason.clone());
        }
        let written = self.try_write_group(group, bytes);
        if let Err(error) = &written {
            self.poisoned = Some(error.to_string());
        }
        written.map_err(|error| error.to_string())
    }

    fn try_write_group(&mut self, group: &[Append], bytes: &mut Vec<u8>) -> Result<(), LogError> {
        let new_segment = self.len >= self.options.segment_bytes;
        if new_segment {
            (self.file, self.path, self.len) =
                new_segment_file(&self.dir, self.next, &self.options.lineage)?;
            // Synced before any record of the new segment exists: its loss is always noticed.
            self.rolled_at = self.next;
            self.mark_end(true)?;
        }
        let mut records = 0;
        for payload in group.iter().flat_map(|append| &append.payloads) {
            put_record(bytes, self.next + records, payload);
            records += 1;
        }
        self.file
            .write_all(bytes)
            .map_err(|e| LogError::io("write", &self.path, e))?;
        let sync = if self.options.durability == Durability::Fsync {
            let started = std::time::Instant::now();
            self.file
                .sync_data()
                .map_err(|e| LogError::io("sync", &self.path, e))?;
            Some(started.elapsed())
        } else {
            None
        };
        self.len += bytes.len() as u64;
        self.next += records;
        // Before the appends are acknowledged; no sync of its own (module docs).
        self.mark_end(false)?;
        (self.observer)(GroupWritten {
            records,
            bytes: bytes.len() as u64,
            sync,
            next: self.next,
            new_segment,
        });
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use proptest::prelude::*;

    use super::*;

    type TestResult = Result<(), Box<dyn std::error::Error>>;

    /// Appends every payload, one at a time (one record per group: segments rotate finely).
    fn append_each(writer: &LogWriter, payloads: Vec<Vec<u8>>) -> Vec<(u64, Vec<u8>)> {
        payloads
            .into_iter()
            .map(|payload| {
                let (tx, rx) = mpsc::channel();
                writer.append(
                    payload.clone(),
                    Box::new(move |result| {
                        let _ = tx.send(result);
                    }),
                );
                (rx.recv().expect("completion").expect("appended"), payload)
            })
            .collect()
    }

    /// Appends every payload from four threads at once; returns the positions given.
    fn append_all(writer: &LogWriter, payloads: Vec<Vec<u8>>) -> Vec<(u64, Vec<u8>)> {
        let given = Arc::new(Mutex::new(Vec::new()));
        let (done_tx, done_rx) = mpsc::channel();
        let n = payloads.len();
        std::thread::scope(|scope| {
            for chunk in payloads.chunks(n.div_ceil(4).max(1)) {
                let (given, done_tx) = (Arc::clone(&given), done_tx.clone());
                scope.spawn(move || {
                    for payload in chunk {
                        let (given, done_tx, copy) =
                            (Arc::clone(&given), done_tx.clone(), payload.clone());
                        writer.append(
                            payload.clone(),
                            Box::new(move |result| {
                                let position = result.expect("appended");
                                given.lock().expect("lock").push((position, copy));
                                let _ = done_tx.send(());
                            }),
                        );
                    }
                });
            }
        });
        for _ in 0..n {
            done_rx.recv().expect("completion");
        }
        let mut given = given.lock().expect("lock").clone();
        given.sort();
        given
    }

    fn read_all(log: &LogDir, after: u64) -> Result<Vec<LogRecord>, LogError> {
        let mut records = Vec::new();
        log.read_after(after, |record| {
            records.push(record);
            Ok::<_, LogError>(())
        })?;
        Ok(records)
    }

    fn payloads(n: usize) -> Vec<Vec<u8>> {
        (0..n)
            .map(|i| format!("batch {i}").repeat(i % 7 + 1).into_bytes())
            .collect()
    }

    fn small_segments() -> WriterOptions {
        WriterOptions {
            segment_bytes: 2_000,
            ..WriterOptions::default()
        }
    }

    #[test]
    fn concurrent_appends_get_dense_positions_and_read_back_in_order() -> TestResult {
        let tmp = tempfile::tempdir()?;
        let log = LogDir::create(tmp.path())?;
        let writer = LogWriter::start(&log, 1, small_segments(), Box::new(|_| {}))?;
        let mut given = append_all(&writer, payloads(300));
        given.extend(append_each(&writer, payloads(60)));
        drop(writer);
        let positions: Vec<u64> = given.iter().map(|(p, _)| *p).collect();
        assert_eq!(positions, (1..=360).collect::<Vec<_>>());
        let scan = log.scan()?;
        assert!(scan.segments.len() >= 3, "rotated: {}", scan.segments.len());
        assert_eq!(scan.corruption(), None);
        assert_eq!(scan.next(), 361);
        let read = read_all(&log, 0)?;
        assert_eq!(read.len(), 360);
        for (record, (position, payload)) in read.iter().zip(&given) {
            assert_eq!((record.position, &record.payload), (*position, payload));
        }
        assert_eq!(read_all(&log, 250)?.first().map(|r| r.position), Some(251));
        // A reopened writer continues the numbering.
        let writer = LogWriter::start(&log, scan.next(), small_segments(), Box::new(|_| {}))?;
        let more = append_all(&writer, payloads(5));
        assert_eq!(more.first().map(|(p, _)| *p), Some(361));
        Ok(())
    }

    #[test]
    fn a_multi_record_append_is_consecutive_and_observed() -> TestResult {
        let tmp = tempfile::tempdir()?;
        let log = LogDir::create(tmp.path())?;
        let seen = Arc::new(Mutex::new(Vec::new()));
        let observer = {
            let seen = Arc::clone(&seen);
            Box::new(move |group: GroupWritten| seen.lock().expect("lock").push(group))
        };
        let writer = LogWriter::start(&log, 7, WriterOptions::default(), observer)?;
        let (tx, rx) = mpsc::channel();
        writer.append_all(
            vec![b"a".to_vec(), b"b".to_vec(), b"c".to_vec()],
            Box::new(move |result| {
                let _ = tx.send(result);
            }),
        );
        assert_eq!(rx.recv()?.map_err(|e| e.to_string())?, 7);
        drop(writer);
        let read = read_all(&log, 0)?;
        let got: Vec<_> = read
            .iter()
            .map(|r| (r.position, r.payload.clone()))
            .collect();
        assert_eq!(
            got,
            vec![(7, b"a".to_vec()), (8, b"b".to_vec()), (9, b"c".to_vec())]
        );
        let seen = seen.lock().expect("lock");
        assert_eq!(seen.len(), 1);
        assert_eq!((seen[0].records, seen[0].next), (3, 10));
        assert!(seen[0].sync.is_some(), "fsync durability syncs");
        Ok(())
    }

    #[test]
    fn truncate_after_leaves_exactly_the_records_up_to_a_position() -> TestResult {
        let tmp = tempfile::tempdir()?;
        let log = LogDir::create(tmp.path())?;
        let writer = LogWriter::start(&log, 1, small_segments(), Box::new(|_| {}))?;
        append_each(&writer, payloads(200));
        drop(writer);
        assert!(log.scan()?.segments.len() >= 3);
        // A write cut short after it, too.
        let newest = log
            .segment_files()?
            .last()
            .map(|(_, p)| p.clone())
            .ok_or("none")?;
        OpenOptions::new()
            .append(true)
            .open(&newest)?
            .write_all(b"\x10\x00")?;
        log.truncate_after(95)?;
        let scan = log.scan()?;
        assert_eq!((scan.next(), scan.corruption()), (96, None));
        assert_eq!(read_all(&log, 0)?.len(), 95);
        let writer = LogWriter::start(&log, 96, small_segments(), Box::new(|_| {}))?;
        let more = append_each(&writer, payloads(3));
        assert_eq!(more.first().map(|(p, _)| *p), Some(96));
        drop(writer);
        assert_eq!(log.scan()?.corruption(), None);
        Ok(())
    }

    #[test]
    fn a_torn_tail_is_cut_and_the_log_continues() -> TestResult {
        let tmp = tempfile::tempdir()?;
        let log = LogDir::create(tmp.path())?;
        let writer = LogWriter::start(&log, 1, WriterOptions::default(), Box::new(|_| {}))?;
        append_all(&writer, payloads(10));
        drop(writer);
        let newest = log
            .scan()?
            .segments
            .last()
            .ok_or("no segment")?
            .path
            .clone();
        // Half a record, then zeros a crashed file system may leave.
        let mut file = OpenOptions::new().append(true).open(&newest)?;
        file.write_all(&[30, 0, 0, 0, 1, 2, 3, 4, 11, 0, 0])?;
        file.write_all(&[0; 100])?;
        let scan = log.scan()?;
        assert_eq!(scan.corruption(), None);
        assert!(matches!(
            scan.segments.last().and_then(|s| s.damage.clone()),
            Some(Damage::TornTail { .. })
        ));
        assert_eq!(scan.next(), 11);
        assert_eq!(log.repair(&scan)?, 111);
        assert_eq!(
            log.scan()?.segments.last().and_then(|s| s.damage.clone()),
            None
        );
        let writer = LogWriter::start(
            &log,
            scan.next(),
            WriterOptions::default(),
            Box::new(|_| {}),
        )?;
        append_all(&writer, payloads(1));
        drop(writer);
        assert_eq!(read_all(&log, 0)?.len(), 11);
        Ok(())
    }

    #[test]
    fn corruption_before_the_tail_and_missing_segments_are_never_repaired() -> TestResult {
        let tmp = tempfile::tempdir()?;
        let log = LogDir::create(tmp.path())?;
        let writer = LogWriter::start(&log, 1, small_segments(), Box::new(|_| {}))?;
        append_each(&writer, payloads(100));
        drop(writer);
        let scan = log.scan()?;
        let newest = scan.segments.last().ok_or("no segment")?;
        // A flipped byte inside the newest segment's first record.
        let mut bytes = fs::read(&newest.path)?;
        bytes[SEGMENT_HEADER_LEN + 20] ^= 0x40;
        fs::write(&newest.path, &bytes)?;
        let (path, reason) = log.scan()?.corruption().ok_or("not detected")?;
        assert_eq!(path, newest.path);
        assert!(reason.contains("intact records after it"), "{reason}");
        // Reading stops at the damage: nothing after it is served.
        assert_eq!(read_all(&log, 0)?.len() as u64, newest.first - 1);

        // A missing middle segment.
        let tmp = tempfile::tempdir()?;
        let log = LogDir::create(tmp.path())?;
        let writer = LogWriter::start(&log, 1, small_segments(), Box::new(|_| {}))?;
        append_each(&writer, payloads(100));
        drop(writer);
        let middle = log.scan()?.segments[1].path.clone();
        fs::remove_file(&middle)?;
        let (_, reason) = log.scan()?.corruption().ok_or("not detected")?;
        assert!(reason.contains("missing"), "{reason}");
        let kept = log.set_aside(&log.scan()?.segments[1].path)?;
        assert!(kept.exists());
        Ok(())
    }

    #[test]
    fn old_segments_are_deleted_once_no_snapshot_needs_them() -> TestResult {
        let tmp = tempfile::tempdir()?;
        let log = LogDir::create(tmp.path())?;
        let writer = LogWriter::start(&log, 1, small_segments(), Box::new(|_| {}))?;
        append_each(&writer, payloads(100));
        drop(writer);
        let before = log.scan()?.segments;
        let keep_from = before[2].first; // a snapshot at position keep_from - 1
        assert_eq!(log.delete_before(keep_from - 1)?, 2);
        let after = log.scan()?;
        assert_eq!(after.segments.first().map(|s| s.first), Some(keep_from));
        assert_eq!(after.corruption(), None);
        assert_eq!(read_all(&log, keep_from - 1)?.len() as u64, 101 - keep_from);
        Ok(())
    }

    fn segment_paths(log: &LogDir) -> Vec<PathBuf> {
        log.segment_files()
            .expect("list")
            .into_iter()
            .map(|(_, p)| p)
            .collect()
    }

    fn watermark(log: &LogDir) -> Watermark {
        log.read_watermark()
            .expect("read")
            .expect("a watermark")
            .expect("valid")
    }

    #[test]
    fn a_complete_last_record_that_fails_its_checksum_is_damage_not_a_torn_write() -> TestResult {
        let tmp = tempfile::tempdir()?;
        let log = LogDir::create(tmp.path())?;
        let writer = LogWriter::start(&log, 1, WriterOptions::default(), Box::new(|_| {}))?;
        append_each(&writer, payloads(5));
        drop(writer);
        let path = segment_paths(&log).pop().ok_or("no segment")?;
        let bytes = fs::read(&path)?;
        let last_len = RECORD_HEADER_LEN + payloads(5)[4].len();
        let at = bytes.len() - last_len;
        // Every byte but the length field: the record is whole on disk, so it is damage.
        for i in at + 4..bytes.len() {
            let mut bad = bytes.clone();
            bad[i] ^= 0x10;
            fs::write(&path, &bad)?;
            let scan = log.scan()?;
            let (_, reason) = scan.corruption().ok_or(format!("byte {i}: not detected"))?;
            assert!(reason.contains("complete record"), "{reason}");
        }
        // The length field: announcing more than the file holds looks torn, and the watermark
        // says the log ends too early.
        let mut bad = bytes.clone();
        bad[at + 2] ^= 0x01;
        fs::write(&path, &bad)?;
        let scan = log.scan()?;
        assert_eq!(scan.corruption(), None);
        assert!(scan.end_problem(&watermark(&log)).is_some());
        // A zero-filled tail, and a partial record ending in zeros, are torn.
        for tail in [
            vec![0u8; 300],
            [&bytes[at..at + 9], &[0u8; 200][..]].concat(),
        ] {
            fs::write(&path, [&bytes[..], &tail].concat())?;
            let scan = log.scan()?;
            assert_eq!(scan.corruption(), None);
            assert_eq!(scan.next(), 6);
            assert_eq!(scan.end_problem(&watermark(&log)), None);
        }
        Ok(())
    }

    #[test]
    fn a_segment_header_of_an_unknown_version_is_damage_and_nothing_of_it_is_read() -> TestResult {
        let tmp = tempfile::tempdir()?;
        let log = LogDir::create(tmp.path())?;
        let writer = LogWriter::start(&log, 1, small_segments(), Box::new(|_| {}))?;
        append_each(&writer, payloads(100));
        drop(writer);
        let newest = log.scan()?.segments.last().ok_or("none")?.clone();
        let mut bytes = fs::read(&newest.path)?;
        bytes[8] = 9;
        let crc = crc32c::crc32c(&bytes[..44]);
        bytes[44..48].copy_from_slice(&crc.to_le_bytes());
        fs::write(&newest.path, &bytes)?;
        let (_, reason) = log.scan()?.corruption().ok_or("not detected")?;
        assert!(reason.contains("version 9"), "{reason}");
        assert_eq!(read_all(&log, 0)?.len() as u64, newest.first - 1);
        Ok(())
    }

    #[test]
    fn segments_carry_their_history_and_epoch_and_version_1_is_still_read() -> TestResult {
        let tmp = tempfile::tempdir()?;
        let log = LogDir::create(tmp.path())?;
        // A version-1 segment, as builds before history ids wrote it.
        let mut v1 = LOG_MAGIC.to_vec();
        v1.extend_from_slice(&1u16.to_le_bytes());
        v1.extend_from_slice(&[0, 0]);
        v1.extend_from_slice(&1u64.to_le_bytes());
        let crc = crc32c::crc32c(&v1);
        v1.extend_from_slice(&crc.to_le_bytes());
        for (i, payload) in payloads(3).iter().enumerate() {
            put_record(&mut v1, i as u64 + 1, payload);
        }
        fs::write(log.segment_path(1), &v1)?;
        let scan = log.scan()?;
        assert_eq!((scan.next(), scan.corruption()), (4, None));
        assert_eq!(
            (scan.segments[0].version, scan.segments[0].history),
            (1, None)
        );
        assert_eq!(read_all(&log, 0)?.len(), 3);

        let history = crate::history::DataHistory::new(crate::history::Legacy {
            log_through: Some(1),
            snapshot_seq: None,
        });
        assert_eq!(
            scan.foreign(&history).count(),
            0,
            "held when the id was made"
        );
        let stranger = crate::history::DataHistory::new(crate::history::Legacy::default());
        assert_eq!(scan.foreign(&stranger).count(), 1);

        // The writer does not append to it: a new segment, of this history and epoch.
        let options = WriterOptions {
            lineage: Lineage {
                history: Some(history.id),
                epoch: 77,
            },
            ..WriterOptions::default()
        };
        let writer = LogWriter::start(&log, 4, options, Box::new(|_| {}))?;
        append_each(&writer, payloads(2));
        drop(writer);
        let scan = log.scan()?;
        assert_eq!(scan.segments.len(), 2);
        let newest = &scan.segments[1];
        assert_eq!(
            (newest.first, newest.version, newest.history, newest.epoch),
            (4, 2, Some(history.id), Some(77))
        );
        assert_eq!(scan.foreign(&history).count(), 0);
        assert_eq!(scan.foreign(&stranger).count(), 2);
        assert_eq!(read_all(&log, 0)?.len(), 5);
        let mark = watermark(&log);
        assert_eq!(
            (mark.history, mark.rolled_at, mark.through),
            (Some(history.id), 4, 5)
        );
        Ok(())
    }

    #[test]
    fn the_watermark_notices_every_way_the_end_of_the_log_goes_missing() -> TestResult {
        let written = |tmp: &Path| -> Result<(LogDir, Vec<PathBuf>), Box<dyn std::error::Error>> {
            let log = LogDir::create(tmp)?;
            let writer = LogWriter::start(&log, 1, small_segments(), Box::new(|_| {}))?;
            append_each(&writer, payloads(100));
            drop(writer);
            let paths = segment_paths(&log);
            assert!(paths.len() >= 3);
            assert_eq!(watermark(&log).through, 100);
            assert_eq!(log.scan()?.end_problem(&watermark(&log)), None);
            Ok((log, paths))
        };
        type Damage = fn(&Path, &[u8]) -> std::io::Result<()>;
        let ways: [(&str, Damage); 4] = [
            ("deleted", |p, _| fs::remove_file(p)),
            ("emptied", |p, _| fs::write(p, b"")),
            ("header only", |p, b| fs::write(p, &b[..SEGMENT_HEADER_LEN])),
            ("cut at a record boundary", |p, b| {
                let mut at = SEGMENT_HEADER_LEN;
                let mut boundaries = vec![];
                while let Some((_, _, len)) = frame_at(b, at) {
                    at += len;
                    boundaries.push(at);
                }
                fs::write(p, &b[..boundaries[boundaries.len() - 2]])
            }),
        ];
        for (name, damage) in ways {
            let tmp = tempfile::tempdir()?;
            let (log, paths) = written(tmp.path())?;
            let newest = paths.last().ok_or("none")?;
            damage(newest, &fs::read(newest)?)?;
            let scan = log.scan()?;
            assert_eq!(scan.corruption(), None, "{name}: the log scans clean");
            assert!(
                scan.end_problem(&watermark(&log)).is_some(),
                "{name}: not noticed"
            );
        }
        // Cutting never-acknowledged records after a failure moves the watermark with them.
        let tmp = tempfile::tempdir()?;
        let (log, _) = written(tmp.path())?;
        log.truncate_after(60)?;
        assert_eq!(watermark(&log).through, 60);
        assert_eq!(log.scan()?.end_problem(&watermark(&log)), None);
        Ok(())
    }

    #[test]
    fn inspection_creates_nothing() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let missing = tmp.path().join("log");
        assert!(LogDir::open_existing(&missing).is_err());
        assert!(!missing.exists());
    }

    /// One way a log can be damaged between two lives.
    #[derive(Clone, Debug)]
    enum Harm {
        Flip { file: usize, at: f64, mask: u8 },
        Cut { file: usize, at: f64 },
        Delete { file: usize },
        Swap { a: usize, b: usize },
        Foreign { file: usize },
        FlipWatermark { at: usize },
    }

    fn harm() -> impl Strategy<Value = Harm> {
        prop_oneof![
            (0usize..8, 0.0f64..1.0, 1u8..=255).prop_map(|(file, at, mask)| Harm::Flip {
                file,
                at,
                mask
            }),
            (0usize..8, 0.0f64..1.0).prop_map(|(file, at)| Harm::Cut { file, at }),
            (0usize..8).prop_map(|file| Harm::Delete { file }),
            (0usize..8, 0usize..8).prop_map(|(a, b)| Harm::Swap { a, b }),
            (0usize..8).prop_map(|file| Harm::Foreign { file }),
            (0usize..WATERMARK_LEN).prop_map(|at| Harm::FlipWatermark { at }),
        ]
    }

    fn apply(harm: &Harm, log: &LogDir, stranger: &Path) -> std::io::Result<()> {
        let paths = segment_paths(log);
        let pick = |i: usize| paths.get(i % paths.len().max(1)).cloned();
        match harm {
            Harm::Flip { file, at, mask } => {
                if let Some(p) = pick(*file) {
                    let mut b = fs::read(&p)?;
                    if !b.is_empty() {
                        let i = ((b.len() as f64 * at) as usize).min(b.len() - 1);
                        b[i] ^= mask;
                        fs::write(&p, b)?;
                    }
                }
            }
            Harm::Cut { file, at } => {
                if let Some(p) = pick(*file) {
                    let len = fs::metadata(&p)?.len();
                    OpenOptions::new()
                        .write(true)
                        .open(&p)?
                        .set_len((len as f64 * at) as u64)?;
                }
            }
            Harm::Delete { file } => {
                if let Some(p) = pick(*file) {
                    fs::remove_file(p)?;
                }
            }
            Harm::Swap { a, b } => {
                if let (Some(a), Some(b)) = (pick(*a), pick(*b)) {
                    let (ba, bb) = (fs::read(&a)?, fs::read(&b)?);
                    fs::write(&a, bb)?;
                    fs::write(&b, ba)?;
                }
            }
            Harm::Foreign { file } => {
                // Another server's segment, under a name of this log.
                let theirs = segment_paths(&LogDir::create(stranger).expect("their log"));
                if let Some(p) = theirs.get(file % theirs.len().max(1)) {
                    fs::copy(p, log.dir.join(p.file_name().unwrap_or_default()))?;
                }
            }
            Harm::FlipWatermark { at } => {
                let p = log.watermark_path();
                let mut b = fs::read(&p)?;
                b[*at] ^= 0x04;
                fs::write(&p, b)?;
            }
        }
        Ok(())
    }

    fn write_log(dir: &Path, history: HistoryId, n: usize) -> Vec<(u64, Vec<u8>)> {
        let log = LogDir::create(dir).expect("log");
        let options = WriterOptions {
            lineage: Lineage {
                history: Some(history),
                epoch: 1,
            },
            durability: Durability::Os, // what is on disk is what matters here, and it is fast
            ..small_segments()
        };
        let writer = LogWriter::start(&log, 1, options, Box::new(|_| {})).expect("writer");
        append_each(&writer, payloads(n))
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

        /// Whatever happens to the files between two lives (flips, cuts, deletions, swaps,
        /// another server's segments, a damaged watermark): a start that accepts the log — no
        /// corruption, nothing foreign, a valid watermark of its history that the log reaches —
        /// reads back every acknowledged record, each as it was acknowledged. So no position,
        /// and no offset, is ever handed to a second batch.
        #[test]
        fn damage_is_noticed_or_harmless(n in 20usize..120, harms in proptest::collection::vec(harm(), 1..4)) {
            let tmp = tempfile::tempdir().expect("tempdir");
            let ours = crate::history::DataHistory::new(crate::history::Legacy::default());
            let theirs = crate::history::DataHistory::new(crate::history::Legacy::default());
            let given = write_log(&tmp.path().join("ours"), ours.id, n);
            write_log(&tmp.path().join("theirs"), theirs.id, 90);
            let log = LogDir::create(tmp.path().join("ours")).expect("log");
            for harm in &harms {
                apply(harm, &log, &tmp.path().join("theirs")).expect("harm");
            }
            let scan = log.scan().expect("scan");
            let mark = log.read_watermark().expect("read");
            // As the server does for a snapshot at position 0: the log must start right after it.
            let accepted = scan.segments.first().is_some_and(|s| s.first == 1)
                && scan.corruption().is_none()
                && scan.foreign(&ours).count() == 0
                && matches!(mark, Some(Ok(m)) if m.history == Some(ours.id) && scan.end_problem(&m).is_none());
            if accepted {
                log.repair(&scan).expect("repair");
                let read = read_all(&log, 0).expect("read");
                prop_assert!(read.len() >= n, "{} of {} acknowledged records", read.len(), n);
                for (record, (position, payload)) in read.iter().zip(&given) {
                    prop_assert_eq!((record.position, &record.payload), (*position, payload));
                }
            }
        }

        /// A crash at any byte of a write: the scan finds no corruption, every record wholly
        /// written before the cut reads back as it was, and nothing after it.
        #[test]
        fn a_cut_at_any_byte_is_a_torn_tail(n in 1usize..40, cut in 0.0f64..1.0) {
            let tmp = tempfile::tempdir().expect("tempdir");
            let log = LogDir::create(tmp.path()).expect("log");
            let writer = LogWriter::start(&log, 1, WriterOptions::default(), Box::new(|_| {})).expect("writer");
            let given = append_all(&writer, payloads(n));
            drop(writer);
            let path = log.scan().expect("scan").segments[0].path.clone();
            let len = fs::metadata(&path).expect("stat").len();
            let keep = (len as f64 * cut) as u64;
            OpenOptions::new().write(true).open(&path).expect("open").set_len(keep).expect("cut");
            let scan = log.scan().expect("scan");
            prop_assert_eq!(scan.corruption(), None);
            log.repair(&scan).expect("repair");
            let read = read_all(&log, 0).expect("read");
            prop_assert_eq!(read.len() as u64, scan.next() - 1);
            for (record, (position, payload)) in read.iter().zip(&given) {
                prop_assert_eq!((record.position, &record.payload), (*position, payload));
            }
            let whole = given.iter().take_while(|(p, _)| {
                let end: usize = given.iter().take(*p as usize).map(|(_, b)| b.len() + RECORD_HEADER_LEN).sum();
                (SEGMENT_HEADER_LEN + end) as u64 <= keep
            }).count();
            prop_assert_eq!(read.len(), whole);
        }
    }
}
