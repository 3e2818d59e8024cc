//! The running runtimes, by name, and the consistency cut over all of them.
//!
//! ## Modules
//!
//! A guest's saved state only means something to the module that saved it. Snapshots record
//! each runtime's [`ModuleFingerprint`] beside its state, and state is handed back only to a
//! runtime running a module with the same fingerprint. A runtime runs the module its config
//! names until one is deployed to it; deployed modules are kept in the [`ModuleStore`] by
//! fingerprint, so that a restart runs, and a replay switches to, exactly the module that ran.
//!
//! ## The cut
//!
//! [`Runtimes::pause_all`] stops every runtime between batches, **in name order**, and keeps
//! them stopped until the returned [`Cut`] is dropped. Inside it nothing commits, so the
//! journal, the views and every guest's state agree. Every cut pauses in the same order, so two
//! cuts never wait on each other's runtimes crosswise.
//!
//! A cluster's record can hold batches of several runtimes, applied by each at one position
//! ([`Runtimes::hold_cuts`]): no cut starts while some have applied theirs and others not, and
//! none at all once such a record was left half applied.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, PoisonError, RwLock, RwLockReadGuard};

use tokio::sync::{Mutex, OwnedMutexGuard};
use viewtape_journal::ViewClaim;

use crate::host::GuestModule;
pub use crate::host::ModuleFingerprint;
use crate::log::Definition;
use crate::runtime::{IngestError, PauseGuard, RuntimeHalt, RuntimeHandle, RuntimeSnapshot};

/// One registered runtime.
#[derive(Clone, Debug)]
pub struct Registered {
    /// Its task.
    pub handle: RuntimeHandle,
    /// The module its config names (it runs another after a deploy).
    pub configured: ModuleFingerprint,
    /// What a define record made it (`None`: a `[[runtime]]` of the config, as the config
    /// says), on the module it was defined with.
    defined: Option<Arc<Definition>>,
}

impl Registered {
    /// What a define record made it, on the build it runs now: a deploy changes a runtime's
    /// module and nothing else (`None`: a `[[runtime]]` of the config, as the config says).
    pub fn definition(&self) -> Option<Definition> {
        let module = self.handle.module();
        self.defined
            .as_ref()
            .map(|defined| defined.running(&module))
    }

    /// Whether it publishes to `view` (a view it names, or one a pattern of it takes).
    pub fn takes(&self, view: &str) -> bool {
        ViewClaim::any_takes(self.handle.views(), view)
    }
}

/// Every runtime of the server, by name: those of the config, started with the server, and
/// those define records made, which come and go while it runs.
#[derive(Debug, Default)]
pub struct Runtimes {
    by_name: RwLock<BTreeMap<String, Registered>>,
    /// The runtimes deleted by a record whose config declaration is known, with its digest
    /// ([`Definition::declared`]), so that a start does not declare them again.
    deleted: RwLock<BTreeMap<String, String>>,
    /// Held by a cut, and by whoever applies a record shared by several runtimes or changes
    /// which runtimes there are.
    cuts: Arc<Mutex<Option<Torn>>>,
}

/// A record shared by several runtimes that was left half applied.
#[derive(Debug)]
struct Torn {
    runtime: String,
    reason: String,
}

/// Keeps cuts from starting while a record shared by several runtimes is applied
/// ([`Runtimes::hold_cuts`]).
#[derive(Debug)]
pub struct CutsHeld(OwnedMutexGuard<Option<Torn>>);

impl CutsHeld {
    /// The record was left half applied: `runtime` could not apply its part, for `reason`.
    /// No cut is taken from now on (it would hold some runtimes' part and not the others'),
    /// and [`Runtimes::pause_all`] says why.
    pub fn tear(&mut self, runtime: &str, reason: &str) {
        *self.0 = Some(Torn {
            runtime: runtime.to_owned(),
            reason: reason.to_owned(),
        });
    }
}

impl Runtimes {
    fn read(&self) -> RwLockReadGuard<'_, BTreeMap<String, Registered>> {
        self.by_name.read().unwrap_or_else(PoisonError::into_inner)
    }

    /// Adds a runtime, or replaces the one of the same name.
    pub fn insert(
        &self,
        handle: RuntimeHandle,
        configured: ModuleFingerprint,
        definition: Option<Arc<Definition>>,
    ) {
        let registered = Registered {
            handle,
            configured,
            defined: definition,
        };
        let name = registered.handle.name().to_owned();
        self.deleted
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&name);
        self.by_name
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(name, registered);
    }

    /// Removes the runtime named `name`, deleted by a record; `declared`: the digest of the
    /// config declaration it had, if any.
    pub fn remove(&self, name: &str, declared: Option<String>) -> Option<Registered> {
        if let Some(declared) = declared {
            self.deleted
                .write()
                .unwrap_or_else(PoisonError::into_inner)
                .insert(name.to_owned(), declared);
        }
        self.by_name
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(name)
    }

    /// The digest of the config declaration runtime `name` had when a record deleted it.
    pub fn deleted(&self, name: &str) -> Option<String> {
        self.deleted
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(name)
            .cloned()
    }

    /// Every deleted runtime's config declaration, by name ([`Runtimes::deleted`]): what a
    /// snapshot keeps.
    pub fn all_deleted(&self) -> BTreeMap<String, String> {
        self.deleted
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Restores what a snapshot kept of deleted runtimes ([`Runtimes::all_deleted`]).
    pub fn restore_deleted(&self, deleted: BTreeMap<String, String>) {
        *self.deleted.write().unwrap_or_else(PoisonError::into_inner) = deleted;
    }

    /// The runtime named `name`.
    pub fn get(&self, name: &str) -> Option<Registered> {
        self.read().get(name).cloned()
    }

    /// The task that runs as `name` now, if it is not `stopped`'s: the runtime was replaced
    /// (by a define record) while `stopped` ended. `None` when it was deleted, or its task
    /// itself stopped.
    pub fn successor(&self, name: &str, stopped: &RuntimeHandle) -> Option<RuntimeHandle> {
        self.get(name)
            .map(|registered| registered.handle)
            .filter(|handle| !handle.is_same(stopped))
    }

    /// The runtime that publishes to `view`, by name or by a pattern.
    pub fn taking(&self, view: &str) -> Option<Registered> {
        self.read().values().find(|r| r.takes(view)).cloned()
    }

    /// Every runtime, in name order.
    pub fn iter(&self) -> impl Iterator<Item = (String, Registered)> {
        let all: Vec<_> = self
            .read()
            .iter()
            .map(|(name, r)| (name.clone(), r.clone()))
            .collect();
        all.into_iter()
    }

    /// The first `Some` that `f` gives for a runtime (its name, its entry), in name order,
    /// each looked at in place: nothing is copied, however many runtimes there are.
    pub fn find_map<R>(&self, mut f: impl FnMut(&str, &Registered) -> Option<R>) -> Option<R> {
        self.read().iter().find_map(|(name, r)| f(name, r))
    }

    /// The compiled module `fingerprint` names, if a runtime runs it: many runtimes on one
    /// module compile it once.
    pub fn running_module(&self, fingerprint: &ModuleFingerprint) -> Option<GuestModule> {
        self.find_map(|_, r| {
            let module = r.handle.running();
            (module.fingerprint() == fingerprint && !module.is_unavailable()).then_some(module)
        })
    }

    /// The runtimes halted on this node ([`RuntimeHalt`]), by name.
    pub fn halted(&self) -> BTreeMap<String, RuntimeHalt> {
        self.read()
            .iter()
            .filter_map(|(name, r)| Some((name.clone(), r.handle.stats().halted()?)))
            .collect()
    }

    /// How many runtimes run.
    pub fn len(&self) -> usize {
        self.read().len()
    }

    /// Whether none runs.
    pub fn is_empty(&self) -> bool {
        self.read().is_empty()
    }

    /// Every runtime's name, in order.
    pub fn names(&self) -> Vec<String> {
        self.read().keys().cloned().collect()
    }

    /// Keeps cuts from starting until the guard is dropped: held while applying a record of
    /// several runtimes' batches at one position, so that a cut holds all of them or none.
    pub async fn hold_cuts(&self) -> CutsHeld {
        CutsHeld(Arc::clone(&self.cuts).lock_owned().await)
    }

    /// Pauses every runtime between batches, in name order; see the module docs.
    ///
    /// # Errors
    /// A runtime task has stopped (the runtimes paused so far are released), or a record shared
    /// by several runtimes was left half applied ([`CutsHeld::tear`]).
    pub async fn pause_all(&self) -> Result<Cut, IngestError> {
        let held = self.hold_cuts().await;
        if let Some(torn) = held.0.as_ref() {
            return Err(IngestError::Shared {
                runtime: torn.runtime.clone(),
                reason: format!("no snapshot is cut: this node left a record of several runtimes half applied ({}); restart it, and it applies the record again from its last snapshot", torn.reason),
            });
        }
        let mut paused = Vec::new();
        for (name, registered) in self.iter() {
            let (saved, guard) = registered.handle.pause().await?;
            paused.push(Paused {
                name,
                module: registered.handle.module(),
                definition: registered.definition(),
                configured: registered.configured,
                saved,
                guard,
            });
        }
        Ok(Cut {
            paused,
            _held: held,
        })
    }
}

/// Every runtime paused between batches; dropping it lets them all run again.
#[derive(Debug)]
pub struct Cut {
    paused: Vec<Paused>,
    _held: CutsHeld,
}

/// One runtime inside a [`Cut`].
#[derive(Debug)]
pub struct Paused {
    /// Its name.
    pub name: String,
    /// The module it runs.
    pub module: ModuleFingerprint,
    /// The module its config names.
    pub configured: ModuleFingerprint,
    /// What a define record made it, on the module it runs.
    pub definition: Option<Definition>,
    /// Its state and checkpoint at the cut: exactly what it has committed.
    pub saved: RuntimeSnapshot,
    /// Keeps it paused; stages and commits a restore.
    pub guard: PauseGuard,
}

impl Cut {
    /// The paused runtimes, in name order.
    pub fn runtimes(&self) -> &[Paused] {
        &self.paused
    }
}

/// Guest modules by fingerprint, in `<data-dir>/modules/<sha-256 hex>.wasm`: every module ever
/// deployed, so that a restart and a replay find the module each record ran on. Each file is
/// checked against its SHA-256 when read; a damaged or missing one is repaired from a copy the
/// server holds elsewhere (a built-in, the config's file: [`ModuleStore::know`]) or by keeping
/// the same bytes again (an upload).
#[derive(Debug)]
pub struct ModuleStore {
    dir: PathBuf,
    /// Copies of modules held outside the store, by fingerprint.
    copies: RwLock<std::collections::HashMap<ModuleFingerprint, bytes::Bytes>>,
}

impl ModuleStore {
    /// The store in `dir`, created if missing; the leftovers of interrupted writes are removed.
    ///
    /// # Errors
    /// The directory cannot be created.
    pub fn open(dir: impl Into<PathBuf>) -> std::io::Result<Self> {
        let dir = dir.into();
        std::fs::create_dir_all(&dir)?;
        for entry in std::fs::read_dir(&dir)?.flatten() {
            let name = entry.file_name();
            let leftover = name
                .to_str()
                .and_then(|name| name.strip_suffix(".wasm.tmp"))
                .is_some_and(|hex| hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit()));
            if leftover {
                match std::fs::remove_file(entry.path()) {
                    Ok(()) => {
                        tracing::info!(file = %entry.path().display(), "removed the leftover of an interrupted module write")
                    }
                    Err(error) => {
                        tracing::warn!(file = %entry.path().display(), %error, "cannot remove the leftover of an interrupted module write")
                    }
                }
            }
        }
        Ok(Self {
            dir,
            copies: RwLock::default(),
        })
    }

    /// Remembers `wasm`, held outside the store, as a copy to repair its file from.
    pub fn know(&self, wasm: bytes::Bytes) {
        let fingerprint = ModuleFingerprint::of(&wasm);
        self.copies
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(fingerprint, wasm);
    }

    /// Keeps `wasm` (durably: written aside, synced, renamed, directory synced) unless it is
    /// kept already, intact; a damaged file is written again. Returns its fingerprint.
    ///
    /// # Errors
    /// Writing or syncing fails.
    pub fn put(&self, wasm: &[u8]) -> std::io::Result<ModuleFingerprint> {
        let fingerprint = ModuleFingerprint::of(wasm);
        let path = self.path(&fingerprint);
        match std::fs::read(&path) {
            Ok(kept) if kept == wasm => return Ok(fingerprint),
            Ok(_) => {
                tracing::warn!(file = %path.display(), module = %fingerprint, "the kept module file was damaged: written again")
            }
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
            Err(error) => return Err(error),
        }
        self.write(&path, wasm)?;
        Ok(fingerprint)
    }

    fn write(&self, path: &Path, wasm: &[u8]) -> std::io::Result<()> {
        let temp = path.with_extension("wasm.tmp");
        let mut file = std::fs::File::create(&temp)?;
        file.write_all(wasm)?;
        file.sync_all()?;
        std::fs::rename(&temp, path)?;
        std::fs::File::open(&self.dir)?.sync_all()
    }

    /// The module with `fingerprint`, checked against it; a damaged or missing file is
    /// repaired from a copy the server holds ([`ModuleStore::know`]).
    ///
    /// # Errors
    /// It is not kept (or damaged) and no copy is held, or it cannot be read.
    pub fn get(&self, fingerprint: &ModuleFingerprint) -> std::io::Result<Vec<u8>> {
        let path = self.path(fingerprint);
        let problem = match std::fs::read(&path) {
            Ok(wasm) if ModuleFingerprint::of(&wasm) == *fingerprint => return Ok(wasm),
            Ok(_) => std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!(
                    "{} is damaged: its bytes are not module {fingerprint}; keep the module's bytes again (POST /admin/modules) to repair it",
                    path.display()
                ),
            ),
            Err(error) => error,
        };
        let copy = self
            .copies
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(fingerprint)
            .cloned();
        let Some(copy) = copy else {
            return Err(problem);
        };
        tracing::warn!(file = %path.display(), module = %fingerprint, error = %problem, "a kept module file could not be used: repaired from the copy the server holds");
        self.write(&path, &copy)?;
        Ok(copy.to_vec())
    }

    /// Where `fingerprint` is kept.
    pub fn path(&self, fingerprint: &ModuleFingerprint) -> PathBuf {
        let text = fingerprint.to_string();
        let name = text.strip_prefix("sha256:").unwrap_or(&text);
        self.dir.join(format!("{name}.wasm"))
    }

    /// The store's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use viewtape_journal::{EventJournal, JournalConfig};

    use super::*;
    use crate::host::{guests, EngineConfig, GuestEngine, GuestModule};
    use crate::runtime::RuntimeConfig;

    /// A cut waits while a shared record is applied, and none is taken once one was left half
    /// applied.
    #[tokio::test]
    async fn cuts_wait_for_shared_records_and_stop_at_a_torn_one() {
        let engine = GuestEngine::new(EngineConfig::default()).unwrap();
        let module = GuestModule::new(&engine, guests::TICKER_WASM).unwrap();
        let journal = Arc::new(EventJournal::new(JournalConfig::default()));
        let hub = Arc::new(crate::hub::Hub::new(Arc::clone(&journal)));
        let handle = RuntimeHandle::spawn(
            module,
            RuntimeConfig::new("demo", ["prices"]),
            None,
            journal,
            hub,
            Arc::default(),
        )
        .await
        .unwrap();
        let runtimes = Runtimes::default();
        runtimes.insert(handle, ModuleFingerprint::of(guests::TICKER_WASM), None);

        let held = runtimes.hold_cuts().await;
        let cut = tokio::time::timeout(Duration::from_millis(200), runtimes.pause_all()).await;
        assert!(cut.is_err(), "a cut waits while a shared record is applied");
        drop(held);
        let cut = runtimes.pause_all().await.unwrap();
        assert_eq!(cut.runtimes().len(), 1);
        drop(cut);

        runtimes.hold_cuts().await.tear("demo", "the guest trapped");
        match runtimes.pause_all().await {
            Err(IngestError::Shared { runtime, reason }) => {
                assert_eq!(runtime, "demo");
                assert!(reason.contains("the guest trapped"), "{reason}");
            }
            other => panic!("a cut after a torn record: {other:?}"),
        }
    }
}
