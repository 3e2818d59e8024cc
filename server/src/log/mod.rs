//! The server's side of the log: what a record holds ([`Entry`]), the receipt a producer
//! gets ([`Receipt`]), idempotent producers ([`producer`]), and [`Log`] — the writer shared by
//! every runtime, with the order in which their batches become visible.
//!
//! ## Durability before visibility
//!
//! A runtime runs a group of batches through its guest, appends their records with one
//! [`Log::append`] (consecutive positions, durable together, sharing group commits with every
//! other runtime), and only once that returns commits them to the journal and answers. Commits
//! happen in log order across all runtimes: [`Log::turn`] waits until every earlier position has
//! committed, so a replay, which applies records in log order, issues the same offsets.
//!
//! ## Backends
//!
//! A server runs in one of three modes, and its log says which by its [`Backend`]: off
//! (`[log] enabled = false`: [`Log::append`] returns at once with no position, and nothing is
//! replayed at a restart), this node's own [`Segments`], or a cluster's [`StreamLog`]. Each
//! variant holds what its mode owns; the commit order is the same for all three.
//!
//! ## Positions
//!
//! A record's place in the log is a [`LogPosition`], defined beside the segment files it
//! numbers (`viewtape_snapshots::log`) and re-exported here: receipts, turns, the committed
//! position and a snapshot's recorded position all carry it, never a bare `u64`. On a cluster a
//! position is the stream sequence of the record's message, the same type: the type's docs say
//! why.
//!
//! | file | job |
//! |---|---|
//! | this one | [`Log`] and its [`Backend`]: appends, turns, the segments' reopen after a failure; the receipt |
//! | `entry` | what a record holds |
//! | `producer` | idempotent producers |
//! | `stream` | a cluster's stream as the log |
//! | [`check`] | a cluster's nodes comparing what they applied |
//! | `gather` | a cluster's group commit: a runtime's waiting batches in one stream message |
//! | `publisher` | publishing to the stream: the shared connection, message ids, the record header and versions |
//! | `metrics` | what `/metrics` renders of the log and the stream |
//!
//! Past 500 lines: [`Log`] is one object whose appends, turns and reopen share its state; the
//! record formats, producers, metrics and the stream are in the files of the table above.

pub mod check;
mod definition;
mod entry;
mod gather;
mod metrics;
pub mod producer;
mod publisher;
pub mod stream;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use serde::{Deserialize, Serialize};
use tokio::sync::{oneshot, watch};
use viewtape_snapshots::log::{Durability, LogDir, LogError, LogWriter};
use viewtape_snapshots::log::{Lineage, WriterOptions};

pub use viewtape_snapshots::log::LogPosition;

pub use definition::{guest_config, Declaring, DefineEntry, Definition, Logged, RetireEntry};
pub use entry::{BatchEntry, DeployEntry, Digest, Entry, Outcome, RestoreEntry};
pub use metrics::LogMetrics;
pub use publisher::PublishError;
pub use stream::{Publishing, StreamDurability, StreamLog};

/// What an acknowledged batch was promised: the body of an ingest `200`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Receipt {
    /// Events per view.
    pub events: BTreeMap<String, u64>,
    /// The gaps the batch reported (the guest's reasons, or its source's).
    pub gaps: Vec<String>,
    /// The batch's log position (`None` with the log off). Positions only increase: none is
    /// named for two batches, also across a start that failed closed.
    pub position: Option<LogPosition>,
    /// `"fsync"` (on the device) or `"os"` (handed to the operating system); `None` with the
    /// log off.
    pub durability: Option<DurabilityName>,
}

/// How durable an acknowledged batch is, as a receipt names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DurabilityName {
    /// Synced to the device.
    Fsync,
    /// Handed to the operating system.
    Os,
    /// Stored by a cluster's stream (JetStream), replicated or synced before it acknowledged.
    Stream,
    /// Stored by a cluster's stream on one NATS server that syncs periodically: it survives a
    /// crash of any process, not a power loss of that server's machine.
    #[serde(rename = "stream_os")]
    StreamOs,
}

impl From<Durability> for DurabilityName {
    fn from(durability: Durability) -> Self {
        match durability {
            Durability::Fsync => Self::Fsync,
            Durability::Os => Self::Os,
        }
    }
}

/// Why the log's history could not be continued (the label of
/// `viewtape_log_fail_closed_total`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Break {
    /// A damaged record or segment before the tail.
    Corrupt,
    /// Records or segments are missing, or nothing ties the log to a snapshot.
    Missing,
    /// A replayed batch produced something else than it did.
    Digest,
    /// A record of a module or guest config that does not run here.
    Module,
    /// The machine restarted under `fsync = "os"`.
    Boot,
}

impl Break {
    /// Every cause.
    pub const ALL: [Break; 5] = [
        Break::Corrupt,
        Break::Missing,
        Break::Digest,
        Break::Module,
        Break::Boot,
    ];

    /// The metric's label.
    pub fn as_str(self) -> &'static str {
        match self {
            Break::Corrupt => "corrupt",
            Break::Missing => "missing",
            Break::Digest => "digest",
            Break::Module => "module",
            Break::Boot => "boot",
        }
    }
}

impl std::fmt::Display for Break {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where a log's records go: the three modes a server runs in, each holding what it owns.
///
/// The runtimes never ask which one they have, but for the way in: a batch is appended here
/// ([`Log::append`]) on the first two, published to the stream on the third. Commit order
/// ([`Log::turn`]) is the same for all three.
#[derive(Debug)]
pub enum Backend {
    /// The log off (`[log] enabled = false`): nothing is appended, nothing is replayed at a
    /// restart, and batches have no positions.
    Off,
    /// This node's own segment files in its data directory.
    Segments(Segments),
    /// A cluster's stream: positions are its sequences, records are published there by any
    /// node and applied by every node in its order. The cluster owns it too.
    Stream(Arc<StreamLog>),
}

/// The local segment log: its writer, and what its reopen after a failure needs.
///
/// ## After a failure
///
/// A failed write or sync poisons the writer: what reached the disk is unknown. The first
/// append that fails starts a reopen, which takes the writer away (appends fail fast with
/// [`LogError::Poisoned`] meanwhile, so ingest answers 503), waits until every record that was
/// made durable has committed, cuts the records after the last committed one (written, never
/// acknowledged), checks what is left, and starts a new writer on a new file descriptor — the
/// old one is never trusted again. It retries every second until it succeeds.
#[derive(Debug)]
pub struct Segments {
    /// `None` before start-up has replayed the log, and while it is reopened.
    writer: Mutex<Option<LogWriter>>,
    /// The log's directory and segment size, once the writer runs.
    dir: OnceLock<(LogDir, u64)>,
    durability: Durability,
    /// The last position made durable.
    durable: AtomicU64,
    /// A reopen is under way.
    reopening: AtomicBool,
    /// What new segments' headers carry, and whether the end-of-log watermark is kept.
    lineage: Mutex<(Lineage, bool)>,
}

impl Segments {
    /// Segments written with `durability`; the writer comes with [`Log::start_writer`].
    pub fn new(durability: Durability) -> Self {
        Self {
            writer: Mutex::new(None),
            dir: OnceLock::new(),
            durability,
            durable: AtomicU64::new(0),
            reopening: AtomicBool::new(false),
            lineage: Mutex::new((Lineage::default(), true)),
        }
    }
}

/// The log as the runtimes use it: its backend ([`Backend`]) and the order in which records
/// commit, whatever the backend.
#[derive(Debug)]
pub struct Log {
    backend: Backend,
    /// The last position committed to the journal.
    committed: watch::Sender<LogPosition>,
    /// Set while a replay that broke off drains the records it had in flight: their turns
    /// will never come, and [`Log::turn_unless_abandoned`] says so.
    abandoned: watch::Sender<bool>,
    metrics: LogMetrics,
}

impl Log {
    /// A log on `backend` whose records up to `committed` are already applied (a snapshot's
    /// position). Segments get their writer with [`Log::start_writer`]; until then nothing is
    /// appended.
    pub fn new(backend: Backend, committed: LogPosition) -> Self {
        if let Backend::Segments(segments) = &backend {
            segments.durable.store(committed.get(), Ordering::Relaxed);
        }
        Self {
            backend,
            committed: watch::Sender::new(committed),
            abandoned: watch::Sender::new(false),
            metrics: LogMetrics::default(),
        }
    }

    /// Its backend: what the mode it runs in owns.
    pub fn backend(&self) -> &Backend {
        &self.backend
    }

    /// The cluster's stream, when it is the log.
    pub fn stream(&self) -> Option<&Arc<StreamLog>> {
        match &self.backend {
            Backend::Stream(stream) => Some(stream),
            Backend::Off | Backend::Segments(_) => None,
        }
    }

    /// The last position committed, when committed batches have positions (in this node's
    /// segments, or in a cluster's stream); `None` with the log off. What a snapshot records.
    pub fn position(&self) -> Option<LogPosition> {
        match self.backend {
            Backend::Off => None,
            Backend::Segments(_) | Backend::Stream(_) => Some(self.committed()),
        }
    }

    /// How durable an acknowledged batch is; `None` with the log off.
    pub fn durability(&self) -> Option<DurabilityName> {
        match &self.backend {
            Backend::Off => None,
            Backend::Segments(segments) => Some(segments.durability.into()),
            Backend::Stream(stream) => Some(match stream.durability() {
                StreamDurability::Replicated => DurabilityName::Stream,
                StreamDurability::Unsynced => DurabilityName::StreamOs,
            }),
        }
    }

    /// Follows the last committed position.
    pub fn watch_committed(&self) -> watch::Receiver<LogPosition> {
        self.committed.subscribe()
    }

    /// Its metrics.
    pub fn metrics(&self) -> &LogMetrics {
        &self.metrics
    }

    /// Sets what the headers of segments made from now on carry (the data directory's history,
    /// the journal's epoch), and whether the end-of-log watermark is kept; call it before
    /// [`Log::start_writer`]. Other backends have no segments: nothing to set.
    pub fn set_lineage(&self, lineage: Lineage, watermark: bool) {
        if let Backend::Segments(segments) = &self.backend {
            *segments
                .lineage
                .lock()
                .unwrap_or_else(PoisonError::into_inner) = (lineage, watermark);
        }
    }

    /// Starts writing at position `next` of `dir`, segments of `segment_bytes`.
    ///
    /// # Errors
    /// The newest segment cannot be opened or a new one created, or the directory cannot be
    /// listed; [`LogError::Stopped`] when the backend is not segments (nothing to start).
    pub fn start_writer(
        &self,
        dir: &LogDir,
        next: LogPosition,
        segment_bytes: u64,
    ) -> Result<(), LogError> {
        let Backend::Segments(segments) = &self.backend else {
            debug_assert!(false, "a writer started on a log without segments");
            return Err(LogError::Stopped);
        };
        let (lineage, watermark) = *segments
            .lineage
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let options = WriterOptions {
            durability: segments.durability,
            segment_bytes,
            lineage,
            watermark,
        };
        let writer = LogWriter::start(dir, next, options, self.metrics.observer())?;
        self.metrics.position.set(gauge(next.prev().get()));
        self.measure(dir)?;
        segments
            .durable
            .fetch_max(next.prev().get(), Ordering::Relaxed);
        *segments
            .writer
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(writer);
        let _ = segments
            .dir
            .set((LogDir::open_existing(dir.path())?, segment_bytes));
        Ok(())
    }

    /// Reopens the segments after a failure; see [`Segments`].
    async fn reopen(self: Arc<Self>) {
        let Backend::Segments(segments) = &self.backend else {
            return;
        };
        let old = segments
            .writer
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        // Dropping it waits for its thread, which fails what is still queued.
        let _ = tokio::task::spawn_blocking(move || drop(old)).await;
        let durable = LogPosition::new(segments.durable.load(Ordering::Relaxed));
        let mut committed = self.committed.subscribe();
        let _ = committed.wait_for(|c| *c >= durable).await;
        let Some((dir, segment_bytes)) = segments.dir.get() else {
            return;
        };
        loop {
            let log = Arc::clone(&self);
            let path = dir.path().to_owned();
            let segment_bytes = *segment_bytes;
            let reopened = tokio::task::spawn_blocking(move || {
                let dir = LogDir::open_existing(path)?;
                let last = log.committed();
                dir.truncate_after(last)?;
                if let Some((file, reason)) = dir.scan()?.corruption() {
                    return Err(LogError::Io {
                        action: "verify",
                        path: file,
                        source: std::io::Error::new(std::io::ErrorKind::InvalidData, reason),
                    });
                }
                log.start_writer(&dir, last.next(), segment_bytes)?;
                Ok(last)
            })
            .await;
            match reopened {
                Ok(Ok(last)) => {
                    tracing::warn!(
                        through = last.get(),
                        "log reopened and verified; ingest resumes"
                    );
                    segments.reopening.store(false, Ordering::Relaxed);
                    return;
                }
                Ok(Err(error)) => {
                    tracing::error!(%error, "reopening the log failed; ingest answers 503; retrying in 1 s");
                }
                Err(error) => tracing::error!(%error, "reopening the log failed; retrying in 1 s"),
            }
            tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        }
    }

    /// Deletes the segments whose records are all at or before `position` (no snapshot kept
    /// needs them any more). Returns how many went: none but of segments that run.
    ///
    /// # Errors
    /// Listing or deleting fails.
    pub fn delete_before(&self, position: LogPosition) -> Result<usize, LogError> {
        let Backend::Segments(segments) = &self.backend else {
            return Ok(0);
        };
        let Some((dir, _)) = segments.dir.get() else {
            return Ok(0);
        };
        let deleted = dir.delete_before(position)?;
        if deleted > 0 {
            self.measure(dir)?;
        }
        Ok(deleted)
    }

    /// Sets the segment and byte gauges from what `dir` holds.
    fn measure(&self, dir: &LogDir) -> Result<(), LogError> {
        let (segments, bytes) = dir.usage()?;
        self.metrics.segments.set(gauge(segments));
        self.metrics.bytes.set(gauge(bytes));
        Ok(())
    }

    /// Appends `records` at consecutive positions and waits until they are durable. Returns the
    /// position of the first, or `None` with the log off. A cluster's records are published to
    /// its stream instead, never appended here: `None` too.
    ///
    /// # Errors
    /// The segments failed (a reopen starts; see [`Segments`]), are being reopened, or are not
    /// started.
    pub async fn append(
        self: &Arc<Self>,
        records: Vec<Vec<u8>>,
    ) -> Result<Option<LogPosition>, LogError> {
        let segments = match &self.backend {
            Backend::Off | Backend::Stream(_) => return Ok(None),
            Backend::Segments(segments) => segments,
        };
        let count = records.len() as u64;
        let (done, durable) = oneshot::channel();
        {
            let writer = segments
                .writer
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            let Some(writer) = writer.as_ref() else {
                return Err(match segments.reopening.load(Ordering::Relaxed) {
                    true => LogError::Poisoned("the log is being reopened after a failure".into()),
                    false => LogError::Stopped,
                });
            };
            writer.append_all(
                records,
                Box::new(move |result| {
                    let _ = done.send(result);
                }),
            );
        }
        match durable.await.map_err(|_| LogError::Stopped)? {
            Ok(first) => {
                segments
                    .durable
                    .fetch_max(last_of(first, count).get(), Ordering::Relaxed);
                Ok(Some(first))
            }
            Err(error) => {
                if !segments.reopening.swap(true, Ordering::Relaxed) {
                    tracing::error!(%error, "the log failed; reopening it");
                    tokio::spawn(Arc::clone(self).reopen());
                }
                Err(error)
            }
        }
    }

    /// Waits until every position before `first` has committed, and returns the turn of the
    /// `count` records from `first`: they are committed when it is dropped. `None` (the log is
    /// off) is always its turn.
    pub async fn turn(&self, first: Option<LogPosition>, count: u64) -> Turn<'_> {
        let Some(first) = first else {
            return Turn {
                log: self,
                last: None,
            };
        };
        let mut committed = self.committed.subscribe();
        // The sender lives as long as `self`.
        let _ = committed.wait_for(|c| c.next() >= first).await;
        Turn {
            log: self,
            last: Some(last_of(first, count)),
        }
    }

    /// As [`Log::turn`], or `None` once the turns waited for are abandoned
    /// ([`Log::abandon_turns`]): a replay broke off before them.
    pub async fn turn_unless_abandoned(
        &self,
        first: Option<LogPosition>,
        count: u64,
    ) -> Option<Turn<'_>> {
        let mut abandoned = self.abandoned.subscribe();
        tokio::select! {
            biased;
            _ = abandoned.wait_for(|abandoned| *abandoned) => None,
            turn = self.turn(first, count) => Some(turn),
        }
    }

    /// Abandons (`true`) the turns waited for through [`Log::turn_unless_abandoned`], or ends
    /// that (`false`).
    pub fn abandon_turns(&self, abandon: bool) {
        self.abandoned.send_replace(abandon);
    }

    /// Marks `position` as applied without a commit (start-up, before the runtimes run).
    pub fn skip_to(&self, position: LogPosition) {
        self.committed.send_modify(|c| *c = (*c).max(position));
    }

    /// The last position committed: what a snapshot taken now reflects.
    pub fn committed(&self) -> LogPosition {
        *self.committed.borrow()
    }
}

impl Default for Log {
    /// The log off.
    fn default() -> Self {
        Self::new(Backend::Off, LogPosition::ZERO)
    }
}

/// Now, on the wall clock, in Unix milliseconds: the time a batch is accepted at.
pub fn unix_ms_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| {
            u64::try_from(since.as_millis()).unwrap_or(u64::MAX)
        })
}

/// The last of `count` records from `first` (`first` itself for none or one).
fn last_of(first: LogPosition, count: u64) -> LogPosition {
    first.saturating_add(count.saturating_sub(1))
}

/// `n` as a gauge's value.
fn gauge(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// A group's turn to commit; see [`Log::turn`].
#[derive(Debug)]
pub struct Turn<'a> {
    log: &'a Log,
    last: Option<LogPosition>,
}

impl Turn<'_> {
    /// Ends the turn without marking its records committed: they were not all applied.
    pub fn abandon(mut self) {
        self.last = None;
    }
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        if let Some(last) = self.last {
            self.log.skip_to(last);
        }
    }
}
