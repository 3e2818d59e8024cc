//! Reaching the journal from inside an ingestion runtime.
//!
//! [`EventJournal::scope`] runs a future with the journal stored in a tokio
//! task-local. Code inside that future — however deep, without being handed
//! the journal — reaches it through [`current`] or reports a discontinuity
//! with [`report_gap`]. The task-local belongs to the future, not the thread:
//! a task spawned from inside the scope is outside it.

use std::future::Future;
use std::sync::Arc;

use crate::journal::EventJournal;

tokio::task_local! {
    static JOURNAL: Arc<EventJournal>;
}

/// What [`report_gap`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use = "a gap report outside a journal scope is lost"]
pub enum GapReport {
    /// The gap was marked on the journal in scope.
    Marked,
    /// The caller is not running inside [`EventJournal::scope`]; nothing was
    /// marked.
    NoJournalInScope,
}

impl EventJournal {
    /// Runs `future` with this journal reachable from inside it through
    /// [`current`] and [`report_gap`].
    pub async fn scope<F: Future>(self: &Arc<Self>, future: F) -> F::Output {
        JOURNAL.scope(Arc::clone(self), future).await
    }
}

/// The journal of the enclosing [`EventJournal::scope`], if any.
pub fn current() -> Option<Arc<EventJournal>> {
    JOURNAL.try_with(Arc::clone).ok()
}

/// Marks a gap on the journal of the enclosing [`EventJournal::scope`]
/// (see [`EventJournal::mark_gap`]).
///
/// Outside any scope this is a no-op that returns
/// [`GapReport::NoJournalInScope`]; it never panics.
pub async fn report_gap() -> GapReport {
    match current() {
        Some(journal) => {
            journal.mark_gap().await;
            GapReport::Marked
        }
        None => GapReport::NoJournalInScope,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Cursor, JournalConfig, ReplayError, ViewOffset};

    #[tokio::test]
    async fn report_gap_reaches_the_journal_in_scope_only() {
        let journal = Arc::new(EventJournal::new(JournalConfig::default()));
        let frame = Arc::new(bytes::Bytes::from_static(b"x"));
        journal
            .append_with("v", "k", |_| Ok::<_, ()>(frame.clone()))
            .await
            .unwrap();
        let cursor = Cursor::new(journal.epoch().await, ViewOffset::FIRST);

        assert_eq!(report_gap().await, GapReport::NoJournalInScope);
        assert!(current().is_none());
        assert!(journal.replay_after("v", Some(&cursor)).await.is_ok());

        let report = journal.scope(async { report_gap().await }).await;
        assert_eq!(report, GapReport::Marked);
        assert_eq!(journal.stats().gaps_marked, 1);
        assert_eq!(
            journal.replay_after("v", Some(&cursor)).await,
            Err(ReplayError::Gap {
                cursor: ViewOffset::new(1),
                resume_from: ViewOffset::new(2)
            })
        );
    }

    #[tokio::test]
    async fn scope_is_reachable_deep_inside_the_future() {
        let journal = Arc::new(EventJournal::new(JournalConfig::default()));
        async fn deep() -> Option<Arc<EventJournal>> {
            tokio::task::yield_now().await;
            current()
        }
        let found = journal.scope(deep()).await.unwrap();
        assert!(Arc::ptr_eq(&found, &journal));
    }
}
