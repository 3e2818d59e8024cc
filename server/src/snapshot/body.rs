//! What a snapshot file holds: the journal dump, every view's state, and each runtime's guest
//! state with the module that saved it.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use viewtape_journal::{JournalEpoch, JournalSnapshot};

use crate::hub::{Hub, ViewStateDump};
use crate::log::Definition;
use crate::log::LogPosition;
use crate::runtime::registry::ModuleFingerprint;
use crate::runtime::RuntimeSnapshot;

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
    pub log_position: Option<LogPosition>,
    /// On a cluster: the epoch of the stream whose history it is part of (the journal's own
    /// epoch differs from it after a live restore). `None`: a single node's.
    #[serde(default)]
    pub stream: Option<JournalEpoch>,
    /// On a cluster: the runtimes this node does not run whose records it passed over, each
    /// with the first sequence of theirs it passed over (see `StreamLog::passed_over`).
    #[serde(default)]
    pub passed_over: BTreeMap<String, LogPosition>,
    /// The runtimes a record deleted, each with the digest of the config declaration it had:
    /// a start does not declare them again while that declaration stands.
    #[serde(default)]
    pub deleted: BTreeMap<String, String>,
}

impl SnapshotBody {
    /// Restores the journal and the views' state into `hub` (keeping the journal's epoch when
    /// `keep_epoch`), and hands back each runtime's record by name, for its task to start from:
    /// the one way every start-up puts a snapshot in place.
    pub async fn restore_into(self, hub: &Hub, keep_epoch: bool) -> StartFrom {
        hub.restore(self.journal, keep_epoch, self.views).await;
        let dumps = self
            .runtimes
            .into_iter()
            .map(|r| (r.name.clone(), r))
            .collect();
        StartFrom {
            dumps,
            deleted: self.deleted,
        }
    }
}

/// What a snapshot hands the runtimes at a start.
#[derive(Debug, Default)]
pub struct StartFrom {
    /// Each runtime's record, by name.
    pub dumps: BTreeMap<String, RuntimeDump>,
    /// The runtimes a record deleted, with their config declarations
    /// ([`SnapshotBody::deleted`]).
    pub deleted: BTreeMap<String, String>,
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
    /// What a define record made it (`None`: a `[[runtime]]` of the config): a start runs it
    /// from this, whatever the config says.
    #[serde(default)]
    pub definition: Option<Definition>,
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
