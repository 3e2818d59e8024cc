//! What a runtime answers when a batch, a deploy or a logged record does not go through.

use crate::host::{GuestError, ModuleFingerprint};
use crate::log::producer::{ClaimError, ProducerEpoch, ProducerSeq};
use crate::log::Break;
use crate::log::LogPosition;

use super::RuntimeHalt;

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
    /// A record shared by several runtimes was left half applied: no cut is taken.
    #[error("runtime `{runtime}`: the shared log: {reason}")]
    Shared {
        /// The runtime.
        runtime: String,
        /// Why.
        reason: String,
    },
    /// This node did not publish the batch to the cluster's stream (it is settling, refuses, or
    /// NATS is not connected): it was not applied, and never will be.
    #[error("runtime `{runtime}`: this node takes no batches now: {reason}")]
    NotTaken {
        /// The runtime.
        runtime: String,
        /// Why, in the server's words.
        reason: String,
    },
    /// The batch may have been published, but this node saw no verdict in time: whether it
    /// applies is not known here. Reading with `?after=` its position (when known) tells, and
    /// sending it again with its producer stamp applies it at most once.
    #[error("runtime `{runtime}`: the outcome is not known: {reason}")]
    Unknown {
        /// The runtime.
        runtime: String,
        /// Where it was published, when that is known.
        position: Option<LogPosition>,
        /// Why.
        reason: String,
    },
    /// The batch was published by a node running another module than the cluster runs for
    /// this runtime: every node refuses it alike.
    #[error("runtime `{runtime}`: the batch was made for module {published}, but the cluster runs {running}; deploy a module through any node (PUT /admin/runtimes/{runtime}/module) instead of restarting a node on it")]
    OtherModule {
        /// The runtime.
        runtime: String,
        /// The module of the node that published it.
        published: ModuleFingerprint,
        /// The module the cluster runs.
        running: ModuleFingerprint,
    },
    /// The batch was published by a node whose guest config (`config =` of its `[[runtime]]`)
    /// is not the one the cluster decided for this runtime: every node refuses it alike.
    #[error("runtime `{runtime}`: the batch was made with guest config crc {published:08x}, but the cluster runs crc {decided:08x}; give every node the same `config =` for the runtime")]
    OtherConfig {
        /// The runtime.
        runtime: String,
        /// The CRC-32C of the publishing node's guest config.
        published: u32,
        /// The CRC-32C of the guest config the cluster decided.
        decided: u32,
    },
    /// The runtime stopped on this node ([`RuntimeHalt`], which says what brings it back).
    #[error("runtime `{runtime}` is {halt}")]
    Halted {
        /// The runtime.
        runtime: String,
        /// Where and why it stopped.
        halt: RuntimeHalt,
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
        expected: ProducerSeq,
    },
    /// The producer sent a `seq` it had used for another batch: a second batch under a used
    /// number is not a retry, and is not taken for one.
    #[error(
        "runtime `{runtime}`: Producer-Seq {seq} was used for another batch; send this one as Producer-Seq {next}"
    )]
    SeqReused {
        /// The runtime.
        runtime: String,
        /// The `seq` sent.
        seq: ProducerSeq,
        /// The next `seq` the producer may send.
        next: ProducerSeq,
    },
    /// The producer resent a `seq` committed so long ago that its receipt is no longer kept.
    #[error(
        "runtime `{runtime}`: Producer-Seq {seq} was committed long ago and its receipt is no longer kept; the next is {next}"
    )]
    SeqStale {
        /// The runtime.
        runtime: String,
        /// The `seq` sent.
        seq: ProducerSeq,
        /// The next `seq` the producer may send.
        next: ProducerSeq,
    },
    /// The producer's epoch is older than one already seen: another instance took over.
    #[error("runtime `{runtime}`: producer epoch {epoch} is fenced by epoch {current}")]
    Fenced {
        /// The runtime.
        runtime: String,
        /// The batch's epoch.
        epoch: ProducerEpoch,
        /// The producer's current epoch.
        current: ProducerEpoch,
    },
    /// The batch brought [`ProducerEpoch::LAST`], which its producer did not claim: no claim
    /// could fence it.
    #[error("runtime `{runtime}`: Producer-Epoch {} is the last epoch, which only a claim gives: no claim could fence a batch that brings it; send a lower epoch, or claim one (POST /runtimes/{runtime}/producers/{{id}})", ProducerEpoch::LAST)]
    LastEpoch {
        /// The runtime.
        runtime: String,
    },
    /// A producer's claim took no epoch.
    #[error("runtime `{runtime}`: producer `{producer}`: {source}")]
    Claim {
        /// The runtime.
        runtime: String,
        /// The producer id.
        producer: String,
        /// Why.
        #[source]
        source: ClaimError,
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
    /// The deploy was made against another module than the one that runs now (another deploy
    /// came first).
    #[error("runtime `{runtime}`: the deploy replaces module {expected}, but {running} runs now")]
    Stale {
        /// The runtime.
        runtime: String,
        /// The module the deploy meant to replace.
        expected: ModuleFingerprint,
        /// The module that runs.
        running: ModuleFingerprint,
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
    /// The cluster's stream did not take the deploy, or this node did not apply it in time.
    #[error("runtime `{runtime}`: the shared log: {reason}")]
    Shared {
        /// The runtime.
        runtime: String,
        /// Why.
        reason: String,
    },
    /// The runtime stopped on this node ([`RuntimeHalt`], which says what brings it back).
    #[error("runtime `{runtime}` is {halt}")]
    Halted {
        /// The runtime.
        runtime: String,
        /// Where and why it stopped.
        halt: RuntimeHalt,
    },
    /// The runtime's task has stopped.
    #[error("runtime `{runtime}` has stopped")]
    Stopped {
        /// The runtime.
        runtime: String,
    },
}

/// Why a logged record could not be applied at its position: from there on, the log is not
/// this runtime's history (or, for [`ApplyError::Unavailable`], not yet).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ApplyError {
    /// The record was written by another module or guest config than the runtime's now.
    #[error("runtime `{runtime}`: the record was processed by module {logged} (guest config crc {logged_config:08x}); {running} (crc {running_config:08x}) runs now")]
    ModuleChanged {
        /// The runtime.
        runtime: String,
        /// The module in the record.
        logged: ModuleFingerprint,
        /// Its guest config's CRC-32C.
        logged_config: u32,
        /// The module running now.
        running: ModuleFingerprint,
        /// The running guest config's CRC-32C.
        running_config: u32,
    },
    /// The guest produced something else than the record says it did (or failed).
    #[error("runtime `{runtime}`: the replayed record produced another result than the logged one ({detail})")]
    Diverged {
        /// The runtime.
        runtime: String,
        /// What differed.
        detail: String,
    },
    /// This node cannot load what the record needs (the module a logged deploy installed).
    #[error("runtime `{runtime}`: the record cannot be applied here: {reason}")]
    Unloadable {
        /// The runtime.
        runtime: String,
        /// Why.
        reason: String,
    },
    /// The runtime could not run the record now, for reasons that are not the record's (see
    /// [`IngestError::Unavailable`]); nothing changed, and it may be applied again.
    #[error("runtime `{runtime}` could not run the record: {reason}")]
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
    /// A replay broke off at an earlier record: this one was not applied, and the runtime is
    /// as it was before it.
    #[error("runtime `{runtime}`: the replay broke off before this record")]
    Abandoned {
        /// The runtime.
        runtime: String,
    },
}

impl ApplyError {
    /// The cause a start-up counts when this ends a replay.
    pub fn cause(&self) -> Break {
        match self {
            ApplyError::ModuleChanged { .. } | ApplyError::Unloadable { .. } => Break::Module,
            _ => Break::Digest,
        }
    }
}
