//! `viewtape-journal`: the tape behind every view.
//!
//! An [`EventJournal`] keeps, for each named view, a bounded and replayable
//! *tape* of encoded frames. Web clients resume from a [`Cursor`]; the journal
//! either hands them exactly the records they missed, in order, or refuses
//! with a typed [`ReplayError`]. It never returns a partial or silently
//! shortened replay. The crate knows nothing of HTTP, WebAssembly or files.
//!
//! # Offsets
//!
//! Every view numbers its records `1, 2, 3, …` with no holes: a [`ViewOffset`]. An offset is
//! issued by [`EventJournal::append_with`] under the journal's lock, and the
//! frame is built *from* that offset inside the same critical section, so the
//! offset a frame embeds is always the offset its record takes. A frame builder
//! that fails consumes no offset. Within one epoch an offset is never issued
//! twice, whatever the sequence of seals, gaps, dumps and exact hydrates.
//!
//! # Epochs
//!
//! A [`JournalEpoch`] names one continuous numbering of the whole journal. It
//! is 64 random bits taken from the operating system's randomness (through
//! std's `RandomState`, which is seeded from it), never a counter or a clock,
//! so a cursor from another life of the server cannot be mistaken for one of
//! this life. A fresh epoch is taken when a journal is created and by a
//! non-exact [`EventJournal::hydrate`]: whenever continuity cannot be proven.
//!
//! # Cursors
//!
//! A [`Cursor`] is `(epoch, offset)` and means "I have seen every record of
//! this view up to and including `offset`". Offset `0` ([`ViewOffset::ZERO`]) means
//! "nothing yet".
//! Its text form, used as the SSE `id:`, is `<16 lowercase hex digits>-<offset>`,
//! e.g. `00f3a9c1d2e4b5a6-42`: short, URL-safe, free of whitespace. Parsing
//! accepts exactly the strings `Display` produces and nothing else.
//!
//! # Retention
//!
//! A record leaves its tape when it is older than [`JournalConfig::max_age`],
//! or when the view holds more than `max_records_per_view` records or more
//! than `max_bytes_per_view` frame bytes (oldest first). Pruning only ever
//! advances a view's first offset. Age is checked on every append *and* on
//! every read ([`EventJournal::window`], [`EventJournal::replay_after`], …),
//! so a view no one appends to still obeys the age bound. Time comes from a
//! [`Clock`], which tests replace with a [`ManualClock`].
//!
//! A replay fails closed, with the first matching reason in this order:
//! [`ReplayError::Disabled`], [`ReplayError::StaleEpoch`],
//! [`ReplayError::Ahead`], [`ReplayError::Expired`], [`ReplayError::Gap`].
//!
//! # Seal and gaps
//!
//! [`EventJournal::seal`] stops offset issuance, permanently and
//! idempotently: later appends return `Ok(None)` without calling the frame
//! builder, and the caller publishes a cursorless frame to live subscribers.
//! The retained tape stays readable.
//!
//! [`EventJournal::mark_gap`] records that events were lost *now*: for every
//! view, cursors issued before this moment fail with [`ReplayError::Gap`],
//! while cursors issued afterwards replay normally. To tell the two apart,
//! the gap takes one offset on every view that has issued one: a *gap
//! record* with an empty key and an empty frame (writing it to a socket
//! writes nothing). A cursor at or after the gap record replays normally; so
//! the head cursor read right after a gap is already valid. A view that has
//! issued no offset in this epoch has nothing to protect and takes none.
//!
//! # Scopes
//!
//! An ingestion runtime is not handed the journal. It is handed a
//! [`JournalScope`] ([`EventJournal::scope`]) naming the views it publishes
//! to, and reports through it that its input was lost
//! ([`JournalScope::report_gap`]): a gap on those views only, so one runtime's
//! loss never resets another runtime's subscribers. The scope is a value the
//! runtime holds, not a task-local set around the code it runs: an ambient
//! scope can be missing where a report is made (a forgotten wrapper, a task
//! spawned from inside), and such a report could only be dropped at run time;
//! a runtime without a [`JournalScope`] does not compile.
//! [`EventJournal::mark_gap`] stays for a loss that is no one runtime's (a
//! restore that replaces every view's state); both mark a gap the same way.
//!
//! # Snapshots
//!
//! [`EventJournal::dump`] clones `Arc`s, not bytes, so it is cheap enough to
//! run inside a consistency cut. [`EventJournal::hydrate`] with `exact`
//! adopts the snapshot's epoch, offsets and gap marks (and unseals); without
//! `exact` it takes a fresh epoch and starts every view with an empty tape,
//! because a retained frame embeds the cursor of its old epoch and must not be
//! served under a new one. A snapshot without an epoch is discarded. Retention
//! is re-applied on load, with record ages carried across the restart.
//!
//! # Counters
//!
//! [`EventJournal::stats`] returns a [`JournalStats`]: appends, cursorless
//! publishes, pruned records by cause, replays served and refused by reason,
//! gaps marked. The server turns them into metrics.
//!
//! # Which call to use
//!
//! Every operation has one implementation. The `async` methods of the public contract
//! (`epoch`, `window`, `entry_counts`, `retained_bytes`, `append_with`) never wait on anything:
//! each is a thin wrapper over a synchronous method, for callers in a non-async context or under
//! a lock of their own. What a server calls:
//!
//! | to | call | why |
//! |---|---|---|
//! | publish an event | [`EventJournal::append_with_cursor`] | the frame embeds the whole cursor, read under the lock that issues the offset |
//! | publish an event replayed from the log | [`EventJournal::append_at`] | the same, with the time it was first written |
//! | publish a batch's events | [`EventJournal::appender`] | the same for a run of one view's events: one lock and one clock reading |
//! | read a view's head with its state | [`EventJournal::window_now`] | under the view's own lock, so state and cursor agree |
//! | follow the tape | [`EventJournal::frames_after`] | frames only, in pages, not counted as replays |
//! | resume with keys | [`EventJournal::replay_after`] | records with offsets and keys |
//! | list views | [`EventJournal::entry_counts_now`], [`EventJournal::retained_bytes_now`] | |
//! | report a runtime's lost input | [`JournalScope::report_gap`] | a gap on that runtime's views only |
//! | snapshot and restore | [`EventJournal::seal`], [`EventJournal::dump`], [`EventJournal::hydrate`], [`EventJournal::mark_gap`] | |
#![deny(missing_docs)]

mod clock;
mod config;
mod cursor;
mod epoch;
mod error;
mod journal;
mod offset;
mod scope;
mod snapshot;
mod stats;
mod tape;
mod view;

pub use clock::{Clock, ManualClock, SystemClock};
pub use compact_str::CompactString;
pub use config::JournalConfig;
pub use cursor::{Cursor, CursorParseError, CursorText};
pub use epoch::{EpochParseError, JournalEpoch};
pub use error::ReplayError;
pub use journal::{Appender, EventJournal, FramesWhere, JournalRecord, ReplayWindow};
pub use offset::ViewOffset;
pub use scope::JournalScope;
pub use snapshot::{JournalSnapshot, SnapshotInvalid, SnapshotRecord, SnapshotView};
pub use stats::JournalStats;
pub use view::{ViewClaim, ViewClaimError, ViewName, ViewNameError};
