//! The journal: every view's tape under one lock.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use bytes::Bytes;
use compact_str::CompactString;
use tokio::sync::watch;

use crate::clock::{Clock, SystemClock};
use crate::config::JournalConfig;
use crate::cursor::Cursor;
use crate::epoch::JournalEpoch;
use crate::error::ReplayError;
use crate::snapshot::{JournalSnapshot, SnapshotRecord, SnapshotView};
use crate::stats::JournalStats;
use crate::tape::{duration_nanos, Slot, Tape};

/// The offsets a view can serve right now: `first ..= next - 1` of `epoch`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReplayWindow {
    /// The journal's current epoch.
    pub epoch: JournalEpoch,
    /// The first retained offset (equals `next` when nothing is retained).
    pub first: u64,
    /// The offset the next append will take.
    pub next: u64,
    /// Whether offset issuance has stopped.
    pub sealed: bool,
}

/// One retained record, as a replay returns it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JournalRecord {
    /// The record's offset in the current epoch.
    pub offset: u64,
    /// The entity the event is about.
    pub key: String,
    /// The encoded frame, shared with every subscriber.
    pub frame: Arc<Bytes>,
}

/// The tapes of all views, their epoch, and their counters.
///
/// Everything sits behind one `std::sync::Mutex`, held for a few hundred
/// nanoseconds at most and never across an `.await`. One lock is what makes
/// an epoch change (a hydrate) unable to race an append: the cursor embedded
/// in a frame is read and issued in the same critical section.
#[derive(Debug)]
pub struct EventJournal {
    config: JournalConfig,
    clock: Arc<dyn Clock>,
    inner: Mutex<Inner>,
    /// Ticked (after the lock is released) whenever cursors may have become
    /// invalid: a gap was marked or the journal was hydrated.
    invalidations: watch::Sender<u64>,
}

#[derive(Debug)]
struct Inner {
    epoch: JournalEpoch,
    sealed: bool,
    views: HashMap<String, Tape>,
    stats: JournalStats,
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
            None => (1, 1),
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
            None => Tape::new(1, 0).start_after(cursor.offset()),
        }
    }
}

/// What [`EventJournal::frames_after_where`] found.
#[derive(Debug, Default)]
pub struct FramesWhere {
    /// The frames taken, each with its offset, in offset order.
    pub frames: Vec<(u64, Arc<Bytes>)>,
    /// The offset of the last record looked at, taken or not (`None`: none was there).
    pub through: Option<u64>,
}

impl EventJournal {
    /// A journal with a fresh random epoch and the real clock.
    pub fn new(config: JournalConfig) -> Self {
        Self::with_clock(config, Arc::new(SystemClock::new()))
    }

    /// A journal that reads time from `clock` (tests use a [`crate::ManualClock`]).
    pub fn with_clock(config: JournalConfig, clock: Arc<dyn Clock>) -> Self {
        Self {
            config,
            clock,
            inner: Mutex::new(Inner {
                epoch: JournalEpoch::random(),
                sealed: false,
                views: HashMap::new(),
                stats: JournalStats::default(),
            }),
            invalidations: watch::Sender::new(0),
        }
    }

    /// Wakes whenever cursors may have become invalid — a gap was marked or
    /// the journal was hydrated — so followers re-check their position
    /// instead of waiting for the next append.
    pub fn invalidations(&self) -> watch::Receiver<u64> {
        self.invalidations.subscribe()
    }

    /// The journal's settings.
    pub fn config(&self) -> &JournalConfig {
        &self.config
    }

    /// Whether the journal issues offsets at all (see [`JournalConfig::enabled`]).
    pub fn is_enabled(&self) -> bool {
        self.config.enabled
    }

    /// The current epoch.
    pub async fn epoch(&self) -> JournalEpoch {
        self.lock().epoch
    }

    /// Whether [`EventJournal::seal`] has stopped offset issuance.
    pub fn is_sealed(&self) -> bool {
        self.lock().sealed
    }

    /// A copy of the counters.
    pub fn stats(&self) -> JournalStats {
        self.lock().stats.clone()
    }

    /// Appends a record to `view_id`, building its frame from the offset it
    /// takes.
    ///
    /// Returns `Ok(Some((offset, frame)))` on success. Returns `Ok(None)`
    /// without calling `build_frame` when the journal is disabled or sealed:
    /// the caller then publishes a cursorless frame to live subscribers.
    ///
    /// # Errors
    /// Whatever `build_frame` returns; no offset is consumed then.
    pub async fn append_with<E>(
        &self,
        view_id: &str,
        key: &str,
        build_frame: impl FnOnce(u64) -> Result<Arc<Bytes>, E>,
    ) -> Result<Option<(u64, Arc<Bytes>)>, E> {
        let appended = self.append_with_cursor(view_id, key, |cursor| build_frame(cursor.offset()));
        Ok(appended?.map(|(cursor, frame)| (cursor.offset(), frame)))
    }

    /// Like [`EventJournal::append_with`], but hands `build_frame` the whole
    /// [`Cursor`] (epoch and offset), read under the same lock that issues
    /// the offset. Use this to embed the cursor in the frame: no restore can
    /// change the epoch between reading it and appending. Synchronous, so it
    /// can be called from a non-async context such as a WebAssembly host.
    ///
    /// # Errors
    /// Whatever `build_frame` returns; no offset is consumed then.
    pub fn append_with_cursor<E>(
        &self,
        view_id: &str,
        key: &str,
        build_frame: impl FnOnce(Cursor) -> Result<Arc<Bytes>, E>,
    ) -> Result<Option<(Cursor, Arc<Bytes>)>, E> {
        self.append_at(view_id, key, self.clock.unix_ms(), build_frame)
    }

    /// [`EventJournal::append_with_cursor`] for a record that was written at `unix_ms` (wall
    /// clock) rather than now: a replay of logged input keeps each record's original age, so
    /// age retention treats it as it would have. A time in the future counts as now.
    ///
    /// # Errors
    /// Whatever `build_frame` returns; no offset is consumed then.
    pub fn append_at<E>(
        &self,
        view_id: &str,
        key: &str,
        unix_ms: u64,
        build_frame: impl FnOnce(Cursor) -> Result<Arc<Bytes>, E>,
    ) -> Result<Option<(Cursor, Arc<Bytes>)>, E> {
        let now = self.now();
        let age_ms = self.clock.unix_ms().saturating_sub(unix_ms);
        let at =
            now.saturating_sub(i64::try_from(age_ms.saturating_mul(1_000_000)).unwrap_or(i64::MAX));
        let mut inner = self.lock();
        if !self.config.enabled {
            inner.stats.cursorless_disabled += 1;
            return Ok(None);
        }
        if inner.sealed {
            inner.stats.cursorless_after_seal += 1;
            return Ok(None);
        }
        let epoch = inner.epoch;
        let Inner { views, stats, .. } = &mut *inner;
        let tape = match views.get_mut(view_id) {
            Some(tape) => tape,
            None => views
                .entry(view_id.to_owned())
                .or_insert_with(|| Tape::new(1, 0)),
        };
        let cursor = Cursor::new(epoch, tape.next());
        let frame = build_frame(cursor)?;
        tape.push(Slot {
            frame: Arc::clone(&frame),
            key: CompactString::new(key),
            at,
        });
        tape.prune(&self.config, now, stats);
        stats.appends += 1;
        Ok(Some((cursor, frame)))
    }

    /// Stops offset issuance, permanently and idempotently: later appends
    /// return `Ok(None)`. The retained tape stays readable.
    pub fn seal(&self) {
        self.lock().sealed = true;
    }

    /// Records that events were lost now: every cursor issued before this
    /// call fails closed with [`ReplayError::Gap`]; cursors issued after it
    /// replay normally.
    ///
    /// The gap takes one offset on the tape of every view that has issued
    /// one: a record with an empty key and an empty frame, so that the head
    /// cursor right after the gap differs from every cursor before it. While
    /// sealed no offset can be taken; the gap is then recorded as pending and
    /// takes its offset when an exact hydrate unseals the tape.
    pub async fn mark_gap(&self) {
        self.mark_gap_where(|_| true);
    }

    /// [`EventJournal::mark_gap`] on the named views only: cursors of every other view stay
    /// valid. For a runtime that lost input, whose loss touches only the views it publishes to.
    pub fn mark_gap_in<'a>(&self, views: impl IntoIterator<Item = &'a str>) {
        let views: Vec<&str> = views.into_iter().collect();
        self.mark_gap_where(|view| views.contains(&view));
    }

    fn mark_gap_where(&self, affected: impl Fn(&str) -> bool) {
        let now = self.now();
        let mut inner = self.lock();
        let Inner {
            sealed,
            views,
            stats,
            ..
        } = &mut *inner;
        let tapes = views
            .iter_mut()
            .filter(|(name, tape)| tape.next() > 1 && affected(name.as_str()));
        for (_, tape) in tapes {
            if *sealed {
                tape.gap_floor = tape.next();
            } else {
                tape.push_gap(now);
                tape.prune(&self.config, now, stats);
            }
        }
        stats.gaps_marked += 1;
        drop(inner);
        self.invalidations.send_modify(|n| *n += 1);
    }

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
        let first = tape.first;
        Ok(tape
            .records
            .range(start..)
            .enumerate()
            .map(|(i, slot)| JournalRecord {
                offset: first + (start + i) as u64,
                key: slot.key.to_string(),
                frame: Arc::clone(&slot.frame),
            })
            .collect())
    }

    /// Up to `limit` frames after `cursor`, in offset order, for a subscriber
    /// that follows the tape: the n-th frame returned has offset
    /// `cursor.offset() + n`. Cheaper than [`EventJournal::replay_after`]
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
        let offset = |index: usize| tape.first + index as u64;
        let frames = tape
            .records
            .range(start..end)
            .enumerate()
            .filter(|(_, slot)| keep(&slot.key))
            .map(|(i, slot)| (offset(start + i), Arc::clone(&slot.frame)))
            .collect();
        Ok(FramesWhere {
            frames,
            through: (end > start).then(|| offset(end - 1)),
        })
    }

    /// Every view's records and offsets, with its epoch, for a snapshot.
    /// Clones `Arc`s, not frame bytes.
    pub async fn dump(&self) -> JournalSnapshot {
        let now = self.now();
        let taken_at_unix_ms = self.clock.unix_ms();
        let mut inner = self.lock();
        let Inner {
            epoch,
            views,
            stats,
            ..
        } = &mut *inner;
        let views = views
            .iter_mut()
            .map(|(name, tape)| {
                tape.prune(&self.config, now, stats);
                SnapshotView {
                    name: name.clone(),
                    first: tape.first,
                    gap_floor: tape.gap_floor,
                    records: tape
                        .records
                        .iter()
                        .map(|slot| SnapshotRecord {
                            key: slot.key.clone(),
                            age_ms: u64::try_from(now.saturating_sub(slot.at) / 1_000_000)
                                .unwrap_or(0),
                            frame: Arc::clone(&slot.frame),
                        })
                        .collect(),
                }
            })
            .collect();
        JournalSnapshot {
            epoch: self.config.enabled.then_some(*epoch),
            taken_at_unix_ms,
            views,
        }
    }

    /// Replaces every view with the snapshot's.
    ///
    /// `exact` adopts the snapshot's epoch, offsets and gap marks and leaves
    /// the journal unsealed, so it issues offsets again. Otherwise a fresh
    /// epoch is taken and each view restarts with an empty tape at the
    /// snapshot's next offset: every earlier cursor fails closed, and no
    /// frame embedding an old cursor is served under the new epoch. A
    /// snapshot without an epoch, and any view that fails
    /// [`JournalSnapshot::validate`], is discarded. Retention is re-applied,
    /// with record ages carried across the time between dump and hydrate.
    pub async fn hydrate(&self, snapshot: JournalSnapshot, exact: bool) {
        let Some(snapshot_epoch) = snapshot.epoch else {
            return;
        };
        let now = self.now();
        let elapsed_ms = self
            .clock
            .unix_ms()
            .saturating_sub(snapshot.taken_at_unix_ms);
        let mut views = HashMap::with_capacity(snapshot.views.len());
        for view in snapshot.views {
            if view.validate().is_err() {
                continue;
            }
            let next = view.next();
            let tape = if exact {
                let mut tape = Tape::new(view.first, view.gap_floor);
                tape.records.reserve_exact(view.records.len());
                for record in view.records {
                    let age_ms = record.age_ms.saturating_add(elapsed_ms);
                    let age = i64::try_from(age_ms)
                        .unwrap_or(i64::MAX)
                        .saturating_mul(1_000_000);
                    tape.push(Slot {
                        key: record.key,
                        frame: record.frame,
                        at: now.saturating_sub(age),
                    });
                }
                if tape.gap_floor == next && next > 1 {
                    // A gap marked while sealed takes its offset now.
                    tape.push_gap(now);
                }
                tape
            } else {
                Tape::new(next, 0)
            };
            views.insert(view.name, tape);
        }
        let mut inner = self.lock();
        let Inner { stats, .. } = &mut *inner;
        for tape in views.values_mut() {
            tape.prune(&self.config, now, stats);
        }
        inner.views = views;
        inner.sealed = false;
        if exact {
            inner.epoch = snapshot_epoch;
        } else {
            let mut epoch = JournalEpoch::random_other_than(snapshot_epoch);
            while epoch == inner.epoch {
                epoch = JournalEpoch::random_other_than(snapshot_epoch);
            }
            inner.epoch = epoch;
        }
        drop(inner);
        self.invalidations.send_modify(|n| *n += 1);
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

    fn now(&self) -> i64 {
        duration_nanos(self.clock.now())
    }

    /// The lock is never held across a call that can panic midway through a
    /// mutation (frame builders run before the record is pushed), so a
    /// poisoned lock still guards consistent state.
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::ManualClock;

    fn frame(text: &str) -> Arc<Bytes> {
        Arc::new(Bytes::copy_from_slice(text.as_bytes()))
    }

    fn journal_with(config: JournalConfig) -> (EventJournal, Arc<ManualClock>) {
        let clock = Arc::new(ManualClock::new(1_700_000_000_000));
        (EventJournal::with_clock(config, clock.clone()), clock)
    }

    #[tokio::test]
    async fn a_record_appended_with_its_original_time_keeps_its_age() {
        let config = JournalConfig {
            max_age: Duration::from_secs(60),
            ..JournalConfig::default()
        };
        let (journal, clock) = journal_with(config);
        let now = clock.unix_ms();
        let append_at = |key: &str, at: u64| {
            journal
                .append_at("a", key, at, |c| Ok::<_, ()>(frame(&c.to_string())))
                .unwrap()
                .map(|(cursor, _)| cursor.offset())
        };
        assert_eq!(append_at("old", now - 90_000), Some(1));
        assert_eq!(
            journal.window("a").await.first,
            2,
            "older than max_age: pruned"
        );
        assert_eq!(append_at("recent", now - 50_000), Some(2));
        assert_eq!(append_at("future", now + 5_000), Some(3));
        clock.advance(Duration::from_secs(15));
        let window = journal.window("a").await;
        assert_eq!(
            (window.first, window.next),
            (3, 4),
            "50 s + 15 s is past 60 s"
        );
    }

    async fn append(journal: &EventJournal, view: &str, key: &str) -> Option<u64> {
        journal
            .append_with(view, key, |offset| {
                Ok::<_, ()>(frame(&format!("{view}:{offset}")))
            })
            .await
            .unwrap()
            .map(|(offset, _)| offset)
    }

    #[tokio::test]
    async fn offsets_are_dense_per_view_and_frames_embed_them() {
        let (journal, _) = journal_with(JournalConfig::default());
        for expected in 1..=3 {
            assert_eq!(append(&journal, "a", "k").await, Some(expected));
        }
        assert_eq!(append(&journal, "b", "k").await, Some(1));
        let records = journal.replay_after("a", None).await.unwrap();
        let offsets: Vec<u64> = records.iter().map(|r| r.offset).collect();
        assert_eq!(offsets, [1, 2, 3]);
        assert_eq!(&records[1].frame[..], b"a:2");
        assert_eq!(records[1].key, "k");
    }

    #[tokio::test]
    async fn a_failing_builder_consumes_no_offset() {
        let (journal, _) = journal_with(JournalConfig::default());
        let failed = journal
            .append_with("a", "k", |_| Err::<Arc<Bytes>, _>("boom"))
            .await;
        assert_eq!(failed, Err("boom"));
        assert_eq!(append(&journal, "a", "k").await, Some(1));
        assert_eq!(journal.stats().appends, 1);
    }

    #[tokio::test]
    async fn append_with_cursor_hands_the_builder_the_epoch() {
        let (journal, _) = journal_with(JournalConfig::default());
        let epoch = journal.epoch().await;
        let (cursor, built) = journal
            .append_with_cursor("a", "k", |cursor| Ok::<_, ()>(frame(&cursor.to_string())))
            .unwrap()
            .unwrap();
        assert_eq!(cursor, Cursor::new(epoch, 1));
        assert_eq!(&built[..], format!("{epoch}-1").as_bytes());
    }

    #[tokio::test]
    async fn replay_after_the_cursor_and_at_the_head() {
        let (journal, _) = journal_with(JournalConfig::default());
        for _ in 0..5 {
            append(&journal, "a", "k").await;
        }
        let epoch = journal.epoch().await;
        let after_two = journal
            .replay_after("a", Some(&Cursor::new(epoch, 2)))
            .await
            .unwrap();
        assert_eq!(
            after_two.iter().map(|r| r.offset).collect::<Vec<_>>(),
            [3, 4, 5]
        );
        assert!(journal
            .replay_after("a", Some(&Cursor::new(epoch, 5)))
            .await
            .unwrap()
            .is_empty());
        assert!(
            journal
                .replay_after("a", Some(&Cursor::new(epoch, 0)))
                .await
                .unwrap()
                .len()
                == 5
        );
        assert_eq!(
            journal
                .replay_after("a", Some(&Cursor::new(epoch, 6)))
                .await,
            Err(ReplayError::Ahead { cursor: 6, next: 6 })
        );
        let other = JournalEpoch::random_other_than(epoch);
        assert_eq!(
            journal
                .replay_after("a", Some(&Cursor::new(other, 1)))
                .await,
            Err(ReplayError::StaleEpoch {
                cursor: other,
                current: epoch
            })
        );
        // An unknown view is an empty view.
        assert!(journal
            .replay_after("nobody", Some(&Cursor::new(epoch, 0)))
            .await
            .unwrap()
            .is_empty());
        assert!(matches!(
            journal
                .replay_after("nobody", Some(&Cursor::new(epoch, 1)))
                .await,
            Err(ReplayError::Ahead { .. })
        ));
        let stats = journal.stats();
        assert_eq!(stats.replays_served, 4);
        assert_eq!(stats.replays_refused_ahead, 2);
        assert_eq!(stats.replays_refused_stale_epoch, 1);
    }

    #[tokio::test]
    async fn frames_after_pages_through_the_tape() {
        let (journal, _) = journal_with(JournalConfig::default());
        for _ in 0..5 {
            append(&journal, "a", "k").await;
        }
        let epoch = journal.epoch().await;
        let page = journal
            .frames_after("a", &Cursor::new(epoch, 1), 2)
            .unwrap();
        assert_eq!(
            page.iter().map(|f| &f[..]).collect::<Vec<_>>(),
            [b"a:2", b"a:3"]
        );
        assert!(journal
            .frames_after("a", &Cursor::new(epoch, 5), 2)
            .unwrap()
            .is_empty());
    }

    #[tokio::test]
    async fn frames_after_where_takes_some_keys_and_says_how_far_it_looked() {
        let (journal, _) = journal_with(JournalConfig::default());
        for key in ["x", "y", "x", "y", "y"] {
            append(&journal, "a", key).await;
        }
        let epoch = journal.epoch().await;
        let page = |after: u64, limit: usize| {
            let found = journal
                .frames_after_where("a", &Cursor::new(epoch, after), limit, |k| k == "x")
                .unwrap();
            let frames: Vec<(u64, Vec<u8>)> = found
                .frames
                .iter()
                .map(|(offset, frame)| (*offset, frame.to_vec()))
                .collect();
            (frames, found.through)
        };
        assert_eq!(
            page(0, 10),
            (vec![(1, b"a:1".to_vec()), (3, b"a:3".to_vec())], Some(5))
        );
        assert_eq!(page(1, 2), (vec![(3, b"a:3".to_vec())], Some(3)));
        assert_eq!(page(3, 10), (vec![], Some(5)));
        assert_eq!(page(5, 10), (vec![], None));
        assert!(matches!(
            journal.frames_after_where("a", &Cursor::new(epoch, 9), 1, |_| true),
            Err(ReplayError::Ahead { .. })
        ));
    }

    #[tokio::test]
    async fn count_and_byte_bounds_prune_oldest_first() {
        let (journal, _) = journal_with(JournalConfig {
            max_records_per_view: 3,
            max_bytes_per_view: 12,
            ..JournalConfig::default()
        });
        for _ in 0..4 {
            append(&journal, "a", "k").await; // frames "a:1".."a:4": 3 bytes each
        }
        let window = journal.window("a").await;
        assert_eq!((window.first, window.next), (2, 5));
        assert_eq!(journal.stats().pruned_count, 1);
        let epoch = window.epoch;
        assert_eq!(
            journal
                .replay_after("a", Some(&Cursor::new(epoch, 0)))
                .await,
            Err(ReplayError::Expired {
                cursor: 0,
                first: 2
            })
        );
        assert_eq!(
            journal
                .replay_after("a", Some(&Cursor::new(epoch, 1)))
                .await
                .unwrap()
                .len(),
            3
        );

        journal
            .append_with("a", "k", |_| Ok::<_, ()>(frame("0123456789")))
            .await
            .unwrap();
        // Four records again: the count bound drops "a:2" first; then
        // 3 + 3 + 10 > 12 makes the byte bound drop "a:3" and "a:4".
        assert_eq!(journal.entry_counts().await, [("a".to_owned(), 1)]);
        assert_eq!(journal.retained_bytes().await, [("a".to_owned(), 10)]);
        let stats = journal.stats();
        assert_eq!((stats.pruned_count, stats.pruned_bytes), (2, 2));
    }

    #[tokio::test]
    async fn age_bound_holds_for_a_quiet_view() {
        let (journal, clock) = journal_with(JournalConfig {
            max_age: Duration::from_millis(1500),
            ..JournalConfig::default()
        });
        append(&journal, "a", "k").await;
        clock.advance(Duration::from_millis(1000));
        append(&journal, "a", "k").await;
        clock.advance(Duration::from_millis(500));
        assert_eq!(
            journal.window("a").await.first,
            1,
            "exactly max_age old is kept"
        );
        clock.advance(Duration::from_millis(1));
        let window = journal.window("a").await;
        assert_eq!((window.first, window.next), (2, 3));
        clock.advance(Duration::from_millis(1000));
        let window = journal.window("a").await;
        assert_eq!((window.first, window.next), (3, 3));
        assert_eq!(journal.stats().pruned_age, 2);
        let epoch = window.epoch;
        assert!(journal
            .replay_after("a", Some(&Cursor::new(epoch, 2)))
            .await
            .unwrap()
            .is_empty());
        assert_eq!(
            journal
                .replay_after("a", Some(&Cursor::new(epoch, 1)))
                .await,
            Err(ReplayError::Expired {
                cursor: 1,
                first: 3
            })
        );
    }

    #[tokio::test]
    async fn seal_stops_offsets_without_calling_the_builder() {
        let (journal, _) = journal_with(JournalConfig::default());
        append(&journal, "a", "k").await;
        journal.seal();
        journal.seal();
        let mut called = false;
        let result = journal
            .append_with("a", "k", |_| {
                called = true;
                Ok::<_, ()>(frame("x"))
            })
            .await;
        assert_eq!(result, Ok(None));
        assert!(!called);
        assert!(journal.window("a").await.sealed);
        assert_eq!(journal.replay_after("a", None).await.unwrap().len(), 1);
        assert_eq!(journal.stats().cursorless_after_seal, 1);
    }

    #[tokio::test]
    async fn disabled_journal_keeps_nothing_and_refuses_replays() {
        let (journal, _) = journal_with(JournalConfig {
            enabled: false,
            ..JournalConfig::default()
        });
        assert!(!journal.is_enabled());
        assert_eq!(append(&journal, "a", "k").await, None);
        assert_eq!(
            journal.replay_after("a", None).await,
            Err(ReplayError::Disabled)
        );
        assert_eq!(journal.stats().cursorless_disabled, 1);
        assert!(journal.dump().await.epoch.is_none());
    }

    #[tokio::test]
    async fn a_gap_takes_an_offset_and_fails_older_cursors_only() {
        let (journal, _) = journal_with(JournalConfig::default());
        append(&journal, "a", "k").await;
        append(&journal, "a", "k").await;
        journal.mark_gap().await;
        let epoch = journal.epoch().await;
        // The head right after the gap is a cursor no one held before it.
        assert_eq!(journal.window("a").await.next, 4);
        assert!(journal
            .replay_after("a", Some(&Cursor::new(epoch, 3)))
            .await
            .unwrap()
            .is_empty());
        assert_eq!(append(&journal, "a", "k").await, Some(4));
        for offset in [0, 1, 2] {
            assert_eq!(
                journal
                    .replay_after("a", Some(&Cursor::new(epoch, offset)))
                    .await,
                Err(ReplayError::Gap {
                    cursor: offset,
                    resume_from: 3
                })
            );
        }
        let after = journal
            .replay_after("a", Some(&Cursor::new(epoch, 3)))
            .await
            .unwrap();
        assert_eq!(after.iter().map(|r| r.offset).collect::<Vec<_>>(), [4]);
        // Without a cursor the whole retained tape is served, the gap
        // record (empty key and frame) included.
        let all = journal.replay_after("a", None).await.unwrap();
        assert_eq!(all.len(), 4);
        assert!(all[2].key.is_empty() && all[2].frame.is_empty());
        // A view with no offsets issued has nothing to protect.
        assert!(journal
            .replay_after("b", Some(&Cursor::new(epoch, 0)))
            .await
            .unwrap()
            .is_empty());
        assert_eq!(journal.stats().replays_refused_gap, 3);
    }

    #[tokio::test]
    async fn a_gap_in_some_views_leaves_the_others_alone() {
        let (journal, _) = journal_with(JournalConfig::default());
        for view in ["a", "b"] {
            append(&journal, view, "k").await;
            append(&journal, view, "k").await;
        }
        journal.mark_gap_in(["a"]);
        let epoch = journal.epoch().await;
        assert!(matches!(
            journal
                .replay_after("a", Some(&Cursor::new(epoch, 1)))
                .await,
            Err(ReplayError::Gap { .. })
        ));
        assert_eq!(
            journal.window("a").await.next,
            4,
            "the gap took an offset in a"
        );
        let b = journal
            .replay_after("b", Some(&Cursor::new(epoch, 1)))
            .await
            .unwrap();
        assert_eq!(b.iter().map(|r| r.offset).collect::<Vec<_>>(), [2]);
        assert_eq!(journal.window("b").await.next, 3, "no offset taken in b");
    }

    #[tokio::test]
    async fn a_gap_marked_while_sealed_takes_its_offset_in_the_next_life() {
        let (journal, clock) = journal_with(JournalConfig::default());
        append(&journal, "a", "k").await;
        journal.seal();
        journal.mark_gap().await;
        let epoch = journal.epoch().await;
        assert!(matches!(
            journal
                .replay_after("a", Some(&Cursor::new(epoch, 1)))
                .await,
            Err(ReplayError::Gap {
                cursor: 1,
                resume_from: 2
            })
        ));
        let next = EventJournal::with_clock(JournalConfig::default(), clock);
        next.hydrate(journal.dump().await, true).await;
        let window = next.window("a").await;
        assert_eq!((window.first, window.next), (1, 3));
        assert!(next
            .replay_after("a", Some(&Cursor::new(epoch, 2)))
            .await
            .unwrap()
            .is_empty());
        assert!(matches!(
            next.replay_after("a", Some(&Cursor::new(epoch, 1))).await,
            Err(ReplayError::Gap { .. })
        ));
    }

    #[tokio::test]
    async fn exact_hydrate_keeps_epoch_offsets_gaps_and_ages() {
        let (journal, clock) = journal_with(JournalConfig {
            max_age: Duration::from_secs(10),
            ..JournalConfig::default()
        });
        append(&journal, "a", "k1").await;
        clock.advance(Duration::from_secs(1));
        append(&journal, "a", "k2").await;
        journal.mark_gap().await;
        clock.advance(Duration::from_secs(5));
        append(&journal, "a", "k3").await;
        journal.seal();
        let epoch = journal.epoch().await;
        let dump = journal.dump().await;
        // k1, k2, the gap record (offset 3), k3 (offset 4).
        assert_eq!(dump.record_count(), 4);

        // The next life starts 5 s later: k1 is 11 s old, k2 exactly 10 s.
        let later = Arc::new(ManualClock::new(clock.unix_ms() + 5_000));
        let next = EventJournal::with_clock(journal.config().clone(), later);
        next.hydrate(dump, true).await;
        assert_eq!(next.epoch().await, epoch);
        let window = next.window("a").await;
        assert_eq!((window.first, window.next, window.sealed), (2, 5, false));
        assert_eq!(append(&next, "a", "k5").await, Some(5));
        let records = next
            .replay_after("a", Some(&Cursor::new(epoch, 4)))
            .await
            .unwrap();
        assert_eq!(records.len(), 1);
        assert_eq!(
            (&records[0].frame[..], records[0].key.as_str()),
            (&b"a:5"[..], "k5")
        );
        assert_eq!(
            next.replay_after("a", Some(&Cursor::new(epoch, 2))).await,
            Err(ReplayError::Gap {
                cursor: 2,
                resume_from: 3
            })
        );
        assert_eq!(
            next.replay_after("a", Some(&Cursor::new(epoch, 0))).await,
            Err(ReplayError::Expired {
                cursor: 0,
                first: 2
            })
        );
    }

    #[tokio::test]
    async fn periodic_hydrate_takes_a_fresh_epoch_and_an_empty_tape() {
        let (journal, _) = journal_with(JournalConfig::default());
        append(&journal, "a", "k").await;
        append(&journal, "a", "k").await;
        let old = journal.epoch().await;
        let dump = journal.dump().await;
        journal.hydrate(dump, false).await;
        let window = journal.window("a").await;
        assert_ne!(window.epoch, old);
        assert_eq!((window.first, window.next), (3, 3));
        assert!(matches!(
            journal.replay_after("a", Some(&Cursor::new(old, 2))).await,
            Err(ReplayError::StaleEpoch { .. })
        ));
        let (cursor, built) = journal
            .append_with_cursor("a", "k", |c| Ok::<_, ()>(frame(&c.to_string())))
            .unwrap()
            .unwrap();
        assert_eq!(cursor, Cursor::new(window.epoch, 3));
        assert_eq!(&built[..], cursor.to_string().as_bytes());
    }

    #[tokio::test]
    async fn hydrate_discards_epochless_snapshots_and_invalid_views() {
        let (journal, _) = journal_with(JournalConfig::default());
        append(&journal, "a", "k").await;
        let epoch = journal.epoch().await;
        let mut dump = journal.dump().await;
        dump.epoch = None;
        journal.hydrate(dump.clone(), true).await;
        assert_eq!(journal.epoch().await, epoch);
        assert_eq!(journal.entry_counts().await, [("a".to_owned(), 1)]);

        dump.epoch = Some(epoch);
        dump.views[0].first = 0;
        assert!(dump.validate().is_err());
        journal.hydrate(dump, true).await;
        assert!(journal.entry_counts().await.is_empty());
    }

    #[tokio::test]
    async fn dump_shares_frames_instead_of_copying() {
        let (journal, _) = journal_with(JournalConfig::default());
        let shared = frame("shared");
        journal
            .append_with("a", "k", |_| Ok::<_, ()>(shared.clone()))
            .await
            .unwrap();
        let dump = journal.dump().await;
        assert!(Arc::ptr_eq(&dump.views[0].records[0].frame, &shared));
    }
}
