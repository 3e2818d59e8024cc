//! Replicas: nodes that share one input log, a JetStream stream (`[cluster]`, `--nats URL`).
//!
//! The stream takes the place of the local log. A node that accepts a batch publishes it —
//! a [`BatchEntry`] whose outcome is still [`Outcome::Pending`], with a message id from its
//! producer stamp so JetStream drops a resent duplicate — and answers once it has applied that
//! stream sequence itself. Every node applies every message in stream order through the same
//! deterministic guests ([`RuntimeHandle::apply`]), at the message's stream sequence as its log
//! position, so every node issues the same offsets and frames under the same epoch: a cursor
//! from one node resumes on any other.
//!
//! - **The epoch** is derived from the stream's name and creation time: the same on every node,
//!   and another one for a stream that was deleted and created again.
//! - **Start-up** restores the newest local snapshot if it belongs to this stream's epoch and the
//!   stream still holds every message after it; else the newest such snapshot another node
//!   shared in the bucket; else, if the stream still holds its first message, the node starts
//!   empty and applies it all. Otherwise it cannot know the history: it fails closed, serving
//!   an empty state under an epoch of its own, refusing ingest, not ready.
//! - **Shared snapshots**: every snapshot a node writes goes to the object store bucket too,
//!   named by epoch and stream sequence; the newest few of the epoch are kept.
//! - **The apply loop** checks every delivered stream sequence: the next one expected, or the
//!   node stops applying and is not ready — a sequence is never skipped, and JetStream moving a
//!   too-old start up to its first message (after a purge, or messages aged out) is caught here,
//!   and so is a stream deleted and created again (another creation time: another history).
//! - **Not ready** (`/readyz` 503) until the node has applied what the stream held when it
//!   joined, and for good after a break, which says why.
//! - **A cursor ahead** of this node (another node issued it) waits up to `ahead_wait` for
//!   the apply loop to reach it ([`Cluster::reach`]) before it is judged.
//! - **Admin**: a live restore or a deploy would change one node alone; both are refused.
//! - **NATS down**: ingest answers `503` with `Retry-After`; streams go on with what the node
//!   has; the client reconnects by itself and the apply loop resumes after its last sequence.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_nats::jetstream::{self, consumer, kv, object_store, stream};
use bytes::Bytes;
use futures_util::StreamExt as _;
use serde::Serialize;
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;
use tracing::Instrument as _;
use viewtape_journal::{Cursor, JournalEpoch, JournalSnapshot};
use viewtape_snapshots::{Loaded, SnapshotDir};

use crate::config::ClusterSection;
use crate::hub::Hub;
use crate::log::{BatchEntry, Entry, Log, Outcome, Receipt};
use crate::registry::Runtimes;
use crate::runtime::{Accepted, BoxFuture, IngestError, ReplayError, SharedLog};
use crate::snapshot::{RuntimeDump, SnapshotBody, Snapshots};

/// Outcomes of applied sequences kept for the ingest that published them.
const OUTCOMES_KEPT: usize = 8192;
/// Times a batch the runtime could not run now is applied again before the node gives up.
const APPLY_ATTEMPTS: u32 = 10;
/// How long a lease lasts unless renewed; renewed every third of it.
const LEASE: Duration = Duration::from_secs(6);
/// Shared snapshots of the epoch kept in the bucket.
const SHARED_KEPT: usize = 3;
/// How often the apply loop checks that the stream is the one it joined and holds what it
/// needs next.
const STREAM_CHECK: Duration = Duration::from_secs(2);
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
    /// No snapshot covers the messages the stream no longer holds.
    #[error("cluster: stream {stream:?} starts at sequence {first}, and no snapshot of its epoch reaches sequence {needed}: this node cannot know the history before it")]
    Uncovered {
        /// The stream.
        stream: String,
        /// The stream's first sequence.
        first: u64,
        /// The last sequence a snapshot would have to reach.
        needed: u64,
    },
    /// The snapshot directory could not be read.
    #[error(transparent)]
    Snapshots(#[from] viewtape_snapshots::SnapshotError),
}

/// Whether this node serves what the cluster has; `/readyz` renders it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Readiness {
    /// Caught up with what the stream held when the node joined, and applying.
    pub ready: bool,
    /// The last sequence applied.
    pub applied: u64,
    /// The stream's last sequence, as last seen.
    pub stream_last: u64,
    /// Why the node stopped applying, if it did.
    pub broken: Option<String>,
}

/// A node's place in its cluster.
pub struct Cluster {
    client: async_nats::Client,
    js: jetstream::Context,
    /// Shared snapshots.
    bucket: object_store::ObjectStore,
    /// Leases of what runs on one node at a time ([`Cluster::spawn_once`]).
    leases: kv::Store,
    stream: String,
    url: String,
    epoch: JournalEpoch,
    /// When the stream was created (Unix nanoseconds): its identity, with its name.
    created_ns: i128,
    apply_timeout: Duration,
    ahead_wait: Duration,
    /// The last sequence the stream held when this node joined.
    joined_at: u64,
    /// The stream's first sequence when this node joined.
    stream_first: u64,
    /// The stream's last sequence, as last seen.
    stream_last: AtomicU64,
    outcomes: Mutex<Outcomes>,
    readiness: watch::Sender<Readiness>,
    /// This process's part of the message ids it makes, and how many it made.
    nonce: u64,
    published: AtomicU64,
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

/// What applying each recent sequence gave, and the ingests waiting for theirs.
#[derive(Debug, Default)]
struct Outcomes {
    done: BTreeMap<u64, Result<Accepted, IngestError>>,
    waiting: HashMap<u64, oneshot::Sender<Result<Accepted, IngestError>>>,
}

impl Cluster {
    /// Connects to `section.nats_url` (waiting for it, however long, with a line every few
    /// seconds), and finds or creates the stream.
    ///
    /// # Errors
    /// [`ClusterError::Stream`]: the stream cannot be created or read.
    pub async fn join(section: &ClusterSection, url: &str) -> Result<Arc<Self>, ClusterError> {
        let failed = |reason: String| ClusterError::Stream {
            stream: section.stream.clone(),
            url: url.to_owned(),
            reason,
        };
        let client = async_nats::ConnectOptions::new()
            .retry_on_initial_connect()
            .connection_timeout(Duration::from_secs(2))
            .connect(url)
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
                        "snapshots of the viewtape nodes of stream {}",
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
        let leases_name = format!("{}-leases", section.stream);
        let leases = match js.get_key_value(&leases_name).await {
            Ok(leases) => leases,
            Err(_) => js
                .create_key_value(kv::Config {
                    bucket: leases_name.clone(),
                    description: "which viewtape node runs what runs once per cluster".into(),
                    history: 1,
                    max_age: LEASE,
                    storage: stream::StorageType::File,
                    num_replicas: section.replicas,
                    ..kv::Config::default()
                })
                .await
                .map_err(|error| failed(format!("the lease bucket {leases_name:?}: {error}")))?,
        };
        let created_ns = info.created.unix_timestamp_nanos();
        let epoch = stream_epoch(&section.stream, created_ns);
        tracing::info!(
            stream = %section.stream,
            %epoch,
            first = info.state.first_sequence,
            last = info.state.last_sequence,
            "cluster: joined the stream"
        );
        Ok(Arc::new(Self {
            client,
            js,
            bucket,
            leases,
            stream: section.stream.clone(),
            url: url.to_owned(),
            epoch,
            created_ns,
            apply_timeout: section.apply_timeout,
            ahead_wait: section.ahead_wait,
            joined_at: info.state.last_sequence,
            stream_first: info.state.first_sequence,
            stream_last: AtomicU64::new(info.state.last_sequence),
            outcomes: Mutex::default(),
            nonce: process_nonce(),
            published: AtomicU64::new(0),
            readiness: watch::Sender::new(Readiness {
                ready: false,
                applied: 0,
                stream_last: info.state.last_sequence,
                broken: None,
            }),
        }))
    }

    /// The epoch every node of this stream serves.
    pub fn epoch(&self) -> JournalEpoch {
        self.epoch
    }

    /// Waits, at most `[cluster] ahead_wait`, until this node's `view` has reached `cursor`: a
    /// cursor another node issued may be ahead of this one for as long as this node's apply
    /// lags, and is judged (and perhaps answered `ahead`) only after that.
    pub async fn reach(&self, hub: &Hub, view: &str, cursor: &Cursor) {
        let Some(view) = hub.view(view) else {
            return;
        };
        let mut ticks = view.ticks();
        let ahead = || {
            let window = hub.journal().window_now(view.name());
            window.epoch == cursor.epoch() && cursor.offset() >= window.next
        };
        let caught_up = async {
            while ahead() {
                if ticks.changed().await.is_err() {
                    return;
                }
            }
        };
        if tokio::time::timeout(self.ahead_wait, caught_up)
            .await
            .is_err()
        {
            tracing::debug!(view = view.name(), %cursor, "cluster: a cursor stayed ahead of this node");
        }
    }

    /// Whether this node serves what the cluster has.
    pub fn readiness(&self) -> Readiness {
        self.readiness.borrow().clone()
    }

    /// Restores the newest local snapshot that continues this stream into `hub`, or starts
    /// `hub` empty under the stream's epoch when the stream still holds its first message.
    /// Returns the runtimes' states and the log of stream positions, at the snapshot's.
    ///
    /// When the stream dropped messages that no snapshot holds, the node starts empty under an
    /// epoch of its own and stays not ready ([`ClusterError::Uncovered`] says why).
    ///
    /// # Errors
    /// The snapshot directory cannot be read.
    pub async fn begin(
        &self,
        hub: &Hub,
        snapshots: &SnapshotDir,
    ) -> Result<(BTreeMap<String, RuntimeDump>, Arc<Log>), ClusterError> {
        let first = self.stream_first.max(1);
        let mut usable = self.usable_local(snapshots, first)?;
        if usable.is_none() {
            if let Some(name) = self.fetch_shared(snapshots, first).await {
                usable = self.usable_local(snapshots, first)?;
                if usable.is_none() {
                    tracing::warn!(name, "cluster: the shared snapshot fetched is not usable");
                }
            }
        }
        if let Some((loaded, position)) = usable {
            hub.restore(loaded.body.journal, true, loaded.body.views)
                .await;
            tracing::info!(file = %loaded.info.path().display(), position, epoch = %self.epoch, "cluster: restored snapshot");
            let dumps = loaded
                .body
                .runtimes
                .into_iter()
                .map(|r| (r.name.clone(), r))
                .collect();
            return Ok((dumps, Arc::new(Log::shared(position))));
        }
        let epoch = match first {
            1 => self.epoch,
            _ => {
                // Fail closed: the history before `first` is unknown here, so nothing this node
                // could serve may carry the cluster's epoch. It serves an empty state under an
                // epoch of its own, refuses ingest, and stays not ready.
                let reason = ClusterError::Uncovered {
                    stream: self.stream.clone(),
                    first,
                    needed: first - 1,
                };
                self.break_off(reason.to_string());
                JournalEpoch::random_other_than(self.epoch)
            }
        };
        let empty = JournalSnapshot {
            epoch: Some(epoch),
            taken_at_unix_ms: crate::log::unix_ms_now(),
            views: Vec::new(),
        };
        hub.restore(empty, true, Vec::new()).await;
        Ok((BTreeMap::new(), Arc::new(Log::shared(0))))
    }

    /// The newest snapshot in `snapshots`, if it is of this stream's epoch and the stream still
    /// holds every message after it (its first sequence is `first`).
    fn usable_local(
        &self,
        snapshots: &SnapshotDir,
        first: u64,
    ) -> Result<Option<(Loaded<SnapshotBody>, u64)>, ClusterError> {
        let newest = snapshots.load_newest_valid::<SnapshotBody>()?;
        Ok(newest.loaded.and_then(|loaded| {
            let position = loaded.body.log_position?;
            let ours = loaded.body.journal.epoch == Some(self.epoch);
            if !ours {
                tracing::warn!(file = %loaded.info.path().display(), "cluster: the newest snapshot belongs to another epoch (another stream, or this one recreated); not used");
                return None;
            }
            (position + 1 >= first).then_some((loaded, position))
        }))
    }

    /// Copies the newest shared snapshot of this epoch that the stream continues (its first
    /// sequence is `first`) into `snapshots`; returns its name. `None` when there is none or the
    /// bucket cannot be read (logged).
    async fn fetch_shared(&self, snapshots: &SnapshotDir, first: u64) -> Option<String> {
        let listed = async {
            let mut names = Vec::new();
            let mut list = self.bucket.list().await?;
            while let Some(info) = list.next().await {
                names.push(info?.name);
            }
            Ok::<_, Box<dyn std::error::Error + Send + Sync>>(names)
        };
        let names = match listed.await {
            Ok(names) => names,
            Err(error) => {
                tracing::warn!(%error, "cluster: cannot list the shared snapshots");
                return None;
            }
        };
        let (position, name) = names
            .into_iter()
            .filter_map(|name| Some((shared_position(&name, self.epoch)?, name)))
            .filter(|(position, _)| position + 1 >= first)
            .max()?;
        let fetched = async {
            let mut object = self.bucket.get(&name).await?;
            let mut bytes = Vec::new();
            tokio::io::AsyncReadExt::read_to_end(&mut object, &mut bytes).await?;
            Ok::<_, Box<dyn std::error::Error + Send + Sync>>(bytes)
        };
        match fetched.await {
            Ok(bytes) => match snapshots.write_encoded(&bytes) {
                Ok(info) => {
                    tracing::info!(name, position, file = %info.path().display(), "cluster: fetched a shared snapshot");
                    Some(name)
                }
                Err(error) => {
                    tracing::warn!(%error, name, "cluster: a shared snapshot is damaged; not used");
                    None
                }
            },
            Err(error) => {
                tracing::warn!(%error, name, "cluster: cannot fetch a shared snapshot");
                None
            }
        }
    }

    /// Shares every snapshot `snapshots` writes from now on in the bucket, keeping the newest
    /// [`SHARED_KEPT`] of this epoch.
    pub fn spawn_share(self: &Arc<Self>, snapshots: &Snapshots) -> JoinHandle<()> {
        let cluster = Arc::clone(self);
        let mut written = snapshots.follow_written();
        let span = tracing::info_span!("cluster_share", stream = %self.stream);
        tokio::spawn(
            async move {
                while written.changed().await.is_ok() {
                    let Some((path, position)) = written.borrow_and_update().clone() else {
                        continue;
                    };
                    if let Err(error) = cluster.share(&path, position).await {
                        tracing::warn!(%error, file = %path.display(), "cluster: sharing a snapshot failed");
                    }
                }
            }
            .instrument(span),
        )
    }

    /// Puts the snapshot `path` (at stream sequence `position`) in the bucket, and deletes this
    /// epoch's older ones past [`SHARED_KEPT`].
    async fn share(
        &self,
        path: &std::path::Path,
        position: u64,
    ) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
        let bytes = tokio::fs::read(path).await?;
        let name = shared_name(self.epoch, position);
        self.bucket
            .put(name.as_str(), &mut bytes.as_slice())
            .await?;
        let mut ours = Vec::new();
        let mut list = self.bucket.list().await?;
        while let Some(info) = list.next().await {
            let info = info?;
            if let Some(position) = shared_position(&info.name, self.epoch) {
                ours.push((position, info.name));
            }
        }
        ours.sort_unstable();
        let old = ours.len().saturating_sub(SHARED_KEPT);
        for (_, name) in ours.drain(..old) {
            self.bucket.delete(&name).await?;
        }
        tracing::debug!(name, "cluster: snapshot shared");
        Ok(())
    }

    /// Runs what `start` starts (`name`: the demo feed, say) on one node of the cluster at a
    /// time: the node that holds its lease, taken once the node is ready and renewed every
    /// third of [`LEASE`]. A node that cannot renew stops it; when its holder is gone, another
    /// node takes the lease within [`LEASE`] and starts it there.
    pub fn spawn_once<F>(self: &Arc<Self>, name: &'static str, start: F) -> JoinHandle<()>
    where
        F: Fn() -> JoinHandle<()> + Send + 'static,
    {
        let cluster = Arc::clone(self);
        let span = tracing::info_span!("cluster_once", task = name);
        tokio::spawn(async move { cluster.hold_lease(name, start).await }.instrument(span))
    }

    async fn hold_lease(&self, name: &str, start: impl Fn() -> JoinHandle<()>) {
        let holder = Bytes::from(format!(
            "pid {} since {}",
            std::process::id(),
            crate::log::unix_ms_now()
        ));
        let mut tick = tokio::time::interval(LEASE / 3);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // The task, aborted when the lease is lost (or this loop is).
        let mut running: Option<(AbortOnDrop, u64)> = None;
        loop {
            tick.tick().await;
            running = match running.take() {
                None if !self.readiness().ready => None,
                None => match self.leases.create(name, holder.clone()).await {
                    Ok(revision) => {
                        tracing::info!(name, "cluster: this node holds the lease; starting");
                        Some((AbortOnDrop(start()), revision))
                    }
                    Err(_) => None,
                },
                Some((task, revision)) => {
                    match self.leases.update(name, holder.clone(), revision).await {
                        Ok(revision) => Some((task, revision)),
                        Err(error) => {
                            tracing::warn!(%error, name, "cluster: the lease could not be renewed; stopped here");
                            None
                        }
                    }
                }
            };
        }
    }

    /// Starts applying the stream after `log`'s position to `runtimes`, in order.
    pub fn spawn_apply(self: &Arc<Self>, runtimes: Arc<Runtimes>, log: Arc<Log>) -> JoinHandle<()> {
        let cluster = Arc::clone(self);
        let span = tracing::info_span!("cluster_apply", stream = %self.stream);
        tokio::spawn(async move { cluster.apply_loop(&runtimes, &log).await }.instrument(span))
    }

    /// See the module docs; returns only when the node stops applying for good.
    async fn apply_loop(&self, runtimes: &Runtimes, log: &Log) {
        if self.readiness.borrow().broken.is_some() {
            return;
        }
        let mut next = log.committed() + 1;
        self.note_applied(next - 1);
        loop {
            let messages = match self.subscribe(next).await {
                Ok(Some(messages)) => messages,
                Ok(None) => return,
                Err(error) => {
                    tracing::warn!(%error, next, "cluster: cannot read the stream; retrying");
                    tokio::time::sleep(RETRY).await;
                    continue;
                }
            };
            let mut messages = std::pin::pin!(messages);
            let mut check = tokio::time::interval(STREAM_CHECK);
            check.tick().await;
            let mut checked_at = next;
            loop {
                let message = tokio::select! {
                    message = messages.next() => message,
                    _ = check.tick() => {
                        // The consumer follows a stream of the same name by itself; whether it
                        // is still the same stream, holding what comes next, is checked here.
                        match self.check_stream(next).await {
                            Ok(Some(_)) => {}
                            Ok(None) => return,
                            Err(error) => tracing::debug!(%error, "cluster: cannot check the stream"),
                        }
                        // A consumer that delivers nothing while the stream holds more (after
                        // NATS came back, say) is replaced at once rather than left to its
                        // heartbeats.
                        let stalled = next == checked_at
                            && self.stream_last.load(Ordering::Relaxed) >= next;
                        checked_at = next;
                        if stalled {
                            tracing::info!(next, "cluster: the stream holds more than was delivered; resubscribing");
                            break;
                        }
                        continue;
                    }
                };
                let Some(message) = message else { break };
                let message = match message {
                    Ok(message) => message,
                    Err(error) => {
                        tracing::warn!(%error, next, "cluster: reading the stream failed; resubscribing");
                        break;
                    }
                };
                let sequence = match message.info() {
                    Ok(info) => info.stream_sequence,
                    Err(error) => {
                        tracing::warn!(%error, "cluster: a message without its stream sequence; resubscribing");
                        break;
                    }
                };
                if sequence < next {
                    continue;
                }
                if sequence > next {
                    return self.break_off(format!(
                        "the stream delivered sequence {sequence} where {next} was next: messages {next}..{sequence} are gone (purged or aged out) before this node applied them"
                    ));
                }
                if let Err(reason) = self
                    .apply_one(runtimes, log, sequence, &message.payload)
                    .await
                {
                    return self.break_off(reason);
                }
                next = sequence + 1;
                self.note_applied(sequence);
            }
            tokio::time::sleep(RETRY).await;
        }
    }

    /// An ordered consumer from `next`; `None` when the stream no longer holds `next` (the
    /// node has then stopped applying).
    async fn subscribe(
        &self,
        next: u64,
    ) -> Result<Option<consumer::pull::Ordered>, Box<dyn std::error::Error + Send + Sync>> {
        let Some(stream) = self.check_stream(next).await? else {
            return Ok(None);
        };
        let consumer = stream
            .create_consumer(consumer::pull::OrderedConfig {
                deliver_policy: consumer::DeliverPolicy::ByStartSequence {
                    start_sequence: next,
                },
                ..Default::default()
            })
            .await?;
        Ok(Some(consumer.messages().await?))
    }

    /// The stream, if it is still the one this node joined and still holds `next` (or has not
    /// reached it yet); else the node stops applying and `None`.
    async fn check_stream(
        &self,
        next: u64,
    ) -> Result<Option<stream::Stream>, Box<dyn std::error::Error + Send + Sync>> {
        let mut stream = self.js.get_stream(&self.stream).await?;
        let info = stream.info().await?;
        if info.created.unix_timestamp_nanos() != self.created_ns {
            self.break_off(format!(
                "the stream was deleted and created again (created {}): its sequences are another history, under another epoch; restart this node to join it",
                info.created
            ));
            return Ok(None);
        }
        let state = info.state.clone();
        self.stream_last
            .fetch_max(state.last_sequence, Ordering::Relaxed);
        if state.first_sequence > next && state.last_sequence >= next.max(1) {
            self.break_off(format!(
                "the stream starts at sequence {}, but this node needs {next} next: messages are gone (purged or aged out) before this node applied them",
                state.first_sequence
            ));
            return Ok(None);
        }
        Ok(Some(stream))
    }

    /// Applies the message at `sequence`; `Err` says why the node must stop applying.
    async fn apply_one(
        &self,
        runtimes: &Runtimes,
        log: &Log,
        sequence: u64,
        payload: &Bytes,
    ) -> Result<(), String> {
        let skipped = match Entry::decode(payload) {
            Ok(Entry::Batch(entry)) if entry.outcome == Outcome::Pending => Ok(entry),
            Ok(Entry::Batch(_)) => Err("a batch that already ran elsewhere".to_owned()),
            Ok(Entry::Deploy(deploy)) => {
                return Err(format!(
                    "sequence {sequence} deploys a module to runtime {:?}: deploys through a cluster are not supported",
                    deploy.runtime
                ))
            }
            Err(error) => Err(format!("not a viewtape batch: {error}")),
        };
        let entry = match skipped {
            Ok(entry) => entry,
            Err(why) => {
                // Not published by a node (another client on the stream's subjects): every node
                // passes over it alike, committing nothing at its position.
                tracing::warn!(
                    sequence,
                    why,
                    "cluster: a message on the stream that is no batch of a node; passed over"
                );
                drop(log.turn(Some(sequence), 1).await);
                self.settle(
                    sequence,
                    Err(IngestError::Shared {
                        runtime: String::new(),
                        reason: format!("sequence {sequence} is {why}"),
                    }),
                );
                return Ok(());
            }
        };
        let Some(registered) = runtimes.get(&entry.runtime) else {
            return Err(format!(
                "sequence {sequence} is for runtime {:?}, which this node does not run: every node needs the same runtimes",
                entry.runtime
            ));
        };
        let mut attempt = 0;
        let outcome = loop {
            match registered.handle.apply(entry.clone(), sequence).await {
                Ok(outcome) => break outcome,
                Err(error @ ReplayError::Unavailable { .. }) if attempt < APPLY_ATTEMPTS => {
                    attempt += 1;
                    tracing::warn!(%error, sequence, attempt, "cluster: applying again");
                    tokio::time::sleep(RETRY).await;
                }
                Err(error) => return Err(format!("sequence {sequence}: {error}")),
            }
        };
        debug_assert!(log.committed() >= sequence);
        self.settle(sequence, outcome);
        Ok(())
    }

    /// Hands the outcome of `sequence` to the ingest waiting for it, or keeps it for one that
    /// will ask.
    fn settle(&self, sequence: u64, outcome: Result<Accepted, IngestError>) {
        let mut outcomes = self.outcomes.lock().unwrap_or_else(PoisonError::into_inner);
        match outcomes.waiting.remove(&sequence) {
            Some(waiter) => {
                let _ = waiter.send(outcome);
            }
            None => {
                outcomes.done.insert(sequence, outcome);
                while outcomes.done.len() > OUTCOMES_KEPT {
                    outcomes.done.pop_first();
                }
            }
        }
    }

    fn note_applied(&self, applied: u64) {
        let stream_last = self
            .stream_last
            .fetch_max(applied, Ordering::Relaxed)
            .max(applied);
        self.readiness.send_if_modified(|readiness| {
            let ready = readiness.broken.is_none() && applied >= self.joined_at;
            let changed = readiness.applied != applied || readiness.ready != ready;
            readiness.applied = applied;
            readiness.stream_last = stream_last;
            if ready && !readiness.ready {
                tracing::info!(applied, "cluster: caught up; ready");
            }
            readiness.ready = ready;
            changed
        });
    }

    /// Stops applying for good: the node is not ready, and says why.
    fn break_off(&self, reason: String) {
        tracing::error!(%reason, stream = %self.stream, "cluster: this node stopped applying the stream and is not ready; it keeps serving what it has");
        self.readiness.send_modify(|readiness| {
            readiness.ready = false;
            readiness.broken = Some(reason);
        });
    }

    /// Publishes `entry` and waits for this node to apply it.
    async fn submit_entry(&self, entry: BatchEntry) -> Result<Accepted, IngestError> {
        let runtime = entry.runtime.clone();
        let refused = |reason: String| IngestError::Shared {
            runtime: runtime.clone(),
            reason,
        };
        if let Some(broken) = self.readiness.borrow().broken.clone() {
            return Err(refused(format!(
                "this node stopped applying the stream: {broken}"
            )));
        }
        if self.client.connection_state() != async_nats::connection::State::Connected {
            return Err(refused(format!("not connected to NATS at {}", self.url)));
        }
        // Every message has an id, so JetStream drops a second copy of it: from the producer's
        // stamp (the same batch resent by its producer is the same message, within the
        // duplicate window, and the producer table beyond it), or one of this node's own,
        // which makes the publish below safe to send again.
        let id = match &entry.producer {
            Some(stamp) => format!(
                "{}\u{1f}{}\u{1f}{}\u{1f}{}",
                entry.runtime, stamp.id, stamp.epoch, stamp.seq
            ),
            None => format!(
                "{:016x}-{}",
                self.nonce,
                self.published.fetch_add(1, Ordering::Relaxed)
            ),
        };
        let message = jetstream::message::PublishMessage::build()
            .payload(Bytes::from(Entry::encode_batch(&entry)))
            .message_id(id);
        let subject = format!("{}.in.{}", self.stream, subject_token(&entry.runtime));
        // A publish whose ack is lost (NATS restarting, say) is sent again until the deadline.
        let published = async {
            loop {
                let sent = async {
                    self.js
                        .send_publish(subject.clone(), message.clone())
                        .await
                        .map_err(|error| error.to_string())?
                        .await
                        .map_err(|error| error.to_string())
                };
                match sent.await {
                    Ok(ack) => break ack,
                    Err(error) => {
                        tracing::debug!(%error, "cluster: publish not acknowledged; sending it again");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                }
            }
        };
        let ack = tokio::time::timeout(self.apply_timeout, published)
            .await
            .map_err(|_| {
                refused(format!(
                    "NATS did not acknowledge within {:?}",
                    self.apply_timeout
                ))
            })?;
        self.stream_last.fetch_max(ack.sequence, Ordering::Relaxed);
        let sequence = ack.sequence;
        // A copy of this node's own resend is no news to the producer.
        let duplicate = ack.duplicate && entry.producer.is_some();
        let waiting = {
            let mut outcomes = self.outcomes.lock().unwrap_or_else(PoisonError::into_inner);
            match outcomes.done.remove(&sequence) {
                Some(outcome) => return mark_duplicate(outcome, duplicate),
                None if self.readiness.borrow().applied >= sequence => {
                    // Applied long ago (a duplicate of an old batch): its outcome is gone.
                    return Ok(Accepted {
                        receipt: Receipt {
                            position: Some(sequence),
                            ..Receipt::default()
                        },
                        duplicate: true,
                    });
                }
                None => {
                    let (tx, rx) = oneshot::channel();
                    outcomes.waiting.insert(sequence, tx);
                    rx
                }
            }
        };
        match tokio::time::timeout(self.apply_timeout, waiting).await {
            Ok(Ok(outcome)) => mark_duplicate(outcome, duplicate),
            _ => {
                self.outcomes
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .waiting
                    .remove(&sequence);
                Err(refused(format!(
                    "published at sequence {sequence}, not applied by this node within {:?}; send it again with its Producer-* headers to learn its outcome",
                    self.apply_timeout
                )))
            }
        }
    }
}

impl SharedLog for Cluster {
    fn submit(&self, entry: BatchEntry) -> BoxFuture<'_, Result<Accepted, IngestError>> {
        Box::pin(self.submit_entry(entry))
    }
}

/// A task aborted when this is dropped.
struct AbortOnDrop(JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// `outcome`, flagged as a duplicate when JetStream said the message was one.
fn mark_duplicate(
    outcome: Result<Accepted, IngestError>,
    duplicate: bool,
) -> Result<Accepted, IngestError> {
    outcome.map(|accepted| Accepted {
        duplicate: accepted.duplicate || duplicate,
        ..accepted
    })
}

/// A runtime's name as one token of a NATS subject.
fn subject_token(runtime: &str) -> String {
    runtime
        .chars()
        .map(|c| match c {
            '.' | '*' | '>' | ' ' | '\t' => '_',
            c => c,
        })
        .collect()
}

/// 64 random bits for this process (std's `RandomState` keys from the OS's randomness).
fn process_nonce() -> u64 {
    use std::hash::{BuildHasher as _, Hasher as _};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u32(std::process::id());
    hasher.finish()
}

/// The name of a shared snapshot: its epoch and stream position.
fn shared_name(epoch: JournalEpoch, position: u64) -> String {
    format!("{epoch}-{position:020}")
}

/// The position in a shared snapshot's name, if it is one of `epoch`.
fn shared_position(name: &str, epoch: JournalEpoch) -> Option<u64> {
    let (of, position) = name.split_once('-')?;
    (of == epoch.to_string()).then(|| position.parse().ok())?
}

/// The epoch of the stream `name` created at `created_ns`.
fn stream_epoch(name: &str, created_ns: i128) -> JournalEpoch {
    use sha2::Digest as _;
    let mut hash = sha2::Sha256::new();
    hash.update(b"viewtape cluster epoch\0");
    hash.update(name.as_bytes());
    hash.update(b"\0");
    hash.update(created_ns.to_le_bytes());
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
    fn shared_snapshot_names_carry_epoch_and_position() {
        let epoch = stream_epoch("viewtape", 1);
        let name = shared_name(epoch, 42);
        assert_eq!(shared_position(&name, epoch), Some(42));
        assert_eq!(shared_position(&name, stream_epoch("viewtape", 2)), None);
        assert_eq!(shared_position("garbage", epoch), None);
        assert_eq!(shared_position(&format!("{epoch}-x"), epoch), None);
        // Names sort as positions do.
        assert!(shared_name(epoch, 9) < shared_name(epoch, 10));
    }

    #[test]
    fn runtime_names_become_one_subject_token() {
        assert_eq!(subject_token("orders.eu"), "orders_eu");
        assert_eq!(subject_token("a*b>c d"), "a_b_c_d");
        assert_eq!(subject_token("demo"), "demo");
    }
}
