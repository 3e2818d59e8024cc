//! Replicas: nodes that share one input log, a JetStream stream (`[cluster]`, `--nats URL`).
//!
//! The stream is the log ([`Backend::Stream`]), and the cluster owns it: a node that accepts a
//! batch publishes it and answers once it has applied that stream sequence itself; every node
//! applies every record in stream order through the same deterministic guests, at the record's
//! stream sequence as its log position, so every node issues the same offsets and frames under
//! the same epoch: a cursor from one node resumes on any other. A single node is the same
//! runtime over its local log; only where the records come from differs.
//!
//! | file | job |
//! |---|---|
//! | this one | joining: the stream, the buckets, the epoch, readiness |
//! | `begin` | where a node starts: its own snapshot, a shared one, or the stream's beginning |
//! | `bucket` | the object store: shared snapshots, modules by SHA-256, snapshots to restore |
//! | `lease` | what runs once per cluster (the demo feed, file sources) |
//! | `apply` | the apply loop: every record in order |
//! | `settle` | once caught up: the config's runtimes declared, a contradicting config refused |
//! | `halt` | why a node stops applying, for good: [`Halt`] |
//! | `restore` | a live restore, published by any node and applied by all |
//!
//! - **The epoch** is derived from the stream's name and creation time: the same on every node,
//!   and another one for a stream that was deleted and created again. A live restore takes a
//!   new epoch derived from the stream's and the restore's position, so it too is the same on
//!   every node.
//! - **Every change is a record**: a batch, a deploy (the module in the bucket by SHA-256), a
//!   live restore (the snapshot in the bucket). Every node applies each at its position; a node
//!   that cannot (a record of a newer kind, a module it cannot fetch) stops applying and says
//!   why in `/readyz` (a [`Halt`]), never skipping one. A message on the stream that no node
//!   published is passed over alike on every node.
//! - **The stream decides which module runs.** A runtime's first module on the stream is
//!   declared by the first node to catch up; later ones come by deploys through any node. A
//!   node runs the stream's module (fetching it from the bucket), and a node whose config names
//!   a module the stream never ran is not ready and refuses ingest, saying which module the
//!   stream runs: nothing it does puts a record on the stream that stops the others.
//! - **Runtimes a node does not run** are another node's business: their records are passed
//!   over (alike on every node that lacks them), so one node's extra runtime stops no one. A
//!   node whose state holds nothing of a runtime the stream has records of from before that
//!   state is not ready: it cannot know that runtime's history.
//! - **Not ready** (`/readyz` 503) until the node has applied what the stream held when it
//!   joined and its runtimes' modules are settled, and for good after a break, which says why.
//! - **A cursor ahead** of this node (another node issued it) waits up to `ahead_wait` for
//!   the apply loop to reach it ([`Cluster::reach`]) before it is judged.
//! - **NATS down**: ingest answers `503` with `Retry-After`; streams go on with what the node
//!   has; the client reconnects by itself and the apply loop resumes after its last sequence.

mod apply;
mod begin;
mod bucket;
mod halt;
mod lease;
mod restore;
mod settle;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::{self, kv, object_store, stream};
use serde::Serialize;
use tokio::sync::watch;
use viewtape_journal::{Cursor, JournalEpoch};

pub use apply::Appliers;
pub use halt::Halt;

use crate::config::ClusterSection;
use crate::hub::Hub;
use crate::log::{Backend, Log, LogPosition, StreamDurability, StreamLog};

/// Times a record the runtime could not apply now is applied again before the node gives up.
const APPLY_ATTEMPTS: u32 = 10;
/// How long a lease lasts unless renewed; renewed every third of it.
const LEASE: Duration = Duration::from_secs(6);
/// Shared snapshots of the epoch kept in the bucket.
const SHARED_KEPT: usize = 3;
/// How often the apply loop checks that the stream is the one it joined and holds what it
/// needs next.
const STREAM_CHECK: Duration = Duration::from_secs(1);
/// How often the client pings its NATS server: a server that answers no third ping in a row
/// (a link that stopped forwarding, a stopped process) is left for another within
/// `3 × PING_INTERVAL`, and what waits on it gives up then.
const PING_INTERVAL: Duration = Duration::from_millis(500);
/// How long the stream may hold more than this node's reading of it delivered before the
/// reading is made again (after a stream leader moved, say) and the node says it is behind.
const STALL: Duration = Duration::from_secs(1);
/// How often the apply loop looks for a stalled reading.
const STALL_CHECK: Duration = Duration::from_millis(250);
/// How long the apply loop waits before it reads the stream again.
const RESUBSCRIBE: Duration = Duration::from_millis(100);
/// Pause before the apply loop retries after an error of NATS.
const RETRY: Duration = Duration::from_secs(1);

/// Why a node could not join its cluster.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClusterError {
    /// The stream could not be found or created.
    #[error("cluster: stream {stream:?} on {url}: {reason}")]
    Stream {
        /// The stream.
        stream: String,
        /// The NATS server.
        url: String,
        /// Why.
        reason: String,
    },
    /// The snapshot directory could not be read.
    #[error(transparent)]
    Snapshots(#[from] viewtape_snapshots::SnapshotError),
}

/// Whether this node serves what the cluster has; `/readyz` renders it, with the halt as two
/// members: `broken` (why, in words) and `halt` (its kind, [`Halt::kind`]), both `null` while
/// the node applies.
#[derive(Clone, Debug)]
pub struct Readiness {
    /// Caught up with what the stream held when the node joined, its modules settled, and
    /// applying.
    pub ready: bool,
    /// The last sequence applied.
    pub applied: LogPosition,
    /// The stream's last sequence, as last seen.
    pub stream_last: LogPosition,
    /// Why the node stopped applying, if it did.
    pub broken: Option<Halt>,
    /// Why the node takes no ingest although it applies (its config names another build than
    /// the cluster runs), if it does not.
    pub refused: Option<String>,
    /// Runtimes with records on the stream that this node does not run: it passes over their
    /// records (another node's config names them) and serves none of their views.
    pub passed_over: BTreeSet<String>,
    /// The runtime this node is settling with the stream (declaring its module or its
    /// definition), while it does.
    pub settling: Option<String>,
    /// Why this node is behind the stream now, if it is: it is not connected to NATS, or the
    /// stream holds more than its reading delivered for a while. Ready again once it caught up.
    pub behind: Option<String>,
}

impl Serialize for Readiness {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct as _;
        let mut fields = serializer.serialize_struct("Readiness", 9)?;
        fields.serialize_field("ready", &self.ready)?;
        fields.serialize_field("applied", &self.applied)?;
        fields.serialize_field("stream_last", &self.stream_last)?;
        let broken = self.broken.as_ref();
        fields.serialize_field("broken", &broken.map(ToString::to_string))?;
        fields.serialize_field("halt", &broken.map(Halt::kind))?;
        fields.serialize_field("refused", &self.refused)?;
        fields.serialize_field("settling", &self.settling)?;
        fields.serialize_field("behind", &self.behind)?;
        fields.serialize_field("passed_over", &self.passed_over)?;
        fields.end()
    }
}

/// Why a node cannot judge a cursor ahead of it now ([`Cluster::reach`]).
#[derive(Debug, thiserror::Error)]
pub enum Behind {
    /// It stopped applying the stream.
    #[error("this node stopped applying the stream: {0}")]
    Stopped(String),
    /// It has not applied all the stream holds.
    #[error("this node has applied sequence {applied} of the stream's {last}")]
    Applied {
        /// What it applied.
        applied: LogPosition,
        /// What the stream holds.
        last: LogPosition,
    },
    /// NATS did not say what the stream holds.
    #[error("this node cannot read the stream now")]
    Unreadable,
}

/// A node's place in its cluster.
pub struct Cluster {
    js: jetstream::Context,
    /// Shared snapshots, modules and snapshots to restore.
    bucket: object_store::ObjectStore,
    /// Leases of what runs on one node at a time ([`Cluster::spawn_once`]).
    leases: kv::Store,
    stream: String,
    url: String,
    /// This node's way into the stream: the backend of its log.
    stream_log: Arc<StreamLog>,
    epoch: JournalEpoch,
    /// When the stream was created (Unix nanoseconds): its identity, with its name.
    created_ns: i128,
    ahead_wait: Duration,
    /// The last sequence the stream held when this node joined.
    joined_at: LogPosition,
    /// The stream's first sequence when this node joined.
    stream_first: LogPosition,
    /// The stream's last sequence, as last seen (a [`LogPosition`]'s number: the atomic holds a
    /// `u64`).
    stream_last: AtomicU64,
    /// Every runtime's module is settled (declared on the stream, and named by this node's
    /// config).
    settled: AtomicBool,
    /// Settling has begun.
    settling: AtomicBool,
    readiness: watch::Sender<Readiness>,
    /// Outcomes of the restores applied lately.
    restores: restore::RestoreOutcomes,
}

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster")
            .field("url", &self.url)
            .field("stream", &self.stream)
            .field("epoch", &self.epoch)
            .field("readiness", &self.readiness())
            .finish_non_exhaustive()
    }
}

impl Cluster {
    /// Connects to `section.nats_url` (waiting for it, however long, with a line every few
    /// seconds), and finds or creates the stream and the buckets.
    ///
    /// # Errors
    /// [`ClusterError::Stream`]: the stream cannot be created or read.
    pub async fn join(section: &ClusterSection, url: &str) -> Result<Arc<Self>, ClusterError> {
        let failed = |reason: String| ClusterError::Stream {
            stream: section.stream.clone(),
            url: url.to_owned(),
            reason,
        };
        // One server, or several separated by commas: the client moves between them.
        let servers = url
            .split(',')
            .map(str::trim)
            .filter(|server| !server.is_empty())
            .map(|server| {
                server
                    .parse::<async_nats::ServerAddr>()
                    .map_err(|error| failed(format!("NATS server {server:?} of {url:?}: {error}")))
            })
            .collect::<Result<Vec<_>, _>>()?;
        // The client's connection, followed from its events: waits on NATS end when it is lost.
        let (connection, connected) = watch::channel(false);
        let connection = Arc::new(connection);
        let client = async_nats::ConnectOptions::new()
            .event_callback(move |event| {
                let connection = Arc::clone(&connection);
                async move {
                    match event {
                        async_nats::Event::Connected => connection.send_replace(true),
                        async_nats::Event::Disconnected | async_nats::Event::Closed => {
                            connection.send_replace(false)
                        }
                        _ => return,
                    };
                }
            })
            .retry_on_initial_connect()
            .connection_timeout(Duration::from_secs(2))
            .ping_interval(PING_INTERVAL)
            .connect(servers.as_slice())
            .await
            .map_err(|error| failed(error.to_string()))?;
        let js = jetstream::new(client.clone());
        let config = stream::Config {
            name: section.stream.clone(),
            subjects: vec![format!("{}.in.>", section.stream)],
            storage: stream::StorageType::File,
            num_replicas: section.replicas,
            max_age: section.max_age,
            ..stream::Config::default()
        };
        let mut waited = 0u32;
        let info = loop {
            match js.get_or_create_stream(config.clone()).await {
                Ok(mut stream) => match stream.info().await {
                    Ok(info) => break info.clone(),
                    Err(error) => {
                        tracing::warn!(%error, "cluster: reading the stream failed; retrying")
                    }
                },
                Err(error) if waited.is_multiple_of(5) => {
                    tracing::warn!(%error, url, stream = %section.stream, "cluster: waiting for NATS JetStream");
                }
                Err(_) => {}
            }
            waited += 1;
            if waited > 600 {
                return Err(failed(
                    "NATS JetStream did not answer for 10 minutes".into(),
                ));
            }
            tokio::time::sleep(RETRY).await;
        };
        let bucket = match js.get_object_store(&section.bucket).await {
            Ok(bucket) => bucket,
            Err(_) => js
                .create_object_store(object_store::Config {
                    bucket: section.bucket.clone(),
                    description: Some(format!(
                        "snapshots and modules of the viewtape nodes of stream {}",
                        section.stream
                    )),
                    storage: stream::StorageType::File,
                    num_replicas: section.replicas,
                    ..object_store::Config::default()
                })
                .await
                .map_err(|error| {
                    failed(format!("the snapshot bucket {:?}: {error}", section.bucket))
                })?,
        };
        let bucket_of = |suffix: &str, description: &str, max_age: Duration| {
            let config = kv::Config {
                bucket: format!("{}-{suffix}", section.stream),
                description: description.to_owned(),
                history: 1,
                max_age,
                storage: stream::StorageType::File,
                num_replicas: section.replicas,
                ..kv::Config::default()
            };
            key_value(&js, config)
        };
        let leases = bucket_of(
            "leases",
            "which viewtape node runs what runs once per cluster",
            LEASE,
        )
        .await
        .map_err(|error| failed(format!("the lease bucket: {error}")))?;
        let checks = bucket_of(
            "checks",
            "what each viewtape node applied, compared",
            crate::log::check::KEPT,
        )
        .await
        .map_err(|error| failed(format!("the check bucket: {error}")))?;
        let created_ns = info.created.unix_timestamp_nanos();
        let epoch = stream_epoch(&section.stream, created_ns);
        let durability = match info.config.num_replicas > 1 || section.stream_synced {
            true => StreamDurability::Replicated,
            false => {
                tracing::warn!(
                    stream = %section.stream,
                    "cluster: the stream has one replica, and NATS acknowledges a message before it syncs it to disk unless its server runs with `sync_interval: always`: a power loss of the NATS machine can lose acknowledged batches. Use a replicated stream ([cluster] replicas = 3 on a NATS cluster), or set `sync_interval: always` on the server and [cluster] stream_synced = true; receipts say \"durability\": \"stream_os\" until then"
                );
                StreamDurability::Unsynced
            }
        };
        tracing::info!(
            stream = %section.stream,
            %epoch,
            first = info.state.first_sequence,
            last = info.state.last_sequence,
            "cluster: joined the stream"
        );
        let stream_log = Arc::new(StreamLog::new(
            (client, connected),
            url,
            (&section.stream, epoch),
            section.apply_timeout,
            durability,
            (section.batches_per_message, checks),
        ));
        Ok(Arc::new(Self {
            js,
            stream_log,
            bucket,
            leases,
            stream: section.stream.clone(),
            url: url.to_owned(),
            epoch,
            created_ns,
            ahead_wait: section.ahead_wait,
            joined_at: LogPosition::new(info.state.last_sequence),
            stream_first: LogPosition::new(info.state.first_sequence),
            stream_last: AtomicU64::new(info.state.last_sequence),
            settled: AtomicBool::new(false),
            settling: AtomicBool::new(false),
            restores: watch::Sender::new(Default::default()),
            readiness: watch::Sender::new(Readiness {
                ready: false,
                applied: LogPosition::ZERO,
                stream_last: LogPosition::new(info.state.last_sequence),
                broken: None,
                refused: None,
                passed_over: BTreeSet::new(),
                settling: None,
                behind: None,
            }),
        }))
    }

    /// The epoch every node of this stream serves.
    pub fn epoch(&self) -> JournalEpoch {
        self.epoch
    }

    /// The log of this node: the stream from `position` on, having passed over the records of
    /// the runtimes in `passed_over` ([`StreamLog::passed_over`]).
    fn log_at(
        &self,
        position: LogPosition,
        passed_over: BTreeMap<String, LogPosition>,
    ) -> Arc<Log> {
        self.stream_log.take_passed_over(passed_over);
        let backend = Backend::Stream(Arc::clone(&self.stream_log));
        Arc::new(Log::new(backend, position))
    }

    /// Waits, at most `[cluster] ahead_wait`, until this node's `view` has reached `cursor`: a
    /// cursor another node issued may be ahead of this one for as long as this node's apply
    /// lags. A cursor still ahead after the wait is judged (and answered `ahead`) only when this
    /// node has applied all that the stream holds, asked for then: every cursor any node issued
    /// names an event of that.
    ///
    /// # Errors
    /// The cursor is still ahead after the wait and this node has not applied what the stream
    /// holds (or cannot learn what that is): it cannot tell a cursor of another node from a
    /// false one, and says why rather than reset a cursor that may be valid.
    pub async fn reach(&self, hub: &Hub, view: &str, cursor: &Cursor) -> Result<(), Behind> {
        let Some(view) = hub.view(view) else {
            return Ok(());
        };
        let ahead = || {
            let window = hub.journal().window_now(view.name());
            window.epoch == cursor.epoch() && cursor.offset() >= window.next
        };
        let mut ticks = view.ticks();
        let caught_up = async {
            while ahead() {
                if ticks.changed().await.is_err() {
                    return;
                }
            }
        };
        if tokio::time::timeout(self.ahead_wait, caught_up)
            .await
            .is_ok()
        {
            return Ok(());
        }
        let last = self.stream_last_now().await;
        let readiness = self.readiness.borrow();
        let behind = match (&readiness.broken, last) {
            (Some(broken), _) => Behind::Stopped(broken.to_string()),
            (None, Some(last)) if readiness.applied >= last => return Ok(()),
            (None, Some(last)) => Behind::Applied {
                applied: readiness.applied,
                last,
            },
            (None, None) => Behind::Unreadable,
        };
        tracing::debug!(view = view.name(), %cursor, %behind, "cluster: a cursor stayed ahead of this node, which is behind the stream");
        Err(behind)
    }

    /// The stream's last sequence, asked for now; `None` if NATS does not answer within
    /// [`STREAM_CHECK`].
    async fn stream_last_now(&self) -> Option<LogPosition> {
        let last = async {
            let mut stream = self.js.get_stream(&self.stream).await.ok()?;
            let info = stream.info().await.ok()?;
            // A replicated stream without a leader (one is being elected) is described from
            // what the cluster last knew of it, which may lag what its nodes applied: nothing
            // is judged on that.
            if info.cluster.as_ref().is_some_and(|c| c.leader.is_none()) {
                return None;
            }
            Some(info.state.last_sequence)
        };
        let last = tokio::time::timeout(STREAM_CHECK, last).await.ok()??;
        let seen = self
            .stream_last
            .fetch_max(last, std::sync::atomic::Ordering::Relaxed);
        // Never less than what this node saw the stream hold before.
        Some(LogPosition::new(last.max(seen)))
    }

    /// Waits, at most `[cluster] ahead_wait`, until this node has applied the stream up to
    /// `position` (one another node answered a change or a batch with); whether it has.
    pub async fn reach_position(&self, position: LogPosition) -> bool {
        let mut readiness = self.readiness.subscribe();
        let reached = async {
            readiness
                .wait_for(|r| r.applied >= position || r.broken.is_some())
                .await
                .is_ok_and(|readiness| readiness.applied >= position)
        };
        tokio::time::timeout(self.ahead_wait, reached)
            .await
            .unwrap_or(false)
    }

    /// The last position this node applied.
    pub fn applied(&self) -> LogPosition {
        self.readiness.borrow().applied
    }

    /// Whether this node serves what the cluster has.
    pub fn readiness(&self) -> Readiness {
        self.readiness.borrow().clone()
    }
}

/// The key-value bucket `config` names, made as `config` says if it is not there.
///
/// # Errors
/// Neither worked: why it could not be made.
async fn key_value(
    js: &jetstream::Context,
    config: kv::Config,
) -> Result<kv::Store, jetstream::context::CreateKeyValueError> {
    match js.get_key_value(&config.bucket).await {
        Ok(store) => Ok(store),
        Err(_) => js.create_key_value(config).await,
    }
}

/// The epoch of the stream `name` created at `created_ns`.
fn stream_epoch(name: &str, created_ns: i128) -> JournalEpoch {
    use sha2::Digest as _;
    let mut hash = sha2::Sha256::new();
    hash.update(b"viewtape cluster epoch\0");
    hash.update(name.as_bytes());
    hash.update(b"\0");
    hash.update(created_ns.to_le_bytes());
    epoch_of(hash)
}

/// The epoch a live restore at stream `position` takes on every node.
fn restored_epoch(stream: JournalEpoch, position: LogPosition) -> JournalEpoch {
    use sha2::Digest as _;
    let mut hash = sha2::Sha256::new();
    hash.update(b"viewtape restore epoch\0");
    hash.update(stream.to_string().as_bytes());
    hash.update(position.get().to_le_bytes());
    epoch_of(hash)
}

fn epoch_of(hash: sha2::Sha256) -> JournalEpoch {
    use sha2::Digest as _;
    let digest = hash.finalize();
    let mut bits = [0u8; 8];
    bits.copy_from_slice(&digest[..8]);
    JournalEpoch::from_bits(u64::from_le_bytes(bits))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_epoch_is_the_streams_identity() {
        let a = stream_epoch("viewtape", 1_700_000_000_000_000_000);
        assert_eq!(a, stream_epoch("viewtape", 1_700_000_000_000_000_000));
        assert_ne!(a, stream_epoch("viewtape", 1_700_000_000_000_000_001));
        assert_ne!(a, stream_epoch("other", 1_700_000_000_000_000_000));
    }

    #[test]
    fn readyz_names_the_halt_and_says_why() {
        let mut readiness = Readiness {
            ready: true,
            applied: LogPosition::new(7),
            stream_last: LogPosition::new(7),
            broken: None,
            refused: None,
            passed_over: BTreeSet::new(),
            settling: None,
            behind: None,
        };
        let body = serde_json::to_value(&readiness).unwrap();
        assert_eq!(
            body,
            serde_json::json!({
                "ready": true, "applied": 7, "stream_last": 7, "broken": null, "halt": null,
                "refused": null, "passed_over": [], "settling": null, "behind": null,
            })
        );
        let halt = Halt::Recreated {
            created: "2026-01-01 0:00:00.0 +00:00:00".into(),
        };
        readiness.ready = false;
        readiness.broken = Some(halt.clone());
        let body = serde_json::to_value(&readiness).unwrap();
        assert_eq!(body["halt"], "recreated");
        assert_eq!(body["broken"], halt.to_string());
        assert!(body["broken"].as_str().unwrap().contains("created again"));
    }

    #[test]
    fn a_restore_takes_an_epoch_of_its_position_on_every_node() {
        let stream = stream_epoch("viewtape", 1);
        assert_eq!(
            restored_epoch(stream, LogPosition::new(7)),
            restored_epoch(stream, LogPosition::new(7))
        );
        assert_ne!(
            restored_epoch(stream, LogPosition::new(7)),
            restored_epoch(stream, LogPosition::new(8))
        );
        assert_ne!(restored_epoch(stream, LogPosition::new(7)), stream);
    }
}
