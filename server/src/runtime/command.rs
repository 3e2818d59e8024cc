//! What a [`RuntimeHandle`](super::RuntimeHandle) sends its task: one [`Command`] at a time,
//! each carrying a oneshot for its answer; and what the holder of a pause asks meanwhile.

use bytes::Bytes;
use tokio::sync::{mpsc, oneshot};

use super::{Accepted, ApplyError, DeployError, Deployed, IngestError, RuntimeSnapshot};
use crate::host::{GuestError, GuestModule};
use crate::log::producer::ProducerStamp;
use crate::log::{BatchEntry, DeployEntry, LogPosition, Outcome};
use crate::source::SourceCheckpoint;

pub(super) type Reply = oneshot::Sender<Result<Accepted, IngestError>>;

/// One batch on its way in.
pub(super) struct Ingest {
    pub input: Bytes,
    pub checkpoint: Option<SourceCheckpoint>,
    pub source_gap: Option<String>,
    pub producer: Option<ProducerStamp>,
    pub reply: Reply,
}

/// A logged record, ready to apply.
#[derive(Clone, Debug)]
pub enum Record {
    /// A batch.
    Batch(BatchEntry),
    /// Batches a node gathered into one record of a cluster's stream, judged in order, each
    /// with its index among the record's batches.
    Batches {
        /// The batches, with their indices.
        batches: Vec<(u32, BatchEntry)>,
        /// The record holds other runtimes' batches too: its position counts as applied once
        /// all of them are, which the caller marks ([`Log::turn`](crate::log::Log::turn)); this runtime takes no turn.
        shared: bool,
    },
    /// A deploy, with its module loaded.
    Deploy(DeployEntry, GuestModule),
    /// A deploy this node cannot apply (the module it installs is gone here, or cannot be
    /// fetched), and why: the runtime halts at its position ([`RuntimeHalt`](super::RuntimeHalt)),
    /// on a local log or a cluster's stream alike.
    Halt(String),
}

impl Record {
    /// A record whose failure to apply halts the runtime: one of the local log, which the
    /// runtime judged before it was logged (not one published to a cluster's stream, which every
    /// node judges at its position), and a [`Record::Halt`] wherever it comes from.
    pub fn judged(&self) -> bool {
        match self {
            Record::Batch(entry) => entry.outcome != Outcome::Pending,
            Record::Deploy(entry, _) => !entry.pending,
            Record::Batches { .. } => false,
            Record::Halt(_) => true,
        }
    }

    /// How many offsets the record may take on each view of its runtime, at most: its events
    /// and gaps, and one more for a gap of its source or its loss.
    pub fn offsets(&self) -> u64 {
        match self {
            Record::Batch(BatchEntry {
                outcome: Outcome::Committed(digest),
                ..
            }) => digest.per_view.values().sum::<u64>() + u64::from(digest.gaps) + 2,
            Record::Batches { batches, .. } => batches.len() as u64 * 2,
            Record::Batch(_) | Record::Deploy(..) | Record::Halt(_) => 2,
        }
    }
}

/// When a deploy happens, which decides what a module that refuses the state gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum DeployWhen {
    /// While the runtime runs: a module that refuses the state is refused, nothing changes;
    /// a halted runtime takes no deploy.
    Live,
    /// At start-up, the config naming another module than the one that saved the state: a
    /// module that refuses it starts fresh (a gap on the runtime's views); a halted runtime
    /// starts fresh on it.
    AtStart,
}
/// What a handle asks of its task. Its large parts are boxed: the queue of every runtime holds
/// a block of commands from the start, idle or not.
pub(super) enum Command {
    Ingest(Box<Ingest>),
    Apply {
        record: Box<Record>,
        position: LogPosition,
        reply: oneshot::Sender<Result<(), ApplyError>>,
    },
    Save {
        reply: oneshot::Sender<RuntimeSnapshot>,
    },
    Deploy {
        module: GuestModule,
        when: DeployWhen,
        reply: oneshot::Sender<Result<Deployed, DeployError>>,
    },
    Pause {
        reply: oneshot::Sender<RuntimeSnapshot>,
        /// Closed when the [`PauseGuard`](super::PauseGuard) is dropped; carries what the holder of the cut asks of
        /// the paused runtime meanwhile.
        control: mpsc::Receiver<PauseOp>,
    },
}

/// What the holder of a [`PauseGuard`](super::PauseGuard) may ask of the paused runtime.
pub(super) enum PauseOp {
    /// Instantiate a guest from this state, and keep it aside.
    Stage {
        snapshot: Box<RuntimeSnapshot>,
        reply: oneshot::Sender<Result<(), GuestError>>,
    },
    /// Swap the staged guest in (`false`: nothing was staged).
    Commit { reply: oneshot::Sender<bool> },
    /// End the task when the pause ends: the runtime was deleted or replaced. What waits in its
    /// queue is answered [`IngestError::Stopped`].
    Stop { reply: oneshot::Sender<()> },
}
