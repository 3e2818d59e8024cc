//! Runtimes as data: created, replaced and deleted while the server runs.
//!
//! Every change is a record of the log ([`DefineEntry`], [`RetireEntry`]), applied at one
//! position by [`Catalog::apply`] — the one path, whoever feeds it: `PUT` and `DELETE
//! /admin/runtimes/{runtime}` on a single node (judged first, then logged and applied), the
//! start-up replay of the local log, and a cluster's apply loop (published first, then judged
//! alike by every node at its position). So a restart, `kill -9` included, and every node of a
//! cluster run the same runtimes, and the definitions live on in snapshots.
//!
//! - **Create**: a new task on the definition's module, started by the guest's `init`; its
//!   views exist from then on.
//! - **Replace**: the running task is paused, a new one starts from its state, as a deploy
//!   carries state over (a module that refuses the state refuses the replacement, and nothing
//!   changes), and the old one ends: what waited in its queue is answered "stopped", and the
//!   HTTP ingest sends it again to the new one (`http/ingest.rs`). Views it no longer declares
//!   are retired.
//! - **Delete**: the task ends, its ingest answers `404`, its views are retired.
//!
//! A change holds the cuts ([`Runtimes::hold_cuts`]): a snapshot holds the runtimes as they were
//! before a change or after it, never halfway.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};

use bytes::Bytes;
use viewtape_journal::{EventJournal, ViewClaim};

use crate::host::{GuestEngine, GuestError, GuestModule, ModuleFingerprint};
use crate::hub::Hub;
use viewtape_snapshots::log::LogError;

use crate::log::{
    unix_ms_now, DefineEntry, Definition, Entry, Log, LogPosition, Publishing, RetireEntry,
};
use crate::runtime::registry::{ModuleStore, Registered, Runtimes};
use crate::runtime::{BatchSink as _, RuntimeConfig, RuntimeHandle, RuntimeSnapshot};
use crate::schema::{ConfiguredSchemas, ViewSchema};

/// What a `PUT` did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Changed {
    /// A new runtime.
    Created,
    /// A runtime of that name now runs the new definition.
    Replaced,
    /// The runtime runs that definition already: nothing was logged.
    Unchanged,
    /// The runtime was deleted.
    Deleted,
}

/// Why a change did not happen; nothing changed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CatalogError {
    /// No runtime has that name.
    #[error("no runtime named {0:?}")]
    NoSuchRuntime(String),
    /// A view or pattern overlaps another runtime's.
    #[error("view {view:?} overlaps {theirs:?} of runtime {runtime:?}: a view has one runtime")]
    Conflict {
        /// The definition's view or pattern.
        view: String,
        /// The other runtime.
        runtime: String,
        /// Its view or pattern.
        theirs: String,
    },
    /// A field of the definition is wrong.
    #[error("{field}: {message}")]
    Invalid {
        /// The field, as a path (`views[1]`, `schemas.orders`).
        field: String,
        /// What is wrong, in the server's words.
        message: String,
    },
    /// The module is not kept on this node.
    #[error("module {0} is not kept here: upload it first (POST /admin/modules)")]
    NoSuchModule(ModuleFingerprint),
    /// The guest refused to start, or to take the running state over.
    #[error("runtime {runtime:?}: the guest refused: {message}")]
    Refused {
        /// The runtime.
        runtime: String,
        /// Why, in the server's words.
        message: String,
    },
    /// A bound of the server's is reached (its runtimes, its guest instances); nothing is wrong
    /// with the definition.
    #[error("runtime {runtime:?}: {message}")]
    Capacity {
        /// The runtime.
        runtime: String,
        /// Which bound, in the server's words.
        message: String,
    },
    /// The record could not be logged.
    #[error("runtime {runtime:?}: the change could not be logged: {source}")]
    Log {
        /// The runtime.
        runtime: String,
        /// Why.
        #[source]
        source: LogError,
    },
    /// A cluster's stream did not take the record, or this node did not apply it in time:
    /// whether it changed anything is not known here.
    #[error("runtime {runtime:?}: {reason}")]
    Shared {
        /// The runtime.
        runtime: String,
        /// Why.
        reason: String,
    },
}

/// How many verdicts on pending records a node keeps for their waiters. A waiter takes its
/// verdict as soon as its node has applied the record, so only a burst of this many changes
/// through other nodes within that moment could push one out (its waiter then answers that
/// there is no verdict, and the change stands as judged).
const VERDICTS_KEPT: usize = 1024;

/// Creates, replaces and deletes runtimes; see the module docs.
#[derive(Debug)]
pub struct Catalog {
    engine: GuestEngine,
    modules: Arc<ModuleStore>,
    runtimes: Arc<Runtimes>,
    journal: Arc<EventJournal>,
    hub: Arc<Hub>,
    log: Arc<Log>,
    /// The config's `[[runtime]]`s as definitions, by name.
    configured: BTreeMap<String, Definition>,
    /// The most runtimes a put may make (`[server] max_runtimes`).
    max_runtimes: usize,
    /// One change at a time, from its check to its record applied.
    changing: tokio::sync::Mutex<()>,
    /// On a cluster: the verdicts on pending records, by position, for the waiter of the node
    /// that published one; at most [`VERDICTS_KEPT`], the oldest dropped first (every node
    /// judges every record, and only its publisher takes the verdict away).
    verdicts: Mutex<BTreeMap<LogPosition, Result<Changed, CatalogError>>>,
    /// Wakes the waiters for verdicts when one is given (after the record's position counts as
    /// applied: a waiter waits for its verdict, not for the position).
    verdict_given: tokio::sync::Notify,
}

impl Catalog {
    /// The catalog of `runtimes`, whose tasks run on `engine`, publish to `hub` and log to
    /// `log`, with modules from `modules`; `configured`: the config's `[[runtime]]`s; a put
    /// makes no runtime past `max_runtimes`.
    pub fn new(
        engine: GuestEngine,
        modules: Arc<ModuleStore>,
        runtimes: Arc<Runtimes>,
        hub: Arc<Hub>,
        log: Arc<Log>,
        configured: BTreeMap<String, Definition>,
        max_runtimes: usize,
    ) -> Self {
        Self {
            engine,
            modules,
            journal: Arc::clone(hub.journal()),
            runtimes,
            hub,
            log,
            configured,
            max_runtimes,
            changing: tokio::sync::Mutex::new(()),
            verdicts: Mutex::new(BTreeMap::new()),
            verdict_given: tokio::sync::Notify::new(),
        }
    }

    /// The runtimes.
    pub fn runtimes(&self) -> &Arc<Runtimes> {
        &self.runtimes
    }

    /// The module store.
    pub fn modules(&self) -> &Arc<ModuleStore> {
        &self.modules
    }

    /// What `registered` runs, as a definition: its record's, or its `[[runtime]]`'s, on the
    /// build that runs now.
    pub fn definition_of(&self, registered: &Registered) -> Option<Definition> {
        registered.definition().or_else(|| {
            self.configured
                .get(registered.handle.name())
                .map(|configured| configured.running(&registered.handle.module()))
        })
    }

    /// The config's `[[runtime]]` declaration that last declared runtime `name`, as a digest
    /// ([`Definition::declared`]), whether it runs now (`existing`) or was deleted.
    fn declared(&self, name: &str, existing: Option<&Registered>) -> Option<String> {
        match existing {
            Some(registered) => match registered.definition() {
                Some(definition) => definition.declared,
                None => self.configured.get(name).map(Definition::digest),
            },
            None => self.runtimes.deleted(name),
        }
    }

    /// Starts runtime `name` as a snapshot holds it: `definition` on `module`, from `saved`.
    ///
    /// # Errors
    /// The guest refuses to start.
    pub async fn start(
        &self,
        name: &str,
        definition: Definition,
        module: GuestModule,
        saved: RuntimeSnapshot,
    ) -> Result<(), CatalogError> {
        let handle = self
            .spawn(name, &definition, module, Some(saved), None)
            .await?;
        self.install(handle, definition);
        Ok(())
    }

    /// Creates runtime `name` or replaces it, by a record (at the position it answers, `None`
    /// with the log off or when nothing changed); see the module docs. A definition that names
    /// no config declaration ([`Definition::declared`]) keeps the one the runtime had.
    ///
    /// # Errors
    /// [`CatalogError`]; nothing changed.
    pub async fn put(
        &self,
        name: &str,
        definition: Definition,
    ) -> Result<(Changed, Option<LogPosition>), CatalogError> {
        self.put_by(name, definition, Publishing::Request).await
    }

    /// [`Catalog::put`] by a cluster's node that is settling its config's runtimes with the
    /// stream: it publishes while the node takes no other change yet.
    ///
    /// # Errors
    /// As [`Catalog::put`].
    pub async fn put_settling(
        &self,
        name: &str,
        definition: Definition,
    ) -> Result<(Changed, Option<LogPosition>), CatalogError> {
        self.put_by(name, definition, Publishing::Settle).await
    }

    async fn put_by(
        &self,
        name: &str,
        mut definition: Definition,
        by: Publishing,
    ) -> Result<(Changed, Option<LogPosition>), CatalogError> {
        let _changing = self.changing.lock().await;
        self.check(name, &definition)?;
        let existing = self.runtimes.get(name);
        if existing.is_none() && self.runtimes.len() >= self.max_runtimes {
            return Err(CatalogError::Capacity {
                runtime: name.to_owned(),
                message: format!(
                    "this node runs {} runtimes, its bound (raise [server] max_runtimes)",
                    self.max_runtimes
                ),
            });
        }
        if definition.declared.is_none() {
            definition.declared = self.declared(name, existing.as_ref());
        }
        if existing
            .as_ref()
            .and_then(|r| r.definition())
            .is_some_and(|running| running == definition)
        {
            return Ok((Changed::Unchanged, None));
        }
        let module = self.module(&definition.module).await?;
        let entry = DefineEntry {
            runtime: name.to_owned(),
            definition,
            at_ms: unix_ms_now(),
            pending: false,
        };
        if let Some(stream) = self.log.stream() {
            let entry = Entry::Define(DefineEntry {
                pending: true,
                ..entry
            });
            return self.publish(stream, name, entry, by).await;
        }
        let (changed, position) = self.define(entry, module, None).await?;
        tracing::info!(runtime = name, ?changed, "runtime defined");
        Ok((changed, position))
    }

    /// Deletes runtime `name`, by a record (at the position it answers, `None` with the log
    /// off); see the module docs.
    ///
    /// # Errors
    /// [`CatalogError`]; nothing changed.
    pub async fn delete(&self, name: &str) -> Result<Option<LogPosition>, CatalogError> {
        let _changing = self.changing.lock().await;
        if self.runtimes.get(name).is_none() {
            return Err(CatalogError::NoSuchRuntime(name.to_owned()));
        }
        let entry = RetireEntry {
            runtime: name.to_owned(),
            at_ms: unix_ms_now(),
        };
        if let Some(stream) = self.log.stream() {
            return self
                .publish(stream, name, Entry::Retire(entry), Publishing::Request)
                .await
                .map(|(_, position)| position);
        }
        let position = self.retire(entry, None).await?;
        tracing::info!(runtime = name, "runtime deleted");
        Ok(position)
    }

    /// Applies a logged define record at `position` with its module loaded (the start-up
    /// replay, a cluster's apply loop). A pending one (a cluster's) that the guest refuses
    /// consumes its position and changes nothing, alike on every node.
    ///
    /// # Errors
    /// A record already judged that cannot be applied: the log is not this history.
    pub async fn apply_define(
        &self,
        entry: DefineEntry,
        module: GuestModule,
        position: LogPosition,
    ) -> Result<(), CatalogError> {
        let pending = entry.pending;
        let running = self.runtimes.get(&entry.runtime);
        if running
            .and_then(|running| running.definition())
            .is_some_and(|running| running == entry.definition)
        {
            // It runs that definition already (two nodes of a cluster declared the same runtime
            // side by side, say): nothing to change, but the position is consumed.
            drop(self.log.turn(Some(position), 1).await);
            return self.settle(pending, position, Ok(Changed::Unchanged)).await;
        }
        // A pending record is judged again here, at its position, alike on every node: two
        // nodes may have published overlapping definitions side by side.
        let outcome = match pending {
            true => self.check(&entry.runtime, &entry.definition),
            false => Ok(()),
        };
        let outcome = match outcome {
            Ok(()) => self
                .define(entry, module, Some(position))
                .await
                .map(|(changed, _)| changed),
            Err(error) => Err(error),
        };
        self.settle(pending, position, outcome).await
    }

    /// Applies a logged retire record at `position`; as [`Catalog::apply_define`].
    ///
    /// # Errors
    /// As [`Catalog::apply_define`].
    pub async fn apply_retire(
        &self,
        entry: RetireEntry,
        position: LogPosition,
    ) -> Result<(), CatalogError> {
        let outcome = self
            .retire(entry, Some(position))
            .await
            .map(|_| Changed::Deleted);
        self.settle(true, position, outcome).await
    }

    /// Keeps the verdict on a pending record for its waiter; a judged record's failure is the
    /// caller's. A refused record consumes its position all the same, changing nothing.
    async fn settle(
        &self,
        pending: bool,
        position: LogPosition,
        outcome: Result<Changed, CatalogError>,
    ) -> Result<(), CatalogError> {
        if !pending {
            return outcome.map(|_| ());
        }
        if outcome.is_err() {
            // Refused before its turn was taken (a turn taken already is taken again harmlessly).
            drop(self.log.turn(Some(position), 1).await);
        }
        if let Err(error) = &outcome {
            tracing::info!(%error, position = position.get(), "a runtime change on the stream was refused; it changes nothing");
        }
        {
            let mut verdicts = self.verdicts.lock().unwrap_or_else(PoisonError::into_inner);
            verdicts.insert(position, outcome);
            while verdicts.len() > VERDICTS_KEPT {
                verdicts.pop_first();
            }
        }
        self.verdict_given.notify_waiters();
        Ok(())
    }

    /// Checks a definition against the other runtimes' views.
    fn check(&self, name: &str, definition: &Definition) -> Result<(), CatalogError> {
        let ours = claims(definition)?;
        let conflict = self.runtimes.find_map(|other, registered| {
            if other == name {
                return None;
            }
            registered.handle.views().iter().find_map(|theirs| {
                let claim = ViewClaim::new(theirs).ok()?;
                let view = ours.iter().find(|ours| ours.overlaps(&claim))?;
                Some(CatalogError::Conflict {
                    view: view.to_string(),
                    runtime: other.to_owned(),
                    theirs: theirs.clone(),
                })
            })
        });
        if let Some(conflict) = conflict {
            return Err(conflict);
        }
        schemas(definition)?;
        Ok(())
    }

    /// The module `fingerprint`: the compilation a runtime runs, else compiled from the store.
    async fn module(&self, fingerprint: &ModuleFingerprint) -> Result<GuestModule, CatalogError> {
        if let Some(module) = self.runtimes.running_module(fingerprint) {
            return Ok(module);
        }
        let wasm = self
            .modules
            .get(fingerprint)
            .map_err(|_| CatalogError::NoSuchModule(fingerprint.clone()))?;
        let engine = self.engine.clone();
        tokio::task::spawn_blocking(move || GuestModule::new(&engine, &wasm))
            .await
            .map_err(|error| CatalogError::Invalid {
                field: "module".to_owned(),
                message: error.to_string(),
            })?
            .map_err(|error| CatalogError::Invalid {
                field: "module".to_owned(),
                message: error.public_message().into_owned(),
            })
    }

    /// Creates or replaces the runtime of `entry` — at `position` of the log, or logged here
    /// (`None`); the position it applied at.
    async fn define(
        &self,
        entry: DefineEntry,
        module: GuestModule,
        position: Option<LogPosition>,
    ) -> Result<(Changed, Option<LogPosition>), CatalogError> {
        let name = entry.runtime.clone();
        let refused = |message: String| CatalogError::Refused {
            runtime: name.clone(),
            message,
        };
        // Cuts wait for the change; taken before the runtime pauses, as a cut takes them.
        let held = self.runtimes.hold_cuts().await;
        let existing = self.runtimes.get(&name);
        let (saved, guard) = match &existing {
            Some(registered) => {
                let (saved, guard) = registered
                    .handle
                    .pause()
                    .await
                    .map_err(|error| refused(error.to_string()))?;
                (Some(saved), Some(guard))
            }
            None => (None, None),
        };
        // A replacement takes the running state over, as a deploy does. The define record
        // decides the runtime's module, on every node alike: a cluster node finds it in the
        // runtime's history (so it is not taken for another build, or for a runtime whose
        // history this node lacks).
        let mut saved = saved.unwrap_or_default();
        saved.ran(&entry.definition.module);
        let previous = existing.as_ref().map(|registered| &registered.handle);
        let handle = self
            .spawn(&name, &entry.definition, module, Some(saved), previous)
            .await?;
        // Judged as a deploy is: the views' values must fit the schemas that change.
        if let Some(previous) = &existing {
            let (before, after) = (previous.handle.schemas(), handle.schemas());
            let misfit = before
                .changed_in(&after)
                .find_map(|(view, schema)| self.hub.misfit(view, schema));
            if let Some(violation) = misfit {
                return Err(refused(violation.to_string()));
            }
        }
        let position = match position {
            Some(position) => Some(position),
            None => self
                .log
                .append(vec![Entry::Define(entry.clone()).encode()])
                .await
                .map_err(|source| CatalogError::Log {
                    runtime: name.clone(),
                    source,
                })?,
        };
        let turn = self.log.turn(position, 1).await;
        self.install(handle.clone(), entry.definition);
        if let Some(previous) = &existing {
            self.retire_views(previous, Some(&handle), "its runtime no longer declares it");
        }
        drop(turn);
        drop(held);
        if let Some(guard) = guard {
            guard.stop().await;
        }
        let changed = match existing {
            Some(_) => Changed::Replaced,
            None => Changed::Created,
        };
        Ok((changed, position))
    }

    /// A task running `definition` on `module`, from `saved` (else the guest's `init`),
    /// replacing `previous` if any.
    async fn spawn(
        &self,
        name: &str,
        definition: &Definition,
        module: GuestModule,
        saved: Option<RuntimeSnapshot>,
        previous: Option<&RuntimeHandle>,
    ) -> Result<RuntimeHandle, CatalogError> {
        RuntimeHandle::spawn_after(
            previous,
            module,
            runtime_config(name, definition)?,
            saved,
            Arc::clone(&self.journal),
            Arc::clone(&self.hub),
            Arc::clone(&self.log),
        )
        .await
        .map_err(|error| match error {
            GuestError::InstancesUsedUp { .. } => CatalogError::Capacity {
                runtime: name.to_owned(),
                message: error.to_string(),
            },
            _ => CatalogError::Refused {
                runtime: name.to_owned(),
                message: error.public_message().into_owned(),
            },
        })
    }

    /// Registers `handle` as running `definition`; the views it names exist from now on.
    fn install(&self, handle: RuntimeHandle, definition: Definition) {
        for view in &definition.views {
            if ViewClaim::new(view).is_ok_and(|claim| !claim.is_pattern()) {
                self.hub.declare(view);
            }
        }
        let module = definition.module.clone();
        self.runtimes
            .insert(handle, module, Some(Arc::new(definition)));
    }

    /// Deletes the runtime of `entry` — at `position`, or logged here (`None`); the position
    /// it applied at. The config declaration it had is remembered ([`Runtimes::remove`]).
    async fn retire(
        &self,
        entry: RetireEntry,
        position: Option<LogPosition>,
    ) -> Result<Option<LogPosition>, CatalogError> {
        let name = entry.runtime.clone();
        let held = self.runtimes.hold_cuts().await;
        let Some(registered) = self.runtimes.get(&name) else {
            // A record of a runtime this node lacks: its position is consumed by the caller.
            return Err(CatalogError::NoSuchRuntime(name));
        };
        let (_, guard) =
            registered
                .handle
                .pause()
                .await
                .map_err(|error| CatalogError::Refused {
                    runtime: name.clone(),
                    message: error.to_string(),
                })?;
        let position = match position {
            Some(position) => Some(position),
            None => self
                .log
                .append(vec![Entry::Retire(entry).encode()])
                .await
                .map_err(|source| CatalogError::Log {
                    runtime: name.clone(),
                    source,
                })?,
        };
        let turn = self.log.turn(position, 1).await;
        let declared = self.declared(&name, Some(&registered));
        self.runtimes.remove(&name, declared);
        self.retire_views(&registered, None, "its runtime was deleted");
        drop(turn);
        drop(held);
        guard.stop().await;
        Ok(position)
    }

    /// Retires the views `previous` published to that `next` (if any) does not take; a halted
    /// runtime's, past the offsets it lost.
    fn retire_views(&self, previous: &Registered, next: Option<&RuntimeHandle>, reason: &str) {
        let kept = |view: &str| next.is_some_and(|next| ViewClaim::any_takes(next.views(), view));
        let lost = previous.handle.stats().halted().map_or(0, |halt| halt.lost);
        for view in self.hub.views() {
            if previous.takes(view.name()) && !kept(view.name()) {
                self.hub.retire(view.name(), reason, lost);
            }
        }
    }

    /// Publishes a runtime change to the cluster's stream, as `by` may, and waits for this
    /// node's verdict; the record's position.
    async fn publish(
        &self,
        stream: &crate::log::StreamLog,
        name: &str,
        entry: Entry,
        by: Publishing,
    ) -> Result<(Changed, Option<LogPosition>), CatalogError> {
        let shared = |reason: String| CatalogError::Shared {
            runtime: name.to_owned(),
            reason,
        };
        let (payload, id) = (entry.encode(), stream.own_id());
        let published = stream
            .publish(name, payload, id, by)
            .await
            .map_err(|error| shared(error.to_string()))?;
        let sequence = published.sequence;
        // The verdict is given once the record is applied (its position may count as applied a
        // moment before): wait for the verdict itself, within the stream's timeout.
        let deadline = tokio::time::Instant::now() + stream.timeout();
        loop {
            let given = self.verdict_given.notified();
            let mut given = std::pin::pin!(given);
            given.as_mut().enable();
            let verdict = self
                .verdicts
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .remove(&sequence);
            if let Some(verdict) = verdict {
                return verdict.map(|changed| (changed, Some(sequence)));
            }
            if tokio::time::timeout_at(deadline, given).await.is_err() {
                return Err(shared(format!(
                    "published at sequence {}, no verdict from this node within {:?}",
                    sequence.get(),
                    stream.timeout()
                )));
            }
        }
    }
}

/// The definition's views, read.
fn claims(definition: &Definition) -> Result<Vec<ViewClaim>, CatalogError> {
    if definition.views.is_empty() {
        return Err(CatalogError::Invalid {
            field: "views".to_owned(),
            message: "a runtime publishes to at least one view".to_owned(),
        });
    }
    let mut claims: Vec<ViewClaim> = Vec::with_capacity(definition.views.len());
    for (i, view) in definition.views.iter().enumerate() {
        let claim = ViewClaim::new(view).map_err(|error| CatalogError::Invalid {
            field: format!("views[{i}]"),
            message: format!("{view:?}: {error}"),
        })?;
        if let Some(other) = claims.iter().find(|other| other.overlaps(&claim)) {
            return Err(CatalogError::Invalid {
                field: format!("views[{i}]"),
                message: format!("{view:?} overlaps {other} of the same runtime"),
            });
        }
        claims.push(claim);
    }
    Ok(claims)
}

/// The definition's schemas, compiled.
fn schemas(definition: &Definition) -> Result<ConfiguredSchemas, CatalogError> {
    let mut out = std::collections::BTreeMap::new();
    for (view, text) in &definition.schemas {
        let invalid = |message: String| CatalogError::Invalid {
            field: format!("schemas.{view}"),
            message,
        };
        if !ViewClaim::any_takes(&definition.views, view) {
            return Err(invalid(
                "the runtime does not publish to this view".to_owned(),
            ));
        }
        let document =
            serde_json::from_str(text).map_err(|error| invalid(format!("not JSON: {error}")))?;
        let schema = ViewSchema::new(view, document).map_err(|error| invalid(error.to_string()))?;
        out.insert(view.clone(), Arc::new(schema));
    }
    Ok(Arc::new(out))
}

/// How a runtime of `definition` is set up.
fn runtime_config(name: &str, definition: &Definition) -> Result<RuntimeConfig, CatalogError> {
    Ok(RuntimeConfig {
        guest_config: Bytes::from(definition.guest_config()),
        limits: definition.limits.to_limits(),
        schemas: schemas(definition)?,
        ..RuntimeConfig::new(name, definition.views.iter().cloned())
    })
}
