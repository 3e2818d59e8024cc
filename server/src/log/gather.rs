//! A cluster's group commit: batches of one runtime gathered into one stream message.
//!
//! While a message of a runtime is on its way to the stream, the batches that arrive for that
//! runtime wait, and go together in its next message: one round trip to NATS (and one write and
//! sync there) for every batch that waited, as the local log shares one `fdatasync` among every
//! batch waiting for it. A batch alone goes as it always did, under its producer's message id.
//! Each batch of a message keeps its place in it (its index) and is judged alone where the
//! message is applied, producers' duplicates included.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::oneshot;
use tracing::Instrument as _;

use super::entry::{BatchEntry, Entry};
use super::stream::{PublishError, Publisher};

/// What a batch adds to a message beside its input, at most (its runtime's name aside).
const BATCH_OVERHEAD: usize = 256;

/// Where a batch was published.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Placed {
    /// The message's stream sequence: the batch's log position.
    pub sequence: u64,
    /// Its index among the message's batches.
    pub index: u32,
    /// JetStream held the batch already: the producer sent it again within the duplicate
    /// window (its message carried the producer's id).
    pub duplicate: bool,
}

/// Each runtime's batches waiting to be published, and how many may go in one message.
#[derive(Debug)]
pub(super) struct Gathers {
    runtimes: Mutex<HashMap<String, Arc<Gather>>>,
    most: usize,
}

/// One runtime's batches waiting, and whether a task is publishing them.
#[derive(Debug, Default)]
struct Gather(Mutex<Waiting>);

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

impl Gathers {
    /// At most `most` batches (at least one) in a message.
    pub(super) fn new(most: usize) -> Self {
        Self {
            runtimes: Mutex::default(),
            most: most.max(1),
        }
    }

    /// Publishes `entry` on `subject` with the batches waiting beside it, and says where.
    pub(super) async fn publish(
        &self,
        publisher: &Publisher,
        subject: String,
        entry: BatchEntry,
    ) -> Result<Placed, PublishError> {
        let gather = Arc::clone(
            self.runtimes
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .entry(entry.runtime.clone())
                .or_default(),
        );
        let (placed, rx) = oneshot::channel();
        let lead = {
            let mut waiting = gather.0.lock().unwrap_or_else(PoisonError::into_inner);
            waiting.batches.push_back(Queued { entry, placed });
            !std::mem::replace(&mut waiting.publishing, true)
        };
        if lead {
            // A task of its own: a caller that goes away does not strand the batches behind it.
            let span = tracing::debug_span!("cluster_publish", %subject);
            let lead = gather.lead(publisher.clone(), subject, self.most);
            tokio::spawn(lead.instrument(span));
        }
        rx.await.unwrap_or_else(|_| {
            Err(PublishError::Refusing(
                "this node is stopping; send it again".into(),
            ))
        })
    }
}

impl Gather {
    /// Publishes the waiting batches, as many as fit in a message at a time, until none wait.
    async fn lead(self: Arc<Self>, publisher: Publisher, subject: String, most: usize) {
        let budget = publisher.max_payload() / 2;
        loop {
            let group = {
                let mut waiting = self.0.lock().unwrap_or_else(PoisonError::into_inner);
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
            // A batch alone carries its producer's id, so JetStream drops the producer's resend
            // within its duplicate window; a message of several carries one of this process's.
            let producer_id = match batches.as_slice() {
                [batch] => batch.producer.as_ref().map(|stamp| {
                    format!(
                        "{}\u{1f}{}\u{1f}{}\u{1f}{}",
                        batch.runtime, stamp.id, stamp.epoch, stamp.seq
                    )
                }),
                _ => None,
            };
            let by_producer = producer_id.is_some();
            let id = producer_id.unwrap_or_else(|| publisher.own_id());
            let sent = publisher.send(subject.clone(), payload, id).await;
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
