use std::sync::Arc;

use bytes::Bytes;

use super::{EventJournal, Inner};
use crate::config::JournalConfig;
use crate::cursor::Cursor;
use crate::epoch::JournalEpoch;
use crate::error::ReplayError;
use crate::offset::ViewOffset;
use crate::tape::Tape;

/// The offsets a view can serve right now: `first ..= next - 1` of `epoch`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReplayWindow {
    /// The journal's current epoch.
    pub epoch: JournalEpoch,
    /// The first retained offset (equals `next` when nothing is retained).
    pub first: ViewOffset,
    /// The offset the next append will take.
    pub next: ViewOffset,
    /// Whether offset issuance has stopped.
    pub sealed: bool,
}

/// One retained record, as a replay returns it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JournalRecord {
    /// The record's offset in the current epoch.
    pub offset: ViewOffset,
    /// The entity the event is about.
    pub key: String,
    /// The encoded frame, shared with every subscriber.
    pub frame: Arc<Bytes>,
}

/// What [`EventJournal::frames_after_where`] found.
#[derive(Debug, Default)]
pub struct FramesWhere {
    /// The frames taken, each with its offset, in offset order.
    pub frames: Vec<(ViewOffset, Arc<Bytes>)>,
    /// The offset of the last record looked at, taken or not (`None`: none was there).
    pub through: Option<ViewOffset>,
}

impl Inner {
    /// The view's tape pruned to `now`, if the view exists.
    fn pruned(&mut self, view_id: &str, config: &JournalConfig, now: i64) -> Option<&Tape> {
        let tape = self.views.get_mut(view_id)?;
        tape.prune(config, now, &mut self.stats);
        Some(tape)
    }

    fn window(&mut self, view_id: &str, config: &JournalConfig, now: i64) -> ReplayWindow {
        let (epoch, sealed) = (self.epoch, self.sealed);
        let (first, next) = match self.pruned(view_id, config, now) {
            Some(tape) => (tape.first, tape.next()),
            None => (ViewOffset::FIRST, ViewOffset::FIRST),
        };
        ReplayWindow {
            epoch,
            first,
            next,
            sealed,
        }
    }

    /// Checks a cursor against the view and returns the index to read from.
    fn start_after(
        &mut self,
        view_id: &str,
        cursor: Option<&Cursor>,
        config: &JournalConfig,
        now: i64,
    ) -> Result<usize, ReplayError> {
        if !config.enabled {
            return Err(ReplayError::Disabled);
        }
        let Some(cursor) = cursor else {
            return Ok(0);
        };
        if cursor.epoch() != self.epoch {
            return Err(ReplayError::StaleEpoch {
                cursor: cursor.epoch(),
                current: self.epoch,
            });
        }
        match self.pruned(view_id, config, now) {
            Some(tape) => tape.start_after(cursor.offset()),
            None => Tape::new(ViewOffset::FIRST, ViewOffset::ZERO).start_after(cursor.offset()),
        }
    }
}

impl EventJournal {
    /// The view's window, after pruning by age.
    pub async fn window(&self, view_id: &str) -> ReplayWindow {
        self.window_now(view_id)
    }

    /// [`EventJournal::window`], synchronously: for callers that must read
    /// the window under a lock of their own, such as a view's state, which
    /// is only consistent with the head cursor read in the same section.
    pub fn window_now(&self, view_id: &str) -> ReplayWindow {
        let now = self.now();
        self.lock().window(view_id, &self.config, now)
    }

    /// Every retained record after `cursor` (all of them without one), in
    /// offset order; empty when the cursor is at the head.
    ///
    /// # Errors
    /// A [`ReplayError`] when the journal is disabled, or the cursor is from
    /// another epoch, ahead of the head, before pruned records, or before a
    /// gap. Never a partial result.
    pub async fn replay_after(
        &self,
        view_id: &str,
        cursor: Option<&Cursor>,
    ) -> Result<Vec<JournalRecord>, ReplayError> {
        let now = self.now();
        let mut inner = self.lock();
        let start = match inner.start_after(view_id, cursor, &self.config, now) {
            Ok(start) => start,
            Err(error) => {
                inner.stats.count_refusal(&error);
                return Err(error);
            }
        };
        inner.stats.replays_served += 1;
        let Some(tape) = inner.views.get(view_id) else {
            return Ok(Vec::new());
        };
        Ok(tape
            .records
            .range(start..)
            .enumerate()
            .map(|(i, slot)| JournalRecord {
                offset: tape.offset_at(start + i),
                key: slot.key.to_string(),
                frame: Arc::clone(&slot.frame),
            })
            .collect())
    }

    /// Up to `limit` frames after `cursor`, in offset order, for a subscriber
    /// that follows the tape: the n-th frame returned has offset
    /// `cursor.offset()` plus `n`. Cheaper than [`EventJournal::replay_after`]
    /// (no keys are copied) and not counted as a replay.
    ///
    /// # Errors
    /// As [`EventJournal::replay_after`].
    pub fn frames_after(
        &self,
        view_id: &str,
        cursor: &Cursor,
        limit: usize,
    ) -> Result<Vec<Arc<Bytes>>, ReplayError> {
        let found = self.frames_after_where(view_id, cursor, limit, |_| true)?;
        Ok(found.frames.into_iter().map(|(_, frame)| frame).collect())
    }

    /// [`EventJournal::frames_after`] for a subscriber that reads some keys only: among the
    /// next `limit` records after `cursor`, the frames whose key `keep` takes, each with its
    /// offset, and the offset of the last record looked at (`None`: none follows the cursor).
    ///
    /// # Errors
    /// As [`EventJournal::replay_after`].
    pub fn frames_after_where(
        &self,
        view_id: &str,
        cursor: &Cursor,
        limit: usize,
        keep: impl Fn(&str) -> bool,
    ) -> Result<FramesWhere, ReplayError> {
        let now = self.now();
        let mut inner = self.lock();
        let start = inner.start_after(view_id, Some(cursor), &self.config, now)?;
        let Some(tape) = inner.views.get(view_id) else {
            return Ok(FramesWhere::default());
        };
        let end = tape.records.len().min(start.saturating_add(limit));
        let frames = tape
            .records
            .range(start..end)
            .enumerate()
            .filter(|(_, slot)| keep(&slot.key))
            .map(|(i, slot)| (tape.offset_at(start + i), Arc::clone(&slot.frame)))
            .collect();
        Ok(FramesWhere {
            frames,
            through: (end > start).then(|| tape.offset_at(end - 1)),
        })
    }

    /// Retained records per view, after pruning by age, sorted by view.
    pub async fn entry_counts(&self) -> Vec<(String, u64)> {
        self.entry_counts_now()
    }

    /// [`EventJournal::entry_counts`], synchronously.
    pub fn entry_counts_now(&self) -> Vec<(String, u64)> {
        self.per_view(|tape| tape.records.len() as u64)
    }

    /// Retained frame bytes per view, after pruning by age, sorted by view.
    pub async fn retained_bytes(&self) -> Vec<(String, u64)> {
        self.retained_bytes_now()
    }

    /// [`EventJournal::retained_bytes`], synchronously.
    pub fn retained_bytes_now(&self) -> Vec<(String, u64)> {
        self.per_view(|tape| tape.bytes as u64)
    }

    /// The names of the views the journal knows, sorted.
    pub fn views(&self) -> Vec<String> {
        let mut names: Vec<String> = self.lock().views.keys().cloned().collect();
        names.sort_unstable();
        names
    }

    fn per_view(&self, measure: impl Fn(&Tape) -> u64) -> Vec<(String, u64)> {
        let now = self.now();
        let mut inner = self.lock();
        let Inner { views, stats, .. } = &mut *inner;
        let mut out: Vec<(String, u64)> = views
            .iter_mut()
            .map(|(name, tape)| {
                tape.prune(&self.config, now, stats);
                (name.clone(), measure(tape))
            })
            .collect();
        out.sort_unstable();
        out
    }
}
