use std::sync::{Arc, MutexGuard};

use bytes::Bytes;
use compact_str::CompactString;

use super::{EventJournal, Inner};
use crate::cursor::Cursor;
use crate::offset::ViewOffset;
use crate::tape::{Slot, Tape};

/// A run of appends to one view under one hold of the journal's lock
/// ([`EventJournal::appender`]).
pub struct Appender<'a> {
    journal: &'a EventJournal,
    inner: MutexGuard<'a, Inner>,
    view_id: &'a str,
    /// The clock when the run began.
    now: i64,
    /// The records' time on the journal's clock.
    at: i64,
}

impl Appender<'_> {
    /// Appends a record, building its frame from the cursor it takes: the result of
    /// [`EventJournal::append_with_cursor`].
    ///
    /// # Errors
    /// Whatever `build_frame` returns; no offset is consumed then.
    pub fn append<E>(
        &mut self,
        key: &str,
        build_frame: impl FnOnce(Cursor) -> Result<Arc<Bytes>, E>,
    ) -> Result<Option<(Cursor, Arc<Bytes>)>, E> {
        let config = &self.journal.config;
        let inner = &mut *self.inner;
        if !config.enabled {
            inner.stats.cursorless_disabled += 1;
            return Ok(None);
        }
        if inner.sealed {
            inner.stats.cursorless_after_seal += 1;
            return Ok(None);
        }
        let epoch = inner.epoch;
        let Inner { views, stats, .. } = inner;
        let tape = match views.get_mut(self.view_id) {
            Some(tape) => tape,
            None => views
                .entry(self.view_id.to_owned())
                .or_insert_with(|| Tape::new(ViewOffset::FIRST, ViewOffset::ZERO)),
        };
        let cursor = Cursor::new(epoch, tape.next());
        let frame = build_frame(cursor)?;
        tape.push(Slot {
            frame: Arc::clone(&frame),
            key: CompactString::new(key),
            at: self.at,
        });
        tape.prune(config, self.now, stats);
        stats.appends += 1;
        Ok(Some((cursor, frame)))
    }
}

impl EventJournal {
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
        build_frame: impl FnOnce(ViewOffset) -> Result<Arc<Bytes>, E>,
    ) -> Result<Option<(ViewOffset, Arc<Bytes>)>, E> {
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
        self.appender(view_id, unix_ms).append(key, build_frame)
    }

    /// Holds the journal for a run of appends to `view_id`, all written at `unix_ms` (as
    /// [`EventJournal::append_at`]): one lock and one clock reading for the run instead of one
    /// per record. Every other reader and writer of the journal waits while it is held: keep
    /// runs short (tens of records), and never hold one across an `.await`.
    pub fn appender<'a>(&'a self, view_id: &'a str, unix_ms: u64) -> Appender<'a> {
        let now = self.now();
        let age_ms = self.clock.unix_ms().saturating_sub(unix_ms);
        let at =
            now.saturating_sub(i64::try_from(age_ms.saturating_mul(1_000_000)).unwrap_or(i64::MAX));
        Appender {
            journal: self,
            inner: self.lock(),
            view_id,
            now,
            at,
        }
    }

    /// Stops offset issuance, permanently and idempotently: later appends
    /// return `Ok(None)`. The retained tape stays readable.
    pub fn seal(&self) {
        self.lock().sealed = true;
    }

    /// Records that events were lost now: every cursor issued before this
    /// call fails closed with [`ReplayError::Gap`](crate::ReplayError::Gap);
    /// cursors issued after it replay normally.
    ///
    /// The gap takes one offset on the tape of every view that has issued
    /// one: a record with an empty key and an empty frame, so that the head
    /// cursor right after the gap differs from every cursor before it. While
    /// sealed no offset can be taken; the gap is then recorded as pending and
    /// takes its offset when an exact hydrate unseals the tape.
    pub async fn mark_gap(&self) {
        self.mark_gap_where(|_| true, &Lost::default());
    }

    /// [`EventJournal::mark_gap`] on the views `affected` selects, after
    /// `lost` offsets: the one implementation of a gap, which a
    /// [`JournalScope`](crate::JournalScope) narrows to its runtime's views.
    pub(crate) fn mark_gap_where(&self, affected: impl Fn(&str) -> bool, lost: &Lost<'_>) {
        let now = self.now();
        let mut inner = self.lock();
        let Inner {
            sealed,
            views,
            stats,
            ..
        } = &mut *inner;
        if lost.offsets > 0 {
            // A view that issued nothing in this life may have issued offsets in the one lost.
            for name in lost.named {
                views
                    .entry(name.clone())
                    .or_insert_with(|| Tape::new(ViewOffset::FIRST, ViewOffset::ZERO));
            }
        }
        let tapes = views.iter_mut().filter(|(name, tape)| {
            (lost.offsets > 0 || tape.next() > ViewOffset::FIRST) && affected(name.as_str())
        });
        for (_, tape) in tapes {
            if *sealed {
                // No offset is issued again once sealed: none can be reused.
                tape.gap_floor = tape.next();
            } else {
                tape.push_gap(now, lost.offsets);
                tape.prune(&self.config, now, stats);
            }
        }
        stats.gaps_marked += 1;
        drop(inner);
        self.invalidations.send_modify(|n| *n += 1);
    }
}

/// Offsets a gap goes on past: `offsets` issued in a life of the server the journal does not
/// remember, on each of its views, and the views `named` exactly, which get a tape if they
/// have none (see [`JournalScope::report_loss`](crate::JournalScope::report_loss)).
#[derive(Debug, Default)]
pub(crate) struct Lost<'a> {
    pub offsets: u64,
    pub named: &'a [String],
}

#[cfg(test)]
mod tests {
    use super::super::tests::{append, journal_with};
    use super::*;
    use crate::config::JournalConfig;
    use crate::error::ReplayError;

    #[tokio::test]
    async fn a_gap_takes_an_offset_and_fails_older_cursors_only() {
        let (journal, _) = journal_with(JournalConfig::default());
        append(&journal, "a", "k").await;
        append(&journal, "a", "k").await;
        journal.mark_gap().await;
        let epoch = journal.epoch().await;
        // The head right after the gap is a cursor no one held before it.
        assert_eq!(journal.window("a").await.next.get(), 4);
        assert!(journal
            .replay_after("a", Some(&Cursor::new(epoch, ViewOffset::new(3))))
            .await
            .unwrap()
            .is_empty());
        assert_eq!(append(&journal, "a", "k").await, Some(4));
        for offset in [0, 1, 2].map(ViewOffset::new) {
            assert_eq!(
                journal
                    .replay_after("a", Some(&Cursor::new(epoch, offset)))
                    .await,
                Err(ReplayError::Gap {
                    cursor: offset,
                    resume_from: ViewOffset::new(3)
                })
            );
        }
        let after = journal
            .replay_after("a", Some(&Cursor::new(epoch, ViewOffset::new(3))))
            .await
            .unwrap();
        assert_eq!(
            after.iter().map(|r| r.offset.get()).collect::<Vec<_>>(),
            [4]
        );
        // Without a cursor the whole retained tape is served, the gap
        // record (empty key and frame) included.
        let all = journal.replay_after("a", None).await.unwrap();
        assert_eq!(all.len(), 4);
        assert!(all[2].key.is_empty() && all[2].frame.is_empty());
        // A view with no offsets issued has nothing to protect.
        assert!(journal
            .replay_after("b", Some(&Cursor::new(epoch, ViewOffset::new(0))))
            .await
            .unwrap()
            .is_empty());
        assert_eq!(journal.stats().replays_refused_gap, 3);
    }

    #[tokio::test]
    async fn a_gap_marked_while_sealed_takes_its_offset_in_the_next_life() {
        let (journal, clock) = journal_with(JournalConfig::default());
        append(&journal, "a", "k").await;
        journal.seal();
        journal.mark_gap().await;
        let epoch = journal.epoch().await;
        assert_eq!(
            journal
                .replay_after("a", Some(&Cursor::new(epoch, ViewOffset::new(1))))
                .await,
            Err(ReplayError::Gap {
                cursor: ViewOffset::new(1),
                resume_from: ViewOffset::new(2)
            })
        );
        let next = EventJournal::with_clock(JournalConfig::default(), clock);
        next.hydrate(journal.dump().await, true).await;
        let window = next.window("a").await;
        assert_eq!((window.first.get(), window.next.get()), (1, 3));
        assert!(next
            .replay_after("a", Some(&Cursor::new(epoch, ViewOffset::new(2))))
            .await
            .unwrap()
            .is_empty());
        assert!(matches!(
            next.replay_after("a", Some(&Cursor::new(epoch, ViewOffset::new(1))))
                .await,
            Err(ReplayError::Gap { .. })
        ));
    }
}
