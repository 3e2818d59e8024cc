//! The verdict on a record a runtime published to a cluster's stream, given by its task when it
//! applies the record at its position, and kept for the publisher waiting for it.

use std::collections::{BTreeMap, HashMap};

use tokio::sync::oneshot;

use super::{Accepted, DeployError, Deployed, IngestError};
use crate::log::LogPosition;

/// Verdicts of applied stream positions kept for the publisher that has not asked yet.
const VERDICTS_KEPT: usize = 8192;

/// The verdict on a record published to a cluster's stream, given when it was applied.
#[derive(Debug)]
pub(crate) enum Verdict {
    Batch(Result<Accepted, IngestError>),
    Deploy(Result<Deployed, DeployError>),
}

/// A record's place on the stream: its position, and its index among the batches of that
/// position (0 for a record alone).
pub(crate) type Place = (LogPosition, u32);

/// Verdicts of recently applied stream positions, and the publishers waiting for theirs.
#[derive(Debug, Default)]
pub(crate) struct Verdicts {
    done: BTreeMap<Place, Verdict>,
    waiting: HashMap<Place, oneshot::Sender<Verdict>>,
}

impl Verdicts {
    /// The verdict on `place`, if it was given and is still kept.
    pub fn take(&mut self, place: Place) -> Option<Verdict> {
        self.done.remove(&place)
    }

    /// The acceptance given on `place`, if it was accepted and is still kept.
    pub fn accepted(&self, place: Place) -> Option<Verdict> {
        match self.done.get(&place) {
            Some(Verdict::Batch(Ok(accepted))) => Some(Verdict::Batch(Ok(accepted.clone()))),
            _ => None,
        }
    }

    /// Waits for the verdict on `place` (which is not given yet): the receiver gets it.
    pub fn wait(&mut self, place: Place) -> oneshot::Receiver<Verdict> {
        let (tx, rx) = oneshot::channel();
        self.waiting.insert(place, tx);
        rx
    }

    /// No longer waits for the verdict on `place`.
    pub fn stop_waiting(&mut self, place: Place) {
        self.waiting.remove(&place);
    }

    /// Hands the verdict on `place` to its publisher, or keeps it for one that will ask.
    pub fn give(&mut self, place: Place, verdict: Verdict) {
        match self.waiting.remove(&place) {
            Some(waiter) => {
                let _ = waiter.send(verdict);
            }
            None => {
                self.done.insert(place, verdict);
                while self.done.len() > VERDICTS_KEPT {
                    self.done.pop_first();
                }
            }
        }
    }
}
