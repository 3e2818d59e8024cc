//! One logged record applied at its position, whoever reads the log: the start-up replay of the
//! local log, or a cluster's apply loop (see the module docs of [`crate::runtime`]).
//!
//! ## Judged and pending records
//!
//! A local log holds only records this server judged before it logged them: a batch is run
//! again and must produce its digest, a deploy must switch from the module that runs. Anything
//! else is not this runtime's history ([`ApplyError`]).
//!
//! A cluster's stream holds records nobody judged yet: every node judges each one at its
//! position, the same way, through the same deterministic guest, and the verdict goes to the
//! publisher ([`Verdict`]). A batch made by a node running a module the stream never ran, a
//! producer's batch out of order, a guest's refusal, a deploy against a module that no longer
//! runs: each is refused alike on every node, its position consumed, and nothing stops. A batch
//! made for an earlier module of the runtime (published while a deploy was on its way) runs on
//! the module of its position, like every batch.
//!
//! ## A runtime's first module on a stream
//!
//! Before its first record, a runtime's module on a stream is not yet decided. A node that has
//! caught up publishes a first deploy for each undecided runtime, naming its own module (as both
//! `module` and `previous`); the first such record decides, on every node. A node whose module
//! lost switches to the winner's ([`Record::Deploy`] carries it) and is then a node whose config
//! names another build than the cluster's, which the cluster layer refuses to make ready.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::command::Record;
use super::group::{Staged, Staging};
use super::guest::Fit;
use super::task::Task;
use super::verdict::{Place, Verdict};
use super::{ApplyError, BatchSink, DeployError, Deployed, IngestError, RuntimeHalt};
use crate::host::GuestModule;
use crate::log::producer::{InputDigest, Undo};
use crate::log::{BatchEntry, DeployEntry, Digest, LogPosition, Outcome};

impl<S: BatchSink> Task<S> {
    /// Applies `record` at `position`; see the module docs. A record of the local log this node
    /// cannot reproduce halts this runtime alone ([`RuntimeHalt`]); a halted runtime passes its
    /// later records by.
    pub(super) async fn apply(
        &mut self,
        record: Record,
        position: LogPosition,
    ) -> Result<(), ApplyError> {
        if let Some(halt) = self.last.halted.clone() {
            return self.pass(record, halt, position).await;
        }
        let (judged, offsets) = (record.judged(), record.offsets());
        match self.apply_record(record, position).await {
            Err(
                error @ (ApplyError::Diverged { .. }
                | ApplyError::ModuleChanged { .. }
                | ApplyError::Unloadable { .. }),
            ) if judged => {
                let halt = RuntimeHalt {
                    position,
                    reason: error.to_string(),
                    lost: offsets,
                    unreadable: None,
                };
                self.halt(halt).await
            }
            applied => applied,
        }
    }

    /// Halts this runtime at `halt.position` ([`RuntimeHalt`]), in its turn.
    async fn halt(&mut self, halt: RuntimeHalt) -> Result<(), ApplyError> {
        let log = Arc::clone(&self.log);
        let Some(turn) = log.turn_unless_abandoned(Some(halt.position), 1).await else {
            return Err(ApplyError::Abandoned {
                runtime: self.name.to_string(),
            });
        };
        tracing::error!(
            position = halt.position.get(),
            reason = halt.reason,
            "runtime halted on this node: it cannot reproduce its logged history from here; its views keep what they had and take nothing new; every other runtime goes on"
        );
        self.last.halted = Some(halt);
        self.note_state();
        drop(turn);
        Ok(())
    }

    /// A record of a halted runtime, passed by in its turn (the offsets it may have taken are
    /// added to the halt's): a batch or a deploy published to a cluster's stream is refused
    /// here, naming the halt. A logged deploy that started the runtime fresh applies: it does
    /// not depend on the state the halt lost, and lifts the halt.
    async fn pass(
        &mut self,
        record: Record,
        mut halt: RuntimeHalt,
        position: LogPosition,
    ) -> Result<(), ApplyError> {
        let record = match record {
            Record::Deploy(entry, module) if entry.fresh && !entry.pending => {
                return self.replay_deploy(&entry, module, position).await;
            }
            record => record,
        };
        halt.lost += record.offsets();
        // Its state no longer covers the log: a start that reads its module cannot run it on.
        halt.unreadable = None;
        self.last.halted = Some(halt.clone());
        let runtime = self.name.to_string();
        let (indices, shared) = match record {
            Record::Batch(entry) if entry.outcome == Outcome::Pending => (vec![0], false),
            Record::Batches { batches, shared } => (
                batches.into_iter().map(|(index, _)| index).collect(),
                shared,
            ),
            Record::Deploy(entry, _) if entry.pending => {
                drop(self.log.turn(Some(position), 1).await);
                let refused = DeployError::Halted { runtime, halt };
                self.give((position, 0), Verdict::Deploy(Err(refused)));
                return Ok(());
            }
            Record::Batch(_) | Record::Deploy(..) | Record::Halt(_) => {
                let log = Arc::clone(&self.log);
                return match log.turn_unless_abandoned(Some(position), 1).await {
                    Some(_turn) => Ok(()),
                    None => Err(ApplyError::Abandoned { runtime }),
                };
            }
        };
        let log = Arc::clone(&self.log);
        let turn = log.turn((!shared).then_some(position), 1).await;
        for index in indices {
            let refused = IngestError::Halted {
                runtime: runtime.clone(),
                halt: halt.clone(),
            };
            self.give((position, index), Verdict::Batch(Err(refused)));
        }
        drop(turn);
        Ok(())
    }

    /// Applies `record` at `position` to a runtime that runs.
    async fn apply_record(
        &mut self,
        record: Record,
        position: LogPosition,
    ) -> Result<(), ApplyError> {
        match record {
            Record::Halt(reason) => Err(ApplyError::Unloadable {
                runtime: self.name.to_string(),
                reason,
            }),
            Record::Batch(entry) if entry.outcome == Outcome::Pending => {
                self.judge_batches(vec![(0, entry)], position, false).await
            }
            Record::Batches { batches, shared } => {
                self.judge_batches(batches, position, shared).await
            }
            Record::Batch(entry) => self.replay_batch(entry, position).await,
            Record::Deploy(entry, module) if entry.pending => {
                let verdict = self.judge_deploy(&entry, module, position).await;
                if let Err(error) = &verdict {
                    tracing::warn!(%error, position = position.get(), module = %entry.module, "deploy refused here as on every node; nothing changed");
                }
                self.give((position, 0), Verdict::Deploy(verdict));
                Ok(())
            }
            Record::Deploy(entry, module) => self.replay_deploy(&entry, module, position).await,
        }
    }

    /// Hands a verdict to the publisher waiting for `place`.
    fn give(&self, place: Place, verdict: Verdict) {
        self.verdicts
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .give(place, verdict);
    }

    /// Judges the batches published to a cluster's stream at `position` (one, or several a node
    /// gathered into one message, each with its index there) in order, commits those that pass
    /// together, and hands each its verdict. `shared`: other runtimes apply batches at the same
    /// position, and the caller marks it applied once all have.
    async fn judge_batches(
        &mut self,
        entries: Vec<(u32, BatchEntry)>,
        position: LogPosition,
        shared: bool,
    ) -> Result<(), ApplyError> {
        let (state, checkpoint) = (self.last.state.clone(), self.last.checkpoint);
        let mut undo = Vec::new();
        let mut judged: Vec<(u32, Option<Staged>, Option<IngestError>)> =
            Vec::with_capacity(entries.len());
        for (index, entry) in entries {
            let Staging { staged, refused } = self.judge(entry, &mut undo).await?;
            if let Some(error @ IngestError::Unavailable { .. }) = &refused {
                // A fault of this node (an instance that could not be made, the wall-clock
                // backstop), not the batch's verdict: the position's batches are undone, and it
                // stays open.
                if judged.iter().any(|(_, staged, _)| staged.is_some()) {
                    self.rewind(state);
                }
                self.last.checkpoint = checkpoint;
                for undo in undo.into_iter().rev() {
                    self.last.producers.undo(undo);
                }
                return Err(ApplyError::Unavailable {
                    runtime: self.name.to_string(),
                    reason: error.to_string(),
                });
            }
            judged.push((index, staged, refused));
        }
        let log = Arc::clone(&self.log);
        let turn = log.turn((!shared).then_some(position), 1).await;
        for (index, staged, refused) in judged {
            let accepted = match staged {
                Some(staged) => Some(self.finish(staged, Some(position)).await),
                None => None,
            };
            let verdict = match (refused, accepted) {
                (Some(error), _) => Err(error),
                (None, Some(accepted)) => Ok(accepted),
                (None, None) => Err(IngestError::Stopped {
                    runtime: self.name.to_string(),
                }),
            };
            // Given before the position counts as applied: a copy waiting for that finds it.
            self.give((position, index), Verdict::Batch(verdict));
        }
        drop(turn);
        Ok(())
    }

    /// Judges one published batch: refused alike on every node when it was made for a module or
    /// a guest config the stream never ran, else run through the guest ([`Task::stage`]). `Err`
    /// when this node cannot reproduce what its publisher runs.
    async fn judge(
        &mut self,
        entry: BatchEntry,
        undo: &mut Vec<Undo>,
    ) -> Result<Staging, ApplyError> {
        let running = self.slot.module().fingerprint().clone();
        if entry.module != running && self.last.modules.is_empty() {
            // Published before this runtime's first module was decided (by a viewtape that
            // does not publish one): this node cannot reproduce what its publisher runs.
            return Err(self.module_changed(&entry));
        }
        let refused = |refused| {
            Ok(Staging {
                staged: None,
                refused: Some(refused),
            })
        };
        // A batch made for a module this runtime ran before the newest deploy was published by a
        // node of the cluster just before that deploy reached it: it runs on the module of now.
        // One made for a module the stream never ran came from a node on another build.
        if entry.module != running && !self.last.modules.contains(&entry.module) {
            return refused(IngestError::OtherModule {
                runtime: self.name.to_string(),
                published: entry.module,
                running,
            });
        }
        // Likewise a batch made with another guest config than the stream decided. A node whose
        // own config is not the stream's cannot reproduce the others, and stops (itself alone).
        if let Some(decided) = self.last.config.filter(|&c| c != entry.guest_config) {
            return refused(IngestError::OtherConfig {
                runtime: self.name.to_string(),
                published: entry.guest_config,
                decided,
            });
        }
        if entry.guest_config != self.guest_config_crc {
            return Err(self.module_changed(&entry));
        }
        self.last.ran(&running);
        self.last.config.get_or_insert(entry.guest_config);
        Ok(self.stage(entry, undo).await)
    }

    /// Runs a batch of the local log again: it must produce what its record says.
    async fn replay_batch(
        &mut self,
        entry: BatchEntry,
        position: LogPosition,
    ) -> Result<(), ApplyError> {
        if entry.module != *self.slot.module().fingerprint()
            || entry.guest_config != self.guest_config_crc
        {
            return Err(self.module_changed(&entry));
        }
        let diverged = |runtime: &str, detail: String| ApplyError::Diverged {
            runtime: runtime.to_owned(),
            detail,
        };
        let claim = entry.producer.as_ref().filter(|stamp| stamp.claim);
        let before = self.last.state.clone();
        let batch = match &entry.outcome {
            _ if claim.is_some() => None,
            Outcome::Lost | Outcome::Pending => None,
            Outcome::Committed(logged) => {
                let batch = self
                    .run_guest(&entry, Fit::Known)
                    .await
                    .map_err(|error| diverged(&self.name, format!("it failed: {error}")))?;
                let digest = Digest::of(&batch);
                if digest != *logged {
                    self.rewind(before);
                    return Err(diverged(
                        &self.name,
                        format!(
                            "events {:?} crc {:08x}, logged {:?} crc {:08x}",
                            digest.per_view, digest.crc, logged.per_view, logged.crc
                        ),
                    ));
                }
                Some(batch)
            }
        };
        // Replays of several runtimes run ahead of each other and commit in turn; a replay that
        // broke off before this record abandons its turn, and the guest goes back to the state
        // before it.
        let log = Arc::clone(&self.log);
        let Some(turn) = log.turn_unless_abandoned(Some(position), 1).await else {
            if batch.is_some() {
                self.rewind(before);
            }
            return Err(ApplyError::Abandoned {
                runtime: self.name.to_string(),
            });
        };
        if entry.checkpoint.is_some() {
            self.last.checkpoint = entry.checkpoint;
        }
        match &entry.producer {
            Some(stamp) if stamp.claim => {
                // A claim is logged only once it took an epoch; one that finds none changes
                // nothing, here as where it was judged.
                if let Err(error) = self.last.producers.claim(&stamp.id) {
                    tracing::warn!(producer = %stamp.id, %error, position = position.get(), "a logged claim took no epoch");
                }
            }
            Some(stamp) => {
                self.last
                    .producers
                    .stage(stamp, InputDigest::of(&entry.input));
            }
            None => {}
        }
        if claim.is_none() {
            self.commit(&entry, batch, Some(position)).await;
        }
        drop(turn);
        self.log.metrics().replayed.inc();
        Ok(())
    }

    /// Switches again to the module a deploy of the local log installed.
    async fn replay_deploy(
        &mut self,
        entry: &DeployEntry,
        module: GuestModule,
        position: LogPosition,
    ) -> Result<(), ApplyError> {
        let running = self.slot.module().fingerprint().clone();
        if entry.previous != running {
            return Err(ApplyError::ModuleChanged {
                runtime: self.name.to_string(),
                logged: entry.previous.clone(),
                logged_config: self.guest_config_crc,
                running,
                running_config: self.guest_config_crc,
            });
        }
        self.switch(module, entry.fresh, Some(position))
            .await
            .map_err(|error| ApplyError::Diverged {
                runtime: self.name.to_string(),
                detail: format!("the logged deploy does not take the state again: {error}"),
            })?;
        self.log.metrics().replayed.inc();
        Ok(())
    }

    /// Judges a deploy published to a cluster's stream; see the module docs.
    async fn judge_deploy(
        &mut self,
        entry: &DeployEntry,
        module: GuestModule,
        position: LogPosition,
    ) -> Result<Deployed, DeployError> {
        let running = self.slot.module().fingerprint().clone();
        let first = entry.previous == entry.module;
        let undecided = self.last.modules.is_empty();
        let unchanged = |running: crate::host::ModuleFingerprint| Deployed {
            previous: running.clone(),
            module: running,
            position: Some(position),
            fresh: false,
        };
        if first && !undecided || !first && entry.previous != running {
            drop(self.log.turn(Some(position), 1).await);
            return match entry.module == running {
                true => Ok(unchanged(running)),
                false => Err(DeployError::Stale {
                    runtime: self.name.to_string(),
                    expected: entry.previous.clone(),
                    running,
                }),
            };
        }
        let deployed = if entry.module == running {
            drop(self.log.turn(Some(position), 1).await);
            self.last.ran(&running);
            Ok(unchanged(running))
        } else {
            self.switch(module, first, Some(position)).await
        };
        if first && deployed.is_ok() {
            // The first deploy decides the runtime's guest config too.
            self.last.config = entry.guest_config;
        }
        deployed
    }

    fn module_changed(&self, entry: &BatchEntry) -> ApplyError {
        ApplyError::ModuleChanged {
            runtime: self.name.to_string(),
            logged: entry.module.clone(),
            logged_config: entry.guest_config,
            running: self.slot.module().fingerprint().clone(),
            running_config: self.guest_config_crc,
        }
    }

    /// Counts a deploy.
    pub(super) fn deployed(&self) {
        self.stats.deploys.fetch_add(1, Ordering::Relaxed);
    }
}
