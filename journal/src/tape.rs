//! One view's tape: its retained records and the offsets around them.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use compact_str::CompactString;

use crate::config::JournalConfig;
use crate::error::ReplayError;
use crate::offset::ViewOffset;
use crate::stats::JournalStats;

/// One retained record. Its offset is not stored: it is `first + index`.
///
/// 40 bytes: the frame pointer, the key (inline up to 24 bytes, so short keys
/// cost no allocation) and the append time.
#[derive(Debug, Clone)]
pub(crate) struct Slot {
    pub(crate) frame: Arc<Bytes>,
    pub(crate) key: CompactString,
    /// Append time in nanoseconds on the journal clock. Signed, because a
    /// hydrated record may predate the clock's base.
    pub(crate) at: i64,
}

/// A view's tape.
///
/// Invariants: `first >= 1`; `next() == first + records.len()` (no overflow);
/// `bytes == sum of records' frame lengths`; `gap_floor <= next()`.
#[derive(Debug, Clone)]
pub(crate) struct Tape {
    /// Offset of `records[0]`; equals `next()` when the tape is empty.
    pub(crate) first: ViewOffset,
    pub(crate) records: VecDeque<Slot>,
    pub(crate) bytes: usize,
    /// Cursors with an offset below this fail with [`ReplayError::Gap`]. It
    /// is the offset of the newest gap record, or `next()` while a gap
    /// marked under seal waits for its offset, or [`ViewOffset::ZERO`].
    pub(crate) gap_floor: ViewOffset,
}

impl Tape {
    pub(crate) fn new(first: ViewOffset, gap_floor: ViewOffset) -> Self {
        debug_assert!(first >= ViewOffset::FIRST, "offset 0 is never issued");
        Self {
            first,
            records: VecDeque::new(),
            bytes: 0,
            gap_floor,
        }
    }

    pub(crate) fn next(&self) -> ViewOffset {
        self.first.saturating_add(self.records.len() as u64)
    }

    /// The offset of `records[index]`.
    pub(crate) fn offset_at(&self, index: usize) -> ViewOffset {
        self.first.saturating_add(index as u64)
    }

    pub(crate) fn push(&mut self, slot: Slot) {
        self.bytes += slot.frame.len();
        self.records.push_back(slot);
    }

    /// Records a gap: an empty record whose offset becomes the gap floor, after `lost` offsets
    /// issued in a life the tape does not hold (0: right after its last record). With `lost`,
    /// the retained records go too: every cursor before the gap is refused anyway.
    pub(crate) fn push_gap(&mut self, now: i64, lost: u64) {
        if lost > 0 {
            self.first = self.next().saturating_add(lost);
            self.records.clear();
            self.bytes = 0;
        }
        self.gap_floor = self.next();
        self.push(Slot {
            frame: Arc::new(Bytes::new()),
            key: CompactString::default(),
            at: now,
        });
    }

    fn pop_front(&mut self) {
        if let Some(slot) = self.records.pop_front() {
            self.bytes -= slot.frame.len();
            self.first = self.first.next();
        }
    }

    /// Drops records past the age, count and byte bounds, oldest first.
    pub(crate) fn prune(&mut self, config: &JournalConfig, now: i64, stats: &mut JournalStats) {
        let max_age = duration_nanos(config.max_age);
        while self
            .records
            .front()
            .is_some_and(|slot| now.saturating_sub(slot.at) > max_age)
        {
            self.pop_front();
            stats.pruned_age += 1;
        }
        while self.records.len() > config.max_records_per_view {
            self.pop_front();
            stats.pruned_count += 1;
        }
        while self.bytes > config.max_bytes_per_view {
            self.pop_front();
            stats.pruned_bytes += 1;
        }
        debug_assert_eq!(
            self.bytes,
            self.records.iter().map(|s| s.frame.len()).sum::<usize>()
        );
    }

    /// Where a replay after `offset` (in the current epoch) starts, as an
    /// index into `records`.
    pub(crate) fn start_after(&self, offset: ViewOffset) -> Result<usize, ReplayError> {
        let next = self.next();
        if offset >= next {
            return Err(ReplayError::Ahead {
                cursor: offset,
                next,
            });
        }
        if offset.next() < self.first {
            return Err(ReplayError::Expired {
                cursor: offset,
                first: self.first,
            });
        }
        if offset < self.gap_floor {
            return Err(ReplayError::Gap {
                cursor: offset,
                resume_from: self.gap_floor,
            });
        }
        Ok(offset.next().since(self.first) as usize)
    }
}

pub(crate) fn duration_nanos(duration: Duration) -> i64 {
    i64::try_from(duration.as_nanos()).unwrap_or(i64::MAX)
}
