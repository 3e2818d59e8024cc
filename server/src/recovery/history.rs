//! The data directory's identity at start-up: its history, and the checks that keep files of
//! another history — and a log whose end went missing — from being taken for its own.
//!
//! - [`open`] reads `<data-dir>/history`, or makes it once (a random id), adopting the files of
//!   the formats before history ids that the directory already holds (see
//!   [`viewtape_snapshots::history`]).
//! - [`set_aside_foreign`]: segments of another history are renamed `….vtlog.foreign`, logged,
//!   counted (`viewtape_foreign_files_total{kind}`), never replayed. Snapshots of another
//!   history are set aside by the snapshot directory itself; [`note_skipped_snapshots`] logs
//!   and counts them.
//! - [`end_mark`]: the end-of-log watermark says where the log ended; a log that ends before
//!   it (its newest segment deleted, emptied or cut) fails closed, keeping what its intact
//!   records prove; bytes past it were never acknowledged.

use std::path::Path;

use viewtape_snapshots::history::{DataHistory, HistoryError, Legacy, HISTORY_FILE};
use viewtape_snapshots::log::{LogDir, LogError, LogScan, Watermark};
use viewtape_snapshots::{Skipped, SnapshotDir, SnapshotError};

use crate::log::LogMetrics;

/// Reads the data directory's history, or makes it (see the module docs). Returns it and
/// whether it was made now.
///
/// # Errors
/// The history file is damaged or cannot be read or written, or the files it must look at
/// to adopt older ones cannot be listed.
pub fn open(
    data_dir: &Path,
    snapshots: &SnapshotDir,
    log_dir: &Path,
) -> Result<(DataHistory, bool), OpenError> {
    let legacy = match data_dir.join(HISTORY_FILE).exists() {
        true => Legacy::default(), // not looked at: the file says it
        false => legacy_files(snapshots, log_dir)?,
    };
    let (history, created) = DataHistory::open_or_create(data_dir, || legacy)?;
    if created {
        tracing::info!(history = %history.id, legacy_log_through = ?history.legacy.log_through.map(|p| p.get()), legacy_snapshot_seq = ?history.legacy.snapshot_seq.map(|s| s.get()), "this data directory now has a history id");
    }
    Ok((history, created))
}

/// Why [`open`] failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OpenError {
    /// The history file.
    #[error(transparent)]
    History(#[from] HistoryError),
    /// Listing the snapshots to adopt.
    #[error(transparent)]
    Snapshots(#[from] SnapshotError),
    /// Listing the log's segments to adopt.
    #[error(transparent)]
    Log(#[from] LogError),
}

/// The files of format version 1 that the directory holds: its own.
fn legacy_files(snapshots: &SnapshotDir, log_dir: &Path) -> Result<Legacy, OpenError> {
    let snapshot_seq = snapshots
        .list()?
        .iter()
        .filter(|entry| {
            entry
                .status
                .as_ref()
                .is_ok_and(|info| info.header().version() == 1)
        })
        .map(|entry| entry.seq)
        .max();
    let log_through = match LogDir::open_existing(log_dir) {
        Ok(log) => log
            .scan()?
            .segments
            .iter()
            .filter(|segment| segment.version == 1)
            .map(|segment| segment.first)
            .max(),
        Err(_) => None, // no log directory yet
    };
    Ok(Legacy {
        log_through,
        snapshot_seq,
    })
}

/// Sets aside the segments of `scan` that are not of `history` (`….vtlog.foreign`), with one
/// log line and the metric. Returns whether any were.
///
/// # Errors
/// A rename fails.
pub fn set_aside_foreign(
    dir: &LogDir,
    scan: &LogScan,
    history: &DataHistory,
    metrics: &LogMetrics,
) -> Result<bool, LogError> {
    let mut kept = Vec::new();
    for segment in scan.foreign(history) {
        kept.push(dir.set_aside_as(&segment.path, ".foreign")?);
        metrics.foreign("segment");
    }
    if !kept.is_empty() {
        tracing::error!(
            history = %history.id,
            kept = ?kept,
            "log segments of another history (another data directory's) set aside; they are never replayed"
        );
    }
    Ok(!kept.is_empty())
}

/// What vouches for the end of the log at start-up (see [`end_mark`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EndMark {
    /// This history's watermark: the log must reach it ([`LogScan::end_problem`]), and nothing
    /// past its `through` was ever acknowledged.
    Ours(Watermark),
    /// None, and none is needed: no segment of this format holds a record.
    Unneeded,
    /// Nothing can vouch for the end of the log: why.
    Unvouched(String),
}

impl EndMark {
    /// This history's watermark, if that is what vouches.
    pub fn ours(&self) -> Option<&Watermark> {
        match self {
            Self::Ours(mark) => Some(mark),
            Self::Unneeded | Self::Unvouched(_) => None,
        }
    }

    /// Why the log in `scan` ends before the watermark says it does, or why nothing vouches for
    /// its end; `None` when the end is where it was left.
    pub fn problem(&self, scan: &LogScan) -> Option<String> {
        match self {
            Self::Ours(mark) => scan.end_problem(mark),
            Self::Unneeded => None,
            Self::Unvouched(why) => Some(why.clone()),
        }
    }
}

/// The watermark that vouches for the end of the log, or why none can. `before` is the scan
/// before foreign segments were set aside. A watermark of another history is set aside
/// (`end.foreign`) and counted.
///
/// A log whose segments of this format hold records needs this history's watermark. So does one
/// from which another history's segments were just set aside: another server's `log/` copied
/// over this one's takes this one's watermark with it, and what is left — nothing — must not be
/// taken for an empty log.
///
/// # Errors
/// The watermark cannot be read or set aside.
pub fn end_mark(
    dir: &LogDir,
    before: &LogScan,
    history: &DataHistory,
    metrics: &LogMetrics,
) -> Result<EndMark, LogError> {
    // Older builds wrote no watermark, and a segment with no record yet needs none.
    let needs_mark = before
        .segments
        .iter()
        .any(|s| s.version >= 2 && s.records > 0);
    Ok(match dir.read_watermark()? {
        Some(Ok(mark)) if mark.history == Some(history.id) => EndMark::Ours(mark),
        Some(Ok(_)) => {
            let kept = dir.set_aside_as(&dir.watermark_path(), ".foreign")?;
            metrics.foreign("watermark");
            tracing::error!(kept = %kept.display(), "the log's watermark belongs to another history; set aside");
            EndMark::Unvouched("the log's watermark belongs to another history, so nothing vouches for the end of this one".to_owned())
        }
        Some(Err(reason)) => {
            EndMark::Unvouched(format!("the log's watermark is damaged: {reason}"))
        }
        None if needs_mark => EndMark::Unvouched(
            "the log's watermark is missing, so its end cannot be vouched for".to_owned(),
        ),
        None => EndMark::Unneeded,
    })
}

/// Logs and counts the snapshot files a start passed over.
pub fn note_skipped_snapshots(skipped: &[Skipped], metrics: &LogMetrics) {
    for skipped in skipped {
        match &skipped.set_aside {
            Some(kept) => {
                metrics.foreign("snapshot");
                tracing::error!(file = %skipped.path.display(), kept = %kept.display(), error = %skipped.error, "snapshot of another history set aside; never adopted");
            }
            None => {
                tracing::warn!(file = %skipped.path.display(), error = %skipped.error, "snapshot skipped; falling back to an older one")
            }
        }
    }
}
