//! What a runtime publishes to a cluster's stream — a batch, a deploy — and the verdict on it,
//! which the runtime's task gives when it applies the record at its position.

use std::sync::PoisonError;

use super::verdict::{Place, Verdict};
use super::{Accepted, DeployError, Deployed, IngestError, RuntimeHandle};
use crate::host::ModuleFingerprint;
use crate::log::{unix_ms_now, BatchEntry, DeployEntry, Entry, PublishError};
use crate::log::{LogPosition, Publishing, StreamLog};

/// This node did not apply what it published within the publish timeout: the outcome is
/// unknown here (the record may yet be applied).
#[derive(Debug, thiserror::Error)]
#[error("published at sequence {sequence}, {why}; send it again with its Producer-* headers to learn its outcome")]
pub(crate) struct NotApplied {
    /// Where the record was published.
    sequence: LogPosition,
    /// Why this node did not apply it.
    why: String,
}

impl RuntimeHandle {
    /// Publishes `entry` to the cluster's stream and waits for this node's verdict on it.
    ///
    /// A producer's batch goes under a message id made of its stamp and the digest of its
    /// input, so JetStream drops a retry (the same input) within its duplicate window, and the
    /// first copy's verdict answers it. A retry whose first copy's verdict is no longer kept
    /// is published again under an id of its own: the producer table judges it where it is
    /// applied, as it judges every batch, and answers with the original receipt.
    pub(super) async fn publish_batch(
        &self,
        stream: &StreamLog,
        entry: BatchEntry,
    ) -> Result<Accepted, IngestError> {
        let runtime = || self.name.to_string();
        let unpublished = |error: PublishError| match error {
            PublishError::Refusing(_) | PublishError::Disconnected(_) => IngestError::NotTaken {
                runtime: runtime(),
                reason: error.to_string(),
            },
            PublishError::Timeout(_) | PublishError::Lost(_) => IngestError::Unknown {
                runtime: runtime(),
                position: None,
                reason: error.to_string(),
            },
        };
        let unknown = |position: LogPosition, reason: String| IngestError::Unknown {
            runtime: runtime(),
            position: Some(position),
            reason,
        };
        let again = entry.producer.is_some().then(|| entry.clone());
        let placed = stream.publish_batch(entry).await.map_err(unpublished)?;
        let mut place = (placed.sequence, placed.index);
        let mut mine = !placed.duplicate;
        let not_applied = |error: NotApplied| unknown(error.sequence, error.to_string());
        let verdict = match self
            .verdict(stream, place, mine)
            .await
            .map_err(not_applied)?
        {
            Some(verdict) => Some(verdict),
            None => match again {
                Some(entry) => {
                    let published = stream
                        .publish(
                            &self.name,
                            Entry::Batch(entry).encode(),
                            stream.own_id(),
                            Publishing::Request,
                        )
                        .await
                        .map_err(unpublished)?;
                    (place, mine) = ((published.sequence, 0), true);
                    self.verdict(stream, place, mine)
                        .await
                        .map_err(not_applied)?
                }
                None => None,
            },
        };
        match verdict {
            Some(Verdict::Batch(outcome)) => outcome.map(|accepted| Accepted {
                duplicate: accepted.duplicate || !mine,
                ..accepted
            }),
            Some(Verdict::Deploy(_)) => Err(unknown(
                place.0,
                format!("sequence {} holds a deploy, not this batch", place.0),
            )),
            None => Err(unknown(
                place.0,
                format!("no verdict on the batch at sequence {}", place.0),
            )),
        }
    }

    /// This node's verdict on what was published at `place`, once it has applied it; `None`
    /// when it was applied so long ago that its verdict is no longer kept. The verdict goes to
    /// the batch's first copy (`claim`); a copy JetStream knew already, perhaps sent while the
    /// first waits, only reads the first's acceptance, if it was accepted.
    async fn verdict(
        &self,
        stream: &StreamLog,
        place: Place,
        claim: bool,
    ) -> Result<Option<Verdict>, NotApplied> {
        let sequence = place.0;
        let waiting = {
            let mut verdicts = self.verdicts.lock().unwrap_or_else(PoisonError::into_inner);
            let verdict = match claim {
                true => verdicts.take(place),
                false => verdicts.accepted(place),
            };
            if verdict.is_some() {
                return Ok(verdict);
            }
            if self.log.committed() >= sequence {
                return Ok(None);
            }
            claim.then(|| verdicts.wait(place))
        };
        let mine = waiting.is_some();
        let applied = async {
            match waiting {
                Some(verdict) => verdict.await.ok().map(Some),
                None => {
                    let mut committed = self.log.watch_committed();
                    let applied = committed.wait_for(|c| *c >= sequence).await;
                    applied.ok().map(|_| {
                        let verdicts = self.verdicts.lock();
                        verdicts
                            .unwrap_or_else(PoisonError::into_inner)
                            .accepted(place)
                    })
                }
            }
        };
        // A node that lost NATS answers at once: nothing more reaches it until it is back.
        let applied = async {
            tokio::select! {
                verdict = tokio::time::timeout(stream.timeout(), applied) => verdict.ok().flatten(),
                () = stream.lost() => None,
            }
        };
        match applied.await {
            Some(verdict) => Ok(verdict),
            None => {
                let why = match stream.connected() {
                    true => format!("not applied by this node within {:?}", stream.timeout()),
                    false => {
                        "and this node lost its connection to NATS before it applied it".to_owned()
                    }
                };
                if mine {
                    self.verdicts
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .stop_waiting(place);
                }
                Err(NotApplied { sequence, why })
            }
        }
    }

    /// Publishes a deploy of `module` (which every node finds by its fingerprint) and waits for
    /// this node's verdict on it; [`Publishing::Settle`]: a declaration of the first module,
    /// which a node makes before it takes anything else.
    pub(super) async fn publish_deploy(
        &self,
        stream: &StreamLog,
        module: ModuleFingerprint,
        by: Publishing,
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
        let published = stream
            .publish(&self.name, payload, id, by)
            .await
            .map_err(|error: PublishError| shared(error.to_string()))?;
        match self
            .verdict(stream, (published.sequence, 0), true)
            .await
            .map_err(|error| shared(error.to_string()))?
        {
            Some(Verdict::Deploy(outcome)) => outcome,
            _ => Err(shared(format!(
                "no verdict on the deploy at sequence {}",
                published.sequence
            ))),
        }
    }
}
