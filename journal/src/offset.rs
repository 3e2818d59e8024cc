//! View offsets: a record's place on one view's tape.

use std::fmt;
use std::num::ParseIntError;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// The place of a record on one view's tape, in one epoch.
///
/// Invariants, held by the journal that issues offsets:
/// - a view's offsets are dense: `1, 2, 3, …` with no holes, each issued once per epoch;
/// - offset `0` is never issued: [`ViewOffset::ZERO`] is the cursor of a client that has seen
///   nothing yet;
/// - an offset means nothing without its view and its [`JournalEpoch`](crate::JournalEpoch):
///   the same number in another view or epoch names another record.
///
/// It is its own type so that it cannot be mixed with the other numbers a server carries (log
/// positions, producer sequences, counts): the only arithmetic it offers is what a tape means —
/// the offset after this one ([`ViewOffset::next`]) or before it ([`ViewOffset::prev`]), the
/// offset `count` records later
/// ([`ViewOffset::checked_add`], [`ViewOffset::saturating_add`]) and how many offsets lie
/// between two of them ([`ViewOffset::since`]). At the edges (metrics, wire formats) the
/// number comes out with [`ViewOffset::get`] or `u64::from`.
///
/// Its text form ([`Display`](fmt::Display), [`FromStr`]) and its serde form are the bare
/// decimal number, as when offsets were plain `u64`s.
///
/// # Examples
///
/// ```
/// use viewtape_journal::ViewOffset;
///
/// let first = ViewOffset::FIRST;
/// let third = first.saturating_add(2);
/// assert_eq!(third, ViewOffset::new(3));
/// assert_eq!(third.since(first), 2);
/// assert_eq!(third.to_string(), "3");
/// ```
#[derive(
    Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug, Default, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct ViewOffset(u64);

impl ViewOffset {
    /// The offset of nothing: a cursor at `ZERO` has seen no record yet.
    pub const ZERO: Self = Self(0);

    /// The first offset a view issues.
    pub const FIRST: Self = Self(1);

    /// The offset numbered `offset`: for numbers read from the outside (a cursor's text, a
    /// test).
    pub const fn new(offset: u64) -> Self {
        Self(offset)
    }

    /// The number, for metrics and wire formats.
    pub const fn get(self) -> u64 {
        self.0
    }

    /// The offset after this one. Saturates at `u64::MAX`, which no view reaches: it would
    /// take 2^64 appends.
    #[must_use]
    pub const fn next(self) -> Self {
        Self(self.0.saturating_add(1))
    }

    /// The offset before this one; [`ViewOffset::ZERO`] stays zero. The head cursor's offset
    /// of a view whose next offset is `self`.
    #[must_use]
    pub const fn prev(self) -> Self {
        Self(self.0.saturating_sub(1))
    }

    /// The offset `count` records after this one, or `None` past `u64::MAX`.
    #[must_use]
    pub const fn checked_add(self, count: u64) -> Option<Self> {
        match self.0.checked_add(count) {
            Some(offset) => Some(Self(offset)),
            None => None,
        }
    }

    /// The offset `count` records after this one, stopping at `u64::MAX`.
    #[must_use]
    pub const fn saturating_add(self, count: u64) -> Self {
        Self(self.0.saturating_add(count))
    }

    /// How many offsets lie in `earlier .. self`: the number of records from `earlier` up to,
    /// not including, `self`. Zero when `earlier` is not before `self`.
    pub const fn since(self, earlier: Self) -> u64 {
        self.0.saturating_sub(earlier.0)
    }
}

impl From<ViewOffset> for u64 {
    fn from(offset: ViewOffset) -> Self {
        offset.0
    }
}

impl fmt::Display for ViewOffset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl FromStr for ViewOffset {
    type Err = ParseIntError;

    /// Parses a decimal number as `u64` does. A cursor's text is stricter (no sign, no leading
    /// zero): see [`Cursor`](crate::Cursor).
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        text.parse().map(Self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serde_and_text_are_the_bare_number() {
        let offset = ViewOffset::new(42);
        assert_eq!(serde_json::to_string(&offset).unwrap(), "42");
        assert_eq!(
            rmp_serde::to_vec(&offset).unwrap(),
            rmp_serde::to_vec(&42u64).unwrap()
        );
        assert_eq!(
            serde_json::from_str::<ViewOffset>("42").unwrap(),
            ViewOffset::new(42)
        );
        assert_eq!(offset.to_string(), "42");
        assert_eq!("42".parse::<ViewOffset>(), Ok(offset));
    }

    #[test]
    fn arithmetic_stays_in_range() {
        let max = ViewOffset::new(u64::MAX);
        assert_eq!(max.next(), max);
        assert_eq!(max.checked_add(1), None);
        assert_eq!(ViewOffset::FIRST.checked_add(2), Some(ViewOffset::new(3)));
        assert_eq!(ViewOffset::FIRST.since(ViewOffset::new(3)), 0);
        assert_eq!(ViewOffset::ZERO.next(), ViewOffset::FIRST);
        assert_eq!(ViewOffset::ZERO.prev(), ViewOffset::ZERO);
    }
}
