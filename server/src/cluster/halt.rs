//! Why a node stopped applying its cluster's stream: one [`Halt`] for each way it can, typed
//! like the local log's [`crate::log::Break`].
//!
//! A halt is for good: the node keeps serving what it has, is not ready, and takes no ingest.
//! `/readyz` says why in words (`broken`) and names the kind (`halt`); the gauge
//! `viewtape_cluster_halted` is 1 for that kind ([`Halt::KINDS`]), so an alert can tell a
//! purged stream from a record this build cannot read without parsing a message.

use std::sync::Arc;

use crate::host::ModuleFingerprint;
use crate::log::stream::{RECORD_VERSION, SHARED_VERSION};
use crate::log::LogPosition;
use crate::runtime::ApplyError;

/// An error of NATS or of the bucket, shared by the clones of a halt.
pub type SharedError = Arc<dyn std::error::Error + Send + Sync>;

/// Why a node stopped applying the stream; see the module docs. Every variant's message is
/// what `/readyz` shows as `broken`.
#[derive(Clone, Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Halt {
    /// The stream no longer holds what no snapshot covers: the node cannot know the history
    /// before the stream's first message (it starts empty, under an epoch of its own).
    #[error("cluster: stream {stream:?} starts at sequence {first}, and no snapshot of its epoch reaches sequence {needed}: this node cannot know the history before it")]
    Uncovered {
        /// The stream.
        stream: String,
        /// The stream's first sequence.
        first: LogPosition,
        /// The last sequence a snapshot would have to reach.
        needed: LogPosition,
    },
    /// The stream delivered a later sequence than the next one: the messages between are gone
    /// (purged or aged out) before this node applied them.
    #[error("the stream delivered sequence {delivered} where {next} was next: messages {next}..{delivered} are gone (purged or aged out) before this node applied them")]
    Skipped {
        /// The sequence this node needed next.
        next: LogPosition,
        /// The sequence the stream delivered.
        delivered: LogPosition,
    },
    /// The stream now starts after the sequence this node needs next.
    #[error("the stream starts at sequence {first}, but this node needs {next} next: messages are gone (purged or aged out) before this node applied them")]
    Purged {
        /// The stream's first sequence.
        first: LogPosition,
        /// The sequence this node needed next.
        next: LogPosition,
    },
    /// The stream was deleted and created again: its sequences are another history.
    #[error("the stream was deleted and created again (created {created}): its sequences are another history, under another epoch; restart this node to join it")]
    Recreated {
        /// When the new stream was created, as NATS says it.
        created: String,
    },
    /// A record of a format this build does not read.
    #[error("sequence {sequence} is a record of format {version}, which this viewtape cannot read (it reads {RECORD_VERSION} and {SHARED_VERSION}): upgrade this node")]
    Format {
        /// The record's sequence.
        sequence: LogPosition,
        /// Its format, as its header names it.
        version: String,
    },
    /// A record of a known format that does not decode (a kind of a newer build, say).
    #[error("sequence {sequence} is a record this viewtape cannot read (a kind of a newer viewtape?): {source}")]
    Unreadable {
        /// The record's sequence.
        sequence: LogPosition,
        /// Why it does not decode.
        source: Arc<rmp_serde::decode::Error>,
    },
    /// A runtime defined on a module this node can neither fetch nor compile. (A deploy of
    /// one halts only its runtime, on this node.)
    #[error("sequence {sequence} defines runtime {runtime:?} on module {module}, which this node cannot load: {source}")]
    Module {
        /// The record's sequence.
        sequence: LogPosition,
        /// The module.
        module: ModuleFingerprint,
        /// The runtime defined on it.
        runtime: String,
        /// Why it cannot be loaded.
        source: SharedError,
    },
    /// A restore of a snapshot this node cannot fetch from the bucket.
    #[error("sequence {sequence} restores {object}, which this node cannot fetch: {source}")]
    Restore {
        /// The record's sequence.
        sequence: LogPosition,
        /// The snapshot's object in the bucket.
        object: String,
        /// Why it cannot be fetched.
        source: SharedError,
    },
    /// A runtime could not apply the record (after retries, when it was only unavailable).
    #[error("sequence {sequence}: {source}")]
    Apply {
        /// The record's sequence.
        sequence: LogPosition,
        /// Why.
        source: Arc<ApplyError>,
    },
}

impl Halt {
    /// Every kind, as [`Halt::kind`] names it: the labels of `viewtape_cluster_halted`.
    pub const KINDS: [&'static str; 8] = [
        "uncovered",
        "gone",
        "recreated",
        "format",
        "unreadable",
        "module",
        "restore",
        "apply",
    ];

    /// Its kind: `halt` in `/readyz`, the `reason` of `viewtape_cluster_halted`. Messages gone
    /// from the stream are one kind however they were found missing.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Uncovered { .. } => "uncovered",
            Self::Skipped { .. } | Self::Purged { .. } => "gone",
            Self::Recreated { .. } => "recreated",
            Self::Format { .. } => "format",
            Self::Unreadable { .. } => "unreadable",
            Self::Module { .. } => "module",
            Self::Restore { .. } => "restore",
            Self::Apply { .. } => "apply",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One of each variant.
    fn every() -> Vec<Halt> {
        let shared: SharedError = Arc::new(std::io::Error::other("the bucket is away"));
        vec![
            Halt::Uncovered {
                stream: "viewtape".into(),
                first: LogPosition::new(9),
                needed: LogPosition::new(8),
            },
            Halt::Skipped {
                next: LogPosition::new(4),
                delivered: LogPosition::new(7),
            },
            Halt::Purged {
                first: LogPosition::new(7),
                next: LogPosition::new(4),
            },
            Halt::Recreated {
                created: "2026-01-01 0:00:00.0 +00:00:00".into(),
            },
            Halt::Format {
                sequence: LogPosition::new(3),
                version: "9".into(),
            },
            Halt::Unreadable {
                sequence: LogPosition::new(3),
                source: Arc::new(
                    rmp_serde::from_slice::<u8>(b"").expect_err("nothing is no record"),
                ),
            },
            Halt::Module {
                sequence: LogPosition::new(3),
                module: ModuleFingerprint::of(b"wasm"),
                runtime: "demo".into(),
                source: Arc::clone(&shared),
            },
            Halt::Restore {
                sequence: LogPosition::new(3),
                object: "restore-00".into(),
                source: shared,
            },
            Halt::Apply {
                sequence: LogPosition::new(3),
                source: Arc::new(ApplyError::Stopped {
                    runtime: "demo".into(),
                }),
            },
        ]
    }

    #[test]
    fn every_halt_has_a_listed_kind_and_every_kind_a_halt() {
        let halts = every();
        for halt in &halts {
            assert!(Halt::KINDS.contains(&halt.kind()), "{halt:?}");
        }
        for kind in Halt::KINDS {
            assert!(halts.iter().any(|h| h.kind() == kind), "{kind}");
        }
    }

    #[test]
    fn halts_say_why_in_the_words_readyz_always_used() {
        let [uncovered, skipped, purged, recreated, format, unreadable, module, restore, apply] =
            <[Halt; 9]>::try_from(every()).expect("nine halts");
        assert!(uncovered.to_string().contains("no snapshot"));
        assert_eq!(
            skipped.to_string(),
            "the stream delivered sequence 7 where 4 was next: messages 4..7 are gone (purged or aged out) before this node applied them"
        );
        assert_eq!(
            purged.to_string(),
            "the stream starts at sequence 7, but this node needs 4 next: messages are gone (purged or aged out) before this node applied them"
        );
        assert!(recreated.to_string().contains("created again"));
        assert_eq!(
            format.to_string(),
            "sequence 3 is a record of format 9, which this viewtape cannot read (it reads 1 and 2): upgrade this node"
        );
        assert!(unreadable.to_string().contains("cannot read"));
        assert!(module
            .to_string()
            .ends_with("which this node cannot load: the bucket is away"));
        assert!(restore
            .to_string()
            .ends_with("cannot fetch: the bucket is away"));
        assert_eq!(apply.to_string(), "sequence 3: runtime `demo` has stopped");
        assert!(std::error::Error::source(&apply).is_some());
    }
}
