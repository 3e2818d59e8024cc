//! What a runtime publishes to a cluster's stream — a batch, a deploy — and the verdict on it,
//! which the runtime's task gives when it applies the record at its position.

use std::collections::{BTreeMap, HashMap};
use std::sync::PoisonError;

use tokio::sync::oneshot;

use super::{Accepted, DeployError, Deployed, IngestError, RuntimeHandle};
use crate::host::ModuleFingerprint;
use crate::log::{unix_ms_now, BatchEntry, DeployEntry, Entry, PublishError, Published};
use crate::log::{Receipt, StreamLog};

/// Verdicts of applied stream positions kept for the publisher that has not asked yet.
const VERDICTS_KEPT: usize = 8192;

/// The verdict on a record published to a cluster's stream, given when it was applied.
#[derive(Debug)]
pub(crate) enum Verdict {
    Batch(Result<Accepted, IngestError>),
    Deploy(Result<Deployed, DeployError>),
}

/// Verdicts of recently applied stream positions, and the publishers waiting for theirs.
#[derive(Debug, Default)]
pub(crate) struct Verdicts {
    done: BTreeMap<u64, Verdict>,
    waiting: HashMap<u64, oneshot::Sender<Verdict>>,
}

impl Verdicts {
    /// Hands the verdict on `position` to its publisher, or keeps it for one that will ask.
    pub fn give(&mut self, position: u64, verdict: Verdict) {
        match self.waiting.remove(&position) {
            Some(waiter) => {
                let _ = waiter.send(verdict);
            }
            None => {
                self.done.insert(position, verdict);
                while self.done.len() > VERDICTS_KEPT {
                    self.done.pop_first();
                }
            }
        }
    }
}

impl RuntimeHandle {
    /// Publishes `entry` to the cluster's stream and waits for this node's verdict on it.
    pub(super) async fn publish_batch(
        &self,
        stream: &StreamLog,
        entry: BatchEntry,
    ) -> Result<Accepted, IngestError> {
        let shared = |reason: String| IngestError::Shared {
            runtime: self.name.to_string(),
            reason,
        };
        let id = match &entry.producer {
            Some(stamp) => format!(
                "{}\u{1f}{}\u{1f}{}\u{1f}{}",
                entry.runtime, stamp.id, stamp.epoch, stamp.seq
            ),
            None => stream.own_id(),
        };
        let has_producer = entry.producer.is_some();
        let published = stream
            .publish(&self.name, Entry::encode_batch(&entry), id)
            .await
            .map_err(|error| shared(error.to_string()))?;
        // A copy of this node's own resend is no news to the producer.
        let duplicate = published.duplicate && has_producer;
        match self.verdict(stream, published).await.map_err(shared)? {
            Some(Verdict::Batch(outcome)) => outcome.map(|accepted| Accepted {
                duplicate: accepted.duplicate || duplicate,
                ..accepted
            }),
            Some(Verdict::Deploy(_)) => Err(shared(format!(
                "sequence {} holds a deploy, not this batch",
                published.sequence
            ))),
            // Applied long ago (a duplicate of an old batch): its verdict is gone.
            None => Ok(Accepted {
                receipt: Receipt {
                    position: Some(published.sequence),
                    durability: self.log.durability(),
                    ..Receipt::default()
                },
                duplicate: true,
            }),
        }
    }

    /// This node's verdict on what was published at `published.sequence`, once it has applied
    /// it; `None` when it was applied so long ago that its verdict is no longer kept.
    async fn verdict(
        &self,
        stream: &StreamLog,
        published: Published,
    ) -> Result<Option<Verdict>, String> {
        let sequence = published.sequence;
        let waiting = {
            let mut verdicts = self.verdicts.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some(verdict) = verdicts.done.remove(&sequence) {
                return Ok(Some(verdict));
            }
            if self.log.committed() >= sequence {
                return Ok(None);
            }
            let (tx, rx) = oneshot::channel();
            verdicts.waiting.insert(sequence, tx);
            rx
        };
        match tokio::time::timeout(stream.timeout, waiting).await {
            Ok(Ok(verdict)) => Ok(Some(verdict)),
            _ => {
                self.verdicts
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .waiting
                    .remove(&sequence);
                Err(format!(
                    "published at sequence {sequence}, not applied by this node within {:?}; send it again with its Producer-* headers to learn its outcome",
                    stream.timeout
                ))
            }
        }
    }

    /// Publishes a deploy of `module` (which every node finds by its fingerprint) and waits for
    /// this node's verdict on it; `settling`: a declaration of the first module, which a node
    /// makes before it takes anything else.
    pub(super) async fn publish_deploy(
        &self,
        stream: &StreamLog,
        module: ModuleFingerprint,
        settling: bool,
    ) -> Result<Deployed, DeployError> {
        let shared = |reason: String| DeployError::Shared {
            runtime: self.name.to_string(),
            reason,
        };
        let entry = Entry::Deploy(DeployEntry {
            runtime: self.name.to_string(),
            module,
            previous: self.module(),
            at_ms: unix_ms_now(),
            pending: true,
            fresh: false,
            guest_config: Some(self.guest_config_crc()),
        });
        let (payload, id) = (entry.encode(), stream.own_id());
        let published = match settling {
            true => stream.publish_settling(&self.name, payload, id).await,
            false => stream.publish(&self.name, payload, id).await,
        }
        .map_err(|error: PublishError| shared(error.to_string()))?;
        match self.verdict(stream, published).await.map_err(shared)? {
            Some(Verdict::Deploy(outcome)) => outcome,
            _ => Err(shared(format!(
                "no verdict on the deploy at sequence {}",
                published.sequence
            ))),
        }
    }
}
