//! The running runtimes, by name, and the consistency cut over all of them.
//!
//! ## Module fingerprints
//!
//! A guest's saved state only means something to the module that saved it. Every runtime is
//! registered with the [`ModuleFingerprint`] of its module; snapshots record it beside the
//! state, and state is handed back only to a runtime whose module has the same fingerprint.
//!
//! ## The cut
//!
//! [`Runtimes::pause_all`] stops every runtime between batches, **in name order**, and keeps
//! them stopped until the returned [`Cut`] is dropped. Inside it nothing commits, so the
//! journal, the views and every guest's state agree. Every cut pauses in the same order, so two
//! cuts never wait on each other's runtimes crosswise.

use std::collections::BTreeMap;

pub use crate::host::ModuleFingerprint;
use crate::runtime::{IngestError, PauseGuard, RuntimeHandle, RuntimeSnapshot};

/// One registered runtime.
#[derive(Clone, Debug)]
pub struct Registered {
    /// Its task.
    pub handle: RuntimeHandle,
    /// The module it runs.
    pub module: ModuleFingerprint,
}

/// Every runtime of the server, by name. Built at start-up, then shared read-only.
#[derive(Clone, Debug, Default)]
pub struct Runtimes {
    by_name: BTreeMap<String, Registered>,
}

impl Runtimes {
    /// Adds a runtime (start-up only).
    pub fn insert(&mut self, handle: RuntimeHandle, module: ModuleFingerprint) {
        self.by_name
            .insert(handle.name().to_owned(), Registered { handle, module });
    }

    /// The runtime named `name`.
    pub fn get(&self, name: &str) -> Option<&Registered> {
        self.by_name.get(name)
    }

    /// Every runtime, in name order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Registered)> {
        self.by_name.iter().map(|(name, r)| (name.as_str(), r))
    }

    /// Every runtime's name, in order.
    pub fn names(&self) -> Vec<&str> {
        self.by_name.keys().map(String::as_str).collect()
    }

    /// Pauses every runtime between batches, in name order; see the module docs.
    ///
    /// # Errors
    /// A runtime task has stopped; the runtimes paused so far are released.
    pub async fn pause_all(&self) -> Result<Cut, IngestError> {
        let mut paused = Vec::with_capacity(self.by_name.len());
        for (name, registered) in &self.by_name {
            let (saved, guard) = registered.handle.pause().await?;
            paused.push(Paused {
                name: name.clone(),
                module: registered.module.clone(),
                saved,
                guard,
            });
        }
        Ok(Cut { paused })
    }
}

/// Every runtime paused between batches; dropping it lets them all run again.
#[derive(Debug)]
pub struct Cut {
    paused: Vec<Paused>,
}

/// One runtime inside a [`Cut`].
#[derive(Debug)]
pub struct Paused {
    /// Its name.
    pub name: String,
    /// The module it runs.
    pub module: ModuleFingerprint,
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
