use super::{FILE_EXT, FILE_PREFIX};
use crate::seq::SnapshotSeq;

/// The kind a snapshot file's *name* states.
///
/// A file is treated as exact only when its name says [`SnapshotKind::Exact`] **and** its header
/// carries the exact flag; every other combination loads as periodic.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SnapshotKind {
    /// Exact and not yet adopted by a server life.
    Exact,
    /// Periodic: taken while running.
    Periodic,
    /// Was exact, and a server life has adopted its epoch: from now on it loads as periodic.
    Consumed,
    /// Taken while running because an operator asked for it: loads and is retained as a
    /// periodic one; only its name says who took it.
    Manual,
}

impl SnapshotKind {
    /// The word used in file names: `exact`, `periodic`, `consumed` or `manual`.
    pub fn as_str(self) -> &'static str {
        match self {
            SnapshotKind::Exact => "exact",
            SnapshotKind::Periodic => "periodic",
            SnapshotKind::Consumed => "consumed",
            SnapshotKind::Manual => "manual",
        }
    }

    fn parse(s: &str) -> Option<Self> {
        match s {
            "exact" => Some(SnapshotKind::Exact),
            "periodic" => Some(SnapshotKind::Periodic),
            "consumed" => Some(SnapshotKind::Consumed),
            "manual" => Some(SnapshotKind::Manual),
            _ => None,
        }
    }
}

impl std::fmt::Display for SnapshotKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The parts of a snapshot file name `snap-<unix_ms:016>-<seq:010>-<kind>.vtsnap`.
///
/// Ordering is by `(unix_ms, seq)`: the writer keeps both non-decreasing, so this is write order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct FileName {
    pub(super) unix_ms: u64,
    pub(super) seq: SnapshotSeq,
    pub(super) kind: SnapshotKind,
}

impl FileName {
    pub(super) fn render(&self) -> String {
        format!(
            "{FILE_PREFIX}{:016}-{:010}-{}{FILE_EXT}",
            self.unix_ms, self.seq, self.kind
        )
    }

    pub(super) fn parse(name: &str) -> Option<Self> {
        let mid = name.strip_prefix(FILE_PREFIX)?.strip_suffix(FILE_EXT)?;
        let mut parts = mid.splitn(3, '-');
        let digits = |s: &str| -> Option<u64> {
            if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            s.parse().ok()
        };
        let unix_ms = digits(parts.next()?)?;
        let seq = SnapshotSeq::new(digits(parts.next()?)?);
        let kind = SnapshotKind::parse(parts.next()?)?;
        Some(FileName { unix_ms, seq, kind })
    }
}
