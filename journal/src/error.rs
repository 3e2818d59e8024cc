//! Why a replay is refused.

use crate::epoch::JournalEpoch;
use crate::offset::ViewOffset;

/// A replay the journal cannot honour. Replays fail closed: the caller gets
/// this instead of a partial or silently shortened result.
///
/// When several reasons apply, the first in declaration order is reported.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ReplayError {
    /// The journal is disabled: it keeps no tape.
    #[error("the journal is disabled")]
    Disabled,
    /// The cursor belongs to another epoch (another life of the server, or
    /// before a restore).
    #[error("cursor epoch {cursor} is not the current epoch {current}")]
    StaleEpoch {
        /// The cursor's epoch.
        cursor: JournalEpoch,
        /// The journal's epoch.
        current: JournalEpoch,
    },
    /// The cursor points past the last issued offset.
    #[error("cursor offset {cursor} is ahead of the head (next offset {next})")]
    Ahead {
        /// The cursor's offset.
        cursor: ViewOffset,
        /// The next offset the view will issue.
        next: ViewOffset,
    },
    /// Records right after the cursor have been pruned.
    #[error("records after offset {cursor} were pruned (first retained {first})")]
    Expired {
        /// The cursor's offset.
        cursor: ViewOffset,
        /// The first retained offset.
        first: ViewOffset,
    },
    /// Events were lost after the cursor was issued.
    #[error("events were lost after offset {cursor} (gap before offset {resume_from})")]
    Gap {
        /// The cursor's offset.
        cursor: ViewOffset,
        /// The first offset whose cursor replays again.
        resume_from: ViewOffset,
    },
}

impl ReplayError {
    /// A short, stable name for the reason: `disabled`, `stale_epoch`,
    /// `ahead`, `expired` or `gap`. Suitable for metrics labels and wire
    /// protocols.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Disabled => "disabled",
            Self::StaleEpoch { .. } => "stale_epoch",
            Self::Ahead { .. } => "ahead",
            Self::Expired { .. } => "expired",
            Self::Gap { .. } => "gap",
        }
    }
}
