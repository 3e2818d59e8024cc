//! The log: segment files of checksummed records, and a writer with group commit.
//!
//! A log is a directory of *segments*, `log-<first position:020>.vtlog`. A record is opaque
//! bytes (the server's encoded batch) with a *position* ([`LogPosition`]): 1, 2, 3, … across
//! segments, dense and
//! never reused, so "everything after position P" is what a restart replays on top of a
//! snapshot taken at P.
//!
//! | file | job |
//! |---|---|
//! | this one | the format's constants and the public names |
//! | `error` | [`LogError`] |
//! | `segment` | a segment's bytes: its header, record frames, and what a scan makes of damage ([`Damage`]) |
//! | `read` | reading a segment's records front to back, and scanning it |
//! | `scan` | what a scan reports: [`LogScan`], [`SegmentScan`], [`LogDamage`] |
//! | `dir` | the directory: [`LogDir`] lists, scans, repairs, reads, cuts and deletes segments |
//! | `watermark` | the end-of-log [`Watermark`], its file, and why one is not valid ([`WatermarkError`]) |
//! | `writer` | [`LogWriter`]: group commit on a thread of its own |
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
//! The watermark also bounds what counts as damage: bytes after the last intact record of the
//! newest segment, at positions past `through` and with no intact record after them, were never
//! acknowledged, whatever they look like — a complete record that fails its checksum, random
//! bytes — so [`LogScan::torn_past`] makes them a torn tail, which a repair cuts. Only damage to
//! what was acknowledged is corruption. (After a power loss `through` may lag behind records
//! that were synced and acknowledged; such a record is then cut only if it is also damaged.)
//!
//! [`LogScan::last_used`] and [`Watermark::last_used`] give the highest position the files show
//! was used, so that a log that starts over after damage never hands out a position again.
//!
//! ## Group commit
//!
//! [`LogWriter`] owns the newest segment on a thread of its own. Appends queue up while it
//! writes and syncs; the next round takes every queued record, writes them with one write and
//! makes them durable with one `fdatasync`, then completes them all: a busy server pays one sync
//! for many batches. A failed write or sync *poisons* the writer — what reached the disk is
//! unknown, and retrying `fsync` on the same descriptor cannot be trusted — and every later
//! append fails until the log is reopened and scanned again.

mod dir;
mod error;

mod read;
mod scan;
mod segment;
mod watermark;
mod writer;

#[cfg(test)]
mod props;
#[cfg(test)]
mod tests;

pub use crate::position::LogPosition;
pub use dir::LogDir;
pub use error::LogError;
pub use scan::{LogDamage, LogDamageKind, LogRecord, LogScan, SegmentScan};
pub use segment::{Damage, Lineage};
pub use watermark::{Watermark, WatermarkError};
pub use writer::{Completion, Durability, GroupWritten, LogWriter, Observer, WriterOptions};

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
