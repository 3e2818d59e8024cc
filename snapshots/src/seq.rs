//! [`SnapshotSeq`]: a snapshot file's write sequence, below the directory and the history
//! file that both name one.

use std::fmt;

/// A snapshot file's write sequence number: the second part of its name.
///
/// Invariant: a directory's writer hands them out strictly increasing (1, 2, 3, …, continuing
/// after the highest found when it opens), so with the name's time they give write order. `0`
/// is no file's: the last sequence of a directory without snapshots.
///
/// Its own type so that it mixes neither with a log position (a snapshot records one of those
/// too) nor with the name's time. Its text is the bare decimal number; in a file name it is
/// padded to 10 digits (`{:010}`), as it always was.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SnapshotSeq(u64);

impl SnapshotSeq {
    /// Sequence number `seq`, as a file name or the history file gives it.
    pub const fn new(seq: u64) -> Self {
        Self(seq)
    }

    /// The number.
    pub const fn get(self) -> u64 {
        self.0
    }

    /// The sequence after this one.
    #[must_use]
    pub const fn next(self) -> Self {
        Self(self.0.saturating_add(1))
    }
}

impl fmt::Display for SnapshotSeq {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl std::str::FromStr for SnapshotSeq {
    type Err = std::num::ParseIntError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        text.parse().map(Self)
    }
}
