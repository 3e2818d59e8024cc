//! Log positions: a record's place in the log.

use std::fmt;
use std::num::ParseIntError;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// The place of a record in the log: what a receipt names, what a snapshot records as applied,
/// what a restart replays after.
///
/// Invariants, held by whoever issues positions:
/// - positions start at 1 and only increase; none is used for two records, also across a
///   start that failed closed (a log that starts over takes positions after
///   [`LogScan::last_used`](super::LogScan::last_used));
/// - [`LogPosition::ZERO`] is never a record's: it means "nothing yet" (no record applied, no
///   record made durable);
/// - in a log of segment files positions are dense (`1, 2, 3, …` across segments).
///
/// ## A cluster's stream
///
/// In a cluster the log is a JetStream stream, and a record's position *is* the stream
/// sequence of the message that holds it, on every node: receipts, snapshots, turns and the
/// committed position carry it unchanged, and nothing ever converts between the two. So a
/// stream sequence is a `LogPosition`, not a type of its own: a second type would only add a
/// conversion at every place a sequence is read, with no place where the two numbers could
/// differ. What differs is density: a stream's sequences may skip (messages this node passes
/// over, several batches in one message), so code that counts records between two positions
/// holds only for segment files. The number enters at the edge, where the NATS client hands
/// out a `u64` sequence, with [`LogPosition::new`].
///
/// It is its own type so that it cannot be mixed with the other numbers a server carries
/// (view offsets, producer sequences, byte lengths, counts): the only arithmetic it offers is
/// what a log means — the position after this one ([`LogPosition::next`]), the one before it
/// ([`LogPosition::prev`]), the position `count` records later ([`LogPosition::checked_add`],
/// [`LogPosition::saturating_add`]) and how many positions lie between two of them
/// ([`LogPosition::since`]). At the edges (metrics, file headers, wire formats) the number
/// comes out with [`LogPosition::get`] or `u64::from`.
///
/// Its text form ([`Display`](fmt::Display), [`FromStr`]) and its serde form are the bare
/// decimal number, and in the files (segment headers, record frames, the watermark) it is the
/// `u64` it always was: nothing written before this type existed reads differently.
///
/// # Examples
///
/// ```
/// use viewtape_snapshots::log::LogPosition;
///
/// let first = LogPosition::FIRST;
/// let last = first.saturating_add(9);
/// assert_eq!(last.since(first), 9);
/// assert_eq!(last.next(), LogPosition::new(11));
/// assert_eq!(last.to_string(), "10");
/// ```
#[derive(
    Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug, Default, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct LogPosition(u64);

impl LogPosition {
    /// No record: the position applied or made durable before the first record.
    pub const ZERO: Self = Self(0);

    /// The position of a log's first record.
    pub const FIRST: Self = Self(1);

    /// The position numbered `position`: for numbers read from the outside (a file, a stream's
    /// acknowledgement, a command line, a test).
    pub const fn new(position: u64) -> Self {
        Self(position)
    }

    /// The number, for metrics, file headers and wire formats.
    pub const fn get(self) -> u64 {
        self.0
    }

    /// The position after this one. Saturates at `u64::MAX`, which no log reaches.
    #[must_use]
    pub const fn next(self) -> Self {
        Self(self.0.saturating_add(1))
    }

    /// The position before this one; [`LogPosition::ZERO`] stays zero. The last position of a
    /// log whose next record takes `self`.
    #[must_use]
    pub const fn prev(self) -> Self {
        Self(self.0.saturating_sub(1))
    }

    /// The position `count` records after this one, or `None` past `u64::MAX`.
    #[must_use]
    pub const fn checked_add(self, count: u64) -> Option<Self> {
        match self.0.checked_add(count) {
            Some(position) => Some(Self(position)),
            None => None,
        }
    }

    /// The position `count` records after this one, stopping at `u64::MAX`.
    #[must_use]
    pub const fn saturating_add(self, count: u64) -> Self {
        Self(self.0.saturating_add(count))
    }

    /// How many positions lie in `earlier .. self`; zero when `earlier` is not before `self`.
    pub const fn since(self, earlier: Self) -> u64 {
        self.0.saturating_sub(earlier.0)
    }
}

impl From<LogPosition> for u64 {
    fn from(position: LogPosition) -> Self {
        position.0
    }
}

impl fmt::Display for LogPosition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl FromStr for LogPosition {
    type Err = ParseIntError;

    /// Parses a decimal number as `u64` does.
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        text.parse().map(Self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serde_and_text_are_the_bare_number() {
        let position = LogPosition::new(7);
        assert_eq!(
            rmp_serde::to_vec(&position).unwrap(),
            rmp_serde::to_vec(&7u64).unwrap()
        );
        assert_eq!(
            rmp_serde::from_slice::<LogPosition>(&rmp_serde::to_vec(&7u64).unwrap()).unwrap(),
            position
        );
        assert_eq!(position.to_string(), "7");
        assert_eq!("7".parse::<LogPosition>(), Ok(position));
    }

    #[test]
    fn arithmetic_stays_in_range() {
        assert_eq!(LogPosition::ZERO.prev(), LogPosition::ZERO);
        assert_eq!(
            LogPosition::new(u64::MAX).next(),
            LogPosition::new(u64::MAX)
        );
        assert_eq!(LogPosition::new(u64::MAX).checked_add(1), None);
        assert_eq!(LogPosition::FIRST.since(LogPosition::new(5)), 0);
    }
}
