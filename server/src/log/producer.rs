//! Idempotent producers: `Producer-Id`, `Producer-Epoch` and `Producer-Seq` on an ingest.
//!
//! Per runtime and producer id, a [`ProducerTable`] keeps the producer's epoch, the next
//! sequence number it may send, and what its last [`RECEIPTS_KEPT`] batches were: a digest of
//! each one's input and its receipt. It lives with the runtime: in its snapshots, and rebuilt by
//! log replay, so a retry after a timeout, a crash or a restart is recognised.
//!
//! | the batch's stamp | verdict |
//! |---|---|
//! | same epoch, one of the last batches, the same input | a duplicate: nothing runs again, the original receipt |
//! | same epoch, one of the last batches, another input | a reused `seq`: refused, the next `seq` named |
//! | same epoch, older than the batches kept | refused as stale: its receipt is no longer kept |
//! | same epoch, the next `seq`; or a newer epoch (or a new id) with `seq == 0` | runs |
//! | same epoch, past the next `seq`; or a newer epoch or new id with `seq > 0` | refused: the expected `seq` is named |
//! | an older epoch | fenced |
//!
//! ## Claims
//!
//! A producer that keeps no store of its own cannot know where a previous run under its id
//! stopped; were it to start at epoch 0, `seq` 0 again, its new batches would be taken for the
//! old run's. It claims an epoch instead ([`ProducerTable::claim`], a record in the log like a
//! batch): one more than the highest the table knows for the id, which fences every older
//! holder, with its next `seq` 0.
//!
//! ## The last epoch
//!
//! Epochs end at [`ProducerEpoch::LAST`] (`u64::MAX`), which a claim takes only from the epoch
//! before it: a batch may not bring it unclaimed ([`Verdict::LastEpoch`]), since no claim could
//! then fence its sender. Once a producer holds it, the epoch space of its id is used up, and a
//! claim is refused ([`ClaimError::EpochsUsedUp`]) rather than handing out an epoch that fences
//! nobody.
//!
//! The table holds at most [`MAX_PRODUCERS`] ids; past it the one that committed least recently
//! is forgotten (deterministically, so a replay forgets the same one). A forgotten producer that
//! comes back is told to start again at `seq` 0.

use std::collections::{HashMap, VecDeque};

use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

use super::Receipt;

/// Most producer ids one runtime remembers.
pub const MAX_PRODUCERS: usize = 10_000;

/// Longest producer id, in bytes.
pub const MAX_PRODUCER_ID: usize = 256;

/// Batches per producer whose receipt is kept, the newest included: a retry of any of them gets
/// its original receipt. A producer that has at most this many batches in flight is never told
/// that a retry is stale.
pub const RECEIPTS_KEPT: usize = 8;

/// A producer's epoch: each claim takes a higher one, and a batch of an older one is fenced.
///
/// Epoch 0 is a producer's before any claim (a batch without `Producer-Epoch`). Its own type, as
/// [`ProducerSeq`] is, so that neither mixes with the other or with a log position; the number
/// comes out with [`ProducerEpoch::get`] only on the wire. Serde and [`Display`] are the bare
/// number.
///
/// [`Display`]: std::fmt::Display
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct ProducerEpoch(u64);

impl ProducerEpoch {
    /// The last epoch: only a claim takes it (see the module docs).
    pub const LAST: Self = Self(u64::MAX);

    /// Epoch `epoch`, as a `Producer-Epoch` header (or a test) gives it.
    pub const fn new(epoch: u64) -> Self {
        Self(epoch)
    }

    /// The number, for the wire.
    pub const fn get(self) -> u64 {
        self.0
    }

    /// The epoch a claim takes after this one; `None` after [`ProducerEpoch::LAST`].
    #[must_use]
    pub const fn next(self) -> Option<Self> {
        match self.0.checked_add(1) {
            Some(next) => Some(Self(next)),
            None => None,
        }
    }
}

/// A producer's sequence number within its epoch: 0, 1, 2, … with no gap. Serde and
/// [`Display`] are the bare number.
///
/// [`Display`]: std::fmt::Display
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct ProducerSeq(u64);

impl ProducerSeq {
    /// The first `seq` of an epoch.
    pub const FIRST: Self = Self(0);

    /// Sequence number `seq`, as a `Producer-Seq` header (or a test) gives it.
    pub const fn new(seq: u64) -> Self {
        Self(seq)
    }

    /// The number, for the wire.
    pub const fn get(self) -> u64 {
        self.0
    }

    /// The one after this.
    #[must_use]
    pub fn next(self) -> Self {
        Self(self.0.saturating_add(1))
    }
}

impl std::fmt::Display for ProducerEpoch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::fmt::Display for ProducerSeq {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

/// The producer headers of one batch, or a claim of a new epoch.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ProducerStamp {
    /// `Producer-Id`.
    pub id: String,
    /// `Producer-Epoch` (0 when absent).
    pub epoch: ProducerEpoch,
    /// `Producer-Seq`.
    pub seq: ProducerSeq,
    /// The record claims a new epoch for `id` and carries no input; `epoch` and `seq` are not
    /// read (the epoch is decided where the record is applied: the same on every reader).
    #[serde(default)]
    pub claim: bool,
}

impl ProducerStamp {
    /// The stamp of a claim of a new epoch for `id`.
    pub fn claim(id: String) -> Self {
        Self {
            id,
            epoch: ProducerEpoch::default(),
            seq: ProducerSeq::default(),
            claim: true,
        }
    }
}

/// What a batch's input was, as far as telling a retry from a reused `seq` needs: the first 8
/// bytes of its SHA-256.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct InputDigest(u64);

impl InputDigest {
    /// The digest of `input`.
    pub fn of(input: &[u8]) -> Self {
        let hash = Sha256::digest(input);
        let mut first = [0; 8];
        first.copy_from_slice(&hash[..8]);
        Self(u64::from_le_bytes(first))
    }
}

impl std::fmt::Display for InputDigest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

/// What the table says about a stamp.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The next batch of this producer: run it.
    Next,
    /// Already committed, with the same input. The original's receipt, `None` only while the
    /// original is staged and not yet committed (its receipt comes with its commit).
    Duplicate(Option<Receipt>),
    /// A `seq` committed before with another input: a second batch under a used number.
    Reused {
        /// The `seq` that would run.
        next: ProducerSeq,
    },
    /// Committed before, too long ago for its receipt to be kept.
    Stale {
        /// The `seq` that would run.
        next: ProducerSeq,
    },
    /// A batch is missing before this one: the producer must send `expected` first.
    OutOfOrder {
        /// The `seq` that would run.
        expected: ProducerSeq,
    },
    /// An older epoch than the producer's current one.
    Fenced {
        /// The producer's current epoch.
        current: ProducerEpoch,
    },
    /// [`ProducerEpoch::LAST`], which the producer did not claim: no claim could fence it.
    LastEpoch,
}

/// Why a claim takes no epoch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ClaimError {
    /// The producer holds [`ProducerEpoch::LAST`]: there is no higher epoch to fence it with.
    #[error(
        "the producer holds epoch {}, the last one: no claim can fence it; use another producer id",
        ProducerEpoch::LAST
    )]
    EpochsUsedUp,
}

/// One of a producer's last batches.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Kept {
    seq: ProducerSeq,
    input: Option<InputDigest>,
    /// Its receipt; `None` between staging and commit.
    receipt: Option<Receipt>,
}

/// One producer.
///
/// Invariant: `earlier` holds batches of `epoch` with `seq`s below `seq`, ascending, at most
/// [`RECEIPTS_KEPT`] - 1 of them; when `claimed`, `earlier` is empty.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Entry {
    epoch: ProducerEpoch,
    /// The last `seq` committed in `epoch` (not read when `claimed`).
    seq: ProducerSeq,
    /// The receipt of `seq`; `None` between staging and commit.
    receipt: Option<Receipt>,
    /// When it last committed, in the runtime's count of batches: the eviction order.
    used: u64,
    /// `epoch` was claimed and no batch of it has come yet: the next `seq` is 0.
    #[serde(default)]
    claimed: bool,
    /// The digest of `seq`'s input (`None` in tables written before digests were kept: a
    /// retry of it is then taken as a duplicate).
    #[serde(default)]
    input: Option<InputDigest>,
    /// The batches before `seq` whose receipts are kept.
    #[serde(default)]
    earlier: VecDeque<Kept>,
}

impl Entry {
    fn next(&self) -> ProducerSeq {
        match self.claimed {
            true => ProducerSeq::FIRST,
            false => self.seq.next(),
        }
    }

    /// The verdict on `seq` in this producer's epoch.
    fn judge(&self, seq: ProducerSeq, input: InputDigest) -> Verdict {
        let next = self.next();
        if seq == next {
            return Verdict::Next;
        }
        if seq > next {
            return Verdict::OutOfOrder { expected: next };
        }
        let same = |kept: Option<InputDigest>, receipt: &Option<Receipt>| match kept {
            Some(kept) if kept != input => Verdict::Reused { next },
            _ => Verdict::Duplicate(receipt.clone()),
        };
        if seq == self.seq {
            return same(self.input, &self.receipt);
        }
        match self.earlier.iter().find(|kept| kept.seq == seq) {
            Some(kept) => same(kept.input, &kept.receipt),
            None => Verdict::Stale { next },
        }
    }
}

/// A runtime's producers. Serialized as a list sorted by id, so equal tables encode equally.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProducerTable {
    entries: HashMap<String, Entry>,
    /// Batches staged so far: the clock of `Entry::used`.
    clock: u64,
}

/// How to take back what [`ProducerTable::stage`] or [`ProducerTable::claim`] did, if the
/// record never commits.
#[derive(Debug)]
pub struct Undo {
    id: String,
    previous: Option<Entry>,
    clock: u64,
    evicted: Option<(String, Entry)>,
}

impl ProducerTable {
    /// The verdict on `stamp`, a batch whose input has the digest `input`.
    pub fn check(&self, stamp: &ProducerStamp, input: InputDigest) -> Verdict {
        let last = self.entries.get(&stamp.id);
        if stamp.epoch == ProducerEpoch::LAST && last.is_none_or(|last| last.epoch != stamp.epoch) {
            return Verdict::LastEpoch;
        }
        let Some(last) = last else {
            return match stamp.seq {
                ProducerSeq::FIRST => Verdict::Next,
                _ => Verdict::OutOfOrder {
                    expected: ProducerSeq::FIRST,
                },
            };
        };
        if stamp.epoch < last.epoch {
            return Verdict::Fenced {
                current: last.epoch,
            };
        }
        if stamp.epoch > last.epoch {
            return match stamp.seq {
                ProducerSeq::FIRST => Verdict::Next,
                _ => Verdict::OutOfOrder {
                    expected: ProducerSeq::FIRST,
                },
            };
        }
        last.judge(stamp.seq, input)
    }

    /// Records `stamp` as this producer's last batch (its receipt comes with
    /// [`ProducerTable::committed`]). Call it only after [`Verdict::Next`].
    pub fn stage(&mut self, stamp: &ProducerStamp, input: InputDigest) -> Undo {
        let previous = self.entries.get(&stamp.id).cloned();
        let mut earlier = VecDeque::new();
        if let Some(last) = previous
            .as_ref()
            .filter(|last| last.epoch == stamp.epoch && !last.claimed)
        {
            earlier.clone_from(&last.earlier);
            earlier.push_back(Kept {
                seq: last.seq,
                input: last.input,
                receipt: last.receipt.clone(),
            });
            while earlier.len() >= RECEIPTS_KEPT {
                earlier.pop_front();
            }
        }
        self.put(
            &stamp.id,
            Entry {
                epoch: stamp.epoch,
                seq: stamp.seq,
                receipt: None,
                used: 0,
                claimed: false,
                input: Some(input),
                earlier,
            },
            previous,
        )
    }

    /// Claims a new epoch for `id`: one more than the highest this table knows for it (1 for
    /// an id it does not know), with the next `seq` 0. Every batch of an older epoch is fenced
    /// from here on.
    ///
    /// # Errors
    /// [`ClaimError::EpochsUsedUp`] when `id` holds [`ProducerEpoch::LAST`]; nothing changes.
    pub fn claim(&mut self, id: &str) -> Result<(ProducerEpoch, Undo), ClaimError> {
        let previous = self.entries.get(id).cloned();
        let epoch = previous
            .as_ref()
            .map_or(ProducerEpoch::default(), |last| last.epoch)
            .next()
            .ok_or(ClaimError::EpochsUsedUp)?;
        let entry = Entry {
            epoch,
            seq: ProducerSeq::FIRST,
            receipt: None,
            used: 0,
            claimed: true,
            input: None,
            earlier: VecDeque::new(),
        };
        Ok((epoch, self.put(id, entry, previous)))
    }

    /// Puts `entry` in as the most recently used, forgetting the least recent past the limit.
    fn put(&mut self, id: &str, mut entry: Entry, previous: Option<Entry>) -> Undo {
        self.clock += 1;
        entry.used = self.clock;
        self.entries.insert(id.to_owned(), entry);
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
            id: id.to_owned(),
            previous,
            clock: self.clock - 1,
            evicted,
        }
    }

    /// Gives the batch `stamp` staged its receipt, once it committed (the producer's later
    /// batches of the same group may have been staged meanwhile).
    pub fn committed(&mut self, stamp: &ProducerStamp, receipt: &Receipt) {
        let Some(entry) = self
            .entries
            .get_mut(&stamp.id)
            .filter(|e| e.epoch == stamp.epoch && !e.claimed)
        else {
            return;
        };
        if entry.seq == stamp.seq {
            entry.receipt = Some(receipt.clone());
        } else if let Some(kept) = entry.earlier.iter_mut().find(|k| k.seq == stamp.seq) {
            kept.receipt = Some(receipt.clone());
        }
    }

    /// Takes back a [`ProducerTable::stage`] or [`ProducerTable::claim`] whose record did not
    /// commit. Undo in reverse order.
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

    /// The epoch of `id` and the next `seq` it may send in it.
    pub fn next(&self, id: &str) -> Option<(ProducerEpoch, ProducerSeq)> {
        self.entries.get(id).map(|e| (e.epoch, e.next()))
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
mod tests;
