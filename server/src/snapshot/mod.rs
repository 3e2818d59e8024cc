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
//! [`ModuleFingerprint`]: crate::runtime::registry::ModuleFingerprint
//! [`Cut`]: crate::runtime::registry::Cut
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
//!
//! | file | job |
//! |---|---|
//! | this one | [`Snapshots`]: the actions' shared parts, the listing, the errors |
//! | `body` | what a snapshot file holds: the journal, the views, each runtime's state |
//! | `write` | writing one under the cut, pruning, the log segments kept, the periodic timer |
//! | `restore` | a live restore: checked first, then put in place under the cut |

use std::collections::BTreeMap;
use std::sync::Arc;

use viewtape_snapshots::{SnapshotDir, SnapshotEntry, SnapshotError};

use crate::hub::Hub;
use crate::log::{Log, LogPosition};
use crate::runtime::registry::Runtimes;
use crate::runtime::IngestError;

mod body;
mod restore;
mod write;

pub use body::{RuntimeDump, SnapshotBody, StartFrom};
pub use restore::{RestoreAt, Restored};

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

/// The server's snapshot actions, over its hub, snapshot directory and runtimes.
#[derive(Debug)]
pub struct Snapshots {
    hub: Arc<Hub>,
    dir: Arc<SnapshotDir>,
    runtimes: Arc<Runtimes>,
    log: Arc<Log>,
    /// The log position of each snapshot file written or restored in this life: segments older
    /// than every kept snapshot's position are deleted.
    positions: std::sync::Mutex<BTreeMap<std::path::PathBuf, LogPosition>>,
    /// One action at a time.
    busy: tokio::sync::Mutex<()>,
    /// The last file written, with its log position: what a cluster shares.
    written: tokio::sync::watch::Sender<Option<(std::path::PathBuf, LogPosition)>>,
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
    ) -> tokio::sync::watch::Receiver<Option<(std::path::PathBuf, LogPosition)>> {
        self.written.subscribe()
    }

    /// Every file in the snapshot directory, newest first.
    ///
    /// # Errors
    /// The directory cannot be read.
    pub async fn list(&self) -> Result<Vec<SnapshotEntry>, SnapshotActionError> {
        let dir = Arc::clone(&self.dir);
        Ok(tokio::task::spawn_blocking(move || dir.list()).await??)
    }
}

#[cfg(test)]
mod tests {
    use viewtape_journal::{EventJournal, JournalConfig};

    use super::*;
    use crate::host::{guests, EngineConfig, GuestEngine, GuestModule};
    use crate::runtime::registry::ModuleFingerprint;
    use crate::runtime::{RuntimeConfig, RuntimeHandle};

    /// A server's snapshot actions with one `demo` runtime running the ticker.
    pub(super) async fn server(dir: &std::path::Path) -> (Snapshots, Arc<Hub>, RuntimeHandle) {
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
        let runtimes = Runtimes::default();
        runtimes.insert(
            handle.clone(),
            ModuleFingerprint::of(guests::TICKER_WASM),
            None,
        );
        let dir = Arc::new(SnapshotDir::open(dir).unwrap());
        let snapshots = Snapshots::new(Arc::clone(&hub), dir, Arc::new(runtimes), Arc::default());
        (snapshots, hub, handle)
    }
}
