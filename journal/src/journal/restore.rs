use std::collections::HashMap;
use std::sync::Arc;

use super::{EventJournal, Inner};
use crate::epoch::JournalEpoch;
use crate::offset::ViewOffset;
use crate::snapshot::{JournalSnapshot, SnapshotRecord, SnapshotView};
use crate::tape::{Slot, Tape};

impl EventJournal {
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
                if tape.gap_floor == next && next > ViewOffset::FIRST {
                    // A gap marked while sealed takes its offset now.
                    tape.push_gap(now, 0);
                }
                tape
            } else {
                Tape::new(next, ViewOffset::ZERO)
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
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::super::tests::{append, frame, journal_with};
    use super::*;
    use crate::clock::Clock;
    use crate::config::JournalConfig;
    use crate::cursor::Cursor;
    use crate::error::ReplayError;
    use crate::ManualClock;

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
        assert_eq!(
            (window.first.get(), window.next.get(), window.sealed),
            (2, 5, false)
        );
        assert_eq!(append(&next, "a", "k5").await, Some(5));
        let records = next
            .replay_after("a", Some(&Cursor::new(epoch, ViewOffset::new(4))))
            .await
            .unwrap();
        assert_eq!(records.len(), 1);
        assert_eq!(
            (&records[0].frame[..], records[0].key.as_str()),
            (&b"a:5"[..], "k5")
        );
        assert_eq!(
            next.replay_after("a", Some(&Cursor::new(epoch, ViewOffset::new(2))))
                .await,
            Err(ReplayError::Gap {
                cursor: ViewOffset::new(2),
                resume_from: ViewOffset::new(3)
            })
        );
        assert_eq!(
            next.replay_after("a", Some(&Cursor::new(epoch, ViewOffset::new(0))))
                .await,
            Err(ReplayError::Expired {
                cursor: ViewOffset::new(0),
                first: ViewOffset::new(2)
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
        assert_eq!((window.first.get(), window.next.get()), (3, 3));
        assert!(matches!(
            journal
                .replay_after("a", Some(&Cursor::new(old, ViewOffset::new(2))))
                .await,
            Err(ReplayError::StaleEpoch { .. })
        ));
        let (cursor, built) = journal
            .append_with_cursor("a", "k", |c| Ok::<_, ()>(frame(&c.to_string())))
            .unwrap()
            .unwrap();
        assert_eq!(cursor, Cursor::new(window.epoch, ViewOffset::new(3)));
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
        dump.views[0].first = ViewOffset::ZERO;
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
