use std::fs;
use std::path::PathBuf;
use std::sync::PoisonError;

use serde::Serialize;

use super::file::{read_dir, sync_dir, write_durably};
use super::info::{PruneReport, SnapshotInfo};
use super::name::{FileName, SnapshotKind};
use super::{SnapshotDir, FILE_EXT, TEMP_PREFIX};
use crate::codec;
use crate::error::SnapshotError;
use crate::header::{SnapshotHeader, SnapshotMeta};

impl SnapshotDir {
    /// Encodes `body` and writes it atomically as a new snapshot file (see
    /// [`SnapshotDir::write_encoded`]). Does not prune: call [`SnapshotDir::prune`] after.
    ///
    /// # Errors
    /// [`SnapshotError::Encode`] or [`SnapshotError::Io`].
    pub fn write<T: Serialize + ?Sized>(
        &self,
        body: &T,
        meta: &SnapshotMeta,
    ) -> Result<SnapshotInfo, SnapshotError> {
        let history = self.history.map(|h| h.history.id);
        let bytes =
            codec::encode_in_history(body, meta, history, 0).map_err(SnapshotError::Encode)?;
        self.write_named(&bytes, meta.manual)
    }

    /// Writes an already encoded snapshot ([`crate::encode`]) atomically: a temp file in this
    /// directory, write, fsync, rename to its final name, fsync the directory. When this
    /// returns `Ok`, the file is durable under its final name; on error no file with a snapshot
    /// name was created (a crash may leave a hidden `.tmp-*` file: see
    /// [`SnapshotDir::remove_temp_files`]).
    ///
    /// # Errors
    /// [`SnapshotError::Invalid`] when `bytes` do not verify (nothing is written), or
    /// [`SnapshotError::Io`].
    pub fn write_encoded(&self, bytes: &[u8]) -> Result<SnapshotInfo, SnapshotError> {
        self.write_named(bytes, false)
    }

    /// [`SnapshotDir::write_encoded`], its file named `manual` when `manual` and the header
    /// is not exact.
    fn write_named(&self, bytes: &[u8], manual: bool) -> Result<SnapshotInfo, SnapshotError> {
        let header = codec::verify(bytes)
            .map_err(|e| SnapshotError::invalid("<encoded bytes to write>", e))?;
        let name = self.next_name(&header, manual);
        let path = self.dir.join(name.render());
        let tmp = self.dir.join(format!("{TEMP_PREFIX}{}", name.render()));
        if let Err(err) = write_durably(&tmp, bytes).and_then(|()| {
            fs::rename(&tmp, &path).map_err(|e| SnapshotError::io("rename temp file to", &path, e))
        }) {
            // Best effort: the temp file is not a snapshot and holds nothing we need.
            let _ = fs::remove_file(&tmp);
            return Err(err);
        }
        sync_dir(&self.dir)?;
        Ok(SnapshotInfo { path, name, header })
    }

    fn next_name(&self, header: &SnapshotHeader, manual: bool) -> FileName {
        let mut state = self.names.lock().unwrap_or_else(PoisonError::into_inner);
        // Names stay in write order even if the clock steps back.
        state.last_ms = state.last_ms.max(header.created_at_ms());
        state.last_seq = state.last_seq.next();
        FileName {
            unix_ms: state.last_ms,
            seq: state.last_seq,
            kind: match (header.is_exact(), manual) {
                (true, _) => SnapshotKind::Exact,
                (false, true) => SnapshotKind::Manual,
                (false, false) => SnapshotKind::Periodic,
            },
        }
    }

    /// Applies retention: keeps the newest exact snapshot and the newest `keep_periodic`
    /// periodic, manual or consumed ones, and removes the other valid snapshots. A file that fails
    /// validation is never removed (it is kept for inspection) and does not count towards the
    /// kept ones. Verifies every file's checksum before deciding.
    ///
    /// # Errors
    /// [`SnapshotError::Io`] when the directory cannot be read, a file cannot be removed, or the
    /// directory cannot be synced.
    pub fn prune(&self) -> Result<PruneReport, SnapshotError> {
        let mut report = PruneReport::default();
        let mut kept_exact = false;
        let mut kept_periodic = 0usize;
        for entry in self.list()? {
            let Ok(info) = &entry.status else {
                report.kept_invalid.push(entry.path);
                continue;
            };
            // Whatever does not load as exact (periodic, manual, consumed, or a name and header that
            // disagree) is retained as periodic.
            let keep = if info.is_exact() {
                !std::mem::replace(&mut kept_exact, true)
            } else {
                kept_periodic += 1;
                kept_periodic <= self.keep_periodic
            };
            if keep {
                report.kept.push(entry.path);
            } else {
                fs::remove_file(&entry.path)
                    .map_err(|e| SnapshotError::io("remove old snapshot", &entry.path, e))?;
                report.removed.push(entry.path);
            }
        }
        if !report.removed.is_empty() {
            sync_dir(&self.dir)?;
        }
        Ok(report)
    }

    /// Removes hidden `.tmp-*` files left by a crash during a write. Call it only from the
    /// process that owns the directory (the server at start), never while it may be writing.
    /// Returns the removed paths.
    ///
    /// # Errors
    /// [`SnapshotError::Io`].
    pub fn remove_temp_files(&self) -> Result<Vec<PathBuf>, SnapshotError> {
        let mut removed = Vec::new();
        for entry in read_dir(&self.dir)? {
            let name = entry.file_name();
            let Some(name) = name.to_str() else { continue };
            if name.starts_with(TEMP_PREFIX) && name.ends_with(FILE_EXT) {
                let path = entry.path();
                fs::remove_file(&path)
                    .map_err(|e| SnapshotError::io("remove temp file", &path, e))?;
                removed.push(path);
            }
        }
        if !removed.is_empty() {
            sync_dir(&self.dir)?;
        }
        Ok(removed)
    }
}
