//! The way into a runtime task: [`RuntimeHandle`], the commands it sends, and the answers.
//!
//! Every request is one [`Command`] carrying a oneshot for its answer
//! ([`RuntimeHandle::ask`]). On a cluster, an ingest or a deploy is first published to the
//! stream; the task answers it when it applies the published record at its position, through
//! the [`Verdicts`] it shares with its handles.

use std::sync::{Arc, Mutex, PoisonError};

use bytes::Bytes;
use tokio::sync::{mpsc, oneshot};
use tracing::Instrument;
use viewtape_journal::EventJournal;

pub use super::command::Record;
use super::command::{Command, DeployWhen, Ingest, PauseOp};
use super::guest::{GuestSlot, Typing};
use super::task::Task;
use super::verdict::Verdicts;
use super::{Accepted, BatchSink, Deployed, RuntimeConfig, RuntimeSnapshot, RuntimeStats};
use super::{ApplyError, DeployError, IngestError};
use crate::host::{GuestError, GuestModule, ModuleFingerprint};
use crate::log::producer::ProducerStamp;
use crate::log::{unix_ms_now, Backend, BatchEntry, Log, LogPosition, Outcome, Publishing};
use crate::schema::ViewSchemas;
use crate::source::SourceCheckpoint;

/// A record's outcome to come ([`RuntimeHandle::hand_over`]).
pub type Applied =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), ApplyError>> + Send>>;

/// Holds a runtime paused (see [`RuntimeHandle::pause`]); dropping it
/// lets the runtime run again.
///
/// ## Restoring inside the cut
///
/// A live restore replaces the guest's state while every runtime is paused, in two steps so
/// that a guest refusing its state leaves everything untouched: [`PauseGuard::stage_restore`]
/// instantiates a new guest from the snapshot's state next to the running one, and
/// [`PauseGuard::commit_restore`] swaps it in (with the snapshot's checkpoint as the last good
/// position). Dropping the guard without committing discards the staged guest.
#[derive(Debug)]
pub struct PauseGuard {
    runtime: Arc<str>,
    control: mpsc::Sender<PauseOp>,
}

impl PauseGuard {
    /// Instantiates a guest from `snapshot.state` (an empty state runs the guest's `init`
    /// instead) and keeps it aside until [`PauseGuard::commit_restore`]. The running guest is
    /// untouched.
    ///
    /// # Errors
    /// [`IngestError::Guest`] when the guest refuses the state or cannot be instantiated;
    /// [`IngestError::Stopped`] if the task has stopped.
    pub async fn stage_restore(&self, snapshot: RuntimeSnapshot) -> Result<(), IngestError> {
        let (reply, rx) = oneshot::channel();
        self.control
            .send(PauseOp::Stage {
                snapshot: Box::new(snapshot),
                reply,
            })
            .await
            .map_err(|_| self.stopped())?;
        rx.await
            .map_err(|_| self.stopped())?
            .map_err(|source| IngestError::Guest {
                runtime: self.runtime.to_string(),
                source,
            })
    }

    /// Replaces the running guest and its last good state and checkpoint with the staged ones.
    /// Returns `false` when nothing was staged.
    ///
    /// # Errors
    /// [`IngestError::Stopped`] if the task has stopped.
    pub async fn commit_restore(&self) -> Result<bool, IngestError> {
        let (reply, rx) = oneshot::channel();
        self.control
            .send(PauseOp::Commit { reply })
            .await
            .map_err(|_| self.stopped())?;
        rx.await.map_err(|_| self.stopped())
    }

    /// Ends the runtime's task where it is paused: it runs nothing more, and every batch that
    /// waits for it, or is sent to it later, is answered [`IngestError::Stopped`].
    pub async fn stop(self) {
        let (reply, rx) = oneshot::channel();
        if self.control.send(PauseOp::Stop { reply }).await.is_ok() {
            let _ = rx.await;
        }
    }

    fn stopped(&self) -> IngestError {
        IngestError::Stopped {
            runtime: self.runtime.to_string(),
        }
    }
}

/// The task's answer on `rx` to a command sent on `tx`; `None` once the task has stopped
/// without answering it. The stop is watched for, not only the answer: a command sent just as
/// the task stopped can stay in its queue unread (and its reply channel open) for as long as
/// any handle lives — the waiting caller's own among them.
async fn answer<T>(tx: &mpsc::Sender<Command>, rx: oneshot::Receiver<T>) -> Option<T> {
    tokio::select! {
        biased;
        answer = rx => answer.ok(),
        () = tx.closed() => None,
    }
}

/// The cloneable handle of a runtime task. The task stops when every handle is dropped.
#[derive(Clone, Debug)]
pub struct RuntimeHandle {
    pub(super) name: Arc<str>,
    tx: mpsc::Sender<Command>,
    stats: Arc<RuntimeStats>,
    /// The module it runs now (a deploy changes it).
    module: Arc<Mutex<GuestModule>>,
    /// The schemas its views are held to now (a deploy changes them).
    schemas: Arc<Mutex<Arc<ViewSchemas>>>,
    /// The views it declares.
    views: Arc<[String]>,
    /// CRC-32C of its guest config and the schemas its config gives.
    guest_config: u32,
    /// The log it appends to: the local one, or a cluster's stream.
    pub(super) log: Arc<Log>,
    /// Verdicts on what it published to a cluster's stream.
    pub(super) verdicts: Arc<Mutex<Verdicts>>,
}

impl RuntimeHandle {
    /// Instantiates `module` (restoring `restore.state` if given) and spawns the runtime task
    /// on the current tokio runtime, appending to `log`. The task keeps only its scope of
    /// `journal` (its declared views), to report gaps through; its events go to `sink`.
    ///
    /// # Errors
    /// The guest's first instantiation failed (its `init` or `restore` refused, or no instance
    /// could be made).
    pub async fn spawn<S: BatchSink>(
        module: GuestModule,
        config: RuntimeConfig,
        restore: Option<RuntimeSnapshot>,
        journal: Arc<EventJournal>,
        sink: Arc<S>,
        log: Arc<Log>,
    ) -> Result<Self, GuestError> {
        Self::spawn_after(None, module, config, restore, journal, sink, log).await
    }

    /// [`RuntimeHandle::spawn`] of the task that replaces `previous` (if any): the verdicts on
    /// what was published to a cluster's stream are shared, so that a batch the replacement
    /// applies answers the request that waits on it through the replaced task.
    ///
    /// # Errors
    /// As [`RuntimeHandle::spawn`].
    pub(crate) async fn spawn_after<S: BatchSink>(
        previous: Option<&RuntimeHandle>,
        module: GuestModule,
        config: RuntimeConfig,
        restore: Option<RuntimeSnapshot>,
        journal: Arc<EventJournal>,
        sink: Arc<S>,
        log: Arc<Log>,
    ) -> Result<Self, GuestError> {
        let last = restore.unwrap_or_default();
        let name: Arc<str> = Arc::from(config.name.as_str());
        let stats = Arc::new(RuntimeStats::default());
        let running = module.clone();
        let views: Arc<[String]> = Arc::from(config.views.as_slice());
        let guest_config =
            ViewSchemas::fold_crc(crc32c::crc32c(&config.guest_config), &config.schemas);
        let typing = Typing {
            views: Some(Arc::clone(&views)),
            configured: config.schemas,
        };
        let slot = GuestSlot::new(
            module,
            Arc::clone(&name),
            config.limits,
            config.guest_config.clone(),
            typing,
            Some(&last.state[..]),
            Arc::clone(&stats),
        )
        .await?;
        let (tx, rx) = mpsc::channel(config.queue_depth.max(1));
        let handle = Self {
            name,
            tx,
            stats,
            module: Arc::new(Mutex::new(running)),
            schemas: Arc::new(Mutex::new(Arc::clone(slot.schemas()))),
            views: Arc::clone(&views),
            guest_config,
            log: Arc::clone(&log),
            verdicts: previous.map_or_else(Arc::default, |previous| Arc::clone(&previous.verdicts)),
        };
        let task = Task {
            name: Arc::clone(&handle.name),
            guest_config_crc: handle.guest_config,
            slot,
            last,
            scope: journal.scope(views.iter().map(String::as_str)),
            sink,
            log,
            stats: Arc::clone(&handle.stats),
            module_now: Arc::clone(&handle.module),
            schemas_now: Arc::clone(&handle.schemas),
            verdicts: Arc::clone(&handle.verdicts),
            stopping: false,
            diverged: mpsc::unbounded_channel(),
        };
        task.note_state();
        let span = tracing::info_span!("runtime", runtime = %handle.name);
        tokio::spawn(task.run(rx).instrument(span));
        Ok(handle)
    }

    /// Whether `other` is a handle of the same task.
    pub fn is_same(&self, other: &RuntimeHandle) -> bool {
        self.tx.same_channel(&other.tx)
    }

    /// The runtime's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its counters.
    pub fn stats(&self) -> &RuntimeStats {
        &self.stats
    }

    /// The module it runs now.
    pub fn module(&self) -> ModuleFingerprint {
        self.running().fingerprint().clone()
    }

    /// The compiled module it runs now.
    pub fn running(&self) -> GuestModule {
        self.module
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The views it declares (`views =` of its `[[runtime]]`).
    pub fn views(&self) -> &[String] {
        &self.views
    }

    /// The schemas its views are held to now.
    pub fn schemas(&self) -> Arc<ViewSchemas> {
        Arc::clone(&self.schemas.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// The CRC-32C of its guest config (`config =` of its `[[runtime]]`) and the schemas the
    /// config gives its views.
    pub fn guest_config_crc(&self) -> u32 {
        self.guest_config
    }

    /// Runs one batch of pushed input (e.g. an HTTP body) and commits it once it is durable.
    /// With a producer stamp, a batch already committed is answered with its original receipt
    /// instead of running again.
    ///
    /// # Errors
    /// [`IngestError::Guest`] when the guest refused or failed on the batch (nothing was
    /// committed; the caller may fix and resend); [`IngestError::OutOfOrder`] or
    /// [`IngestError::Fenced`] for a producer's batch that may not run;
    /// [`IngestError::Unavailable`], [`IngestError::Log`], [`IngestError::Shared`] or
    /// [`IngestError::Stopped`] when the runtime cannot run it.
    pub async fn ingest(
        &self,
        input: Bytes,
        producer: Option<ProducerStamp>,
    ) -> Result<Accepted, IngestError> {
        self.send(input, None, None, producer).await
    }

    /// Claims a new epoch for the producer `id` (one more than the highest the runtime knows,
    /// fencing every older holder; its next `seq` is 0), logged like a batch.
    /// [`Accepted::claimed`] holds the epoch.
    ///
    /// # Errors
    /// As [`RuntimeHandle::ingest`], but for the guest's and the producer's refusals.
    pub async fn claim(&self, id: String) -> Result<Accepted, IngestError> {
        self.send(Bytes::new(), None, None, Some(ProducerStamp::claim(id)))
            .await
    }

    /// Runs one batch read by a pull source; `checkpoint` is the source position after it.
    /// `source_gap` says why input was lost just before it (a truncated or replaced file); it is
    /// logged and marked on the runtime's views before the batch. If the batch fails, its input
    /// is lost too (the source has moved on), so a gap is marked and the checkpoint still
    /// advances. Empty `input` only records the gap and the checkpoint.
    ///
    /// # Errors
    /// As [`RuntimeHandle::ingest`].
    pub async fn ingest_from_source(
        &self,
        input: Bytes,
        checkpoint: SourceCheckpoint,
        source_gap: Option<String>,
    ) -> Result<Accepted, IngestError> {
        self.send(input, Some(checkpoint), source_gap, None).await
    }

    async fn send(
        &self,
        input: Bytes,
        checkpoint: Option<SourceCheckpoint>,
        source_gap: Option<String>,
        producer: Option<ProducerStamp>,
    ) -> Result<Accepted, IngestError> {
        if let Some(halt) = self.stats.halted() {
            let runtime = self.name.to_string();
            return Err(IngestError::Halted { runtime, halt });
        }
        if let Backend::Stream(stream) = self.log.backend() {
            let entry = BatchEntry {
                runtime: self.name.to_string(),
                module: self.module(),
                guest_config: self.guest_config,
                at_ms: unix_ms_now(),
                input,
                producer,
                checkpoint,
                source_gap,
                outcome: Outcome::Pending,
            };
            return self.publish_batch(stream, entry).await;
        }
        self.ask(|reply| {
            Command::Ingest(Box::new(Ingest {
                input,
                checkpoint,
                source_gap,
                producer,
                reply,
            }))
        })
        .await
        .unwrap_or_else(|| Err(self.stopped()))
    }

    /// Applies a logged record at `position`, where every reader of the log applies it: a
    /// replay of the local log at start-up, or a cluster's stream. See the module docs.
    ///
    /// # Errors
    /// [`ApplyError`]: the record is not this runtime's history (or, for
    /// [`ApplyError::Unavailable`], cannot be applied now; nothing changed).
    pub async fn apply(&self, record: Record, position: LogPosition) -> Result<(), ApplyError> {
        self.hand_over(record, position).await.await
    }

    /// Hands `record` at `position` to the task (records reach it in the order of calls) and
    /// returns its outcome to come: a replay applies records of several runtimes side by side
    /// this way, each runtime committing in turn.
    pub async fn hand_over(&self, record: Record, position: LogPosition) -> Applied {
        let (reply, rx) = oneshot::channel();
        let command = Command::Apply {
            record: Box::new(record),
            position,
            reply,
        };
        let sent = self.tx.send(command).await.is_ok();
        let stopped = ApplyError::Stopped {
            runtime: self.name.to_string(),
        };
        let tx = self.tx.clone();
        Box::pin(async move {
            match sent {
                true => answer(&tx, rx).await.unwrap_or(Err(stopped)),
                false => Err(stopped),
            }
        })
    }

    /// Replaces the guest's module between two batches, carrying its state over: the new
    /// module restores the old one's saved state, the deploy is logged, and the next batch runs
    /// on the new module. No gap, no new epoch. If the new module refuses the state or the log
    /// fails, the old module keeps running as if nothing happened. Deploying the module that
    /// runs already changes nothing. On a cluster, the deploy is published to the stream and
    /// every node switches at its position.
    ///
    /// # Errors
    /// [`DeployError`], with nothing changed.
    pub async fn deploy(&self, module: GuestModule) -> Result<Deployed, DeployError> {
        if let Some(halt) = self.stats.halted() {
            let runtime = self.name.to_string();
            return Err(DeployError::Halted { runtime, halt });
        }
        match self.log.backend() {
            Backend::Stream(stream) => {
                self.publish_deploy(stream, module.fingerprint().clone(), Publishing::Request)
                    .await
            }
            Backend::Off | Backend::Segments(_) => self.ask_deploy(module, DeployWhen::Live).await,
        }
    }

    /// On a cluster, declares the module this runtime runs as its first on the stream (a deploy
    /// from it to itself): the first such record decides, on every node. Elsewhere, nothing.
    ///
    /// # Errors
    /// [`DeployError::Shared`]: the stream did not take it, or this node did not apply it.
    pub async fn declare_module(&self) -> Result<Deployed, DeployError> {
        let module = self.module();
        match self.log.backend() {
            Backend::Stream(stream) => {
                self.publish_deploy(stream, module, Publishing::Settle)
                    .await
            }
            Backend::Off | Backend::Segments(_) => Ok(Deployed {
                previous: module.clone(),
                module,
                position: None,
                fresh: false,
            }),
        }
    }

    /// A deploy at start-up, when the config names another module than the one that saved the
    /// state: as [`RuntimeHandle::deploy`], except that a module refusing the state starts
    /// fresh, with a gap on this runtime's views; and a halted runtime
    /// ([`RuntimeHalt`](super::RuntimeHalt)) starts fresh on it, running again, its views' numbering
    /// going on past every offset the records it could not apply may have taken.
    ///
    /// # Errors
    /// [`DeployError`]: it could not be logged, or even a fresh start failed.
    pub async fn deploy_at_start(&self, module: GuestModule) -> Result<Deployed, DeployError> {
        self.ask_deploy(module, DeployWhen::AtStart).await
    }

    async fn ask_deploy(
        &self,
        module: GuestModule,
        when: DeployWhen,
    ) -> Result<Deployed, DeployError> {
        self.ask(|reply| Command::Deploy {
            module,
            when,
            reply,
        })
        .await
        .unwrap_or_else(|| {
            Err(DeployError::Stopped {
                runtime: self.name.to_string(),
            })
        })
    }

    /// The state and checkpoint after the last committed batch, taken between batches: what a
    /// snapshot stores.
    ///
    /// # Errors
    /// [`IngestError::Stopped`] if the task has stopped.
    pub async fn save(&self) -> Result<RuntimeSnapshot, IngestError> {
        self.ask(|reply| Command::Save { reply })
            .await
            .ok_or_else(|| self.stopped())
    }

    /// Stops the runtime between batches and keeps it stopped until the
    /// returned [`PauseGuard`] is dropped: the runtime's side of a
    /// consistency cut. Returns the state and checkpoint at that point,
    /// which match exactly what it has committed.
    ///
    /// # Errors
    /// [`IngestError::Stopped`] if the task has stopped.
    pub async fn pause(&self) -> Result<(RuntimeSnapshot, PauseGuard), IngestError> {
        let (control, ops) = mpsc::channel(1);
        let saved = self
            .ask(|reply| Command::Pause {
                reply,
                control: ops,
            })
            .await
            .ok_or_else(|| self.stopped())?;
        Ok((
            saved,
            PauseGuard {
                runtime: Arc::clone(&self.name),
                control,
            },
        ))
    }

    /// Sends the task the command `make` builds around a reply channel and waits for the
    /// reply; `None` when the task has stopped.
    async fn ask<T>(&self, make: impl FnOnce(oneshot::Sender<T>) -> Command) -> Option<T> {
        let (reply, rx) = oneshot::channel();
        self.tx.send(make(reply)).await.ok()?;
        answer(&self.tx, rx).await
    }

    pub(super) fn stopped(&self) -> IngestError {
        IngestError::Stopped {
            runtime: self.name.to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// A command that reaches the queue of a task after its receiver closed (the sender had its
    /// place before the close) stays there unread while any sender lives: its caller is answered
    /// by the stop, not left waiting for good.
    #[tokio::test]
    async fn a_command_left_in_the_queue_of_a_stopped_task_is_answered() {
        let (tx, rx) = mpsc::channel::<Command>(4);
        let place = tx.reserve().await.unwrap();
        drop(rx);
        let (reply, answered) = oneshot::channel();
        place.send(Command::Save { reply });
        let answer = tokio::time::timeout(Duration::from_secs(5), answer(&tx, answered)).await;
        assert!(
            matches!(answer, Ok(None)),
            "the caller waited with its command unread: {answer:?}"
        );
    }
}
