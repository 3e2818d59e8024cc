//! A cluster's group commit: the batches a node takes, of every runtime, gathered into one
//! stream message.
//!
//! While a node's message is on its way to the stream, the batches that arrive wait, and go
//! together in its next message: one round trip to NATS (and one write and sync there) for
//! every batch that waited, as the local log shares one `fdatasync` among every batch waiting
//! for it. A batch alone goes as it always did, under its producer's message id, on its
//! runtime's subject; so do batches of one runtime. Batches of several runtimes go on
//! [`super::stream::StreamLog`]'s gathered subject, as a record of [`SHARED_VERSION`]: every
//! runtime applies its own at the message's position. Each batch of a message keeps its place
//! in it (its index) and is judged alone where the message is applied, producers' duplicates
//! included.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::oneshot;
use tracing::Instrument as _;

use super::entry::{BatchEntry, Entry};
use super::producer::InputDigest;
use super::publisher::{subject_token, PublishError, Publisher, RECORD_VERSION, SHARED_VERSION};

/// What a batch adds to a message beside its input, at most (its runtime's name aside).
const BATCH_OVERHEAD: usize = 256;

/// Where a batch was published.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Placed {
    /// The message's stream sequence: the batch's log position.
    pub sequence: super::LogPosition,
    /// Its index among the message's batches.
    pub index: u32,
    /// JetStream held the batch already: the producer sent it again within the duplicate
    /// window (its message carried the producer's id).
    pub duplicate: bool,
}

/// The batches waiting to be published, and where and how many may go in one message.
#[derive(Debug)]
pub(super) struct Gather(Arc<Shared>);

#[derive(Debug)]
struct Shared {
    waiting: Mutex<Waiting>,
    /// `<stream>.in.`: the subjects' prefix.
    subjects: String,
    most: usize,
}

#[derive(Debug, Default)]
struct Waiting {
    batches: VecDeque<Queued>,
    publishing: bool,
}

#[derive(Debug)]
struct Queued {
    entry: BatchEntry,
    placed: oneshot::Sender<Result<Placed, PublishError>>,
}

impl Gather {
    /// Subjects under `subjects` (`<stream>.in.`), at most `most` batches (at least one) in a
    /// message.
    pub(super) fn new(subjects: String, most: usize) -> Self {
        Self(Arc::new(Shared {
            waiting: Mutex::default(),
            subjects,
            most: most.max(1),
        }))
    }

    /// The subject `runtime`'s records are published on.
    pub(super) fn subject(&self, runtime: &str) -> String {
        self.0.subject(runtime)
    }

    /// Publishes `entry` with the batches waiting beside it, and says where.
    pub(super) async fn publish(
        &self,
        publisher: &Publisher,
        entry: BatchEntry,
    ) -> Result<Placed, PublishError> {
        let (placed, rx) = oneshot::channel();
        let lead = {
            let mut waiting = self
                .0
                .waiting
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            waiting.batches.push_back(Queued { entry, placed });
            !std::mem::replace(&mut waiting.publishing, true)
        };
        if lead {
            // A task of its own: a caller that goes away does not strand the batches behind it.
            let span = tracing::debug_span!("cluster_publish");
            let lead = Arc::clone(&self.0).lead(publisher.clone());
            tokio::spawn(lead.instrument(span));
        }
        rx.await.unwrap_or_else(|_| {
            Err(PublishError::Refusing(
                "this node is stopping; send it again".into(),
            ))
        })
    }
}

impl Shared {
    /// See [`Gather::subject`].
    fn subject(&self, runtime: &str) -> String {
        format!("{}{}", self.subjects, subject_token(runtime))
    }

    /// Where `batches` go, and the version of their record: their runtime's subject, or, for
    /// batches of several runtimes, a subject of two tokens, which no runtime's is.
    fn destination(&self, batches: &[&BatchEntry]) -> (String, &'static str) {
        match batches {
            [first, rest @ ..] if rest.iter().all(|batch| batch.runtime == first.runtime) => {
                (self.subject(&first.runtime), RECORD_VERSION)
            }
            _ => (format!("{}gathered.batches", self.subjects), SHARED_VERSION),
        }
    }

    /// Publishes the waiting batches, as many as fit in a message at a time, until none wait.
    async fn lead(self: Arc<Self>, publisher: Publisher) {
        let budget = publisher.max_payload() / 2;
        let most = self.most;
        loop {
            let group = {
                let mut waiting = self.waiting.lock().unwrap_or_else(PoisonError::into_inner);
                let mut size = 0;
                let mut take = 0;
                for queued in &waiting.batches {
                    size += queued.entry.input.len() + queued.entry.runtime.len() + BATCH_OVERHEAD;
                    if take == most || (take > 0 && size > budget) {
                        break;
                    }
                    take += 1;
                }
                if take == 0 {
                    waiting.publishing = false;
                    return;
                }
                waiting.batches.drain(..take).collect::<Vec<_>>()
            };
            let batches: Vec<&BatchEntry> = group.iter().map(|queued| &queued.entry).collect();
            let payload = Entry::encode_batches(&batches);
            let (subject, version) = self.destination(&batches);
            // A batch alone carries its producer's id and its input's digest, so JetStream
            // drops the producer's resend within its duplicate window, and not another batch
            // sent under a used seq (its verdict says so); a message of several, or a claim,
            // carries one of this process's.
            let producer_id = match batches.as_slice() {
                [batch] => batch
                    .producer
                    .as_ref()
                    .filter(|stamp| !stamp.claim)
                    .map(|stamp| {
                        format!(
                            "{}\u{1f}{}\u{1f}{}\u{1f}{}\u{1f}{}",
                            batch.runtime,
                            stamp.id,
                            stamp.epoch,
                            stamp.seq,
                            InputDigest::of(&batch.input)
                        )
                    }),
                _ => None,
            };
            let by_producer = producer_id.is_some();
            let id = producer_id.unwrap_or_else(|| publisher.own_id());
            let sent = publisher.send(subject, version, payload, id).await;
            for (index, queued) in (0u32..).zip(group) {
                let placed = sent.clone().map(|published| Placed {
                    sequence: published.sequence,
                    index,
                    duplicate: published.duplicate && by_producer,
                });
                let _ = queued.placed.send(placed);
            }
        }
    }
}
