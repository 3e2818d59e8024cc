//! The journal's durable form: what `dump` returns and `hydrate` takes.

use std::sync::Arc;

use bytes::Bytes;
use compact_str::CompactString;
use serde::{Deserialize, Serialize};

use crate::epoch::JournalEpoch;
use crate::offset::ViewOffset;

/// Every view's tape with its epoch, as of one instant.
///
/// Serde-serializable; frames serialize as byte strings (not arrays of
/// integers), so a MessagePack encoding of a dump runs at memcpy-like speed.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct JournalSnapshot {
    /// The epoch the offsets belong to; `None` for a disabled journal, whose
    /// snapshot `hydrate` discards.
    pub epoch: Option<JournalEpoch>,
    /// Wall-clock time of the dump; record ages are relative to it.
    pub taken_at_unix_ms: u64,
    /// One entry per view.
    pub views: Vec<SnapshotView>,
}

/// One view's tape in a [`JournalSnapshot`].
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SnapshotView {
    /// The view's name.
    pub name: String,
    /// Offset of the first record (the next offset when there is none).
    pub first: ViewOffset,
    /// Cursors below this offset fail with a gap.
    pub gap_floor: ViewOffset,
    /// Retained records, oldest first, at offsets `first, first + 1, …`.
    pub records: Vec<SnapshotRecord>,
}

/// One retained record in a [`SnapshotView`].
///
/// Serialized as the tuple `(key, age_ms, frame)`, not as a map: records
/// are the bulk of a snapshot, and repeating three field names per record
/// made encoding 20% slower and files larger. A record's shape changes only
/// with the snapshot format's version.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(from = "RecordTuple", into = "RecordTuple")]
pub struct SnapshotRecord {
    /// The entity the event is about (inline up to 24 bytes, so a dump of
    /// short keys copies no heap memory).
    pub key: CompactString,
    /// Age at the time of the dump, in milliseconds.
    pub age_ms: u64,
    /// The encoded frame.
    pub frame: Arc<Bytes>,
}

#[derive(Serialize, Deserialize)]
struct RecordTuple(CompactString, u64, #[serde(with = "arc_bytes")] Arc<Bytes>);

impl From<RecordTuple> for SnapshotRecord {
    fn from(RecordTuple(key, age_ms, frame): RecordTuple) -> Self {
        Self { key, age_ms, frame }
    }
}

impl From<SnapshotRecord> for RecordTuple {
    fn from(record: SnapshotRecord) -> Self {
        Self(record.key, record.age_ms, record.frame)
    }
}

/// Why a [`SnapshotView`] cannot be hydrated.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SnapshotInvalid {
    /// The view name is not a valid [`crate::ViewName`].
    #[error("view name {0:?} is invalid")]
    Name(String),
    /// `first` is 0, or `first + records` overflows.
    #[error("view {0:?} has impossible offsets")]
    Offsets(String),
    /// The gap floor lies past the view's next offset.
    #[error("view {0:?} has a gap floor past its head")]
    GapFloor(String),
}

impl SnapshotView {
    /// The offset the view will issue next.
    pub fn next(&self) -> ViewOffset {
        self.first.saturating_add(self.records.len() as u64)
    }

    /// Checks the view's invariants.
    ///
    /// # Errors
    /// A [`SnapshotInvalid`] naming the broken invariant.
    pub fn validate(&self) -> Result<(), SnapshotInvalid> {
        if crate::ViewName::new(&self.name).is_err() {
            return Err(SnapshotInvalid::Name(self.name.clone()));
        }
        if self.first == ViewOffset::ZERO
            || self.first.checked_add(self.records.len() as u64).is_none()
        {
            return Err(SnapshotInvalid::Offsets(self.name.clone()));
        }
        if self.gap_floor > self.next() {
            return Err(SnapshotInvalid::GapFloor(self.name.clone()));
        }
        Ok(())
    }
}

impl JournalSnapshot {
    /// Checks every view's invariants (hydrate skips views that fail).
    ///
    /// # Errors
    /// The first [`SnapshotInvalid`] found.
    pub fn validate(&self) -> Result<(), SnapshotInvalid> {
        self.views.iter().try_for_each(SnapshotView::validate)
    }

    /// Retained records in all views.
    pub fn record_count(&self) -> usize {
        self.views.iter().map(|view| view.records.len()).sum()
    }
}

mod arc_bytes {
    use std::sync::Arc;

    use bytes::Bytes;
    use serde::{Deserialize, Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(
        frame: &Arc<Bytes>,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        serializer.serialize_bytes(frame)
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Arc<Bytes>, D::Error> {
        let buf = serde_bytes::ByteBuf::deserialize(deserializer)?;
        Ok(Arc::new(Bytes::from(buf.into_vec())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Cursor, EventJournal, JournalConfig};

    #[tokio::test]
    async fn a_dump_round_trips_through_messagepack() {
        let journal = EventJournal::new(JournalConfig::default());
        for key in ["ACME", "a-key-longer-than-twenty-four-bytes"] {
            journal
                .append_with("prices", key, |offset| {
                    Ok::<_, ()>(Arc::new(Bytes::from(format!("frame {offset}"))))
                })
                .await
                .unwrap();
        }
        journal.mark_gap().await;
        let epoch = journal.epoch().await;
        let packed = rmp_serde::to_vec_named(&journal.dump().await).unwrap();
        let snapshot: JournalSnapshot = rmp_serde::from_slice(&packed).unwrap();
        assert_eq!(snapshot.record_count(), 3);

        let next = EventJournal::new(JournalConfig::default());
        next.hydrate(snapshot, true).await;
        let records = next.replay_after("prices", None).await.unwrap();
        let keys: Vec<&str> = records.iter().map(|r| r.key.as_str()).collect();
        assert_eq!(keys, ["ACME", "a-key-longer-than-twenty-four-bytes", ""]);
        assert_eq!(&records[1].frame[..], b"frame 2");
        assert!(next
            .replay_after("prices", Some(&Cursor::new(epoch, ViewOffset::new(3))))
            .await
            .is_ok());
    }
}
