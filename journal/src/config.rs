//! Journal settings.

use std::time::Duration;

/// How a journal retains records.
///
/// Plain public fields, so `JournalConfig { max_age, ..Default::default() }`
/// works. Bounds are literal: a record older than `max_age` is pruned, and a
/// view never holds more than `max_records_per_view` records or more than
/// `max_bytes_per_view` bytes of frames (a zero bound keeps nothing).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JournalConfig {
    /// Whether offsets are issued at all. A disabled journal keeps no tape;
    /// every publish is cursorless and every replay is refused.
    pub enabled: bool,
    /// How long a record stays on its tape.
    pub max_age: Duration,
    /// The most records a view retains; the oldest go first.
    pub max_records_per_view: usize,
    /// The most frame bytes a view retains; the oldest go first.
    pub max_bytes_per_view: usize,
}

impl Default for JournalConfig {
    /// Enabled, one hour, 100,000 records and 64 MiB per view.
    fn default() -> Self {
        Self {
            enabled: true,
            max_age: Duration::from_secs(3600),
            max_records_per_view: 100_000,
            max_bytes_per_view: 64 * 1024 * 1024,
        }
    }
}
