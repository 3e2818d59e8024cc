use std::path::{Path, PathBuf};

use super::name::{FileName, SnapshotKind};
use crate::error::{FormatError, SnapshotError};
use crate::header::SnapshotHeader;
use crate::seq::SnapshotSeq;

/// A snapshot file whose header and body checksum have been verified.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SnapshotInfo {
    pub(super) path: PathBuf,
    pub(super) name: FileName,
    pub(super) header: SnapshotHeader,
}

impl SnapshotInfo {
    /// The file's full path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The file name, e.g. `snap-0001764409200000-0000000007-exact.vtsnap`.
    pub fn file_name(&self) -> String {
        self.path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| self.name.render())
    }

    /// The write sequence number from the file name (strictly increasing per directory).
    pub fn seq(&self) -> SnapshotSeq {
        self.name.seq
    }

    /// The kind the file name states.
    pub fn kind(&self) -> SnapshotKind {
        self.name.kind
    }

    /// `true` when this snapshot's epoch and offsets may be adopted: its name says exact (not
    /// consumed) and its header carries the exact flag. Adopt only after
    /// [`SnapshotDir::consume_exact`](super::SnapshotDir::consume_exact) succeeded.
    pub fn is_exact(&self) -> bool {
        self.name.kind == SnapshotKind::Exact && self.header.is_exact()
    }

    /// The verified header.
    pub fn header(&self) -> &SnapshotHeader {
        &self.header
    }

    /// Creation time from the header, unix milliseconds.
    pub fn created_at_ms(&self) -> u64 {
        self.header.created_at_ms()
    }

    /// File size in bytes.
    pub fn size(&self) -> u64 {
        self.header.file_len()
    }
}

/// One snapshot file found by [`SnapshotDir::list`](super::SnapshotDir::list), valid or not.
#[derive(Debug)]
pub struct SnapshotEntry {
    /// The file's full path.
    pub path: PathBuf,
    /// The file name.
    pub file_name: String,
    /// The kind the file name states.
    pub kind: SnapshotKind,
    /// The write sequence number from the name.
    pub seq: SnapshotSeq,
    /// The creation time from the name, unix milliseconds (the header's when valid is in
    /// `status`).
    pub name_created_at_ms: u64,
    /// The file size on disk, in bytes.
    pub size: u64,
    /// The verified snapshot, or why the file is refused (header, length and body checksum are
    /// checked; the body is not decoded).
    pub status: Result<SnapshotInfo, SnapshotError>,
}

impl SnapshotEntry {
    /// `true` when header, length and checksum verified.
    pub fn is_valid(&self) -> bool {
        self.status.is_ok()
    }

    /// `true` when valid and exact (see [`SnapshotInfo::is_exact`]).
    pub fn is_exact(&self) -> bool {
        self.status.as_ref().is_ok_and(SnapshotInfo::is_exact)
    }

    /// Creation time: the header's when valid, else the name's.
    pub fn created_at_ms(&self) -> u64 {
        match &self.status {
            Ok(info) => info.created_at_ms(),
            Err(_) => self.name_created_at_ms,
        }
    }
}

/// A snapshot that was validated and decoded.
#[derive(Debug)]
pub struct Loaded<T> {
    /// The file it came from.
    pub info: SnapshotInfo,
    /// The decoded body.
    pub body: T,
}

/// A snapshot file that [`SnapshotDir::load_newest_valid`](super::SnapshotDir::load_newest_valid)
/// passed over, and why.
#[derive(Debug)]
pub struct Skipped {
    /// The file.
    pub path: PathBuf,
    /// Why it was refused (its message names the file and the reason).
    pub error: SnapshotError,
    /// Where it went when it belongs to another history (renamed `….vtsnap.foreign`); `None`
    /// when it stayed (a damaged file stays where it is).
    pub set_aside: Option<PathBuf>,
}

impl Skipped {
    /// `true` when the file is intact but of another data directory's history.
    pub fn is_foreign(&self) -> bool {
        matches!(
            self.error.format_error(),
            Some(FormatError::ForeignHistory { .. })
        )
    }
}

/// What [`SnapshotDir::load_newest_valid`](super::SnapshotDir::load_newest_valid) found.
#[derive(Debug)]
pub struct NewestValid<T> {
    /// The newest snapshot that validated and decoded, if any.
    pub loaded: Option<Loaded<T>>,
    /// Newer files that were refused, newest first: log them ("fell back to X because Y").
    pub skipped: Vec<Skipped>,
}

/// What [`SnapshotDir::load_for_start`](super::SnapshotDir::load_for_start) decided.
#[derive(Debug)]
pub struct StartupRestore<T> {
    /// The newest valid snapshot, if any. When exact and adopted, it is now named `consumed`.
    pub loaded: Option<Loaded<T>>,
    /// `true` only when the snapshot was exact **and** it was durably consumed: hydrate with the
    /// snapshot's epoch. `false`: hydrate the state but take a fresh epoch.
    pub adopt_epoch: bool,
    /// Newer files that were refused, newest first.
    pub skipped: Vec<Skipped>,
    /// Set when an exact snapshot could not be consumed (so `adopt_epoch` is `false`).
    pub consume_error: Option<SnapshotError>,
}

/// What [`SnapshotDir::prune`](super::SnapshotDir::prune) did.
#[derive(Debug, Default)]
pub struct PruneReport {
    /// Valid snapshots kept (the newest exact and the newest periodic ones).
    pub kept: Vec<PathBuf>,
    /// Files that failed validation: never deleted, kept for inspection.
    pub kept_invalid: Vec<PathBuf>,
    /// Files removed.
    pub removed: Vec<PathBuf>,
}
