//! The runtime task: one per ingestion runtime, owning its guest instance.
//!
//! A [`RuntimeHandle`] is the cloneable way in. Batches go over a bounded queue (backpressure:
//! `ingest` waits when the runtime is [`RuntimeConfig::queue_depth`] batches behind) and each
//! gets its answer on a oneshot. The task owns the [`GuestInstance`](crate::host::GuestInstance)
//! — the `Store` is never shared, never behind a lock.
//!
//! | file | job |
//! |---|---|
//! | [`handle`] | the way in: the handle, its requests and their answers, the pause guard |
//! | `command` | what a handle sends its task, and what a pause's holder asks meanwhile |
//! | `publish` | on a cluster: a batch or a deploy published to the stream, waiting for its verdict |
//! | `verdict` | on a cluster: the verdicts the task gives, kept for the publishers waiting |
//! | `task` | the task's loop: one command at a time, batches taken as groups; a batch through the guest |
//! | `group` | group commit: stage a group, log it, commit it in log order |
//! | `apply` | one logged record applied at its position: a replay at start, or a cluster's stream |
//! | `deploy` | a new module swapped in between two batches, state carried over |
//! | `pause` | the runtime's side of the consistency cut, and a restore inside it |
//! | [`guest`] | the guest slot: the instance, re-made from the last good state after a failure |
//! | `follow` | a file source feeding the runtime |
//! | [`registry`] | the running runtimes by name, the module store, and the consistency cut over all of them |
//!
//! ## A group of batches
//!
//! The task takes every batch waiting in its queue as one group (up to [`MAX_GROUP`]):
//! 1. each batch's producer stamp is checked ([`ProducerTable`]): a duplicate does not run
//!    again, an out-of-order or fenced one is refused;
//! 2. each batch runs through the guest, which saves its state after every success, so the last
//!    good state always matches what ran; a batch that fails is refused alone (a push source
//!    gets the error and may resend) and the instance is made again from the last good state;
//! 3. the accepted batches' records ([`BatchEntry`](crate::log::BatchEntry)) go to the log
//!    together and the task waits until they are durable ([`Log::append`]) and until every
//!    earlier position has committed ([`Log::turn`]);
//! 4. then, in order, each batch commits: its gaps are marked on this runtime's views, its
//!    events go to the [`BatchSink`] with the batch's time, and its caller gets the
//!    [`Receipt`](crate::log::Receipt).
//!
//! Nothing of a batch is visible or acknowledged before step 3. If the log fails, nothing of
//! the group commits: the guest, its state, its checkpoint and its producers go back to where
//! they were before the group, and every caller gets [`IngestError::Log`].
//!
//! A pull source's input is consumed once read, so a batch from a source that the guest fails on
//! is logged as lost ([`Outcome::Lost`](crate::log::Outcome::Lost)): a gap on the runtime's
//! views, and the checkpoint moves past it.
//!
//! ## The log's records, applied
//!
//! A record applied at its position ([`RuntimeHandle::apply`]) takes one path, whoever feeds
//! it: the start-up replay of the local log, or a cluster's apply loop over the shared stream.
//! A record the guest already judged (a local log's batch) is run again and checked against
//! its digest; a record nobody judged yet (a batch published to a cluster's stream, whose
//! guest runs on every node in stream order) is judged here, the same way on every node, and
//! its verdict goes to the publisher through the log ([`Log::settle`]). Either way its position
//! is consumed, so later positions commit after it.
//!
//! With a cluster's stream as the log, ingest publishes the batch ([`Log::publish`]) and waits
//! for its verdict: the guest runs only once the stream has ordered the batch among every
//! node's.
//!
//! [`ProducerTable`]: crate::log::producer::ProducerTable

mod apply;
mod command;
mod deploy;
mod error;
mod follow;
mod group;
pub mod guest;
pub mod handle;
mod pause;
mod publish;
pub mod registry;
mod task;
#[cfg(test)]
mod tests;
mod verdict;

use std::future::Future;
use std::sync::atomic::AtomicU64;
use std::sync::{Mutex, PoisonError};

use bytes::Bytes;

pub use error::{ApplyError, DeployError, IngestError};
pub use handle::{PauseGuard, RuntimeHandle};

use crate::host::{GuestBatch, GuestError, Limits, ModuleFingerprint};
use crate::log::producer::{ProducerEpoch, ProducerTable};
use crate::log::{LogPosition, Receipt};
use crate::schema::{ConfiguredSchemas, ViewSchema, Violation};
use crate::source::SourceCheckpoint;

#[cfg(doc)]
use crate::log::Log;

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
    /// Schemas the config gives some of its views (`schemas =`), over the guest's own.
    pub schemas: ConfiguredSchemas,
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
            schemas: ConfiguredSchemas::default(),
        }
    }
}

/// An acknowledged batch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Accepted {
    /// What it was promised.
    pub receipt: Receipt,
    /// It had been committed before: this is the original's receipt, nothing ran again.
    pub duplicate: bool,
    /// A producer's claim: the epoch it was given (its next `seq` is 0).
    pub claimed: Option<ProducerEpoch>,
}

/// A module that replaced a runtime's module.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Deployed {
    /// The module before.
    pub previous: ModuleFingerprint,
    /// The module now.
    pub module: ModuleFingerprint,
    /// The deploy's log position (`None` with the log off, or when the module already ran).
    pub position: Option<LogPosition>,
    /// The new module refused the state, so the guest started fresh (a gap on the runtime's
    /// views). Only a deploy at start-up may do that; a live deploy is refused instead.
    pub fresh: bool,
}

/// Where successful batches go. The server implements it (append to the journal, fan out to
/// subscribers); tests implement it with a `Vec`.
pub trait BatchSink: Send + Sync + 'static {
    /// Commits one successful batch: its events, in order, accepted at `at_ms` (wall clock, Unix
    /// milliseconds).
    ///
    /// The batch's `gaps` have already been logged, counted and marked on the journal by the
    /// runtime task before this is called; they are passed along for information only.
    fn commit(
        &self,
        runtime: &str,
        batch: GuestBatch,
        at_ms: u64,
    ) -> impl Future<Output = ()> + Send;

    /// The first key of `view` whose value does not fit `schema` (a deploy that changes the
    /// view's schema is refused then), if any.
    fn misfit(&self, view: &str, schema: &ViewSchema) -> Option<Violation>;
}

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
    /// Every module the runtime has run in its log's history, oldest first (empty in snapshots
    /// written before this was kept). A cluster node whose config names none of them runs
    /// another build than the cluster, and is refused.
    #[serde(default)]
    pub modules: Vec<ModuleFingerprint>,
    /// The CRC-32C of the guest config a cluster's stream decided for the runtime (its first
    /// deploy, or its first batch on a stream older than that); `None` on a local log. A
    /// batch made with another config is refused on every node; a node configured otherwise
    /// is not ready.
    #[serde(default)]
    pub config: Option<u32>,
    /// Set when this runtime stopped on this node: its log's history could not be reproduced
    /// here. Kept in snapshots, so a restart does not run on from a state that skipped it.
    #[serde(default)]
    pub halted: Option<RuntimeHalt>,
    /// The position of the last batch it committed: which of its batches a cluster's node
    /// checks against the others ([`crate::log::check`]) follows from it, the same on every
    /// node, also on one that started from a snapshot.
    #[serde(default)]
    pub last_batch: Option<LogPosition>,
}

/// A runtime stopped for good on this node ([`RuntimeSnapshot::halted`]): a record of it could
/// not be reproduced here (its guest gave other events than the record's digest, or failed; the
/// record names another module; the module a deploy installs cannot be loaded; or, on a
/// cluster, another node applied something else). Its views keep what they had, take nothing
/// new, and never serve another event under a cursor already issued; every other runtime goes
/// on. It takes no batch and no deploy until a new module in its config starts it fresh, it is
/// deleted, or a snapshot is restored. Its `Display` is what a refused request is told.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RuntimeHalt {
    /// The position of the record it could not reproduce.
    pub position: LogPosition,
    /// Why, in the server's words.
    pub reason: String,
    /// How many offsets the records it could not apply (that one and those after it) may have
    /// taken on each of its views when they were first applied, at most: numbering goes on past
    /// them when it runs again, so that no cursor issued for their events names another.
    #[serde(default)]
    pub lost: u64,
    /// Set when it halted only because a start could not read this module (missing or damaged,
    /// with no copy to repair it from) and it passed no record since: a start that reads the
    /// module again runs it on from its state.
    #[serde(default)]
    pub unreadable: Option<ModuleFingerprint>,
}

impl std::fmt::Display for RuntimeHalt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "halted on this node since log position {}: {}; its views keep what they had; name a new module in its config and restart (it starts fresh), delete it and define it again, or restore a snapshot",
            self.position, self.reason
        )
    }
}

impl RuntimeSnapshot {
    /// Notes that the runtime runs `module` from here on.
    pub(crate) fn ran(&mut self, module: &ModuleFingerprint) {
        if !self.modules.contains(module) {
            self.modules.push(module.clone());
        }
    }
}

/// Counters of one runtime, for metrics, and what an operator reads of it now: the size of its
/// state and its guest's last failure.
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
    /// Modules deployed (live, at start-up, or applied from the log).
    pub deploys: AtomicU64,
    /// Bytes of the guest's saved state as last committed — by a batch, a deploy or a restore
    /// — which is what a snapshot stores; 0 for a fresh guest before its first batch. Set before
    /// the commit's caller is answered.
    pub state_bytes: AtomicU64,
    /// The guest's last failure since the process started.
    last_failure: Mutex<Option<GuestFailure>>,
    /// Why the runtime stopped on this node, if it did ([`RuntimeSnapshot::halted`]).
    halted: Mutex<Option<RuntimeHalt>>,
}

impl RuntimeStats {
    /// The guest's last failure since the process started (see [`GuestFailure`]); `None` if
    /// it never failed.
    pub fn last_failure(&self) -> Option<GuestFailure> {
        self.last_failure
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Why the runtime stopped on this node, if it did (see [`RuntimeHalt`]).
    pub fn halted(&self) -> Option<RuntimeHalt> {
        self.halted
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Notes the runtime's halt as its task has it now.
    pub(crate) fn note_halt(&self, halt: Option<&RuntimeHalt>) {
        *self.halted.lock().unwrap_or_else(PoisonError::into_inner) = halt.cloned();
    }

    /// Notes a failure of the guest, now.
    pub(crate) fn failed(&self, kind: FailureKind, error: &GuestError) {
        let failure = GuestFailure {
            kind,
            message: error.public_message().into_owned(),
            at_ms: crate::log::unix_ms_now(),
        };
        *self
            .last_failure
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(failure);
    }
}

/// A runtime's guest failed on a batch or could not be made to run one: the last such failure
/// of a runtime is [`RuntimeStats::last_failure`]. Every batch the guest failed on (counted in
/// [`RuntimeStats::failures`]) sets it, whoever sent the batch — a push source, a pull source, a
/// cluster's stream, a replay — and so does an instance that could not be made again from the
/// last good state. A refusal that is not the guest's (a producer's batch out of order or
/// fenced, the log) does not; nor does a deploy the new module refuses (its
/// caller is told, and the old module runs on). A later success does not clear it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GuestFailure {
    /// What kind of failure.
    pub kind: FailureKind,
    /// The error, as the batch's sender was told it ([`GuestError::public_message`]; the full
    /// detail is in the server's log).
    pub message: String,
    /// When, in Unix milliseconds.
    pub at_ms: u64,
}

/// What kind of [`GuestFailure`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FailureKind {
    /// The guest refused the batch as bad input (it returned an error, or the batch was over
    /// its size limit): the sender may fix it and send it again.
    Rejected,
    /// The guest failed on the batch: it trapped (a panic), used up its CPU budget or its
    /// memory, ran past the wall-clock limit, emitted an event over the limit or to a view its
    /// runtime does not declare, or broke the ABI.
    Failed,
    /// No instance could be made from the last good state, so the batch did not run.
    Unavailable,
}

impl FailureKind {
    /// `rejected`, `failed` or `unavailable`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Rejected => "rejected",
            Self::Failed => "failed",
            Self::Unavailable => "unavailable",
        }
    }
}
