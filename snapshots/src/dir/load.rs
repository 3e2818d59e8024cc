use std::fs;

use serde::de::DeserializeOwned;

use super::file::{load_file, read_file, sync_dir};
use super::info::{Loaded, NewestValid, Skipped, SnapshotEntry, SnapshotInfo, StartupRestore};
use super::name::{FileName, SnapshotKind};
use super::SnapshotDir;
use crate::codec;
use crate::error::SnapshotError;

impl SnapshotDir {
    /// Lists every snapshot file, newest first, verifying each one's header, length and body
    /// checksum (it reads every file; the body is not decoded). Files whose names are not
    /// snapshot names are ignored.
    ///
    /// # Errors
    /// [`SnapshotError::Io`] when the directory cannot be read; per-file problems are in
    /// [`SnapshotEntry::status`].
    pub fn list(&self) -> Result<Vec<SnapshotEntry>, SnapshotError> {
        let mut entries = Vec::new();
        for (path, name) in self.scan_newest_first()? {
            let size = fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
            let status = read_file(&path).and_then(|bytes| {
                let header = codec::verify(&bytes).map_err(|e| SnapshotError::invalid(&path, e))?;
                self.check_history(&path, &name, &header)?;
                Ok(SnapshotInfo {
                    path: path.clone(),
                    name,
                    header,
                })
            });
            entries.push(SnapshotEntry {
                file_name: path
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_else(|| name.render()),
                path,
                kind: name.kind,
                seq: name.seq,
                name_created_at_ms: name.unix_ms,
                size,
                status,
            });
        }
        Ok(entries)
    }

    /// Walks snapshots newest → oldest and returns the first that validates completely and
    /// decodes as `T`, plus every newer file it refused as invalid (for the log: "fell back to X
    /// because Y"). Refused files stay on disk. Only invalid files are passed over: a file that
    /// cannot be *read* may well be intact, and falling back past it would silently lose what it
    /// holds.
    ///
    /// # Errors
    /// [`SnapshotError::Io`] when the directory or a snapshot file cannot be read (naming the
    /// file). Invalid files are in [`NewestValid::skipped`].
    pub fn load_newest_valid<T: DeserializeOwned>(&self) -> Result<NewestValid<T>, SnapshotError> {
        let mut skipped = Vec::new();
        for (path, name) in self.scan_newest_first()? {
            let loaded = load_file::<T>(&path).and_then(|(header, body)| {
                self.check_history(&path, &name, &header)?;
                Ok((header, body))
            });
            match loaded {
                Ok((header, body)) => {
                    return Ok(NewestValid {
                        loaded: Some(Loaded {
                            info: SnapshotInfo { path, name, header },
                            body,
                        }),
                        skipped,
                    })
                }
                Err(error @ SnapshotError::Invalid { .. }) => {
                    let mut skipped_file = Skipped {
                        path,
                        error,
                        set_aside: None,
                    };
                    if skipped_file.is_foreign() {
                        skipped_file.set_aside = Some(self.set_aside(&skipped_file.path)?);
                    }
                    skipped.push(skipped_file);
                }
                Err(error) => return Err(error),
            }
        }
        Ok(NewestValid {
            loaded: None,
            skipped,
        })
    }

    /// Loads `file_name` from this directory (an operator's `restore`), validating completely.
    ///
    /// # Errors
    /// [`SnapshotError::Invalid`] or [`SnapshotError::Io`].
    pub fn load_named<T: DeserializeOwned>(
        &self,
        file_name: &str,
    ) -> Result<Loaded<T>, SnapshotError> {
        let path = self.dir.join(file_name);
        let Some(name) = FileName::parse(file_name) else {
            return Err(SnapshotError::io(
                "find snapshot",
                &path,
                std::io::Error::new(std::io::ErrorKind::NotFound, "not a snapshot file name"),
            ));
        };
        let (header, body) = load_file::<T>(&path)?;
        self.check_history(&path, &name, &header)?;
        Ok(Loaded {
            info: SnapshotInfo { path, name, header },
            body,
        })
    }

    /// Marks an exact snapshot as adopted by this server life, durably: renames
    /// `…-exact.vtsnap` to `…-consumed.vtsnap` and fsyncs the directory. From then on it loads
    /// as periodic (fresh epoch), so a crash of this life cannot make a later start adopt the
    /// epoch again. Call it after loading and **before** issuing any offset in the snapshot's
    /// epoch; if it fails, do not adopt the epoch. See the crate docs, "Exact snapshots vouch for
    /// one life". Returns the renamed snapshot.
    ///
    /// # Errors
    /// [`SnapshotError::NotExact`] when `info` is not an unconsumed exact snapshot;
    /// [`SnapshotError::Io`] when the rename or fsync fails (the file may or may not have been
    /// renamed; either way the caller must take a fresh epoch).
    pub fn consume_exact(&self, info: &SnapshotInfo) -> Result<SnapshotInfo, SnapshotError> {
        if !info.is_exact() {
            return Err(SnapshotError::NotExact {
                path: info.path.clone(),
            });
        }
        let name = FileName {
            kind: SnapshotKind::Consumed,
            ..info.name
        };
        let path = self.dir.join(name.render());
        fs::rename(&info.path, &path)
            .map_err(|e| SnapshotError::io("rename to consumed", &info.path, e))?;
        sync_dir(&self.dir)?;
        Ok(SnapshotInfo {
            path,
            name,
            header: info.header,
        })
    }

    /// The start-up rule in one call: load the newest valid snapshot; when it is exact, consume
    /// it durably and adopt its epoch only if that succeeded.
    ///
    /// # Errors
    /// [`SnapshotError::Io`] when the directory cannot be read.
    pub fn load_for_start<T: DeserializeOwned>(&self) -> Result<StartupRestore<T>, SnapshotError> {
        let NewestValid {
            mut loaded,
            skipped,
        } = self.load_newest_valid::<T>()?;
        let mut adopt_epoch = false;
        let mut consume_error = None;
        if let Some(snapshot) = loaded.as_mut().filter(|l| l.info.is_exact()) {
            match self.consume_exact(&snapshot.info) {
                Ok(consumed) => {
                    snapshot.info = consumed;
                    adopt_epoch = true;
                }
                Err(err) => consume_error = Some(err),
            }
        }
        Ok(StartupRestore {
            loaded,
            adopt_epoch,
            skipped,
            consume_error,
        })
    }
}
