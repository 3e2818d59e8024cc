//! What one log record holds ([`Entry`]: a batch, a module deployed to a runtime, a runtime
//! defined or retired, or a live restore of a cluster), and the digest that proves a replay reproduced a batch.
//!
//! Records are MessagePack, fields in order; a field added later comes last and has a default,
//! so that a record written by an older viewtape still reads. A record of a kind this version
//! does not know does not decode: whoever meets one stops there rather than skip it.

use std::collections::BTreeMap;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use super::definition::{DefineEntry, RetireEntry};
use super::producer::ProducerStamp;
use crate::host::{EventKind, GuestBatch, ModuleFingerprint};
use crate::source::SourceCheckpoint;

/// One log record.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Entry {
    /// A batch a runtime accepted.
    Batch(BatchEntry),
    /// A module deployed to a runtime: the records after it ran on that module.
    Deploy(DeployEntry),
    /// A snapshot restored into every runtime and view of a cluster, under a new epoch.
    Restore(RestoreEntry),
    /// Batches published to a cluster's stream together, by a node that had several waiting:
    /// one stream position, judged in order by their runtimes, each with its own verdict.
    Batches(Vec<BatchEntry>),
    /// A runtime created or replaced by its definition.
    Define(DefineEntry),
    /// A runtime deleted, its views retired.
    Retire(RetireEntry),
}

/// A live restore on a cluster's stream: every node restores the same snapshot at this record's
/// position and takes the same new epoch (derived from the stream's and the position).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RestoreEntry {
    /// The snapshot file's name in the cluster's snapshot bucket.
    pub object: String,
    /// SHA-256 of the snapshot file's bytes, in hex.
    pub sha256: String,
    /// When it was asked for (wall clock, Unix milliseconds).
    pub at_ms: u64,
}

/// A module that replaced a runtime's module, carrying the guest's state over.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeployEntry {
    /// The runtime.
    pub runtime: String,
    /// The module it runs from here on (kept in the data dir by this fingerprint).
    pub module: ModuleFingerprint,
    /// The module it ran before (for the first deploy of a runtime on a cluster's stream, its
    /// first module: the same as `module`).
    pub previous: ModuleFingerprint,
    /// When (wall clock, Unix milliseconds).
    pub at_ms: u64,
    /// Published to a cluster's stream before any node judged it: every node tries it at its
    /// position, and the new module's verdict on the state (the same on every node) decides.
    /// A local log's deploys were judged before they were logged.
    #[serde(default)]
    pub pending: bool,
    /// The new module refused the old one's state and started fresh, with a gap on the
    /// runtime's views (a module changed while the server was stopped).
    #[serde(default)]
    pub fresh: bool,
    /// The CRC-32C of the deploying node's guest config: a cluster's first deploy of a runtime
    /// decides its config with it, as it decides its module (`None` from older builds).
    #[serde(default)]
    pub guest_config: Option<u32>,
}

impl Entry {
    /// The runtime it belongs to (`None`: it is the whole server's, or gathers batches of
    /// several runtimes).
    pub fn runtime(&self) -> Option<&str> {
        match self {
            Entry::Batch(batch) => Some(&batch.runtime),
            Entry::Deploy(deploy) => Some(&deploy.runtime),
            Entry::Define(define) => Some(&define.runtime),
            Entry::Retire(retire) => Some(&retire.runtime),
            Entry::Restore(_) => None,
            Entry::Batches(batches) => {
                let (first, rest) = batches.split_first()?;
                rest.iter()
                    .all(|batch| batch.runtime == first.runtime)
                    .then_some(first.runtime.as_str())
            }
        }
    }

    /// The record's bytes.
    pub fn encode(&self) -> Vec<u8> {
        // Plain fields always encode.
        rmp_serde::to_vec(self).unwrap_or_default()
    }

    /// The bytes of the record of `batches`, without copying them into an [`Entry`]: one batch
    /// is an [`Entry::Batch`], more an [`Entry::Batches`].
    pub fn encode_batches(batches: &[&BatchEntry]) -> Vec<u8> {
        /// Encodes as [`Entry`] does: the same name, variants by name.
        #[derive(Serialize)]
        #[serde(rename = "Entry")]
        enum Borrowed<'a, 'b> {
            Batch(&'a BatchEntry),
            Batches(&'b [&'a BatchEntry]),
        }
        let borrowed = match batches {
            [batch] => Borrowed::Batch(batch),
            batches => Borrowed::Batches(batches),
        };
        // Plain fields always encode.
        rmp_serde::to_vec(&borrowed).unwrap_or_default()
    }

    /// Reads a record's bytes.
    ///
    /// # Errors
    /// The bytes are not an entry of this version.
    pub fn decode(bytes: &[u8]) -> Result<Self, rmp_serde::decode::Error> {
        rmp_serde::from_slice(bytes)
    }
}

/// One accepted batch, as the log keeps it: everything that reproduces it exactly.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchEntry {
    /// The runtime that accepted it.
    pub runtime: String,
    /// The module that processed it.
    pub module: ModuleFingerprint,
    /// CRC-32C of the guest config the runtime ran with.
    pub guest_config: u32,
    /// When it was accepted (wall clock, Unix milliseconds): a replay appends with this time.
    pub at_ms: u64,
    /// The input bytes.
    pub input: Bytes,
    /// The producer headers it came with.
    pub producer: Option<ProducerStamp>,
    /// A pull source's position after it.
    pub checkpoint: Option<SourceCheckpoint>,
    /// Why a pull source lost input just before it.
    pub source_gap: Option<String>,
    /// What it produced.
    pub outcome: Outcome,
}

/// What a logged batch did.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Outcome {
    /// The guest accepted it and produced this.
    Committed(Digest),
    /// The guest failed on input a pull source had already consumed: the input is lost, a gap is
    /// marked and the source moves past it. The input is not kept.
    Lost,
    /// Published to a cluster's stream before any node ran it: every node runs it in stream
    /// order, and the guest's verdict (the same on every node) decides whether it commits.
    Pending,
}

/// How many bytes of fields [`Digest::of`] checksums at a time.
const DIGEST_CHUNK: usize = 8 << 10;

/// A digest of what a batch produced: events per view, and a CRC-32C over every event and gap in
/// order. A replay that produces a different digest is not the same history.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Digest {
    /// Events per view.
    pub per_view: BTreeMap<String, u64>,
    /// Gaps the guest reported.
    pub gaps: u32,
    /// CRC-32C over `(view, key, kind, payload)` of every event and the reason of every gap.
    pub crc: u32,
}

impl Digest {
    /// The digest of `batch`.
    pub fn of(batch: &GuestBatch) -> Self {
        let mut digest = Digest {
            gaps: u32::try_from(batch.gaps.len()).unwrap_or(u32::MAX),
            ..Digest::default()
        };
        // Fields are gathered into a buffer and checksummed a few KiB at a time: the CRC of the
        // whole is the same, at a fraction of the calls.
        let mut crc = 0;
        let mut chunk = Vec::with_capacity(DIGEST_CHUNK + 256);
        let mut field = |bytes: &[u8]| {
            let len = u32::try_from(bytes.len()).unwrap_or(u32::MAX);
            chunk.extend_from_slice(&len.to_le_bytes());
            chunk.extend_from_slice(bytes);
            if chunk.len() >= DIGEST_CHUNK {
                crc = crc32c::crc32c_append(crc, &chunk);
                chunk.clear();
            }
        };
        for gap in &batch.gaps {
            field(gap.as_bytes());
        }
        for event in &batch.events {
            match digest.per_view.get_mut(&*event.view) {
                Some(n) => *n += 1,
                None => {
                    digest.per_view.insert(event.view.to_string(), 1);
                }
            }
            let kind: &[u8] = match event.kind {
                EventKind::Update => b"u",
                EventKind::Delete => b"d",
            };
            field(event.view.as_bytes());
            field(event.key.as_bytes());
            field(kind);
            field(&event.payload);
        }
        digest.crc = crc32c::crc32c_append(crc, &chunk);
        digest
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::host::GuestEvent;
    use crate::log::producer::{ProducerEpoch, ProducerSeq};

    fn event(view: &str, key: &str, payload: &'static [u8]) -> GuestEvent {
        GuestEvent::new(
            Arc::from(view),
            key.to_owned(),
            EventKind::Update,
            Bytes::from_static(payload),
        )
    }

    #[test]
    fn the_digest_sees_every_field_and_the_order() {
        let batch = GuestBatch::of_events(vec![event("a", "k", b"1"), event("b", "k", b"2")]);
        let digest = Digest::of(&batch);
        assert_eq!(digest.per_view, [("a".into(), 1), ("b".into(), 1)].into());
        let variants = [
            GuestBatch::of_events(vec![event("b", "k", b"2"), event("a", "k", b"1")]),
            GuestBatch::of_events(vec![event("a", "k", b"1"), event("b", "k", b"3")]),
            GuestBatch::of_events(vec![event("a", "k1", b""), event("b", "k", b"2")]),
            GuestBatch {
                gaps: vec!["lost".into()],
                ..batch.clone()
            },
        ];
        for other in variants {
            assert_ne!(Digest::of(&other), digest, "{other:?}");
        }
        assert_eq!(Digest::of(&batch.clone()), digest);
    }

    /// The digest is part of the log's format: a record an earlier build wrote must replay.
    #[test]
    fn the_digest_is_a_crc_of_length_prefixed_fields_in_order() {
        let payload = "x".repeat(3_000); // several of the chunks the CRC is taken in
        let events: Vec<GuestEvent> = (0..9)
            .map(|i| {
                let payload = Bytes::from(format!("\"{payload}{i}\""));
                GuestEvent::new(Arc::from("v"), format!("k{i}"), EventKind::Update, payload)
            })
            .chain([GuestEvent::new(
                Arc::from("w"),
                "gone",
                EventKind::Delete,
                Bytes::new(),
            )])
            .collect();
        let batch = GuestBatch {
            events,
            gaps: vec!["lost 2".into()],
        };
        let mut bytes = Vec::new();
        let mut put = |field: &[u8]| {
            bytes.extend_from_slice(&(field.len() as u32).to_le_bytes());
            bytes.extend_from_slice(field);
        };
        put(b"lost 2");
        for event in &batch.events {
            let kind = if event.kind == EventKind::Update {
                "u"
            } else {
                "d"
            };
            put(event.view.as_bytes());
            put(event.key.as_bytes());
            put(kind.as_bytes());
            put(&event.payload);
        }
        let digest = Digest::of(&batch);
        assert_eq!(digest.crc, crc32c::crc32c(&bytes));
        assert_eq!(digest.per_view, [("v".into(), 9), ("w".into(), 1)].into());
        assert_eq!(digest.gaps, 1);
    }

    #[test]
    fn an_entry_round_trips() {
        let entry = BatchEntry {
            runtime: "demo".into(),
            module: ModuleFingerprint::of(b"wasm"),
            guest_config: 7,
            at_ms: 1_700_000_000_000,
            input: Bytes::from_static(b"{\"seq\":1}\n"),
            producer: Some(ProducerStamp {
                id: "p".into(),
                epoch: ProducerEpoch::new(1),
                seq: ProducerSeq::new(2),
                claim: false,
            }),
            checkpoint: None,
            source_gap: None,
            outcome: Outcome::Committed(Digest::default()),
        };
        let bytes = Entry::encode_batches(&[&entry]);
        let other = BatchEntry {
            producer: None,
            outcome: Outcome::Pending,
            ..entry.clone()
        };
        let group = Entry::encode_batches(&[&entry, &other]);
        assert_eq!(
            Entry::decode(&group).unwrap(),
            Entry::Batches(vec![entry.clone(), other])
        );
        let entry = Entry::Batch(entry);
        assert_eq!(bytes, entry.encode());
        assert_eq!(Entry::decode(&entry.encode()).unwrap(), entry);
        assert!(Entry::decode(b"\x01garbage").is_err());
        let deploy = Entry::Deploy(DeployEntry {
            runtime: "demo".into(),
            module: ModuleFingerprint::of(b"new"),
            previous: ModuleFingerprint::of(b"old"),
            at_ms: 1,
            pending: true,
            fresh: false,
            guest_config: Some(7),
        });
        assert_eq!(Entry::decode(&deploy.encode()).unwrap(), deploy);
        let define = Entry::Define(crate::log::DefineEntry {
            runtime: "chat".into(),
            definition: crate::log::Definition {
                module: ModuleFingerprint::of(b"json"),
                module_name: "builtin:json".into(),
                views: vec!["chat.*".into()],
                config: String::new(),
                schemas: [("chat.x".to_owned(), "{\"type\":\"object\"}".to_owned())].into(),
                limits: (&crate::host::Limits::default()).into(),
                declared: Some("sha256:00".into()),
            },
            at_ms: 2,
            pending: false,
        });
        assert_eq!(Entry::decode(&define.encode()).unwrap(), define);
        let retire = Entry::Retire(crate::log::RetireEntry {
            runtime: "chat".into(),
            at_ms: 3,
        });
        assert_eq!(Entry::decode(&retire.encode()).unwrap(), retire);
    }
}
