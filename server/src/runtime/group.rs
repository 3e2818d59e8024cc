//! Group commit: a group of batches staged through the guest, logged together, and committed
//! in log order (see the module docs of [`crate::runtime`]).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::Bytes;

use super::command::{Ingest, Reply};
use super::guest::Fit;
use super::task::Task;
use super::{Accepted, BatchSink, IngestError};
use crate::host::GuestBatch;
use crate::log::producer::{InputDigest, ProducerEpoch, ProducerStamp, Undo, Verdict};
use crate::log::{unix_ms_now, BatchEntry, Digest, Entry, LogPosition, Outcome, Receipt};

/// A batch past the guest, before its commit.
pub(super) enum Staged {
    /// It ran (or its input was lost); it commits with its record.
    Batch {
        entry: Box<BatchEntry>,
        /// What the guest produced; `None` for a lost batch.
        batch: Option<GuestBatch>,
    },
    /// A producer's claim of a new epoch: logged, with no input for the guest.
    Claim {
        entry: Box<BatchEntry>,
        epoch: ProducerEpoch,
    },
    /// A producer's batch that was committed before (perhaps earlier in this group), with this
    /// input: answered with the original's receipt once the group has committed.
    Duplicate(ProducerStamp, InputDigest),
}

/// What staging one batch gave: what commits, and what its sender is told at once. A batch
/// from a pull source that the guest failed on has both: its sender gets the error, and its
/// loss commits.
pub(super) struct Staging {
    pub staged: Option<Staged>,
    pub refused: Option<IngestError>,
}

impl<S: BatchSink> Task<S> {
    /// Runs a group of batches, logs them, and commits them; see the module docs.
    pub(super) async fn group(&mut self, group: Vec<Ingest>) {
        let before = (self.last.state.clone(), self.last.checkpoint);
        let at_ms = unix_ms_now();
        let mut staged: Vec<(Staged, Option<Reply>)> = Vec::with_capacity(group.len());
        let mut undo = Vec::new();
        for ingest in group {
            let entry = BatchEntry {
                runtime: self.name.to_string(),
                module: self.slot.module().fingerprint().clone(),
                guest_config: self.guest_config_crc,
                at_ms,
                input: ingest.input,
                producer: ingest.producer,
                checkpoint: ingest.checkpoint,
                source_gap: ingest.source_gap,
                outcome: Outcome::Lost,
            };
            let Staging {
                staged: batch,
                refused,
            } = self.stage(entry, &mut undo).await;
            let mut reply = Some(ingest.reply);
            if let Some(error) = refused {
                if let Some(reply) = reply.take() {
                    let _ = reply.send(Err(error));
                }
            }
            if let Some(batch) = batch {
                staged.push((batch, reply));
            }
        }
        let records: Vec<Vec<u8>> = staged
            .iter()
            .filter_map(|(s, _)| match s {
                Staged::Batch { entry, .. } | Staged::Claim { entry, .. } => {
                    Some(Entry::encode_batches(&[entry]))
                }
                Staged::Duplicate(..) => None,
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
                self.rewind(before.0);
                self.last.checkpoint = before.1;
                for undo in undo.into_iter().rev() {
                    self.last.producers.undo(undo);
                }
                for reply in staged.into_iter().filter_map(|(_, reply)| reply) {
                    let _ = reply.send(Err(IngestError::Log {
                        runtime: self.name.to_string(),
                        source: viewtape_snapshots::log::LogError::Poisoned(error.to_string()),
                    }));
                }
                return;
            }
        };
        let log = Arc::clone(&self.log);
        let turn = log.turn(first, count).await;
        let mut position = first;
        for (staged, reply) in staged {
            let logged = !matches!(staged, Staged::Duplicate(..));
            let accepted = self.finish(staged, position).await;
            if let Some(reply) = reply {
                let _ = reply.send(Ok(accepted));
            }
            if logged {
                position = position.map(LogPosition::next);
            }
        }
        drop(turn);
    }

    /// Checks one batch's producer and runs it through the guest; see [`Staging`].
    pub(super) async fn stage(&mut self, mut entry: BatchEntry, undo: &mut Vec<Undo>) -> Staging {
        let refused = |refused| Staging {
            staged: None,
            refused: Some(refused),
        };
        let mut input = None;
        if let Some(stamp) = &entry.producer {
            if stamp.claim {
                let (epoch, claimed) = match self.last.producers.claim(&stamp.id) {
                    Ok(claimed) => claimed,
                    Err(source) => {
                        return refused(IngestError::Claim {
                            runtime: self.name.to_string(),
                            producer: stamp.id.clone(),
                            source,
                        })
                    }
                };
                undo.push(claimed);
                entry.outcome = Outcome::Committed(Digest::default());
                return Staging {
                    staged: Some(Staged::Claim {
                        entry: Box::new(entry),
                        epoch,
                    }),
                    refused: None,
                };
            }
            let digest = InputDigest::of(&entry.input);
            input = Some(digest);
            match self.last.producers.check(stamp, digest) {
                Verdict::Next => {}
                Verdict::Duplicate(_) => {
                    return Staging {
                        staged: Some(Staged::Duplicate(stamp.clone(), digest)),
                        refused: None,
                    }
                }
                Verdict::Reused { next } => {
                    return refused(IngestError::SeqReused {
                        runtime: self.name.to_string(),
                        seq: stamp.seq,
                        next,
                    })
                }
                Verdict::Stale { next } => {
                    return refused(IngestError::SeqStale {
                        runtime: self.name.to_string(),
                        seq: stamp.seq,
                        next,
                    })
                }
                Verdict::OutOfOrder { expected } => {
                    return refused(IngestError::OutOfOrder {
                        runtime: self.name.to_string(),
                        expected,
                    })
                }
                Verdict::Fenced { current } => {
                    return refused(IngestError::Fenced {
                        runtime: self.name.to_string(),
                        epoch: stamp.epoch,
                        current,
                    })
                }
                Verdict::LastEpoch => {
                    return refused(IngestError::LastEpoch {
                        runtime: self.name.to_string(),
                    })
                }
            }
        }
        let (batch, error) = match self.run_guest(&entry, Fit::Check).await {
            Ok(batch) => {
                entry.outcome = Outcome::Committed(Digest::of(&batch));
                (Some(batch), None)
            }
            // A push source may resend; a pull source's input is gone once read: record its
            // loss.
            Err(error) if entry.checkpoint.is_none() => return refused(error),
            Err(error) => {
                entry.input = Bytes::new();
                entry.outcome = Outcome::Lost;
                (None, Some(error))
            }
        };
        if entry.checkpoint.is_some() {
            self.last.checkpoint = entry.checkpoint;
        }
        if let (Some(stamp), Some(input)) = (&entry.producer, input) {
            undo.push(self.last.producers.stage(stamp, input));
        }
        Staging {
            staged: Some(Staged::Batch {
                entry: Box::new(entry),
                batch,
            }),
            refused: error,
        }
    }

    /// Commits a staged batch or claim at `position`, or answers a duplicate with the
    /// original's receipt.
    pub(super) async fn finish(
        &mut self,
        staged: Staged,
        position: Option<LogPosition>,
    ) -> Accepted {
        match staged {
            Staged::Batch { entry, batch } => Accepted {
                receipt: self.commit(&entry, batch, position).await,
                duplicate: false,
                claimed: None,
            },
            Staged::Claim { epoch, .. } => Accepted {
                receipt: Receipt {
                    position,
                    durability: self.log.durability(),
                    ..Receipt::default()
                },
                duplicate: false,
                claimed: Some(epoch),
            },
            Staged::Duplicate(stamp, input) => {
                // The original committed before this duplicate was staged, or earlier in its
                // group: its receipt is there.
                let receipt = match self.last.producers.check(&stamp, input) {
                    Verdict::Duplicate(Some(receipt)) => receipt,
                    verdict => {
                        tracing::error!(?verdict, producer = %stamp.id, seq = %stamp.seq, "a duplicate's original has no receipt");
                        Receipt::default()
                    }
                };
                Accepted {
                    receipt,
                    duplicate: true,
                    claimed: None,
                }
            }
        }
    }

    /// Makes one durable batch visible: its gaps, then its events.
    pub(super) async fn commit(
        &mut self,
        entry: &BatchEntry,
        batch: Option<GuestBatch>,
        position: Option<LogPosition>,
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
        self.note_state();
        if let (Some(position), Outcome::Committed(digest)) = (position, &entry.outcome) {
            self.check(position, digest);
        }
        receipt
    }
}
