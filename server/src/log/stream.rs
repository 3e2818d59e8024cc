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
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_nats::jetstream;
use bytes::Bytes;
use viewtape_journal::JournalEpoch;

use super::gather::{Gather, Placed};
use super::{BatchEntry, LogPosition};

/// The header every record a node publishes carries, with the record format's version: a
/// message without it was not published by a node.
pub const RECORD_HEADER: &str = "Viewtape-Record";
/// The record format's version (the value of [`RECORD_HEADER`]).
pub const RECORD_VERSION: &str = "1";
/// The version of a record holding batches of several runtimes, which each apply theirs at its
/// position: a viewtape that reads only [`RECORD_VERSION`] stops at it and says to upgrade.
pub const SHARED_VERSION: &str = "2";

/// A published record: where the stream put it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Published {
    /// Its stream sequence: its log position.
    pub sequence: LogPosition,
    /// JetStream already held a message with its id (at `sequence`).
    pub duplicate: bool,
}

/// Why a record was not published.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum PublishError {
    /// This node takes no records now, and says why (it stopped applying the stream, or it
    /// runs another build than the cluster).
    #[error("{0}")]
    Refusing(String),
    /// NATS is not connected.
    #[error("not connected to NATS at {0}")]
    Disconnected(String),
    /// NATS did not acknowledge in time.
    #[error("NATS did not acknowledge within {0:?}")]
    Timeout(Duration),
}

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
}

/// What publishing needs, shared with the tasks that publish gathered batches.
#[derive(Clone, Debug)]
pub(super) struct Publisher {
    js: jetstream::Context,
    client: async_nats::Client,
    url: Arc<str>,
    /// How long a publish may wait for its acknowledgement, and an ingest for its verdict.
    timeout: Duration,
    ids: Arc<Ids>,
}

/// This process's part of the message ids it makes, and how many it made.
#[derive(Debug)]
struct Ids {
    nonce: u64,
    published: AtomicU64,
}

impl StreamLog {
    /// How long a publish may wait for its acknowledgement, and an ingest for its verdict.
    pub fn timeout(&self) -> Duration {
        self.publisher.timeout
    }

    /// The subject `runtime`'s records are published on.
    pub fn subject(&self, runtime: &str) -> String {
        self.gather.subject(runtime)
    }

    /// Publishes to `stream` (whose history is `epoch`) through `client` (connected to `url`),
    /// waiting at most `timeout`, with at most `batches_per_message` batches in a message.
    pub fn new(
        client: async_nats::Client,
        url: &str,
        (stream, epoch): (&str, JournalEpoch),
        timeout: Duration,
        durability: StreamDurability,
        batches_per_message: usize,
    ) -> Self {
        Self {
            publisher: Publisher {
                js: jetstream::new(client.clone()),
                client,
                url: url.into(),
                timeout,
                ids: Arc::new(Ids {
                    nonce: process_nonce(),
                    published: AtomicU64::new(0),
                }),
            },
            durability,
            refusing: Mutex::new(Refusing::Settling),
            epoch,
            gather: Gather::new(format!("{stream}.in."), batches_per_message),
            passed_over: Mutex::default(),
        }
    }

    /// Takes on the runtimes a snapshot says were passed over before it
    /// ([`StreamLog::passed_over`]).
    pub fn with_passed_over(self, passed_over: BTreeMap<String, LogPosition>) -> Self {
        Self {
            passed_over: Mutex::new(passed_over),
            ..self
        }
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
            Refusing::Settling => Some(
                "this node is catching up with the cluster and settling its modules; send it again shortly".into(),
            ),
            Refusing::For(reason) => Some(reason.clone()),
        }
    }

    /// A message id for a record without a producer stamp: unique to this process.
    pub fn own_id(&self) -> String {
        self.publisher.own_id()
    }

    /// Publishes `payload` for `runtime` under the message id `id`, sending it again while its
    /// acknowledgement is lost (NATS restarting, say), for at most [`StreamLog::timeout`].
    ///
    /// # Errors
    /// [`PublishError`]; a publish that timed out may still have been stored.
    pub async fn publish(
        &self,
        runtime: &str,
        payload: Vec<u8>,
        id: String,
    ) -> Result<Published, PublishError> {
        if let Some(reason) = self.refusing() {
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

    /// [`StreamLog::publish`], also while the node settles its modules (it declares them so),
    /// but not once it refuses for good.
    ///
    /// # Errors
    /// As [`StreamLog::publish`].
    pub async fn publish_settling(
        &self,
        runtime: &str,
        payload: Vec<u8>,
        id: String,
    ) -> Result<Published, PublishError> {
        if let Refusing::For(reason) =
            &*self.refusing.lock().unwrap_or_else(PoisonError::into_inner)
        {
            return Err(PublishError::Refusing(reason.clone()));
        }
        let subject = self.subject(runtime);
        self.publisher
            .send(subject, RECORD_VERSION, payload, id)
            .await
    }
}

impl Publisher {
    /// A message id unique to this process.
    pub(super) fn own_id(&self) -> String {
        format!(
            "{:016x}-{}",
            self.ids.nonce,
            self.ids.published.fetch_add(1, Ordering::Relaxed)
        )
    }

    /// The largest message the NATS server takes.
    pub(super) fn max_payload(&self) -> usize {
        self.client.server_info().max_payload
    }

    /// Publishes `payload`, a record of format `version`, on `subject` under the message id
    /// `id`, sending it again while its acknowledgement is lost, for at most the publish timeout.
    pub(super) async fn send(
        &self,
        subject: String,
        version: &'static str,
        payload: Vec<u8>,
        id: String,
    ) -> Result<Published, PublishError> {
        if self.client.connection_state() != async_nats::connection::State::Connected {
            return Err(PublishError::Disconnected(self.url.to_string()));
        }
        let message = jetstream::message::PublishMessage::build()
            .payload(Bytes::from(payload))
            .header(RECORD_HEADER, version)
            .message_id(id);
        let published = async {
            loop {
                let sent = async {
                    self.js
                        .send_publish(subject.clone(), message.clone())
                        .await
                        .map_err(|error| error.to_string())?
                        .await
                        .map_err(|error| error.to_string())
                };
                match sent.await {
                    Ok(ack) => break ack,
                    Err(error) => {
                        tracing::debug!(%error, "cluster: publish not acknowledged; sending it again");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                }
            }
        };
        let ack = tokio::time::timeout(self.timeout, published)
            .await
            .map_err(|_| PublishError::Timeout(self.timeout))?;
        Ok(Published {
            sequence: LogPosition::new(ack.sequence),
            duplicate: ack.duplicate,
        })
    }
}

/// A runtime's name as one token of a NATS subject.
pub fn subject_token(runtime: &str) -> String {
    runtime
        .chars()
        .map(|c| match c {
            '.' | '*' | '>' | ' ' | '\t' => '_',
            c => c,
        })
        .collect()
}

/// 64 random bits for this process (std's `RandomState` keys from the OS's randomness).
fn process_nonce() -> u64 {
    use std::hash::{BuildHasher as _, Hasher as _};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u32(std::process::id());
    hasher.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runtime_names_become_one_subject_token() {
        assert_eq!(subject_token("orders.eu"), "orders_eu");
        assert_eq!(subject_token("a*b>c d"), "a_b_c_d");
        assert_eq!(subject_token("demo"), "demo");
    }
}
