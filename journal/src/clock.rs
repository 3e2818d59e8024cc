//! Time for retention, injectable so tests never sleep.

use std::fmt::Debug;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Where the journal reads the time.
pub trait Clock: Send + Sync + Debug + 'static {
    /// Monotonic time since an arbitrary, fixed base. Never goes backwards.
    fn now(&self) -> Duration;
    /// Wall-clock milliseconds since the Unix epoch; used only to carry
    /// record ages across a dump and a later hydrate.
    fn unix_ms(&self) -> u64;
}

/// The real clock: [`Instant`] for age, [`SystemTime`] for dumps.
#[derive(Debug)]
pub struct SystemClock {
    base: Instant,
}

impl SystemClock {
    /// A clock whose monotonic base is now.
    pub fn new() -> Self {
        Self {
            base: Instant::now(),
        }
    }
}

impl Default for SystemClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for SystemClock {
    fn now(&self) -> Duration {
        self.base.elapsed()
    }

    fn unix_ms(&self) -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |since| since.as_millis() as u64)
    }
}

/// A clock that moves only when told to; for tests.
#[derive(Debug)]
pub struct ManualClock {
    nanos: AtomicU64,
    unix_base_ms: u64,
}

impl ManualClock {
    /// A clock at monotonic zero whose wall clock reads `unix_base_ms`.
    pub fn new(unix_base_ms: u64) -> Self {
        Self {
            nanos: AtomicU64::new(0),
            unix_base_ms,
        }
    }

    /// Moves both the monotonic and the wall clock forward.
    pub fn advance(&self, by: Duration) {
        let by = u64::try_from(by.as_nanos()).unwrap_or(u64::MAX);
        self.nanos.fetch_add(by, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Duration {
        Duration::from_nanos(self.nanos.load(Ordering::SeqCst))
    }

    fn unix_ms(&self) -> u64 {
        self.unix_base_ms + self.now().as_millis() as u64
    }
}
