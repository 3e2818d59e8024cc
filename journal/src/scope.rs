//! A runtime's scope on the journal: the views it publishes to, and the one
//! thing it does to their tapes from inside — report that its input was lost.
//!
//! ## Why a value, not an ambient journal
//!
//! An ingestion runtime must be able to report a discontinuity without being
//! handed the whole journal. The scope could have been ambient — a task-local
//! set around each command the runtime runs, read back by a free function —
//! but then a report made outside it (a forgotten wrapper, a task spawned
//! from inside) could only be dropped, at run time, and the journal reachable
//! from the ambient scope would be the whole journal, every view included.
//! A [`JournalScope`] is instead a value handed to the runtime once, when it
//! starts: holding one is the proof that a gap reaches a journal, so a report
//! cannot be lost, and the views it may mark are fixed when it is made, so a
//! runtime's lost input never resets another runtime's subscribers.
//!
//! ## Invariants
//!
//! - A gap reported through a scope is marked on exactly its views, as
//!   [`EventJournal::mark_gap`] marks one on every view: cursors of those
//!   views issued before it fail closed with
//!   [`ReplayError::Gap`](crate::ReplayError::Gap), every other cursor stays
//!   valid. There is one implementation of a gap; a scope only narrows it.
//! - A scope names views, not tapes: a view that issues its first offset after
//!   the scope was made is covered all the same, and so is every view a
//!   pattern of the scope takes (`chat.*`, see [`ViewClaim`](crate::ViewClaim)).

use std::sync::Arc;

use crate::journal::EventJournal;

/// A runtime's scope on an [`EventJournal`]: reports a gap on the views it
/// was made for ([`EventJournal::scope`]), and nothing else.
///
/// # Examples
///
/// ```
/// use std::convert::Infallible;
/// use std::sync::Arc;
/// use bytes::Bytes;
/// use viewtape_journal::{Cursor, EventJournal, JournalConfig, ReplayError, ViewOffset};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let journal = Arc::new(EventJournal::new(JournalConfig::default()));
/// for view in ["prices", "orders"] {
///     let frame = Arc::new(Bytes::from_static(b"data: 1\n\n"));
///     journal.append_with(view, "k", |_| Ok::<_, Infallible>(frame)).await?;
/// }
/// let cursor = Cursor::new(journal.epoch().await, ViewOffset::FIRST);
///
/// // The runtime that publishes `prices` is handed its scope, not the journal...
/// let scope = journal.scope(["prices"]);
/// // ...and reports through it that some of its input was lost.
/// scope.report_gap();
///
/// assert!(matches!(
///     journal.replay_after("prices", Some(&cursor)).await,
///     Err(ReplayError::Gap { .. })
/// ));
/// // Another runtime's view is untouched.
/// assert!(journal.replay_after("orders", Some(&cursor)).await?.is_empty());
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct JournalScope {
    journal: Arc<EventJournal>,
    /// The views a reported gap is marked on: sorted, each named once, fixed
    /// when the scope is made.
    views: Box<[String]>,
}

impl EventJournal {
    /// The scope of a runtime that publishes to `views`: what it is handed,
    /// instead of the journal, to report a gap with
    /// ([`JournalScope::report_gap`]).
    pub fn scope<V: Into<String>>(
        self: &Arc<Self>,
        views: impl IntoIterator<Item = V>,
    ) -> JournalScope {
        let mut views: Vec<String> = views.into_iter().map(Into::into).collect();
        views.sort_unstable();
        views.dedup();
        JournalScope {
            journal: Arc::clone(self),
            views: views.into_boxed_slice(),
        }
    }
}

impl JournalScope {
    /// Records that input of this scope's runtime was lost *now*:
    /// [`EventJournal::mark_gap`] on this scope's views only. Cursors of those
    /// views issued before this call fail closed with
    /// [`ReplayError::Gap`](crate::ReplayError::Gap); cursors of every other
    /// view stay valid, and so do cursors issued afterwards.
    ///
    /// Never waits: it takes the journal's lock for as long as one gap record
    /// per view takes, so it may be called between two appends of a runtime
    /// that is publishing, or under a lock of the caller's.
    pub fn report_gap(&self) {
        self.report_loss(0);
    }

    /// As [`JournalScope::report_gap`], for input whose events had taken up to `offsets` offsets
    /// on each of this scope's views in a life of the server this journal does not remember
    /// (records a restart could not reproduce): each view's numbering goes on past them, so
    /// that no cursor issued for one of them ever names another event. The views' retained
    /// records are dropped with them: every cursor before the gap fails anyway (as
    /// [`ReplayError::Expired`](crate::ReplayError::Expired), which is checked first). A view the
    /// scope names exactly gets a tape even if it has issued nothing in this life.
    pub fn report_loss(&self, offsets: u64) {
        debug_assert!(
            self.views.windows(2).all(|pair| pair[0] < pair[1]),
            "a scope's views are sorted and each named once"
        );
        let named: Vec<String> = match offsets {
            0 => Vec::new(),
            _ => self
                .views
                .iter()
                .filter(|view| crate::ViewClaim::new(view).is_ok_and(|claim| !claim.is_pattern()))
                .cloned()
                .collect(),
        };
        let lost = crate::journal::Lost {
            offsets,
            named: &named,
        };
        self.journal
            .mark_gap_where(|view| crate::ViewClaim::any_takes(&self.views, view), &lost);
    }

    /// The views a gap reported through this scope is marked on, sorted.
    pub fn views(&self) -> &[String] {
        &self.views
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;
    use crate::{Cursor, JournalConfig, ManualClock, ReplayError, ViewOffset};

    fn journal_with(config: JournalConfig) -> (Arc<EventJournal>, Arc<ManualClock>) {
        let clock = Arc::new(ManualClock::new(1_700_000_000_000));
        let journal = EventJournal::with_clock(config, clock.clone());
        (Arc::new(journal), clock)
    }

    async fn append(journal: &EventJournal, view: &str, key: &str) {
        let frame = Arc::new(Bytes::from(format!("{view}:{key}")));
        let appended = journal.append_with(view, key, |_| Ok::<_, ()>(frame)).await;
        assert!(matches!(appended, Ok(Some(_))), "{view}: {appended:?}");
    }

    #[tokio::test]
    async fn a_gap_reaches_the_scope_views_and_no_other() {
        let (journal, _) = journal_with(JournalConfig::default());
        for view in ["a", "b", "c"] {
            append(&journal, view, "k").await;
            append(&journal, view, "k").await;
        }
        let epoch = journal.epoch().await;
        let scope = journal.scope(["c", "a", "a"]);
        assert_eq!(scope.views(), ["a", "c"]);

        scope.report_gap();

        for view in ["a", "c"] {
            assert_eq!(
                journal
                    .replay_after(view, Some(&Cursor::new(epoch, ViewOffset::new(1))))
                    .await,
                Err(ReplayError::Gap {
                    cursor: ViewOffset::new(1),
                    resume_from: ViewOffset::new(3)
                }),
                "{view}"
            );
            assert_eq!(
                journal.window(view).await.next.get(),
                4,
                "the gap took an offset in {view}"
            );
        }
        let b = journal
            .replay_after("b", Some(&Cursor::new(epoch, ViewOffset::new(1))))
            .await
            .unwrap();
        assert_eq!(b.iter().map(|r| r.offset.get()).collect::<Vec<_>>(), [2]);
        assert_eq!(
            journal.window("b").await.next.get(),
            3,
            "no offset taken in b"
        );
        assert_eq!(journal.stats().gaps_marked, 1);
        // A cursor issued after the gap replays normally.
        append(&journal, "a", "k").await;
        let after = journal
            .replay_after("a", Some(&Cursor::new(epoch, ViewOffset::new(3))))
            .await
            .unwrap();
        assert_eq!(
            after.iter().map(|r| r.offset.get()).collect::<Vec<_>>(),
            [4]
        );
    }

    #[tokio::test]
    async fn a_loss_numbers_on_past_the_offsets_lost_and_resets_every_cursor_below() {
        let (journal, _) = journal_with(JournalConfig::default());
        for _ in 0..3 {
            append(&journal, "a", "k").await;
            append(&journal, "b", "k").await;
        }
        let epoch = journal.epoch().await;
        // A life that issued "a" up to 3 + 5 and "fresh" up to 5, which this journal forgot.
        journal.scope(["a", "fresh", "pat.*"]).report_loss(5);

        for (view, gap) in [("a", 9), ("fresh", 6)] {
            assert_eq!(journal.window(view).await.next.get(), gap + 1, "{view}");
            for issued in [1, gap - 1] {
                // Before the tape's first offset now, or just before: expired, or a gap.
                let replayed = journal
                    .replay_after(view, Some(&Cursor::new(epoch, ViewOffset::new(issued))))
                    .await;
                assert!(
                    matches!(
                        replayed,
                        Err(ReplayError::Expired { first, .. } | ReplayError::Gap { resume_from: first, .. })
                            if first.get() == gap
                    ),
                    "{view} {issued}: {replayed:?}"
                );
            }
        }
        assert_eq!(journal.window("b").await.next.get(), 4, "another view");
        append(&journal, "a", "k").await;
        let after = journal
            .replay_after("a", Some(&Cursor::new(epoch, ViewOffset::new(9))))
            .await
            .unwrap();
        assert_eq!(
            after.iter().map(|r| r.offset.get()).collect::<Vec<_>>(),
            [10]
        );
    }

    #[tokio::test]
    async fn a_scope_covers_a_view_that_began_after_it_was_made() {
        let (journal, _) = journal_with(JournalConfig::default());
        let scope = journal.scope(["late"]);
        // Nothing issued yet: nothing to protect, no offset taken.
        scope.report_gap();
        assert_eq!(journal.window("late").await.next.get(), 1);

        append(&journal, "late", "k").await;
        let epoch = journal.epoch().await;
        scope.report_gap();
        assert!(matches!(
            journal
                .replay_after("late", Some(&Cursor::new(epoch, ViewOffset::new(1))))
                .await,
            Err(ReplayError::Gap { .. })
        ));
        assert_eq!(journal.stats().gaps_marked, 2);
    }

    #[tokio::test]
    async fn a_gap_reported_while_sealed_takes_its_offset_in_the_next_life_on_its_views_only() {
        let (journal, clock) = journal_with(JournalConfig::default());
        for view in ["a", "b"] {
            append(&journal, view, "k").await;
        }
        journal.seal();
        journal.scope(["a"]).report_gap();
        let epoch = journal.epoch().await;

        let next = EventJournal::with_clock(JournalConfig::default(), clock);
        next.hydrate(journal.dump().await, true).await;
        assert_eq!(
            next.window("a").await.next.get(),
            3,
            "the pending gap took its offset"
        );
        assert_eq!(next.window("b").await.next.get(), 2, "b took none");
        assert!(matches!(
            next.replay_after("a", Some(&Cursor::new(epoch, ViewOffset::new(1))))
                .await,
            Err(ReplayError::Gap { .. })
        ));
        assert!(next
            .replay_after("b", Some(&Cursor::new(epoch, ViewOffset::new(1))))
            .await
            .unwrap()
            .is_empty());
    }
}
