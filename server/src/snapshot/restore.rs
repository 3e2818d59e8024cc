//! A live restore: the file checked before anything is touched, then put in place under the cut
//! with a fresh epoch (see the module docs of `snapshot`).

use std::collections::BTreeMap;
use std::sync::Arc;

use viewtape_journal::{JournalEpoch, JournalSnapshot};
use viewtape_snapshots::{FormatError, SnapshotError, SnapshotMeta};

use super::{SnapshotActionError, SnapshotBody, Snapshots};
use crate::hub::ViewStateDump;
use crate::log::LogPosition;
use crate::runtime::{IngestError, RuntimeSnapshot};

/// What a live restore checked and will put in place.
#[derive(Debug)]
struct Restorable {
    journal: JournalSnapshot,
    views: Vec<ViewStateDump>,
    guests: BTreeMap<String, RuntimeSnapshot>,
}

/// Where, and under which epoch, a cluster's restore record puts a snapshot: the same on every
/// node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RestoreAt {
    /// The epoch the restored journal takes.
    pub epoch: JournalEpoch,
    /// The record's stream position.
    pub position: LogPosition,
}

/// A live restore that [`Snapshots::restore_live`] carried out.
#[derive(Clone, Debug)]
pub struct Restored {
    /// The journal's new epoch.
    pub epoch: JournalEpoch,
    /// Journal records restored.
    pub records: usize,
    /// The log position the restore took effect at (with the log on, or on a cluster: the
    /// restore record's).
    pub position: Option<LogPosition>,
}

impl Snapshots {
    /// Replaces the running server's state with the snapshot file `name`; see the module docs.
    ///
    /// # Errors
    /// [`SnapshotActionError::NoSuchSnapshot`], [`SnapshotActionError::Unrestorable`] (nothing
    /// changed), or a runtime or storage failure.
    pub async fn restore_live(&self, name: &str) -> Result<Restored, SnapshotActionError> {
        let _busy = self.busy.lock().await;
        let loaded = self.load_restorable(name).await?;
        self.replace(loaded, name, None).await
    }

    /// Restores the snapshot file `bytes` where a cluster's restore record puts it: at the
    /// record's position, under the epoch every node takes there. The file is kept in the
    /// snapshot directory.
    ///
    /// # Errors
    /// As [`Snapshots::restore_live`]; nothing changed.
    pub async fn restore_encoded(
        &self,
        bytes: &[u8],
        at: RestoreAt,
    ) -> Result<Restored, SnapshotActionError> {
        let _busy = self.busy.lock().await;
        let dir = Arc::clone(&self.dir);
        let bytes = bytes.to_vec();
        let info = tokio::task::spawn_blocking(move || dir.write_encoded(&bytes))
            .await?
            .map_err(|error| match error {
                // Named as the upload: the answer carries no path.
                SnapshotError::Invalid { source, .. } => {
                    SnapshotActionError::Unrestorable(format!("the snapshot is refused: {source}"))
                }
                other => SnapshotActionError::Storage(other),
            })?;
        let name = info.file_name();
        let loaded = self.load_restorable(&name).await?;
        self.replace(loaded, &name, Some(at)).await
    }

    /// The bytes of the snapshot file `name`, once it has been checked to be restorable here
    /// (what a cluster's node publishes for every node to restore).
    ///
    /// # Errors
    /// As [`Snapshots::restore_live`]; nothing changed.
    pub async fn restorable_bytes(&self, name: &str) -> Result<Vec<u8>, SnapshotActionError> {
        self.load_restorable(name).await?;
        let path = self.dir.path().join(name);
        tokio::task::spawn_blocking(move || std::fs::read(&path).map_err(|e| (path, e)))
            .await?
            .map_err(|(path, error)| {
                tracing::error!(file = %path.display(), %error, "snapshot could not be read");
                SnapshotActionError::Unrestorable(format!("{name} could not be read"))
            })
    }

    /// Loads `name` and checks it before anything is touched: the file loads completely, and
    /// each runtime's state belongs to the module that runs now.
    async fn load_restorable(&self, name: &str) -> Result<Restorable, SnapshotActionError> {
        let dir = Arc::clone(&self.dir);
        let file = name.to_owned();
        let loaded = tokio::task::spawn_blocking(move || dir.load_named::<SnapshotBody>(&file))
            .await?
            .map_err(|error| match error {
                SnapshotError::Io { source, .. }
                    if source.kind() == std::io::ErrorKind::NotFound =>
                {
                    SnapshotActionError::NoSuchSnapshot(name.to_owned())
                }
                SnapshotError::Io { source, .. }
                    if source.kind() == std::io::ErrorKind::IsADirectory =>
                {
                    SnapshotActionError::Unrestorable(format!("{name} is a directory"))
                }
                // Named by its file name: the answer carries no path. A body that does not
                // decode is told in our words: the decoder's text names our types.
                SnapshotError::Invalid {
                    source: source @ FormatError::Body { .. },
                    ..
                } => {
                    tracing::warn!(file = %name, error = %source, "snapshot body does not decode");
                    SnapshotActionError::Unrestorable(format!(
                        "{name} is refused: its body is not a snapshot this server reads (the server log says why)"
                    ))
                }
                SnapshotError::Invalid { source, .. } => {
                    SnapshotActionError::Unrestorable(format!("{name} is refused: {source}"))
                }
                other => SnapshotActionError::Storage(other),
            })?;
        let body = loaded.body;
        let mut guests = BTreeMap::new();
        for dump in body.runtimes {
            match self.runtimes.get(&dump.name) {
                Some(running) => {
                    let runtime = dump.name.clone();
                    let saved = dump.saved_for(&running.handle.module()).map_err(|error| {
                        SnapshotActionError::Unrestorable(format!("{name}: {error}"))
                    })?;
                    guests.insert(runtime, saved);
                }
                None => tracing::warn!(
                    runtime = %dump.name,
                    file = %name,
                    "snapshot holds state for a runtime that does not run here; ignored"
                ),
            }
        }
        let mut views = body.views;
        for view in self.hub.views().iter().filter(|view| view.lasting()) {
            if !views.iter().any(|v| v.view == view.name()) {
                views.push(ViewStateDump {
                    view: view.name().to_owned(),
                    entries: Vec::new(),
                });
            }
        }
        Ok(Restorable {
            journal: body.journal,
            views,
            guests,
        })
    }

    /// Steps 2 and 3 of a live restore (see the module docs), `at` a cluster's position.
    async fn replace(
        &self,
        restorable: Restorable,
        name: &str,
        at: Option<RestoreAt>,
    ) -> Result<Restored, SnapshotActionError> {
        let Restorable {
            mut journal,
            views,
            mut guests,
        } = restorable;
        // 2. The cut, and new guests next to the running ones: any refusal leaves everything
        //    as it was.
        let cut = self.runtimes.pause_all().await?;
        for paused in cut.runtimes() {
            if let Some(saved) = guests.get(&paused.name) {
                paused
                    .guard
                    .stage_restore(saved.clone())
                    .await
                    .map_err(|error| {
                        // The guest's refusal in our words; its detail is logged, once.
                        tracing::info!(file = %name, %error, "restore refused by a guest");
                        let told = match &error {
                            IngestError::Guest { runtime, source } => {
                                format!("runtime `{runtime}`: {}", source.public_message())
                            }
                            other => other.to_string(),
                        };
                        SnapshotActionError::Unrestorable(format!("{name}: {told}"))
                    })?;
            }
        }

        // 3. Replace: state and journal (fresh epoch, always), then the guests.
        let records = journal.record_count();
        match at {
            // The same new epoch on every node of the cluster.
            Some(at) => {
                journal.epoch = Some(at.epoch);
                self.hub.restore(journal, true, views).await;
            }
            None => {
                // A dump without an epoch (taken with the journal disabled) is discarded by
                // hydrate, which would keep the current epoch under replaced state: mark a gap
                // so old cursors fail closed. Marked first: the restore's wake-up then reaches
                // every subscriber after the gap.
                if journal.epoch.is_none() {
                    self.hub.journal().mark_gap().await;
                }
                self.hub.restore(journal, false, views).await;
            }
        }
        let epoch = self.hub.journal().epoch().await;
        for paused in cut.runtimes() {
            if let Err(error) = paused.guard.commit_restore().await {
                // The journal is already replaced; a runtime that went away cannot be helped.
                tracing::error!(runtime = %paused.name, %error, "restored guest state not applied");
            }
        }
        if let Some(at) = at {
            self.log.skip_to(at.position);
        }
        // A restart replays the log from the newest snapshot: make it this state, written before
        // the cut is released, so that no batch commits on the restored state before a restart
        // could find it.
        let mut body = self.body_under(&cut).await;
        for dump in &mut body.runtimes {
            if let Some(saved) = guests.remove(&dump.name) {
                dump.saved = saved;
            }
        }
        self.store(body, SnapshotMeta::periodic_now()).await?;
        drop(cut);
        let position = self.log.position();
        Ok(Restored {
            epoch,
            records,
            position,
        })
    }
}

#[cfg(test)]
mod tests {
    use viewtape_snapshots::SnapshotDir;

    use super::super::tests::server;
    use super::*;
    use crate::runtime::registry::ModuleFingerprint;

    #[tokio::test]
    async fn a_live_restore_refuses_what_it_cannot_restore_and_changes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let (snapshots, hub, handle) = server(dir.path()).await;
        handle
            .ingest(
                bytes::Bytes::from_static(b"{\"symbol\":\"ACME\",\"price\":1.5,\"seq\":1}\n"),
                None,
            )
            .await
            .unwrap();
        let written = snapshots.write().await.unwrap();
        let name = written.info.file_name();

        // The same file, but its runtime state saved by another module.
        let (loaded, other) = {
            let dir = SnapshotDir::open(dir.path()).unwrap();
            let mut body = dir.load_named::<SnapshotBody>(&name).unwrap().body;
            body.runtimes[0].module = ModuleFingerprint::of(b"another module");
            let other = dir.write(&body, &SnapshotMeta::periodic_now()).unwrap();
            (body.runtimes.len(), other.file_name())
        };
        assert_eq!(loaded, 1);
        std::fs::create_dir(
            dir.path()
                .join("snap-0000000000001000-0000000099-periodic.vtsnap"),
        )
        .unwrap();

        let epoch = hub.journal().epoch().await;
        for (file, expected) in [
            (other.as_str(), "saved by module"),
            (
                "snap-0000000000001000-0000000099-periodic.vtsnap",
                "directory",
            ),
        ] {
            match snapshots.restore_live(file).await {
                Err(SnapshotActionError::Unrestorable(message)) => {
                    assert!(message.contains(expected), "{file}: {message}")
                }
                other => panic!("{file}: {other:?}"),
            }
        }
        assert!(matches!(
            snapshots.restore_live("snap-nope.vtsnap").await,
            Err(SnapshotActionError::NoSuchSnapshot(_))
        ));
        assert_eq!(hub.journal().epoch().await, epoch, "nothing changed");

        let restored = snapshots.restore_live(&name).await.unwrap();
        assert_ne!(
            restored.epoch, epoch,
            "a live restore always takes a fresh epoch"
        );
        assert_eq!(hub.view("prices").unwrap().keys(), 1);
    }
}
