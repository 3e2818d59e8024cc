//! The runtime task: one per ingestion runtime, owning its guest instance.
//!
//! A [`RuntimeHandle`] is the cloneable way in. Batches go over a bounded queue (backpressure:
//! `ingest` waits when the runtime is [`RuntimeConfig::queue_depth`] batches behind) and each
//! gets its answer on a oneshot. The task owns the [`GuestInstance`] — the `Store` is never
//! shared, never behind a lock.
//!
//! ## A group of batches
//!
//! The task takes every batch waiting in its queue as one group (up to [`MAX_GROUP`]):
//! 1. each batch's producer stamp is checked ([`ProducerTable`]): a duplicate does not run
//!    again, an out-of-order or fenced one is refused;
//! 2. each batch runs through the guest ([`GuestInstance::on_batch`]), which saves its state
//!    ([`GuestInstance::save`]) after every success, so the last good state always matches what
//!    ran; a batch that fails is refused alone (a push source gets the error and may resend)
//!    and the instance is made again from the last good state;
//! 3. the accepted batches' records ([`BatchEntry`]) go to the log together and the task waits
//!    until they are durable ([`Log::append`]) and until every earlier position has committed
//!    ([`Log::turn`]);
//! 4. then, in order, each batch commits: its gaps are marked on this runtime's views, its
//!    events go to the [`BatchSink`] with the batch's time, and its caller gets the
//!    [`Receipt`].
//!
//! Nothing of a batch is visible or acknowledged before step 3. If the log fails, nothing of
//! the group commits: the guest, its state, its checkpoint and its producers go back to where
//! they were before the group, and every caller gets [`IngestError::Log`].
//!
//! A pull source's input is consumed once read, so a batch from a source that the guest fails on
//! is logged as lost ([`Outcome::Lost`]): a gap on the runtime's views, and the checkpoint moves
//! past it.
//!
//! ## Replay
//!
//! At start-up the server hands every logged batch back to its runtime
//! ([`RuntimeHandle::replay`]), which runs it through the same steps without logging it again,
//! with the record's time, and checks that the guest produced the same [`Digest`].

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use bytes::Bytes;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tracing::Instrument;
use viewtape_journal::EventJournal;

use crate::host::{GuestBatch, GuestError, GuestInstance, GuestModule, Limits, ModuleFingerprint};
use crate::log::producer::{ProducerStamp, ProducerTable, Undo, Verdict};
use crate::log::{unix_ms_now, BatchEntry, DeployEntry, Digest, Entry, Log, Outcome, Receipt};
use crate::source::{FileTail, SourceCheckpoint};

/// Most batches one group takes from the queue.
pub const MAX_GROUP: usize = 256;

/// How a runtime is set up.
#[derive(Clone, Debug)]
pub struct RuntimeConfig {
    /// The runtime's name (in logs, metrics and the ingest URL).
    pub name: String,
    /// The bytes given to the guest's `init`.
    pub guest_config: Bytes,
    /// Its limits.
    pub limits: Limits,
    /// Batches that may wait in its queue. Default 64.
    pub queue_depth: usize,
    /// The views it may publish to (`views =` in the config). A batch that publishes anywhere
    /// else is rejected; a gap it reports affects these views only.
    pub views: Vec<String>,
}

impl RuntimeConfig {
    /// A runtime named `name` that publishes to `views`, with an empty guest config and default
    /// limits.
    pub fn new(
        name: impl Into<String>,
        views: impl IntoIterator<Item = impl Into<String>>,
    ) -> Self {
        Self {
            name: name.into(),
            guest_config: Bytes::new(),
            limits: Limits::default(),
            queue_depth: 64,
            views: views.into_iter().map(Into::into).collect(),
        }
    }
}

/// An acknowledged batch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Accepted {
    /// What it was promised.
    pub receipt: Receipt,
    /// It had been committed before: this is the original's receipt, nothing ran again (for an
    /// older `seq` than the producer's last, the receipt is no longer kept and is empty).
    pub duplicate: bool,
}

/// Where successful batches go. The server implements it (append to the journal, fan out to
/// subscribers); tests implement it with a `Vec`.
pub trait BatchSink: Send + Sync + 'static {
    /// Commits one successful batch: its events, in order, accepted at `at_ms` (wall clock, Unix
    /// milliseconds). Runs inside the journal's scope.
    ///
    /// The batch's `gaps` have already been logged, counted and marked on the journal by the
    /// runtime task before this is called; they are passed along for information only.
    fn commit(
        &self,
        runtime: &str,
        batch: GuestBatch,
        at_ms: u64,
    ) -> impl Future<Output = ()> + Send;
}

/// A log shared by several nodes (a cluster's stream): a batch is published there first, and
/// every node, this one included, runs it in the log's order ([`RuntimeHandle::apply`]).
pub trait SharedLog: Send + Sync + std::fmt::Debug + 'static {
    /// Publishes `entry` (its outcome [`Outcome::Pending`]) and waits until this node has
    /// applied it; answers what applying it gave.
    fn submit(&self, entry: BatchEntry) -> BoxFuture<'_, Result<Accepted, IngestError>>;
}

/// A boxed future, as [`SharedLog`] returns.
pub type BoxFuture<'a, T> = std::pin::Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A runtime's state and the source position it reflects: what a snapshot stores.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RuntimeSnapshot {
    /// The guest's saved state after the last committed batch.
    pub state: Bytes,
    /// The source position after the last committed batch (`None` for push sources).
    pub checkpoint: Option<SourceCheckpoint>,
    /// The idempotent producers it has seen.
    #[serde(default)]
    pub producers: ProducerTable,
}

/// Why a batch was not committed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum IngestError {
    /// The guest failed on this batch; nothing of it was committed and the runtime was
    /// re-instantiated from its last good state.
    #[error("runtime `{runtime}`: {source}")]
    Guest {
        /// The runtime.
        runtime: String,
        /// What the guest did.
        #[source]
        source: GuestError,
    },
    /// The runtime could not run the batch for reasons that are not the batch's: it could not
    /// be re-instantiated after an earlier failure (it retries on every batch), or the guest hit
    /// the wall-clock backstop. Nothing was committed; sending the batch again may succeed.
    #[error("runtime `{runtime}` is unavailable: {source}")]
    Unavailable {
        /// The runtime.
        runtime: String,
        /// Why instantiation failed.
        #[source]
        source: GuestError,
    },
    /// The shared log could not take the batch, or this node did not apply it in time. A
    /// batch that was published may still commit: send it again with its producer stamp.
    #[error("runtime `{runtime}`: the shared log: {reason}")]
    Shared {
        /// The runtime.
        runtime: String,
        /// Why.
        reason: String,
    },
    /// The runtime's task has stopped (the server is shutting down).
    #[error("runtime `{runtime}` has stopped")]
    Stopped {
        /// The runtime.
        runtime: String,
    },
    /// The producer skipped a batch: `expected` is the `Producer-Seq` that would run.
    #[error(
        "runtime `{runtime}`: out of order for this producer; send Producer-Seq {expected} first"
    )]
    OutOfOrder {
        /// The runtime.
        runtime: String,
        /// The next `seq` the producer may send.
        expected: u64,
    },
    /// The producer's epoch is older than one already seen: another instance took over.
    #[error("runtime `{runtime}`: producer epoch {epoch} is fenced by epoch {current}")]
    Fenced {
        /// The runtime.
        runtime: String,
        /// The batch's epoch.
        epoch: u64,
        /// The producer's current epoch.
        current: u64,
    },
    /// The log could not make the batch durable; nothing of it was committed, and nothing is
    /// until the log has been reopened and verified (it is, in the background).
    #[error("runtime `{runtime}`: the log failed, nothing was committed: {source}")]
    Log {
        /// The runtime.
        runtime: String,
        /// Why.
        #[source]
        source: viewtape_snapshots::log::LogError,
    },
}

/// A module that replaced a runtime's module.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Deployed {
    /// The module before.
    pub previous: ModuleFingerprint,
    /// The module now.
    pub module: ModuleFingerprint,
    /// The deploy's log position (`None` with the log off, or when the module already ran).
    pub position: Option<u64>,
}

/// Why a deploy did not happen; the runtime runs its old module, untouched.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DeployError {
    /// The new module could not take over the guest's state: its `restore` (or `init`, for a
    /// runtime without state) refused, or it could not be instantiated.
    #[error("runtime `{runtime}`: the new module cannot take over: {source}")]
    Refused {
        /// The runtime.
        runtime: String,
        /// What the new module did.
        #[source]
        source: GuestError,
    },
    /// The deploy could not be made durable.
    #[error("runtime `{runtime}`: the log failed, the deploy did not happen: {source}")]
    Log {
        /// The runtime.
        runtime: String,
        /// Why.
        #[source]
        source: viewtape_snapshots::log::LogError,
    },
    /// The runtime's task has stopped.
    #[error("runtime `{runtime}` has stopped")]
    Stopped {
        /// The runtime.
        runtime: String,
    },
}

/// Why a logged batch could not be replayed: from there on, the log is not this server's
/// history.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReplayError {
    /// The record was written by another module or guest config than the runtime's now.
    #[error("runtime `{runtime}`: the record was processed by module {logged} (guest config crc {logged_config:08x}); {running} (crc {running_config:08x}) runs now")]
    ModuleChanged {
        /// The runtime.
        runtime: String,
        /// The module in the record.
        logged: crate::host::ModuleFingerprint,
        /// Its guest config's CRC-32C.
        logged_config: u32,
        /// The module running now.
        running: crate::host::ModuleFingerprint,
        /// The running guest config's CRC-32C.
        running_config: u32,
    },
    /// The guest produced something else than the record says it did (or failed).
    #[error("runtime `{runtime}`: the replayed batch produced another result than the logged one ({detail})")]
    Diverged {
        /// The runtime.
        runtime: String,
        /// What differed.
        detail: String,
    },
    /// The runtime could not run the batch now, for reasons that are not the batch's (see
    /// [`IngestError::Unavailable`]); nothing changed, and it may be applied again.
    #[error("runtime `{runtime}` could not run the batch: {reason}")]
    Unavailable {
        /// The runtime.
        runtime: String,
        /// Why.
        reason: String,
    },
    /// The runtime's task has stopped.
    #[error("runtime `{runtime}` has stopped")]
    Stopped {
        /// The runtime.
        runtime: String,
    },
}

/// Counters of one runtime, for metrics.
#[derive(Debug, Default)]
pub struct RuntimeStats {
    /// Batches committed.
    pub batches: AtomicU64,
    /// Events committed.
    pub events: AtomicU64,
    /// Gaps the guest reported, plus batches of a pull source lost to failures.
    pub gaps: AtomicU64,
    /// Batches that failed.
    pub failures: AtomicU64,
    /// Times the instance was re-created after a failure.
    pub restarts: AtomicU64,
}

type Reply = oneshot::Sender<Result<Accepted, IngestError>>;

/// One batch on its way in.
struct Ingest {
    input: Bytes,
    checkpoint: Option<SourceCheckpoint>,
    source_gap: Option<String>,
    producer: Option<ProducerStamp>,
    reply: Reply,
}

enum Command {
    Ingest(Ingest),
    Replay {
        entry: BatchEntry,
        position: u64,
        reply: oneshot::Sender<Result<(), ReplayError>>,
    },
    Apply {
        entry: BatchEntry,
        position: u64,
        reply: oneshot::Sender<Result<Result<Accepted, IngestError>, ReplayError>>,
    },
    Save {
        reply: oneshot::Sender<RuntimeSnapshot>,
    },
    Deploy {
        module: GuestModule,
        /// The log position of the deploy when it is replayed.
        replayed_at: Option<u64>,
        reply: oneshot::Sender<Result<Deployed, DeployError>>,
    },
    Pause {
        reply: oneshot::Sender<RuntimeSnapshot>,
        /// Closed when the [`PauseGuard`] is dropped; carries what the holder of the cut asks of
        /// the paused runtime meanwhile.
        control: mpsc::Receiver<PauseOp>,
    },
}

/// What the holder of a [`PauseGuard`] may ask of the paused runtime.
enum PauseOp {
    /// Instantiate a guest from this state, and keep it aside.
    Stage {
        snapshot: RuntimeSnapshot,
        reply: oneshot::Sender<Result<(), GuestError>>,
    },
    /// Swap the staged guest in (`false`: nothing was staged).
    Commit { reply: oneshot::Sender<bool> },
}

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
            .send(PauseOp::Stage { snapshot, reply })
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

    fn stopped(&self) -> IngestError {
        IngestError::Stopped {
            runtime: self.runtime.to_string(),
        }
    }
}

/// The cloneable handle of a runtime task. The task stops when every handle is dropped.
#[derive(Clone, Debug)]
pub struct RuntimeHandle {
    name: Arc<str>,
    tx: mpsc::Sender<Command>,
    stats: Arc<RuntimeStats>,
    /// The module it runs now (a deploy changes it).
    module: Arc<Mutex<ModuleFingerprint>>,
    /// CRC-32C of its guest config.
    guest_config: u32,
    /// Where batches go first when the node is part of a cluster.
    shared: Arc<OnceLock<Arc<dyn SharedLog>>>,
}

impl RuntimeHandle {
    /// Instantiates `module` (restoring `restore.state` if given) and spawns the runtime task
    /// on the current tokio runtime.
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
        let last = restore.unwrap_or_default();
        let state = (!last.state.is_empty()).then_some(&last.state[..]);
        let instance = GuestInstance::new(
            &module,
            &config.name,
            &config.limits,
            &config.guest_config,
            state,
        )
        .await?;
        let (tx, rx) = mpsc::channel(config.queue_depth.max(1));
        let name: Arc<str> = Arc::from(config.name.as_str());
        let stats = Arc::new(RuntimeStats::default());
        let views = Arc::from(config.views.as_slice());
        let module_now = Arc::new(Mutex::new(module.fingerprint().clone()));
        let guest_config = crc32c::crc32c(&config.guest_config);
        let task = Task {
            module_now: Arc::clone(&module_now),
            name: Arc::clone(&name),
            guest_config_crc: guest_config,
            module,
            config,
            instance: Some(instance),
            last,
            journal,
            sink,
            log,
            stats: Arc::clone(&stats),
            views,
        };
        let span = tracing::info_span!("runtime", runtime = %name);
        tokio::spawn(task.run(rx).instrument(span));
        let module = module_now;
        Ok(Self {
            name,
            tx,
            stats,
            module,
            guest_config,
            shared: Arc::default(),
        })
    }

    /// The runtime's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its counters.
    pub fn stats(&self) -> &RuntimeStats {
        &self.stats
    }

    /// Runs one batch of pushed input (e.g. an HTTP body) and commits it once it is durable.
    /// With a producer stamp, a batch already committed is answered with its original receipt
    /// instead of running again.
    ///
    /// # Errors
    /// [`IngestError::Guest`] when the guest refused or failed on the batch (nothing was
    /// committed; the caller may fix and resend); [`IngestError::OutOfOrder`] or
    /// [`IngestError::Fenced`] for a producer's batch that may not run;
    /// [`IngestError::Unavailable`], [`IngestError::Log`] or [`IngestError::Stopped`] when the
    /// runtime cannot run it.
    pub async fn ingest(
        &self,
        input: Bytes,
        producer: Option<ProducerStamp>,
    ) -> Result<Accepted, IngestError> {
        self.send(input, None, None, producer).await
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
        if let Some(shared) = self.shared.get() {
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
            return shared.submit(entry).await;
        }
        self.ask(|reply| {
            Command::Ingest(Ingest {
                input,
                checkpoint,
                source_gap,
                producer,
                reply,
            })
        })
        .await
        .unwrap_or_else(|| Err(self.stopped()))
    }

    /// From now on, sends every batch to `shared` first (a node joining a cluster, before it
    /// serves). Returns false if it already had one.
    pub fn share_through(&self, shared: Arc<dyn SharedLog>) -> bool {
        self.shared.set(shared).is_ok()
    }

    /// Applies a batch of the shared log at `position`, where every node applies it: checks
    /// its producer, runs it, and commits it if the guest accepts it. Whatever the verdict,
    /// `position` is consumed, so later positions commit after it.
    ///
    /// # Errors
    /// [`ReplayError`]: the batch was published by a node running another module or guest
    /// config, so this node cannot reproduce what the others do.
    pub async fn apply(
        &self,
        entry: BatchEntry,
        position: u64,
    ) -> Result<Result<Accepted, IngestError>, ReplayError> {
        self.ask_log(|reply| Command::Apply {
            entry,
            position,
            reply,
        })
        .await
    }

    /// [`RuntimeHandle::ask`] for a record of a log (replayed or applied): a stopped task is
    /// [`ReplayError::Stopped`].
    async fn ask_log<T>(
        &self,
        make: impl FnOnce(oneshot::Sender<Result<T, ReplayError>>) -> Command,
    ) -> Result<T, ReplayError> {
        self.ask(make).await.unwrap_or_else(|| {
            Err(ReplayError::Stopped {
                runtime: self.name.to_string(),
            })
        })
    }

    /// Sends the task the command `make` builds around a reply channel and waits for the
    /// reply; `None` when the task has stopped.
    async fn ask<T>(&self, make: impl FnOnce(oneshot::Sender<T>) -> Command) -> Option<T> {
        let (reply, rx) = oneshot::channel();
        self.tx.send(make(reply)).await.ok()?;
        rx.await.ok()
    }

    /// The module it runs now.
    pub fn module(&self) -> ModuleFingerprint {
        self.module
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Replaces the guest's module between two batches, carrying its state over: the new
    /// module restores the old one's saved state, the deploy is logged, and the next batch runs
    /// on the new module. No gap, no new epoch. If the new module refuses the state or the log
    /// fails, the old module keeps running as if nothing happened. Deploying the module that
    /// runs already changes nothing.
    ///
    /// # Errors
    /// [`DeployError`], with nothing changed.
    pub async fn deploy(&self, module: GuestModule) -> Result<Deployed, DeployError> {
        self.send_deploy(module, None).await
    }

    /// Applies a logged deploy again at `position` (start-up).
    ///
    /// # Errors
    /// [`DeployError`]: the deploy does not replay, so the log is not this runtime's history.
    pub async fn replay_deploy(
        &self,
        module: GuestModule,
        position: u64,
    ) -> Result<Deployed, DeployError> {
        self.send_deploy(module, Some(position)).await
    }

    async fn send_deploy(
        &self,
        module: GuestModule,
        replayed_at: Option<u64>,
    ) -> Result<Deployed, DeployError> {
        self.ask(|reply| Command::Deploy {
            module,
            replayed_at,
            reply,
        })
        .await
        .unwrap_or_else(|| {
            Err(DeployError::Stopped {
                runtime: self.name.to_string(),
            })
        })
    }

    /// Applies a logged batch again (start-up): runs it through the guest unless it was lost,
    /// checks the result against the record's digest, and commits it with the record's time at
    /// `position`. A batch that does not reproduce commits nothing and leaves the guest as it
    /// was.
    ///
    /// # Errors
    /// [`ReplayError`]: the record is not this runtime's history.
    pub async fn replay(&self, entry: BatchEntry, position: u64) -> Result<(), ReplayError> {
        self.ask_log(|reply| Command::Replay {
            entry,
            position,
            reply,
        })
        .await
    }

    /// Feeds `tail` into this runtime until the runtime stops (abort the handle to stop
    /// earlier). A batch the guest fails on is lost (the runtime marks a gap and moves on); a
    /// batch the log could not take ([`IngestError::Log`]) committed nothing and is sent again.
    pub fn follow(&self, mut tail: FileTail) -> JoinHandle<()> {
        let runtime = self.clone();
        let span = tracing::info_span!("file_tail", runtime = %runtime.name());
        let feed = async move {
            loop {
                let batch = match tail.next_batch().await {
                    Ok(batch) => batch,
                    Err(error) => {
                        tracing::warn!(%error, "reading the followed file failed; retrying");
                        tokio::time::sleep(tail.retry_after()).await;
                        continue;
                    }
                };
                let checkpoint = SourceCheckpoint::FileTail(batch.checkpoint);
                loop {
                    let sent = runtime
                        .ingest_from_source(batch.lines.clone(), checkpoint, batch.gap.clone())
                        .await;
                    match sent {
                        Ok(_) => break,
                        Err(error @ IngestError::Stopped { .. }) => {
                            tracing::debug!(%error, "runtime stopped; file tail ends");
                            return;
                        }
                        // Nothing of it was logged: the same lines again, once the log is back.
                        Err(error @ IngestError::Log { .. }) => {
                            tracing::warn!(%error, "batch from the followed file not logged; retrying it");
                            tokio::time::sleep(tail.retry_after()).await;
                        }
                        Err(error) => {
                            tracing::warn!(%error, "batch from the followed file failed");
                            break;
                        }
                    }
                }
            }
        };
        tokio::spawn(feed.instrument(span))
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

    fn stopped(&self) -> IngestError {
        IngestError::Stopped {
            runtime: self.name.to_string(),
        }
    }
}

struct Task<S> {
    name: Arc<str>,
    module: GuestModule,
    config: RuntimeConfig,
    /// CRC-32C of `config.guest_config`, recorded with every batch.
    guest_config_crc: u32,
    /// `None` after a failed re-instantiation; retried on the next batch.
    instance: Option<GuestInstance>,
    /// The state, checkpoint and producers after the last batch that ran: between groups, the
    /// last committed ones.
    last: RuntimeSnapshot,
    journal: Arc<EventJournal>,
    sink: Arc<S>,
    log: Arc<Log>,
    stats: Arc<RuntimeStats>,
    /// `config.views`, shared with each batch's check.
    views: Arc<[String]>,
    /// The fingerprint of `module`, shared with the handles.
    module_now: Arc<Mutex<ModuleFingerprint>>,
}

/// A batch of a group, between the guest and the commit.
enum Staged {
    /// It ran (or its input was lost); it commits with its record.
    Batch {
        entry: Box<BatchEntry>,
        /// What the guest produced; `None` for a lost batch.
        batch: Option<GuestBatch>,
        reply: Option<Reply>,
    },
    /// A producer's batch that was committed before (perhaps earlier in this group): answered
    /// with the original's receipt once the group has committed.
    Duplicate { stamp: ProducerStamp, reply: Reply },
}

impl<S: BatchSink> Task<S> {
    async fn run(mut self, mut rx: mpsc::Receiver<Command>) {
        while let Some(cmd) = rx.recv().await {
            let held = match cmd {
                Command::Ingest(first) => {
                    // Everything already waiting joins the group, up to a command of another
                    // kind, which runs right after it.
                    let mut group = vec![first];
                    let mut held = None;
                    while group.len() < MAX_GROUP && held.is_none() {
                        match rx.try_recv() {
                            Ok(Command::Ingest(next)) => group.push(next),
                            Ok(other) => held = Some(other),
                            Err(_) => break,
                        }
                    }
                    let journal = Arc::clone(&self.journal);
                    journal.scope(self.group(group)).await;
                    held
                }
                other => Some(other),
            };
            if let Some(cmd) = held {
                self.other(cmd).await;
            }
        }
        tracing::debug!("runtime task stopped");
    }

    /// Every command but a batch.
    async fn other(&mut self, cmd: Command) {
        match cmd {
            Command::Ingest(ingest) => {
                let journal = Arc::clone(&self.journal);
                journal.scope(self.group(vec![ingest])).await;
            }
            Command::Replay {
                entry,
                position,
                reply,
            } => {
                let journal = Arc::clone(&self.journal);
                let result = journal.scope(self.replay(entry, position)).await;
                let _ = reply.send(result);
            }
            Command::Apply {
                entry,
                position,
                reply,
            } => {
                let journal = Arc::clone(&self.journal);
                let result = journal.scope(self.apply(entry, position)).await;
                let _ = reply.send(result);
            }
            Command::Deploy {
                module,
                replayed_at,
                reply,
            } => {
                let _ = reply.send(self.deploy(module, replayed_at).await);
            }
            Command::Save { reply } => {
                let _ = reply.send(self.last.clone());
            }
            Command::Pause { reply, control } => {
                if reply.send(self.last.clone()).is_ok() {
                    // Paused until the guard is dropped.
                    self.paused(control).await;
                }
            }
        }
    }

    /// Runs a group of batches, logs them, and commits them; see the module docs.
    async fn group(&mut self, group: Vec<Ingest>) {
        let before = (self.last.state.clone(), self.last.checkpoint);
        let at_ms = unix_ms_now();
        let mut staged = Vec::with_capacity(group.len());
        let mut undo = Vec::new();
        for ingest in group {
            if let Some(batch) = self.stage(ingest, at_ms, &mut undo).await {
                staged.push(batch);
            }
        }
        let records: Vec<Vec<u8>> = staged
            .iter()
            .filter_map(|s| match s {
                Staged::Batch { entry, .. } => Some(Entry::encode_batch(entry)),
                Staged::Duplicate { .. } => None,
            })
            .collect();
        let count = records.len() as u64;
        let durable = match records.is_empty() {
            true => Ok(None),
            false => self.log.append(records).await,
        };
        let first = match durable {
            Ok(first) => first,
            Err(error) => {
                tracing::error!(%error, "the log failed: the group is not committed, nor anything until the log is reopened");
                self.last.state = before.0;
                self.last.checkpoint = before.1;
                self.instance = None;
                for undo in undo.into_iter().rev() {
                    self.last.producers.undo(undo);
                }
                for staged in staged {
                    let reply = match staged {
                        Staged::Batch { reply, .. } => reply,
                        Staged::Duplicate { reply, .. } => Some(reply),
                    };
                    if let Some(reply) = reply {
                        let _ = reply.send(Err(IngestError::Log {
                            runtime: self.name.to_string(),
                            source: viewtape_snapshots::log::LogError::Poisoned(error.to_string()),
                        }));
                    }
                }
                return;
            }
        };
        let log = Arc::clone(&self.log);
        let turn = log.turn(first, count).await;
        let mut position = first;
        for staged in staged {
            let logged = matches!(staged, Staged::Batch { .. });
            self.finish(staged, position).await;
            if logged {
                position = position.map(|p| p + 1);
            }
        }
        drop(turn);
    }

    /// Commits a staged batch at `position` and answers it, or answers a duplicate with the
    /// original's receipt.
    async fn finish(&mut self, staged: Staged, position: Option<u64>) {
        match staged {
            Staged::Batch {
                entry,
                batch,
                reply,
            } => {
                let receipt = self.commit(&entry, batch, position).await;
                if let Some(reply) = reply {
                    let _ = reply.send(Ok(Accepted {
                        receipt,
                        duplicate: false,
                    }));
                }
            }
            Staged::Duplicate { stamp, reply } => {
                let receipt = match self.last.producers.check(&stamp) {
                    Verdict::Duplicate(receipt) => receipt.unwrap_or_default(),
                    _ => Receipt::default(),
                };
                let _ = reply.send(Ok(Accepted {
                    receipt,
                    duplicate: true,
                }));
            }
        }
    }

    /// Applies a batch of the shared log at `position`; see [`RuntimeHandle::apply`].
    async fn apply(
        &mut self,
        entry: BatchEntry,
        position: u64,
    ) -> Result<Result<Accepted, IngestError>, ReplayError> {
        self.same_module(&entry)?;
        let (reply, mut answer) = oneshot::channel();
        let ingest = Ingest {
            input: entry.input,
            checkpoint: entry.checkpoint,
            source_gap: entry.source_gap,
            producer: entry.producer,
            reply,
        };
        // Undo records are for a log that fails after staging; this position is final.
        let staged = self.stage(ingest, entry.at_ms, &mut Vec::new()).await;
        let refused = match staged {
            Some(_) => None,
            None => Some(answer.try_recv().unwrap_or_else(|_| {
                Err(IngestError::Stopped {
                    runtime: self.name.to_string(),
                })
            })),
        };
        if let Some(Err(error @ IngestError::Unavailable { .. })) = &refused {
            // A fault of this node (an instance that could not be made, the wall-clock
            // backstop), not the batch's verdict: nothing changed, the position stays open.
            return Err(ReplayError::Unavailable {
                runtime: self.name.to_string(),
                reason: error.to_string(),
            });
        }
        let log = Arc::clone(&self.log);
        let turn = log.turn(Some(position), 1).await;
        if let Some(staged) = staged {
            self.finish(staged, Some(position)).await;
        }
        drop(turn);
        Ok(refused.unwrap_or_else(|| {
            answer.try_recv().unwrap_or_else(|_| {
                Err(IngestError::Stopped {
                    runtime: self.name.to_string(),
                })
            })
        }))
    }

    /// Whether `entry` was made by the module and guest config this runtime runs.
    fn same_module(&self, entry: &BatchEntry) -> Result<(), ReplayError> {
        if entry.module != *self.module.fingerprint() || entry.guest_config != self.guest_config_crc
        {
            return Err(ReplayError::ModuleChanged {
                runtime: self.name.to_string(),
                logged: entry.module.clone(),
                logged_config: entry.guest_config,
                running: self.module.fingerprint().clone(),
                running_config: self.guest_config_crc,
            });
        }
        Ok(())
    }

    /// Checks one batch's producer and runs it through the guest. Answers at once what will
    /// not commit; returns what will, once durable.
    async fn stage(&mut self, ingest: Ingest, at_ms: u64, undo: &mut Vec<Undo>) -> Option<Staged> {
        let Ingest {
            input,
            checkpoint,
            source_gap,
            producer,
            reply,
        } = ingest;
        if let Some(stamp) = &producer {
            let refused = match self.last.producers.check(stamp) {
                Verdict::Next => None,
                Verdict::Duplicate(_) => {
                    return Some(Staged::Duplicate {
                        stamp: stamp.clone(),
                        reply,
                    })
                }
                Verdict::OutOfOrder { expected } => Some(IngestError::OutOfOrder {
                    runtime: self.name.to_string(),
                    expected,
                }),
                Verdict::Fenced { current } => Some(IngestError::Fenced {
                    runtime: self.name.to_string(),
                    epoch: stamp.epoch,
                    current,
                }),
            };
            if let Some(error) = refused {
                let _ = reply.send(Err(error));
                return None;
            }
        }
        let mut entry = BatchEntry {
            runtime: self.name.to_string(),
            module: self.module.fingerprint().clone(),
            guest_config: self.guest_config_crc,
            at_ms,
            input,
            producer,
            checkpoint,
            source_gap,
            outcome: Outcome::Lost,
        };
        let (batch, reply) = match self.run_guest(&entry).await {
            Ok(batch) => {
                entry.outcome = Outcome::Committed(Digest::of(&batch));
                (Some(batch), Some(reply))
            }
            Err(error) => {
                let _ = reply.send(Err(error));
                // A push source may resend; a pull source's input is gone once read: record its
                // loss.
                entry.checkpoint?;
                entry.input = Bytes::new();
                (None, None)
            }
        };
        if entry.checkpoint.is_some() {
            self.last.checkpoint = entry.checkpoint;
        }
        if let Some(stamp) = &entry.producer {
            undo.push(self.last.producers.stage(stamp));
        }
        Some(Staged::Batch {
            entry: Box::new(entry),
            batch,
            reply,
        })
    }

    /// Runs a logged batch again at `position`; see [`RuntimeHandle::replay`].
    async fn replay(&mut self, entry: BatchEntry, position: u64) -> Result<(), ReplayError> {
        self.same_module(&entry)?;
        let runtime = self.name.to_string();
        let diverged = |detail: String| ReplayError::Diverged {
            runtime: runtime.clone(),
            detail,
        };
        let batch = match &entry.outcome {
            Outcome::Lost => None,
            Outcome::Pending => {
                return Err(diverged(
                    "a batch of a shared log is in the local log".into(),
                ))
            }
            Outcome::Committed(logged) => {
                let before = self.last.state.clone();
                let batch = self
                    .run_guest(&entry)
                    .await
                    .map_err(|error| diverged(format!("it failed: {error}")))?;
                let digest = Digest::of(&batch);
                if digest != *logged {
                    self.last.state = before;
                    self.instance = None;
                    return Err(diverged(format!(
                        "events {:?} crc {:08x}, logged {:?} crc {:08x}",
                        digest.per_view, digest.crc, logged.per_view, logged.crc
                    )));
                }
                Some(batch)
            }
        };
        if entry.checkpoint.is_some() {
            self.last.checkpoint = entry.checkpoint;
        }
        if let Some(stamp) = &entry.producer {
            self.last.producers.stage(stamp);
        }
        let log = Arc::clone(&self.log);
        let turn = log.turn(Some(position), 1).await;
        self.commit(&entry, batch, Some(position)).await;
        drop(turn);
        self.log.metrics().replayed.inc();
        Ok(())
    }

    /// Swaps `module` in, carrying the state over; see [`RuntimeHandle::deploy`].
    async fn deploy(
        &mut self,
        module: GuestModule,
        replayed_at: Option<u64>,
    ) -> Result<Deployed, DeployError> {
        let previous = self.module.fingerprint().clone();
        let next = module.fingerprint().clone();
        if next == previous && replayed_at.is_none() {
            return Ok(Deployed {
                previous,
                module: next,
                position: None,
            });
        }
        let refused = |source| DeployError::Refused {
            runtime: self.name.to_string(),
            source,
        };
        let state = (!self.last.state.is_empty()).then_some(&self.last.state[..]);
        let mut instance = GuestInstance::new(
            &module,
            &self.name,
            &self.config.limits,
            &self.config.guest_config,
            state,
        )
        .await
        .map_err(refused)?;
        // From here on the state is in the new module's own format.
        let state = instance.save().await.map_err(refused)?;
        let position = match replayed_at {
            Some(position) => Some(position),
            None => {
                let entry = Entry::Deploy(DeployEntry {
                    runtime: self.name.to_string(),
                    module: next.clone(),
                    previous: previous.clone(),
                    at_ms: unix_ms_now(),
                });
                self.log
                    .append(vec![entry.encode()])
                    .await
                    .map_err(|source| DeployError::Log {
                        runtime: self.name.to_string(),
                        source,
                    })?
            }
        };
        let log = Arc::clone(&self.log);
        let turn = log.turn(position, 1).await;
        self.module = module;
        self.instance = Some(instance);
        self.last.state = state;
        *self
            .module_now
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = next.clone();
        drop(turn);
        if replayed_at.is_some() {
            self.log.metrics().replayed.inc();
        } else {
            tracing::info!(module = %next, %previous, "module deployed; the guest's state carried over");
        }
        Ok(Deployed {
            previous,
            module: next,
            position,
        })
    }

    /// Makes one durable batch visible: its gaps, then its events.
    async fn commit(
        &mut self,
        entry: &BatchEntry,
        batch: Option<GuestBatch>,
        position: Option<u64>,
    ) -> Receipt {
        let mut receipt = Receipt {
            position,
            durability: self.log.durability(),
            ..Receipt::default()
        };
        if let Some(reason) = &entry.source_gap {
            tracing::warn!(reason = %reason, "source lost input");
            self.mark_gap();
            receipt.gaps.push(reason.clone());
        }
        match batch {
            None => {
                tracing::warn!(reason = "a failed batch from a source was skipped", "gap");
                self.mark_gap();
            }
            Some(batch) => {
                for reason in &batch.gaps {
                    tracing::warn!(reason = %reason, "guest reported a gap");
                    self.mark_gap();
                }
                receipt.gaps.extend(batch.gaps.iter().cloned());
                if let Outcome::Committed(digest) = &entry.outcome {
                    receipt.events = digest.per_view.clone();
                }
                let events = batch.events.len() as u64;
                self.sink.commit(&self.name, batch, entry.at_ms).await;
                self.stats.batches.fetch_add(1, Ordering::Relaxed);
                self.stats.events.fetch_add(events, Ordering::Relaxed);
            }
        }
        if let Some(stamp) = &entry.producer {
            self.last.producers.committed(stamp, &receipt);
        }
        receipt
    }

    /// Serves the holder of the cut until it drops its guard.
    async fn paused(&mut self, mut control: mpsc::Receiver<PauseOp>) {
        let mut staged: Option<(GuestInstance, RuntimeSnapshot)> = None;
        while let Some(op) = control.recv().await {
            match op {
                PauseOp::Stage { snapshot, reply } => {
                    let state = (!snapshot.state.is_empty()).then_some(&snapshot.state[..]);
                    let made = GuestInstance::new(
                        &self.module,
                        &self.name,
                        &self.config.limits,
                        &self.config.guest_config,
                        state,
                    )
                    .await;
                    let result = made.map(|instance| staged = Some((instance, snapshot)));
                    let _ = reply.send(result);
                }
                PauseOp::Commit { reply } => {
                    let committed = match staged.take() {
                        Some((instance, snapshot)) => {
                            self.instance = Some(instance);
                            self.last = snapshot;
                            tracing::info!("guest state restored from a snapshot");
                            true
                        }
                        None => false,
                    };
                    let _ = reply.send(committed);
                }
            }
        }
    }

    async fn instance(&mut self) -> Result<&mut GuestInstance, GuestError> {
        if self.instance.is_none() {
            let state = (!self.last.state.is_empty()).then_some(&self.last.state[..]);
            let instance = GuestInstance::new(
                &self.module,
                &self.name,
                &self.config.limits,
                &self.config.guest_config,
                state,
            )
            .await?;
            self.stats.restarts.fetch_add(1, Ordering::Relaxed);
            self.instance = Some(instance);
        }
        // Just filled if it was empty.
        self.instance
            .as_mut()
            .ok_or_else(|| GuestError::Protocol("instance vanished".into()))
    }

    /// Runs `entry`'s input through the guest (an empty input from a source runs nothing). On
    /// success the guest's new state is the last good one; on failure the instance is made
    /// again from the last good state.
    async fn run_guest(&mut self, entry: &BatchEntry) -> Result<GuestBatch, IngestError> {
        if entry.input.is_empty() && entry.checkpoint.is_some() {
            return Ok(GuestBatch::default());
        }
        let views = Arc::clone(&self.views);
        let instance = match self.instance().await {
            Ok(instance) => instance,
            Err(source) => {
                tracing::error!(error = %source, "runtime unavailable: re-instantiation failed");
                return Err(IngestError::Unavailable {
                    runtime: self.name.to_string(),
                    source,
                });
            }
        };
        let outcome = match instance.on_batch(&entry.input).await {
            Ok(batch) => match declared(&views, batch) {
                Ok(batch) => instance.save().await.map(|state| (batch, state)),
                Err(error) => Err(error),
            },
            Err(err) => Err(err),
        };
        let source = match outcome {
            Ok((batch, state)) => {
                self.last.state = state;
                return Ok(batch);
            }
            Err(source) => source,
        };
        self.stats.failures.fetch_add(1, Ordering::Relaxed);
        if source.is_input_error() {
            tracing::info!(error = %source, "batch rejected");
        } else {
            tracing::warn!(error = %source, "guest failed; re-instantiating from the last good state");
        }
        // Drop the store whatever the failure: its heap may be mid-update.
        self.instance = None;
        if let Err(err) = self.instance().await {
            tracing::error!(error = %err, "re-instantiation failed; will retry on the next batch");
        }
        let runtime = self.name.to_string();
        // The wall-clock backstop is a fault of the moment, not a verdict on the batch.
        Err(if matches!(source, GuestError::Timeout { .. }) {
            IngestError::Unavailable { runtime, source }
        } else {
            IngestError::Guest { runtime, source }
        })
    }

    /// Marks a gap on this runtime's views: the loss of its input touches nothing else.
    fn mark_gap(&self) {
        self.stats.gaps.fetch_add(1, Ordering::Relaxed);
        self.journal
            .mark_gap_in(self.views.iter().map(String::as_str));
    }
}

/// `batch`, if it publishes only to `views` (what its runtime declares).
fn declared(views: &[String], batch: GuestBatch) -> Result<GuestBatch, GuestError> {
    match batch
        .events
        .iter()
        .find(|event| !views.iter().any(|v| **v == *event.view))
    {
        Some(event) => Err(GuestError::UndeclaredView {
            view: event.view.to_string(),
            declared: views.to_vec(),
        }),
        None => Ok(batch),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;
    use std::time::Duration;

    use viewtape_journal::{Cursor, JournalConfig, ReplayError};

    use super::*;
    use crate::host::{guests, EngineConfig, GuestEngine};
    use crate::source::FileTailConfig;

    /// Appends every event to the journal (frame = `key=payload`) and remembers them.
    #[derive(Default)]
    struct TestSink {
        events: Mutex<Vec<(String, String, String)>>,
    }

    impl BatchSink for TestSink {
        async fn commit(&self, _runtime: &str, batch: GuestBatch, _at_ms: u64) {
            let journal = viewtape_journal::current().unwrap();
            for e in batch.events {
                let frame = Arc::new(Bytes::from(format!(
                    "{}={}",
                    e.key,
                    String::from_utf8_lossy(&e.payload)
                )));
                journal
                    .append_with(&e.view, &e.key, |_| Ok::<_, ()>(frame))
                    .await
                    .unwrap();
                let payload = String::from_utf8_lossy(&e.payload).into_owned();
                self.events
                    .lock()
                    .unwrap()
                    .push((e.view.to_string(), e.key, payload));
            }
        }
    }

    fn engine() -> GuestEngine {
        GuestEngine::new(EngineConfig {
            pooled_instances: 8,
            ..EngineConfig::default()
        })
        .unwrap()
    }

    async fn spawn(
        wasm: &[u8],
        limits: Limits,
    ) -> (RuntimeHandle, Arc<EventJournal>, Arc<TestSink>) {
        let module = GuestModule::new(&engine(), wasm).unwrap();
        let journal = Arc::new(EventJournal::new(JournalConfig::default()));
        let sink = Arc::new(TestSink::default());
        let config = RuntimeConfig {
            limits,
            ..RuntimeConfig::new("t", ["v", "state", "prices"])
        };
        let handle = RuntimeHandle::spawn(
            module,
            config,
            None,
            Arc::clone(&journal),
            Arc::clone(&sink),
            Arc::default(),
        )
        .await
        .unwrap();
        (handle, journal, sink)
    }

    #[tokio::test]
    async fn ticker_batch_commits_and_gap_reaches_the_journal() {
        let (rt, journal, sink) = spawn(guests::TICKER_WASM, Limits::default()).await;
        let summary = rt
            .ingest(Bytes::from_static(b"{\"symbol\":\"A\",\"price\":1,\"seq\":1}\n{\"symbol\":\"B\",\"price\":2,\"seq\":2}\n"), None)
            .await
            .unwrap();
        assert_eq!(summary.receipt.events.get("prices"), Some(&2));
        let before = Cursor::new(journal.epoch().await, 1);
        assert_eq!(
            journal
                .replay_after("prices", Some(&before))
                .await
                .unwrap()
                .len(),
            1
        );

        rt.ingest(
            Bytes::from_static(b"{\"symbol\":\"A\",\"price\":3,\"seq\":9}\n"),
            None,
        )
        .await
        .unwrap();
        assert!(matches!(
            journal.replay_after("prices", Some(&before)).await,
            Err(ReplayError::Gap { .. })
        ));
        assert_eq!(rt.stats().gaps.load(Ordering::Relaxed), 1);
        assert_eq!(sink.events.lock().unwrap().len(), 3);
        assert_eq!(guests::saved_state(&rt.save().await.unwrap().state), b"9");
    }

    #[tokio::test]
    async fn failed_batch_commits_nothing_and_the_runtime_recovers_its_state() {
        let (rt, _journal, sink) = spawn(guests::MISBEHAVE_WASM, Limits::default()).await;
        rt.ingest(Bytes::from_static(b"count\ncount"), None)
            .await
            .unwrap();
        let err = rt
            .ingest(
                Bytes::from_static(b"count\npublish v k x\npanic boom"),
                None,
            )
            .await
            .unwrap_err();
        assert!(
            matches!(
                &err,
                IngestError::Guest {
                    source: GuestError::Trap { .. },
                    ..
                }
            ),
            "{err}"
        );
        let err = rt
            .ingest(Bytes::from_static(b"count\nfail nope"), None)
            .await
            .unwrap_err();
        assert!(
            matches!(
                &err,
                IngestError::Guest {
                    source: GuestError::GuestRejected { .. },
                    ..
                }
            ),
            "{err}"
        );
        rt.ingest(Bytes::from_static(b"count"), None).await.unwrap();
        let events = sink.events.lock().unwrap().clone();
        let counts: Vec<_> = events.iter().map(|(_, _, p)| p.as_str()).collect();
        assert_eq!(
            counts,
            vec!["1", "2", "3"],
            "all-or-nothing, state rolled back"
        );
        assert_eq!(rt.stats().failures.load(Ordering::Relaxed), 2);
        assert_eq!(rt.stats().restarts.load(Ordering::Relaxed), 2);
    }

    #[tokio::test]
    async fn infinite_loop_does_not_stop_the_runtime() {
        // Out of fuel: a verdict on the batch, the same every time.
        let (rt, _journal, _sink) = spawn(guests::MISBEHAVE_WASM, Limits::default()).await;
        let err = rt
            .ingest(Bytes::from_static(b"loop"), None)
            .await
            .unwrap_err();
        assert!(
            matches!(
                &err,
                IngestError::Guest {
                    source: GuestError::FuelExhausted { .. },
                    ..
                }
            ),
            "{err}"
        );
        rt.ingest(Bytes::from_static(b"count"), None).await.unwrap();

        // Past the wall-clock backstop: a fault, not the batch's.
        let limits = Limits {
            fuel: u64::MAX,
            batch_timeout: Duration::from_millis(100),
            ..Limits::default()
        };
        let (rt, _journal, _sink) = spawn(guests::MISBEHAVE_WASM, limits).await;
        let err = rt
            .ingest(Bytes::from_static(b"loop"), None)
            .await
            .unwrap_err();
        assert!(
            matches!(
                &err,
                IngestError::Unavailable {
                    source: GuestError::Timeout { .. },
                    ..
                }
            ),
            "{err}"
        );
        rt.ingest(Bytes::from_static(b"count"), None).await.unwrap();
    }

    #[tokio::test]
    async fn restore_from_a_snapshot() {
        let module = GuestModule::new(&engine(), guests::MISBEHAVE_WASM).unwrap();
        let journal = Arc::new(EventJournal::new(JournalConfig::default()));
        let sink = Arc::new(TestSink::default());
        let snapshot = RuntimeSnapshot {
            state: Bytes::from_static(b"41"),
            ..RuntimeSnapshot::default()
        };
        let rt = RuntimeHandle::spawn(
            module,
            RuntimeConfig::new("t", ["v", "state"]),
            Some(snapshot),
            journal,
            Arc::clone(&sink),
            Arc::default(),
        )
        .await
        .unwrap();
        rt.ingest(Bytes::from_static(b"count"), None).await.unwrap();
        assert_eq!(sink.events.lock().unwrap()[0].2, "42");
    }

    #[tokio::test]
    async fn restore_inside_a_pause_replaces_the_guest_only_when_committed() {
        let (rt, _journal, sink) = spawn(guests::MISBEHAVE_WASM, Limits::default()).await;
        rt.ingest(Bytes::from_static(b"count"), None).await.unwrap();
        let snapshot = RuntimeSnapshot {
            state: Bytes::from_static(b"41"),
            ..RuntimeSnapshot::default()
        };
        // Staged but not committed: dropped with the guard.
        let (saved, guard) = rt.pause().await.unwrap();
        assert_eq!(guests::saved_state(&saved.state), b"1");
        guard.stage_restore(snapshot.clone()).await.unwrap();
        drop(guard);
        rt.ingest(Bytes::from_static(b"count"), None).await.unwrap();
        // Committed: the next batch runs on the restored state.
        let (_, guard) = rt.pause().await.unwrap();
        assert!(!guard.commit_restore().await.unwrap(), "nothing staged");
        guard.stage_restore(snapshot).await.unwrap();
        assert!(guard.commit_restore().await.unwrap());
        drop(guard);
        assert_eq!(&rt.save().await.unwrap().state[..], b"41");
        rt.ingest(Bytes::from_static(b"count"), None).await.unwrap();
        let counts: Vec<_> = sink
            .events
            .lock()
            .unwrap()
            .iter()
            .map(|e| e.2.clone())
            .collect();
        assert_eq!(counts, vec!["1", "2", "42"]);
    }

    #[tokio::test]
    async fn file_tail_feeds_the_runtime_and_truncation_marks_a_gap() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ticks.ndjson");
        std::fs::write(&path, "{\"symbol\":\"A\",\"price\":1,\"seq\":1}\n\n\n").unwrap();
        let (rt, journal, sink) = spawn(guests::TICKER_WASM, Limits::default()).await;
        let config = FileTailConfig {
            poll_interval: Duration::from_millis(5),
            ..FileTailConfig::new(&path)
        };
        let task = rt.follow(FileTail::new(config, None));
        let wait = |n: usize| {
            let sink = Arc::clone(&sink);
            async move {
                for _ in 0..1000 {
                    if sink.events.lock().unwrap().len() >= n {
                        return;
                    }
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                panic!("timed out waiting for {n} events");
            }
        };
        wait(1).await;
        let before = Cursor::new(journal.epoch().await, 1);
        std::fs::write(&path, "{\"symbol\":\"B\",\"price\":2,\"seq\":2}\n").unwrap();
        wait(2).await;
        assert!(matches!(
            journal.replay_after("prices", Some(&before)).await,
            Err(ReplayError::Gap { .. })
        ));
        let snap = rt.save().await.unwrap();
        assert!(matches!(snap.checkpoint, Some(SourceCheckpoint::FileTail(cp)) if cp.offset > 0));
        task.abort();
    }
}
