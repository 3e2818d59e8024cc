//! The second backend of the log: a cluster's JetStream stream, which every node appends to
//! and applies in its order.
//!
//! A node appends by publishing a record ([`StreamLog::publish`]); JetStream's acknowledgement
//! names its stream sequence, which is its log position on every node. Every message has an id,
//! so JetStream drops a second copy: from the producer's stamp (the same batch resent by its
//! producer is the same message, within the duplicate window, and the producer table beyond it),
//! or one of this node's own, which makes a publish whose acknowledgement was lost safe to send
//! again.

use std::collections::BTreeMap;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use async_nats::jetstream::kv;
use tokio::sync::watch;
use viewtape_journal::JournalEpoch;

use super::check::Checks;
use super::gather::{Gather, Placed};
use super::publisher::Publisher;
use super::publisher::{PublishError, Published};
/// The record format, for the readers of the stream.
pub use super::publisher::{RECORD_HEADER, RECORD_VERSION, SHARED_VERSION};
use super::{BatchEntry, LogPosition};

/// Whether a node publishes.
#[derive(Debug)]
enum Refusing {
    /// It does.
    No,
    /// Not yet: it has not settled its modules.
    Settling,
    /// Never again, for this reason.
    For(String),
}

/// How durable a message the stream acknowledged is: what a cluster's receipt names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StreamDurability {
    /// Replicated to a quorum of servers, or synced by each before the acknowledgement
    /// (`sync_interval: always`).
    Replicated,
    /// One server, which acknowledges before its periodic sync: a power loss of that machine
    /// may lose recently acknowledged messages.
    Unsynced,
}

/// What a request is told while the node settles.
const SETTLING: &str =
    "this node is catching up with the cluster and settling its modules; send it again shortly";

/// Who publishes a record ([`StreamLog::publish`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Publishing {
    /// A request (an ingest, a deploy, a runtime's definition): taken only once the node has
    /// settled its runtimes with the stream, and not once it refuses for good.
    Request,
    /// The node settling its config's runtimes with the stream (declaring their modules and
    /// definitions): taken while it settles, not once it refuses for good.
    Settle,
}

/// A node's way into its cluster's stream.
#[derive(Debug)]
pub struct StreamLog {
    publisher: Publisher,
    durability: StreamDurability,
    /// Why this node takes no records now, if it does not: until it has caught up and its
    /// runtimes' modules are settled ([`StreamLog::open`]), and for good once it refuses.
    refusing: Mutex<Refusing>,
    /// The epoch of the stream's history.
    epoch: JournalEpoch,
    /// The batches waiting to be published together; a runtime's messages go to
    /// `<stream>.in.<runtime>`.
    gather: Gather,
    /// The runtimes this node does not run whose records it passed over, each with the first
    /// sequence of theirs it passed over. Snapshots keep it, so that a config that adds one of
    /// them later finds its history missing wherever the stream held that history: on the
    /// runtime's subject, in messages of several runtimes, or aged out.
    passed_over: Mutex<BTreeMap<String, LogPosition>>,
    /// The cluster's check bucket: what the nodes applied, compared.
    checks: Checks,
}

impl StreamLog {
    /// How long a publish may wait for its acknowledgement, and an ingest for its verdict.
    pub fn timeout(&self) -> Duration {
        self.publisher.timeout()
    }

    /// The highest stream sequence NATS acknowledged to this node: the stream holds at least
    /// that much.
    pub fn acked(&self) -> LogPosition {
        self.publisher.acked()
    }

    /// Whether the connection to NATS is up.
    pub fn connected(&self) -> bool {
        self.publisher.connected()
    }

    /// Resolves once the connection to NATS is down.
    pub async fn lost(&self) {
        self.publisher.lost().await;
    }

    /// The subject `runtime`'s records are published on.
    pub fn subject(&self, runtime: &str) -> String {
        self.gather.subject(runtime)
    }

    /// Publishes to `stream` (whose history is `epoch`) through `client` (connected to `url`;
    /// beside it, its connection's state from its events), waiting at most `timeout`, with at most `batches_per_message` batches in a message; checks
    /// what it applied in the bucket `checks`.
    pub fn new(
        client: (async_nats::Client, watch::Receiver<bool>),
        url: &str,
        (stream, epoch): (&str, JournalEpoch),
        timeout: Duration,
        durability: StreamDurability,
        (batches_per_message, checks): (usize, kv::Store),
    ) -> Self {
        let publisher = Publisher::new(client, url, timeout);
        let checks = Checks::new(checks, publisher.node());
        Self {
            checks,
            publisher,
            durability,
            refusing: Mutex::new(Refusing::Settling),
            epoch,
            gather: Gather::new(format!("{stream}.in."), batches_per_message),
            passed_over: Mutex::default(),
        }
    }

    /// Takes on the runtimes a snapshot says were passed over before it
    /// ([`StreamLog::passed_over`]), in place of those it knew.
    pub fn take_passed_over(&self, passed_over: BTreeMap<String, LogPosition>) {
        *self
            .passed_over
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = passed_over;
    }

    /// Notes that this node passed over a record of `runtime` at `sequence`.
    pub fn pass_over(&self, runtime: &str, sequence: LogPosition) {
        let mut passed = self
            .passed_over
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        match passed.get_mut(runtime) {
            Some(first) => *first = (*first).min(sequence),
            None => {
                passed.insert(runtime.to_owned(), sequence);
            }
        }
    }

    /// The runtimes this node passed over records of, each with the first sequence of theirs
    /// it passed over.
    pub fn passed_over(&self) -> BTreeMap<String, LogPosition> {
        self.passed_over
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The first sequence of `runtime`'s that this node passed over, if it passed over any.
    pub fn first_passed_over(&self, runtime: &str) -> Option<LogPosition> {
        self.passed_over
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(runtime)
            .copied()
    }

    /// The epoch of the stream's history.
    pub fn epoch(&self) -> JournalEpoch {
        self.epoch
    }

    /// How durable what it acknowledges is.
    pub fn durability(&self) -> StreamDurability {
        self.durability
    }

    /// From now on, publishes nothing and answers `reason` (for good: the first reason stays).
    pub fn refuse(&self, reason: String) {
        let mut refusing = self.refusing.lock().unwrap_or_else(PoisonError::into_inner);
        if !matches!(*refusing, Refusing::For(_)) {
            *refusing = Refusing::For(reason);
        }
    }

    /// Publishes from now on, unless it refuses for good.
    pub fn open(&self) {
        let mut refusing = self.refusing.lock().unwrap_or_else(PoisonError::into_inner);
        if matches!(*refusing, Refusing::Settling) {
            *refusing = Refusing::No;
        }
    }

    /// Why it publishes nothing, if it does not.
    pub fn refusing(&self) -> Option<String> {
        match &*self.refusing.lock().unwrap_or_else(PoisonError::into_inner) {
            Refusing::No => None,
            Refusing::Settling => Some(SETTLING.to_owned()),
            Refusing::For(reason) => Some(reason.clone()),
        }
    }

    /// The cluster's check bucket ([`Checks`]).
    pub fn checks(&self) -> &Checks {
        &self.checks
    }

    /// A message id for a record without a producer stamp: unique to this process.
    pub fn own_id(&self) -> String {
        self.publisher.own_id()
    }

    /// Publishes `payload` for `runtime` under the message id `id`, sending it again while its
    /// acknowledgement is lost (NATS restarting, say), for at most [`StreamLog::timeout`]; as
    /// `by` may ([`Publishing`]).
    ///
    /// # Errors
    /// [`PublishError`]; a publish that timed out may still have been stored.
    pub async fn publish(
        &self,
        runtime: &str,
        payload: Vec<u8>,
        id: String,
        by: Publishing,
    ) -> Result<Published, PublishError> {
        let refused = match (
            &*self.refusing.lock().unwrap_or_else(PoisonError::into_inner),
            by,
        ) {
            (Refusing::No, _) | (Refusing::Settling, Publishing::Settle) => None,
            (Refusing::Settling, Publishing::Request) => Some(SETTLING.to_owned()),
            (Refusing::For(reason), _) => Some(reason.clone()),
        };
        if let Some(reason) = refused {
            return Err(PublishError::Refusing(reason));
        }
        let subject = self.subject(runtime);
        self.publisher
            .send(subject, RECORD_VERSION, payload, id)
            .await
    }

    /// Publishes a batch together with the batches waiting beside it (see [`super::gather`]),
    /// and says where it was placed.
    ///
    /// # Errors
    /// As [`StreamLog::publish`].
    pub async fn publish_batch(&self, entry: BatchEntry) -> Result<Placed, PublishError> {
        if let Some(reason) = self.refusing() {
            return Err(PublishError::Refusing(reason));
        }
        self.gather.publish(&self.publisher, entry).await
    }
}
