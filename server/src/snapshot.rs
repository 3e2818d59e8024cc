//! Snapshots of the running server: what one holds, writing one under the consistency cut,
//! restoring at start-up, restoring into the running server, and the periodic timer. The admin
//! routes, the periodic task, the graceful stop and the property tests all go through
//! [`Snapshots`], so there is one way to do each.
//!
//! ## What a snapshot holds
//!
//! [`SnapshotBody`]: the journal dump, every view's state, and each runtime's guest state and
//! source checkpoint with the [`ModuleFingerprint`] of the module that saved it. All of it is
//! taken inside one [`Cut`], so it is one consistent moment.
//!
//! ## Start-up: the one-life rule
//!
//! With the log off, start-up (the `recovery` module, above this one) restores the newest valid
//! snapshot. An exact one (written at a graceful stop, after `seal`) keeps its epoch — once: it
//! is marked consumed before any offset is issued, so a crash later in this life cannot hand its
//! epoch to the next. Anything else takes a fresh epoch.
//!
//! ## Live restore
//!
//! [`Snapshots::restore_live`] validates before it touches anything: the file must load
//! completely and each runtime's state must belong to the module that runs now — otherwise
//! [`SnapshotActionError::Unrestorable`] and nothing changed. Then, inside one cut: each
//! runtime stages a guest from the snapshot's state next to the running one (a guest refusing
//! its state aborts the restore, still with nothing changed); the views' state and the journal
//! are replaced, **always with a fresh epoch** — the snapshot's offsets were issued in another
//! life, so no cursor may resume into them; the staged guests are swapped in; a snapshot of the
//! restored state is written (a restart replays the log on top of it, never on what was
//! replaced); the cut is released. Every subscriber is woken, finds its cursor's epoch stale and
//! gets a `reset` followed by the restored state. Views the snapshot does not name are emptied;
//! a runtime it does not name keeps its guest. A pull source's read position is not moved (the source task
//! owns it); only the runtime's recorded checkpoint is.
//!
//! Snapshot actions are serialized: one at a time, whoever asks.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::task::JoinHandle;
use tracing::Instrument;
use viewtape_journal::{JournalEpoch, JournalSnapshot};
use viewtape_snapshots::{SnapshotDir, SnapshotEntry, SnapshotError, SnapshotInfo, SnapshotMeta};

use crate::hub::{Hub, ViewStateDump};
use crate::log::Log;
use crate::registry::{Cut, ModuleFingerprint, Runtimes};
use crate::runtime::{IngestError, RuntimeSnapshot};

/// What a snapshot file holds.
#[derive(Debug, Serialize, Deserialize)]
pub struct SnapshotBody {
    /// The journal dump.
    pub journal: JournalSnapshot,
    /// Every view's state.
    pub views: Vec<ViewStateDump>,
    /// Every runtime's state.
    pub runtimes: Vec<RuntimeDump>,
    /// The last log position it reflects (`None`: taken with the log off).
    #[serde(default)]
    pub log_position: Option<u64>,
    /// On a cluster: the epoch of the stream whose history it is part of (the journal's own
    /// epoch differs from it after a live restore). `None`: a single node's.
    #[serde(default)]
    pub stream: Option<JournalEpoch>,
}

impl SnapshotBody {
    /// Restores the journal and the views' state into `hub` (keeping the journal's epoch when
    /// `keep_epoch`), and hands back each runtime's record by name, for its task to start from:
    /// the one way every start-up puts a snapshot in place.
    pub async fn restore_into(self, hub: &Hub, keep_epoch: bool) -> BTreeMap<String, RuntimeDump> {
        hub.restore(self.journal, keep_epoch, self.views).await;
        self.runtimes
            .into_iter()
            .map(|r| (r.name.clone(), r))
            .collect()
    }
}

/// One runtime in a snapshot.
#[derive(Debug, Serialize, Deserialize)]
pub struct RuntimeDump {
    /// The runtime's name.
    pub name: String,
    /// The module the state belongs to: the one the runtime ran.
    pub module: ModuleFingerprint,
    /// The module the runtime's config named then (`None` in snapshots from before deploys:
    /// the same as `module`). A start whose config names this one still runs `module`.
    #[serde(default)]
    pub configured: Option<ModuleFingerprint>,
    /// The guest's state and the source position it reflects.
    pub saved: RuntimeSnapshot,
}

impl RuntimeDump {
    /// The saved state and checkpoint, when they belong to `module`: a guest's state means
    /// something only to the module that saved it.
    ///
    /// # Errors
    /// [`OtherModule`] when another module saved them.
    pub fn saved_for(self, module: &ModuleFingerprint) -> Result<RuntimeSnapshot, OtherModule> {
        if self.module == *module {
            Ok(self.saved)
        } else {
            Err(OtherModule {
                runtime: self.name,
                saved_by: self.module,
                running: module.clone(),
            })
        }
    }
}

/// A runtime's state in a snapshot was saved by another module than the one that runs now.
#[derive(Debug, thiserror::Error)]
#[error(
    "runtime {runtime:?}: the state was saved by module {saved_by}, but module {running} runs now"
)]
pub struct OtherModule {
    /// The runtime.
    pub runtime: String,
    /// The module that saved the state.
    pub saved_by: ModuleFingerprint,
    /// The module that runs now.
    pub running: ModuleFingerprint,
}

/// Why a snapshot action failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SnapshotActionError {
    /// No snapshot file has that name.
    #[error("{}", no_such_snapshot(.0))]
    NoSuchSnapshot(String),
    /// The snapshot cannot be restored: an invalid file, state of another module, or a guest
    /// that refused its state. Nothing was changed.
    #[error("{0}")]
    Unrestorable(String),
    /// A runtime could not be paused.
    #[error(transparent)]
    Runtime(#[from] IngestError),
    /// The snapshot directory failed.
    #[error(transparent)]
    Storage(#[from] SnapshotError),
    /// A blocking file task panicked or was cancelled.
    #[error("snapshot file task failed: {0}")]
    Task(#[from] tokio::task::JoinError),
    /// A cluster's stream did not take the restore, or this node did not apply it in time.
    #[error("the cluster's stream: {0}")]
    Shared(String),
}

/// A snapshot that [`Snapshots::write`] or [`Snapshots::write_exact`] wrote.
#[derive(Debug)]
pub struct WrittenSnapshot {
    /// The file.
    pub info: SnapshotInfo,
    /// Journal records it holds.
    pub records: usize,
}

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
    pub position: u64,
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
    pub position: Option<u64>,
}

/// The server's snapshot actions, over its hub, snapshot directory and runtimes.
#[derive(Debug)]
pub struct Snapshots {
    hub: Arc<Hub>,
    dir: Arc<SnapshotDir>,
    runtimes: Arc<Runtimes>,
    log: Arc<Log>,
    /// The log position of each snapshot file written or restored in this life: segments older
    /// than every kept snapshot's position are deleted.
    positions: std::sync::Mutex<BTreeMap<std::path::PathBuf, u64>>,
    /// One action at a time.
    busy: tokio::sync::Mutex<()>,
    /// The last file written, with its log position: what a cluster shares.
    written: tokio::sync::watch::Sender<Option<(std::path::PathBuf, u64)>>,
}

/// What [`SnapshotActionError::NoSuchSnapshot`] says: the name, unless it is a path (the answer
/// names no directory, not even one the client sent).
fn no_such_snapshot(name: &str) -> String {
    if name.contains(['/', '\\']) {
        "no snapshot by that name: a snapshot is named by its file name alone, as GET /admin/snapshots lists it".to_owned()
    } else {
        format!("no snapshot named {name:?}")
    }
}

impl Snapshots {
    /// Snapshot actions for `hub`, `runtimes` and `log`, kept in `dir`.
    pub fn new(
        hub: Arc<Hub>,
        dir: Arc<SnapshotDir>,
        runtimes: Arc<Runtimes>,
        log: Arc<Log>,
    ) -> Self {
        Self {
            hub,
            dir,
            runtimes,
            log,
            positions: std::sync::Mutex::default(),
            busy: tokio::sync::Mutex::new(()),
            written: tokio::sync::watch::Sender::new(None),
        }
    }

    /// The log the snapshots record positions of.
    pub fn log(&self) -> &Log {
        &self.log
    }

    /// Follows the files written from now on, each with its log position (files of a server
    /// without positions are not announced).
    pub fn follow_written(
        &self,
    ) -> tokio::sync::watch::Receiver<Option<(std::path::PathBuf, u64)>> {
        self.written.subscribe()
    }

    /// Takes the cut, dumps, releases the cut and writes a periodic snapshot (then prunes old
    /// ones).
    ///
    /// # Errors
    /// A runtime could not be paused, or the file could not be written.
    pub async fn write(&self) -> Result<WrittenSnapshot, SnapshotActionError> {
        let _busy = self.busy.lock().await;
        let (body, cut) = self.dump(false).await?;
        drop(cut);
        self.store(body, SnapshotMeta::periodic_now()).await
    }

    /// What a graceful stop writes last: seals the journal inside the cut, dumps and writes an
    /// exact snapshot. The runtimes stay paused while the returned [`Cut`] lives — keep it until
    /// the process ends, so nothing commits after the snapshot.
    ///
    /// # Errors
    /// A runtime could not be paused, or the file could not be written.
    pub async fn write_exact(&self) -> Result<(WrittenSnapshot, Cut), SnapshotActionError> {
        let _busy = self.busy.lock().await;
        let (body, cut) = self.dump(true).await?;
        let written = self.store(body, SnapshotMeta::exact_now()).await?;
        Ok((written, cut))
    }

    /// Takes the cut (sealing first when `seal`) and dumps everything under it.
    async fn dump(&self, seal: bool) -> Result<(SnapshotBody, Cut), SnapshotActionError> {
        let cut = self.runtimes.pause_all().await?;
        if seal {
            self.hub.journal().seal();
        }
        Ok((self.body_under(&cut).await, cut))
    }

    /// Everything a snapshot holds, read inside `cut`.
    async fn body_under(&self, cut: &Cut) -> SnapshotBody {
        let journal = self.hub.journal().dump().await;
        let views = self.hub.dump_states();
        let runtimes = cut
            .runtimes()
            .iter()
            .map(|paused| RuntimeDump {
                name: paused.name.clone(),
                module: paused.module.clone(),
                configured: Some(paused.configured.clone()),
                saved: paused.saved.clone(),
            })
            .collect();
        SnapshotBody {
            journal,
            views,
            runtimes,
            log_position: self.log.has_positions().then(|| self.log.committed()),
            stream: self.log.stream().map(|stream| stream.epoch()),
        }
    }

    /// Writes `body` off the async threads, then prunes old snapshots.
    async fn store(
        &self,
        body: SnapshotBody,
        meta: SnapshotMeta,
    ) -> Result<WrittenSnapshot, SnapshotActionError> {
        let records = body.journal.record_count();
        let position = body.log_position;
        let dir = Arc::clone(&self.dir);
        let (info, pruned) = tokio::task::spawn_blocking(move || {
            let info = dir.write(&body, &meta)?;
            let pruned = dir.prune();
            if let Err(error) = &pruned {
                tracing::warn!(%error, "pruning old snapshots failed");
            }
            Ok::<_, SnapshotError>((info, pruned.ok()))
        })
        .await??;
        if let (Some(position), Some(pruned)) = (position, pruned) {
            self.forget_log_before(info.path(), position, &pruned.kept);
        }
        if let Some(position) = position {
            self.written
                .send_replace(Some((info.path().to_owned(), position)));
        }
        Ok(WrittenSnapshot { info, records })
    }

    /// Notes that `file` is at log `position`, and deletes the segments no kept snapshot needs.
    /// A kept snapshot of an earlier life (its position unknown) keeps every segment.
    fn forget_log_before(
        &self,
        file: &std::path::Path,
        position: u64,
        kept: &[std::path::PathBuf],
    ) {
        let oldest = {
            let mut positions = self
                .positions
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            positions.insert(file.to_owned(), position);
            positions.retain(|path, _| kept.contains(path));
            match kept.iter().all(|path| positions.contains_key(path)) {
                true => positions.values().min().copied(),
                false => None,
            }
        };
        if let Some(oldest) = oldest {
            match self.log.delete_before(oldest) {
                Ok(0) => {}
                Ok(deleted) => tracing::debug!(
                    deleted,
                    before = oldest,
                    "log segments no snapshot needs deleted"
                ),
                Err(error) => tracing::warn!(%error, "deleting old log segments failed"),
            }
        }
    }

    /// Every file in the snapshot directory, newest first.
    ///
    /// # Errors
    /// The directory cannot be read.
    pub async fn list(&self) -> Result<Vec<SnapshotEntry>, SnapshotActionError> {
        let dir = Arc::clone(&self.dir);
        Ok(tokio::task::spawn_blocking(move || dir.list()).await??)
    }

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
                // Named by its file name: the answer carries no path.
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
        for view in self.hub.views() {
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
                        SnapshotActionError::Unrestorable(format!("{name}: {error}"))
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
        let position = self.log.has_positions().then(|| self.log.committed());
        Ok(Restored {
            epoch,
            records,
            position,
        })
    }

    /// Writes a periodic snapshot every `every` until the handle is aborted.
    pub fn spawn_periodic(self: &Arc<Self>, every: Duration) -> JoinHandle<()> {
        let snapshots = Arc::clone(self);
        let span = tracing::info_span!("periodic_snapshots");
        tokio::spawn(
            async move {
                let mut ticker = tokio::time::interval(every);
                ticker.tick().await;
                loop {
                    ticker.tick().await;
                    match snapshots.write().await {
                        Ok(written) => tracing::debug!(file = %written.info.path().display(), "periodic snapshot written"),
                        Err(error) => tracing::warn!(%error, "periodic snapshot failed"),
                    }
                }
            }
            .instrument(span),
        )
    }
}

#[cfg(test)]
mod tests {
    use viewtape_journal::{EventJournal, JournalConfig};

    use super::*;
    use crate::host::{guests, EngineConfig, GuestEngine, GuestModule};
    use crate::runtime::{RuntimeConfig, RuntimeHandle};

    /// A server's snapshot actions with one `demo` runtime running the ticker.
    async fn server(dir: &std::path::Path) -> (Snapshots, Arc<Hub>, RuntimeHandle) {
        let journal = Arc::new(EventJournal::new(JournalConfig::default()));
        let hub = Arc::new(Hub::new(Arc::clone(&journal)));
        let engine = GuestEngine::new(EngineConfig::default()).unwrap();
        let module = GuestModule::new(&engine, guests::TICKER_WASM).unwrap();
        let handle = RuntimeHandle::spawn(
            module,
            RuntimeConfig::new("demo", ["prices"]),
            None,
            journal,
            Arc::clone(&hub),
            Arc::default(),
        )
        .await
        .unwrap();
        let mut runtimes = Runtimes::default();
        runtimes.insert(handle.clone(), ModuleFingerprint::of(guests::TICKER_WASM));
        let dir = Arc::new(SnapshotDir::open(dir).unwrap());
        let snapshots = Snapshots::new(Arc::clone(&hub), dir, Arc::new(runtimes), Arc::default());
        (snapshots, hub, handle)
    }

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

    #[tokio::test]
    async fn nothing_commits_after_the_exact_snapshot_while_its_cut_is_held() {
        let dir = tempfile::tempdir().unwrap();
        let (snapshots, hub, handle) = server(dir.path()).await;
        let (_, cut) = snapshots.write_exact().await.unwrap();
        let tick = bytes::Bytes::from_static(b"{\"symbol\":\"ACME\",\"price\":1.5,\"seq\":1}\n");
        let late = tokio::spawn({
            let handle = handle.clone();
            let tick = tick.clone();
            async move { handle.ingest(tick, None).await }
        });
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        assert!(!late.is_finished(), "a batch ran after the exact snapshot");
        assert!(hub.view("prices").is_none_or(|view| view.keys() == 0));
        drop(cut);
        late.await.unwrap().unwrap();
    }
}
