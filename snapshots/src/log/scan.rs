use std::path::PathBuf;

use super::segment::Damage;
use super::watermark::Watermark;
use super::LogPosition;
use crate::history::HistoryId;

/// One record read back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogRecord {
    /// Its position.
    pub position: LogPosition,
    /// Its payload.
    pub payload: Vec<u8>,
}

/// One segment as a scan found it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SegmentScan {
    /// The file.
    pub path: PathBuf,
    /// The position its name and header give for its first record.
    pub first: LogPosition,
    /// Intact records, from `first`.
    pub records: u64,
    /// Its size on disk.
    pub len: u64,
    /// What is wrong with it, if anything.
    pub damage: Option<Damage>,
    /// Its format version (0: the header could not be read).
    pub version: u16,
    /// The history id its header carries (`None`: version 1, or no readable header).
    pub history: Option<HistoryId>,
    /// The journal epoch its header carries (`None`: version 1, or no readable header).
    pub epoch: Option<u64>,
}

impl SegmentScan {
    /// The position after its last intact record.
    pub fn next(&self) -> LogPosition {
        self.first.saturating_add(self.records)
    }
}

/// What [`LogDir::scan`](super::LogDir::scan) found, oldest segment first.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LogScan {
    /// Every segment.
    pub segments: Vec<SegmentScan>,
}

impl LogScan {
    /// The position the next record takes, after the last intact one.
    pub fn next(&self) -> LogPosition {
        self.segments
            .last()
            .map_or(LogPosition::FIRST, SegmentScan::next)
    }

    /// Why the log ends before `mark` says it does — its newest segment missing, or records
    /// at or before `mark.through` missing — or `None`. See the module docs for what this can
    /// and cannot see.
    pub fn end_problem(&self, mark: &Watermark) -> Option<String> {
        let newest = self.segments.last().map_or(LogPosition::ZERO, |s| s.first);
        if newest < mark.rolled_at {
            return Some(format!(
                "the newest segment started at position {}, but the newest one here starts at {newest} (segments are missing at the end)",
                mark.rolled_at
            ));
        }
        let last = self.next().prev();
        (last < mark.through).then(|| {
            format!(
                "records through position {} were made durable, but the log ends at {last} (the end of the log is missing)",
                mark.through
            )
        })
    }

    /// Takes `mark`'s word for what was acknowledged: bytes after the last intact record of the
    /// newest segment, at positions past `mark.through`, with no intact record after them, were
    /// never acknowledged — whatever they look like (a complete record that fails its checksum,
    /// random bytes), they are a torn tail, which [`LogDir::repair`](super::LogDir::repair)
    /// cuts. Damage at or before `mark.through` stays damage, and so does a bad header. Returns
    /// whether it changed the scan. Call it only with the watermark of this log's own history.
    pub fn torn_past(&mut self, mark: &Watermark) -> bool {
        let Some(newest) = self.segments.last_mut() else {
            return false;
        };
        let unacknowledged = newest.next() > mark.through;
        match newest.damage {
            Some(Damage::Corrupt {
                offset,
                intact_after: None,
                ..
            }) if offset > 0 && unacknowledged => {
                newest.damage = Some(Damage::TornTail { valid_len: offset });
                true
            }
            _ => false,
        }
    }

    /// The highest position the segments show was used: their last intact records, intact
    /// records found after damage, and the position before each segment's first. A log that
    /// starts over takes positions after it, never one a record may have had.
    pub fn last_used(&self) -> LogPosition {
        self.segments
            .iter()
            .map(|segment| {
                let after = match &segment.damage {
                    Some(Damage::Corrupt { intact_after, .. }) => {
                        intact_after.unwrap_or(LogPosition::ZERO)
                    }
                    _ => LogPosition::ZERO,
                };
                segment.next().prev().max(after)
            })
            .max()
            .unwrap_or(LogPosition::ZERO)
    }

    /// The segments that do not belong to `history` (another data directory's, or a version-1
    /// segment it did not hold when it got its id): they must be set aside, never replayed.
    pub fn foreign<'a>(
        &'a self,
        history: &'a crate::history::DataHistory,
    ) -> impl Iterator<Item = &'a SegmentScan> + 'a {
        self.segments.iter().filter(move |segment| {
            segment.version != 0
                && !history.owns(segment.history, segment.first, history.legacy.log_through)
        })
    }

    /// The first damage that is not a torn tail of the newest segment, and where: the point up
    /// to which the log is proven. Segments must also follow each other without a hole.
    pub fn corruption(&self) -> Option<(PathBuf, String)> {
        self.first_damage()
            .map(|damage| (damage.path.clone(), damage.to_string()))
    }

    /// [`LogScan::corruption`], typed: what kind of damage, for a caller that decides by it.
    pub fn first_damage(&self) -> Option<LogDamage> {
        let last = self.segments.len().saturating_sub(1);
        let mut expected = self.segments.first().map(|s| s.first);
        for (i, segment) in self.segments.iter().enumerate() {
            let damage = |kind| {
                Some(LogDamage {
                    path: segment.path.clone(),
                    kind,
                })
            };
            if let Some(expected) = expected.filter(|e| *e != segment.first) {
                return damage(LogDamageKind::Missing {
                    starts: segment.first,
                    expected,
                });
            }
            match &segment.damage {
                Some(Damage::Corrupt { offset, reason, .. }) => {
                    return damage(LogDamageKind::Corrupt {
                        offset: *offset,
                        reason: reason.clone(),
                    })
                }
                Some(Damage::TornTail { valid_len }) if i != last => {
                    return damage(LogDamageKind::TornBeforeTheEnd {
                        valid_len: *valid_len,
                    })
                }
                _ => {}
            }
            expected = Some(segment.next());
        }
        None
    }
}

/// Damage a scan found that no repair may cut: where, and what.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogDamage {
    /// The segment.
    pub path: PathBuf,
    /// What is wrong with it.
    pub kind: LogDamageKind,
}

/// What is wrong with a damaged segment.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum LogDamageKind {
    /// A segment before it is missing: it starts at `starts` where `expected` was next.
    Missing {
        /// Its first position.
        starts: LogPosition,
        /// The position expected.
        expected: LogPosition,
    },
    /// A record or header that fails its checks.
    Corrupt {
        /// Where in the file.
        offset: u64,
        /// What failed.
        reason: String,
    },
    /// It ends inside a record although a newer segment follows it.
    TornBeforeTheEnd {
        /// Its bytes up to the partial record.
        valid_len: u64,
    },
}

impl std::fmt::Display for LogDamage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.kind {
            LogDamageKind::Missing { starts, expected } => write!(
                f,
                "starts at position {starts} where {expected} was expected (a segment is missing)"
            ),
            LogDamageKind::Corrupt { offset, reason } => write!(f, "at byte {offset}: {reason}"),
            LogDamageKind::TornBeforeTheEnd { valid_len } => write!(
                f,
                "ends in a partial record at byte {valid_len}, but is not the newest segment"
            ),
        }
    }
}
