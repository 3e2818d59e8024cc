use std::fs;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};

use super::file::{scan, sync_dir};
use super::name::FileName;
use super::{DEFAULT_KEEP_PERIODIC, FOREIGN_SUFFIX};
use crate::error::{FormatError, SnapshotError};
use crate::header::SnapshotHeader;
use crate::history::DataHistory;
use crate::seq::SnapshotSeq;

/// The highest name handed out so far; the next name is strictly after it.
#[derive(Debug, Default)]
pub(super) struct NameState {
    pub(super) last_ms: u64,
    pub(super) last_seq: SnapshotSeq,
}

/// A directory holding snapshot files.
///
/// One server owns a directory; other readers (the CLI's `verify`) may list and load
/// concurrently. All methods take `&self`; the type is `Send + Sync`.
#[derive(Debug)]
pub struct SnapshotDir {
    pub(super) dir: PathBuf,
    pub(super) keep_periodic: usize,
    pub(super) names: Mutex<NameState>,
    pub(super) history: Option<History>,
}

/// The history a directory's files must carry, and whether others are refused.
#[derive(Clone, Copy, Debug)]
pub(super) struct History {
    pub(super) history: DataHistory,
    pub(super) refuse_foreign: bool,
}

impl SnapshotDir {
    /// Opens `dir`, creating it if missing, and scans existing names so new files sort after
    /// them.
    ///
    /// # Errors
    /// [`SnapshotError::Io`] when the directory cannot be created or read.
    pub fn open(dir: impl Into<PathBuf>) -> Result<Self, SnapshotError> {
        let dir = dir.into();
        fs::create_dir_all(&dir).map_err(|e| SnapshotError::io("create directory", &dir, e))?;
        Self::open_existing(dir)
    }

    /// Opens a directory that must already exist, creating nothing: for inspection.
    ///
    /// # Errors
    /// [`SnapshotError::Io`] when the directory does not exist or cannot be listed.
    pub fn open_existing(dir: impl Into<PathBuf>) -> Result<Self, SnapshotError> {
        let dir = dir.into();
        let mut state = NameState::default();
        for (_, name) in scan(&dir)? {
            state.last_ms = state.last_ms.max(name.unix_ms);
            state.last_seq = state.last_seq.max(name.seq);
        }
        Ok(SnapshotDir {
            dir,
            keep_periodic: DEFAULT_KEEP_PERIODIC,
            names: Mutex::new(state),
            history: None,
        })
    }

    /// Stamps every snapshot written from now on with `history`'s id; with `refuse_foreign`,
    /// loading and listing also refuse a file of another history
    /// ([`FormatError::ForeignHistory`]), and [`SnapshotDir::load_newest_valid`] sets it aside
    /// (`….vtsnap.foreign`). A cluster's nodes share snapshots across data directories and
    /// check the stream's epoch instead: they stamp without refusing.
    #[must_use]
    pub fn with_history(mut self, history: DataHistory, refuse_foreign: bool) -> Self {
        self.history = Some(History {
            history,
            refuse_foreign,
        });
        self
    }

    /// The data directory's history, when one was set.
    pub fn history(&self) -> Option<DataHistory> {
        self.history.map(|h| h.history)
    }

    /// The highest write sequence among the snapshot files here (0 for none).
    pub fn last_seq(&self) -> SnapshotSeq {
        self.names
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .last_seq
    }

    /// Refuses a verified file of another history, when this directory refuses them.
    pub(super) fn check_history(
        &self,
        path: &Path,
        name: &FileName,
        header: &SnapshotHeader,
    ) -> Result<(), SnapshotError> {
        let Some(History {
            history,
            refuse_foreign: true,
        }) = self.history
        else {
            return Ok(());
        };
        if history.owns(header.history(), name.seq, history.legacy.snapshot_seq) {
            return Ok(());
        }
        Err(SnapshotError::invalid(
            path,
            FormatError::ForeignHistory {
                found: header.history(),
                ours: history.id,
            },
        ))
    }

    /// Renames a file of another history out of the directory's listing, keeping it.
    pub(super) fn set_aside(&self, path: &Path) -> Result<PathBuf, SnapshotError> {
        let mut kept = path.as_os_str().to_owned();
        kept.push(FOREIGN_SUFFIX);
        let kept = PathBuf::from(kept);
        fs::rename(path, &kept).map_err(|e| SnapshotError::io("set aside", path, e))?;
        sync_dir(&self.dir)?;
        Ok(kept)
    }

    /// Sets how many periodic (and consumed) snapshots [`SnapshotDir::prune`] keeps besides the
    /// newest exact one. Default [`DEFAULT_KEEP_PERIODIC`].
    #[must_use]
    pub fn with_keep_periodic(mut self, keep: usize) -> Self {
        self.keep_periodic = keep;
        self
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.dir
    }

    pub(super) fn scan_newest_first(&self) -> Result<Vec<(PathBuf, FileName)>, SnapshotError> {
        let mut files = scan(&self.dir)?;
        files.sort_by_key(|f| std::cmp::Reverse(f.1));
        Ok(files)
    }
}
