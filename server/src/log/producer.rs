//! Idempotent producers: `Producer-Id`, `Producer-Epoch` and `Producer-Seq` on an ingest.
//!
//! Per runtime and producer id, a [`ProducerTable`] keeps the highest epoch and sequence number
//! committed and the receipt of that batch. It lives with the runtime: in its snapshots, and
//! rebuilt by log replay, so a retry after a timeout, a crash or a restart is recognised.
//!
//! | the batch's stamp | verdict |
//! |---|---|
//! | same epoch, `seq <= last` | a duplicate: nothing runs again |
//! | same epoch, `seq == last + 1`; or a newer epoch (or a new id) with `seq == 0` | runs |
//! | same epoch, `seq > last + 1`; or a newer epoch or new id with `seq > 0` | refused: the expected `seq` is named |
//! | an older epoch | fenced |
//!
//! The table holds at most [`MAX_PRODUCERS`] ids; past it the one that committed least recently
//! is forgotten (deterministically, so a replay forgets the same one). A forgotten producer that
//! comes back is told to start again at `seq` 0.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use super::Receipt;

/// Most producer ids one runtime remembers.
pub const MAX_PRODUCERS: usize = 10_000;

/// Longest producer id, in bytes.
pub const MAX_PRODUCER_ID: usize = 256;

/// The producer headers of one batch.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ProducerStamp {
    /// `Producer-Id`.
    pub id: String,
    /// `Producer-Epoch` (0 when absent).
    pub epoch: u64,
    /// `Producer-Seq`.
    pub seq: u64,
}

/// What the table says about a stamp.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The next batch of this producer: run it.
    Next,
    /// Already committed. The receipt is the original's when `seq` is the last one committed.
    Duplicate(Option<Receipt>),
    /// A batch is missing before this one: the producer must send `expected` first.
    OutOfOrder {
        /// The `seq` that would run.
        expected: u64,
    },
    /// An older epoch than the producer's current one.
    Fenced {
        /// The producer's current epoch.
        current: u64,
    },
}

/// One producer's last committed batch.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Entry {
    epoch: u64,
    seq: u64,
    /// Its receipt; `None` between staging and commit.
    receipt: Option<Receipt>,
    /// When it last committed, in the runtime's count of batches: the eviction order.
    used: u64,
}

/// A runtime's producers. Serialized as a list sorted by id, so equal tables encode equally.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProducerTable {
    entries: HashMap<String, Entry>,
    /// Batches staged so far: the clock of `Entry::used`.
    clock: u64,
}

/// How to take back what [`ProducerTable::stage`] did, if the batch never commits.
#[derive(Debug)]
pub struct Undo {
    id: String,
    previous: Option<Entry>,
    clock: u64,
    evicted: Option<(String, Entry)>,
}

impl ProducerTable {
    /// The verdict on `stamp`.
    pub fn check(&self, stamp: &ProducerStamp) -> Verdict {
        let Some(last) = self.entries.get(&stamp.id) else {
            return match stamp.seq {
                0 => Verdict::Next,
                _ => Verdict::OutOfOrder { expected: 0 },
            };
        };
        if stamp.epoch < last.epoch {
            return Verdict::Fenced {
                current: last.epoch,
            };
        }
        if stamp.epoch > last.epoch {
            return match stamp.seq {
                0 => Verdict::Next,
                _ => Verdict::OutOfOrder { expected: 0 },
            };
        }
        if stamp.seq <= last.seq {
            let receipt = (stamp.seq == last.seq)
                .then(|| last.receipt.clone())
                .flatten();
            return Verdict::Duplicate(receipt);
        }
        if stamp.seq == last.seq + 1 {
            Verdict::Next
        } else {
            Verdict::OutOfOrder {
                expected: last.seq + 1,
            }
        }
    }

    /// Records `stamp` as this producer's last batch (its receipt comes with
    /// [`ProducerTable::committed`]). Call it only after [`Verdict::Next`].
    pub fn stage(&mut self, stamp: &ProducerStamp) -> Undo {
        self.clock += 1;
        let entry = Entry {
            epoch: stamp.epoch,
            seq: stamp.seq,
            receipt: None,
            used: self.clock,
        };
        let previous = self.entries.insert(stamp.id.clone(), entry);
        let evicted = if self.entries.len() > MAX_PRODUCERS {
            self.entries
                .iter()
                .min_by_key(|(id, e)| (e.used, id.as_str()))
                .map(|(id, _)| id.clone())
                .and_then(|id| self.entries.remove_entry(&id))
        } else {
            None
        };
        Undo {
            id: stamp.id.clone(),
            previous,
            clock: self.clock - 1,
            evicted,
        }
    }

    /// Gives the batch `stamp` staged its receipt, once it committed.
    pub fn committed(&mut self, stamp: &ProducerStamp, receipt: &Receipt) {
        if let Some(entry) = self
            .entries
            .get_mut(&stamp.id)
            .filter(|e| e.epoch == stamp.epoch && e.seq == stamp.seq)
        {
            entry.receipt = Some(receipt.clone());
        }
    }

    /// Takes back a [`ProducerTable::stage`] whose batch did not commit. Undo in reverse order.
    pub fn undo(&mut self, undo: Undo) {
        match undo.previous {
            Some(previous) => self.entries.insert(undo.id, previous),
            None => self.entries.remove(&undo.id),
        };
        if let Some((id, entry)) = undo.evicted {
            self.entries.insert(id, entry);
        }
        self.clock = undo.clock;
    }

    /// The last committed `(epoch, seq)` of `id`.
    pub fn last(&self, id: &str) -> Option<(u64, u64)> {
        self.entries.get(id).map(|e| (e.epoch, e.seq))
    }

    /// Producers remembered.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether no producer is remembered.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[derive(Serialize, Deserialize)]
struct Encoded {
    clock: u64,
    entries: Vec<(String, Entry)>,
}

impl Serialize for ProducerTable {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut entries: Vec<(String, Entry)> = self
            .entries
            .iter()
            .map(|(id, e)| (id.clone(), e.clone()))
            .collect();
        entries.sort_by(|a, b| a.0.cmp(&b.0));
        Encoded {
            clock: self.clock,
            entries,
        }
        .serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for ProducerTable {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let encoded = Encoded::deserialize(deserializer)?;
        Ok(Self {
            entries: encoded.entries.into_iter().collect(),
            clock: encoded.clock,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stamp(id: &str, epoch: u64, seq: u64) -> ProducerStamp {
        ProducerStamp {
            id: id.into(),
            epoch,
            seq,
        }
    }

    fn receipt(events: u64) -> Receipt {
        Receipt {
            events: [("v".to_owned(), events)].into(),
            ..Receipt::default()
        }
    }

    #[test]
    fn the_rules() {
        let mut table = ProducerTable::default();
        assert_eq!(
            table.check(&stamp("p", 0, 1)),
            Verdict::OutOfOrder { expected: 0 }
        );
        assert_eq!(table.check(&stamp("p", 0, 0)), Verdict::Next);
        table.stage(&stamp("p", 0, 0));
        table.committed(&stamp("p", 0, 0), &receipt(1));
        assert_eq!(
            table.check(&stamp("p", 0, 0)),
            Verdict::Duplicate(Some(receipt(1)))
        );
        assert_eq!(table.check(&stamp("p", 0, 1)), Verdict::Next);
        table.stage(&stamp("p", 0, 1));
        table.committed(&stamp("p", 0, 1), &receipt(2));
        assert_eq!(table.check(&stamp("p", 0, 0)), Verdict::Duplicate(None));
        assert_eq!(
            table.check(&stamp("p", 0, 5)),
            Verdict::OutOfOrder { expected: 2 }
        );
        // A new epoch starts at 0 and fences the old one.
        assert_eq!(
            table.check(&stamp("p", 1, 3)),
            Verdict::OutOfOrder { expected: 0 }
        );
        table.stage(&stamp("p", 1, 0));
        assert_eq!(
            table.check(&stamp("p", 0, 2)),
            Verdict::Fenced { current: 1 }
        );
        assert_eq!(table.last("p"), Some((1, 0)));
    }

    #[test]
    fn undo_takes_a_stage_back_and_the_encoding_is_canonical() {
        let mut table = ProducerTable::default();
        table.stage(&stamp("a", 0, 0));
        table.committed(&stamp("a", 0, 0), &receipt(1));
        let before = table.clone();
        let u1 = table.stage(&stamp("a", 0, 1));
        let u2 = table.stage(&stamp("b", 0, 0));
        table.undo(u2);
        table.undo(u1);
        assert_eq!(table, before);
        let encoded = rmp_serde::to_vec(&table).unwrap();
        let decoded: ProducerTable = rmp_serde::from_slice(&encoded).unwrap();
        assert_eq!(decoded, table);
        assert_eq!(rmp_serde::to_vec(&decoded).unwrap(), encoded);
    }

    #[test]
    fn past_the_limit_the_least_recent_is_forgotten_and_undo_brings_it_back() {
        let mut table = ProducerTable::default();
        for i in 0..MAX_PRODUCERS {
            table.stage(&stamp(&format!("p{i}"), 0, 0));
        }
        table.stage(&stamp("p0", 0, 1)); // p0 is now the most recent
        let before = table.clone();
        let undo = table.stage(&stamp("new", 0, 0));
        assert_eq!(table.len(), MAX_PRODUCERS);
        assert_eq!(table.last("p1"), None, "the least recent went");
        assert_eq!(table.last("p0"), Some((0, 1)));
        table.undo(undo);
        assert_eq!(table, before);
    }
}
