//! The journal: every view's tape under one lock.
//!
//! | file | job |
//! |---|---|
//! | this one | [`EventJournal`] and its state: construction, settings, counters, the lock |
//! | `append` | issuing offsets: appends, seal, gaps |
//! | `read` | reading the tapes: windows, replays, frames, per-view measures |
//! | `restore` | snapshots: dump and hydrate |

mod append;
mod read;
mod restore;

#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::sync::watch;

pub use append::Appender;
pub(crate) use append::Lost;
pub use read::{FramesWhere, JournalRecord, ReplayWindow};

use crate::clock::{Clock, SystemClock};
use crate::config::JournalConfig;
use crate::epoch::JournalEpoch;
use crate::stats::JournalStats;
use crate::tape::{duration_nanos, Tape};

/// The tapes of all views, their epoch, and their counters.
///
/// Everything sits behind one `std::sync::Mutex`, held for a few hundred
/// nanoseconds per record (an [`Appender`] holds it for a short run of them)
/// and never across an `.await`. One lock is what makes
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
