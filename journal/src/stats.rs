//! Counters for operators.

/// What a journal has done since it was created. Monotonic counters; the
/// server exports them as metrics.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct JournalStats {
    /// Records appended (offsets issued).
    pub appends: u64,
    /// Appends refused with `Ok(None)` because the journal was sealed; the
    /// caller published those events without a cursor.
    pub cursorless_after_seal: u64,
    /// Appends refused with `Ok(None)` because the journal is disabled.
    pub cursorless_disabled: u64,
    /// Records pruned for being older than `max_age`.
    pub pruned_age: u64,
    /// Records pruned to keep a view within `max_records_per_view`.
    pub pruned_count: u64,
    /// Records pruned to keep a view within `max_bytes_per_view`.
    pub pruned_bytes: u64,
    /// Replays that returned records (or an empty, up-to-date result).
    pub replays_served: u64,
    /// Replays refused: journal disabled.
    pub replays_refused_disabled: u64,
    /// Replays refused: cursor from another epoch.
    pub replays_refused_stale_epoch: u64,
    /// Replays refused: cursor ahead of the head.
    pub replays_refused_ahead: u64,
    /// Replays refused: records after the cursor were pruned.
    pub replays_refused_expired: u64,
    /// Replays refused: the range after the cursor crosses a gap.
    pub replays_refused_gap: u64,
    /// Gaps marked.
    pub gaps_marked: u64,
}

impl JournalStats {
    pub(crate) fn count_refusal(&mut self, error: &crate::ReplayError) {
        use crate::ReplayError as E;
        let counter = match error {
            E::Disabled => &mut self.replays_refused_disabled,
            E::StaleEpoch { .. } => &mut self.replays_refused_stale_epoch,
            E::Ahead { .. } => &mut self.replays_refused_ahead,
            E::Expired { .. } => &mut self.replays_refused_expired,
            E::Gap { .. } => &mut self.replays_refused_gap,
        };
        *counter += 1;
    }
}
