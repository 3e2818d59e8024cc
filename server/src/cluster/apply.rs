//! The apply loop: every record of the stream, in order, at its sequence.
//!
//! Every delivered sequence is checked: the next one expected, or the node stops applying and
//! is not ready — a sequence is never skipped, and JetStream moving a too-old start up to its
//! first message (after a purge, or messages aged out) is caught here, and so is a stream
//! deleted and created again (another creation time: another history).
//!
//! Records carry the [`RECORD_HEADER`]; a message without it is a batch published by an older
//! viewtape (which did not set it) if it reads as one, and otherwise was not published by a
//! node (another client on the stream's subjects): every node passes over it alike, committing
//! nothing at its position. A record with the header that this node cannot read or apply stops
//! the loop.
//!
//! One file of about 600 lines on purpose: the loop, the check of each delivered sequence and the
//! apply of each record are one sequence of decisions about one stream, read top to bottom.
//! Settling the node's runtimes once it has caught up is `settle.rs`.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use async_nats::jetstream::{consumer, stream};
use futures_util::StreamExt as _;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::Instrument as _;

use super::bucket::BoxError;
use super::halt::SharedError;
use super::{Cluster, Halt, APPLY_ATTEMPTS, RESUBSCRIBE, RETRY, STALL, STALL_CHECK, STREAM_CHECK};
use crate::catalog::Catalog;
use crate::host::{GuestEngine, GuestModule, ModuleFingerprint};
use crate::log::stream::{RECORD_HEADER, RECORD_VERSION, SHARED_VERSION};
use crate::log::{BatchEntry, Definition, Entry, Log, LogPosition, Outcome};
use crate::runtime::handle::Record;
use crate::runtime::registry::{ModuleStore, Registered, Runtimes};
use crate::runtime::ApplyError;
use crate::snapshot::Snapshots;

/// What the apply loop applies records to.
#[derive(Debug)]
pub struct Appliers {
    /// The runtimes.
    pub runtimes: Arc<Runtimes>,
    /// Modules by fingerprint, on this node.
    pub modules: Arc<ModuleStore>,
    /// The engine modules are compiled with.
    pub engine: GuestEngine,
    /// Snapshot actions (a restore record restores through them).
    pub snapshots: Arc<Snapshots>,
    /// Runtime changes (define and retire records apply through it).
    pub catalog: Arc<Catalog>,
    /// This node's config's runtimes: one the stream has no record of is declared by a define
    /// record, so that every node runs it.
    pub configured: BTreeMap<String, Definition>,
}

impl Cluster {
    /// Starts applying the stream after `log`'s position, in order.
    pub fn spawn_apply(self: &Arc<Self>, appliers: Appliers, log: Arc<Log>) -> JoinHandle<()> {
        let cluster = Arc::clone(self);
        let span = tracing::info_span!("cluster_apply", stream = %self.stream);
        tokio::spawn(cluster.apply_loop(Arc::new(appliers), log).instrument(span))
    }

    /// See the module docs; returns only when the node stops applying for good.
    async fn apply_loop(self: Arc<Self>, appliers: Arc<Appliers>, log: Arc<Log>) {
        if let Some(broken) = self.readiness.borrow().broken.clone() {
            self.stream_log
                .refuse(format!("this node stopped applying the stream: {broken}"));
            return;
        }
        let mut next = log.committed().next();
        self.note_applied(&appliers, &log, next.prev());
        let mut failures = 0u32;
        loop {
            let messages = match self.subscribe(next).await {
                Ok(Some(messages)) => messages,
                Ok(None) => return,
                Err(error) => {
                    // Tried again soon (a stream leader is elected in seconds), said now and then.
                    if failures.is_multiple_of(20) {
                        tracing::warn!(%error, next = next.get(), failures, "cluster: cannot read the stream; retrying");
                    }
                    failures += 1;
                    self.note_behind(Some(format!("it cannot read the stream: {error}")));
                    tokio::time::sleep(RESUBSCRIBE * 2).await;
                    continue;
                }
            };
            failures = 0;
            let mut messages = std::pin::pin!(messages);
            let mut check = tokio::time::interval(STREAM_CHECK);
            check.tick().await;
            let mut stall = tokio::time::interval(STALL_CHECK);
            let mut delivered = Instant::now();
            loop {
                let message = tokio::select! {
                    message = messages.next() => message,
                    _ = check.tick() => {
                        // The consumer follows a stream of the same name by itself; whether it
                        // is still the same stream, holding what comes next, is checked here.
                        // Bounded: NATS that does not answer must not hold up the reading.
                        match tokio::time::timeout(STREAM_CHECK, self.check_stream(next)).await {
                            Ok(Ok(Some(_))) => {}
                            Ok(Ok(None)) => return,
                            Ok(Err(error)) => tracing::debug!(%error, "cluster: cannot check the stream"),
                            Err(_) => tracing::debug!("cluster: the stream's info did not come in time"),
                        }
                        continue;
                    }
                    _ = stall.tick() => {
                        // A reading that delivers nothing while the stream holds more (its
                        // leader moved, NATS came back) is made again at once rather than left
                        // to its heartbeats; meanwhile the node says it is behind.
                        let last = self.known_last();
                        let stalled = last >= next && delivered.elapsed() >= STALL;
                        self.note_behind(match (self.stream_log.connected(), stalled) {
                            (false, _) => Some("it is not connected to NATS".to_owned()),
                            (true, true) => Some(format!(
                                "the stream holds sequence {last}, this node applied {} and its reading delivered nothing for {STALL:?}",
                                next.prev()
                            )),
                            (true, false) => None,
                        });
                        if stalled {
                            tracing::info!(next = next.get(), last = last.get(), "cluster: the stream holds more than was delivered; reading it again");
                            break;
                        }
                        continue;
                    }
                };
                let Some(message) = message else { break };
                let message = match message {
                    Ok(message) => message,
                    Err(error) => {
                        tracing::warn!(%error, next = next.get(), "cluster: reading the stream failed; resubscribing");
                        break;
                    }
                };
                let (sequence, published) = match message.info() {
                    Ok(info) => (LogPosition::new(info.stream_sequence), info.published),
                    Err(error) => {
                        tracing::warn!(%error, "cluster: a message without its stream sequence; resubscribing");
                        break;
                    }
                };
                if sequence < next {
                    continue;
                }
                if sequence > next {
                    let halt = Halt::Skipped {
                        next,
                        delivered: sequence,
                    };
                    return self.break_off(halt);
                }
                let ours = message
                    .headers
                    .as_ref()
                    .and_then(|headers| headers.get(RECORD_HEADER))
                    .map(|version| version.as_str().to_owned());
                if let Err(halt) = self
                    .apply_one(&appliers, &log, sequence, ours, &message.payload)
                    .await
                {
                    return self.break_off(halt);
                }
                let lag_ns = crate::log::unix_ms_now() as i128 * 1_000_000
                    - published.unix_timestamp_nanos();
                log.metrics()
                    .apply_lag_seconds
                    .set((lag_ns as f64 / 1e9).max(0.0));
                next = sequence.next();
                delivered = Instant::now();
                self.note_applied(&appliers, &log, sequence);
            }
            tokio::time::sleep(RESUBSCRIBE).await;
        }
    }

    /// The last stream sequence this node knows the stream holds: the last it saw in the
    /// stream's info, or the last NATS acknowledged to it.
    fn known_last(&self) -> LogPosition {
        let seen = self.stream_last.load(Ordering::Relaxed);
        LogPosition::new(seen).max(self.stream_log.acked())
    }

    /// Notes why this node is behind the stream now (`None`: it is not).
    fn note_behind(&self, behind: Option<String>) {
        self.readiness.send_if_modified(|readiness| {
            if readiness.behind == behind {
                return false;
            }
            // Said when it starts and when it ends, not at each new reason.
            match (&readiness.behind, &behind) {
                (None, Some(why)) => tracing::warn!(why, "cluster: behind the stream; not ready"),
                (Some(_), None) => tracing::info!("cluster: caught up with the stream again"),
                _ => {}
            }
            readiness.ready = readiness.ready && behind.is_none();
            readiness.behind = behind;
            true
        });
        let (applied, last) = (self.applied(), self.known_last());
        self.update_readiness(applied, last);
    }

    /// An ordered consumer from `next`; `None` when the stream no longer holds `next` (the
    /// node has then stopped applying).
    async fn subscribe(
        &self,
        next: LogPosition,
    ) -> Result<Option<consumer::pull::Ordered>, BoxError> {
        let Some(stream) = self.check_stream(next).await? else {
            return Ok(None);
        };
        let consumer = stream
            .create_consumer(consumer::pull::OrderedConfig {
                deliver_policy: consumer::DeliverPolicy::ByStartSequence {
                    start_sequence: next.get(),
                },
                ..Default::default()
            })
            .await?;
        Ok(Some(consumer.messages().await?))
    }

    /// The stream, if it is still the one this node joined and still holds `next` (or has not
    /// reached it yet); else the node stops applying and `None`.
    async fn check_stream(&self, next: LogPosition) -> Result<Option<stream::Stream>, BoxError> {
        let mut stream = self.js.get_stream(&self.stream).await?;
        let info = stream.info().await?;
        if info.created.unix_timestamp_nanos() != self.created_ns {
            let created = info.created.to_string();
            self.break_off(Halt::Recreated { created });
            return Ok(None);
        }
        let state = info.state.clone();
        self.stream_last
            .fetch_max(state.last_sequence, Ordering::Relaxed);
        let (first, last) = (
            LogPosition::new(state.first_sequence),
            LogPosition::new(state.last_sequence),
        );
        if first > next && last >= next.max(LogPosition::FIRST) {
            self.break_off(Halt::Purged { first, next });
            return Ok(None);
        }
        Ok(Some(stream))
    }

    /// Applies the message at `sequence` (`ours`: its [`RECORD_HEADER`]); `Err` says why the
    /// node must stop applying.
    async fn apply_one(
        &self,
        appliers: &Appliers,
        log: &Log,
        sequence: LogPosition,
        ours: Option<String>,
        payload: &[u8],
    ) -> Result<(), Halt> {
        let kind = |kind: &'static str| log.metrics().counted_record(kind);
        let entry = match ours {
            // Published by a viewtape from before the header: a batch still to run.
            None => match Entry::decode(payload) {
                Ok(
                    entry @ Entry::Batch(BatchEntry {
                        outcome: Outcome::Pending,
                        ..
                    }),
                ) => entry,
                _ => {
                    // Not published by a node (another client on the stream's subjects):
                    // every node passes over it alike, committing nothing at its position.
                    tracing::warn!(
                        sequence = sequence.get(),
                        "cluster: a message on the stream that no node published; passed over"
                    );
                    kind("foreign");
                    drop(log.turn(Some(sequence), 1).await);
                    return Ok(());
                }
            },
            Some(version) if version != RECORD_VERSION && version != SHARED_VERSION => {
                return Err(Halt::Format { sequence, version });
            }
            Some(_) => Entry::decode(payload).map_err(|error| Halt::Unreadable {
                sequence,
                source: Arc::new(error),
            })?,
        };
        let (registered, record) = match entry {
            Entry::Batch(batch) => {
                let Some(registered) = appliers.runtimes.get(&batch.runtime) else {
                    return self.pass_over(log, [batch.runtime], sequence).await;
                };
                kind("batch");
                (registered, Record::Batch(batch))
            }
            Entry::Batches(batches) => {
                let mut parts = BTreeMap::<String, Vec<(u32, BatchEntry)>>::new();
                for (index, batch) in (0u32..).zip(batches) {
                    parts
                        .entry(batch.runtime.clone())
                        .or_default()
                        .push((index, batch));
                }
                let (mut ran, mut passed) = (Vec::with_capacity(parts.len()), Vec::new());
                for (runtime, batches) in parts {
                    match appliers.runtimes.get(&runtime) {
                        Some(registered) => ran.push((registered, batches)),
                        None => passed.push(runtime),
                    }
                }
                if ran.is_empty() {
                    return self.pass_over(log, passed, sequence).await;
                }
                for runtime in passed {
                    self.passed_over(runtime, sequence);
                }
                kind("batches");
                let [(registered, batches)] = match <[_; 1]>::try_from(ran) {
                    Ok(one) => one,
                    Err(several) => return apply_shared(appliers, log, sequence, several).await,
                };
                let shared = false;
                (registered, Record::Batches { batches, shared })
            }
            Entry::Deploy(deploy) => {
                let Some(registered) = appliers.runtimes.get(&deploy.runtime) else {
                    return self.pass_over(log, [deploy.runtime], sequence).await;
                };
                kind("deploy");
                match self.load_module(appliers, &deploy.module).await {
                    Ok(module) => (registered, Record::Deploy(deploy, module)),
                    // This node cannot run what the others run from here: the runtime halts
                    // here, alone.
                    Err(error) => {
                        let reason = format!(
                            "the module its deploy installs cannot be loaded here: {}: {error}",
                            deploy.module
                        );
                        (registered, Record::Halt(reason))
                    }
                }
            }
            Entry::Define(define) => {
                kind("define");
                let (runtime, fingerprint) =
                    (define.runtime.clone(), define.definition.module.clone());
                let halt = |source: SharedError| Halt::Module {
                    sequence,
                    module: fingerprint.clone(),
                    runtime: runtime.clone(),
                    source,
                };
                let module = self
                    .load_module(appliers, &fingerprint)
                    .await
                    .map_err(|error| halt(Arc::from(error)))?;
                return appliers
                    .catalog
                    .apply_define(define, module, sequence)
                    .await
                    .map_err(|error| halt(Arc::new(error)));
            }
            Entry::Retire(retire) => {
                kind("retire");
                // A deletion is judged at its position and never fails the loop.
                return match appliers.catalog.apply_retire(retire, sequence).await {
                    Ok(()) => Ok(()),
                    Err(error) => {
                        tracing::warn!(%error, sequence = sequence.get(), "cluster: a runtime deletion could not be applied");
                        Ok(())
                    }
                };
            }
            Entry::Restore(restore) => {
                kind("restore");
                return self.apply_restore(appliers, log, sequence, restore).await;
            }
        };
        apply_record(&registered, record, sequence).await?;
        debug_assert!(log.committed() >= sequence);
        Ok(())
    }

    /// Passes over the record at `sequence`, of `runtimes`, which this node does not run:
    /// another node's config names them, and their records are that node's business. Passing
    /// over them (alike on every node that lacks them) keeps one node's extra runtime from
    /// stopping the others; this node serves none of its views, and a config that adds it later
    /// finds its history missing ([`Cluster::settle_modules`]).
    async fn pass_over(
        &self,
        log: &Log,
        runtimes: impl IntoIterator<Item = String>,
        sequence: LogPosition,
    ) -> Result<(), Halt> {
        log.metrics().counted_record("passed_over");
        for runtime in runtimes {
            self.passed_over(runtime, sequence);
        }
        drop(log.turn(Some(sequence), 1).await);
        Ok(())
    }

    /// Notes that this node passes over the records of `runtime` (one at `sequence`).
    fn passed_over(&self, runtime: String, sequence: LogPosition) {
        self.stream_log.pass_over(&runtime, sequence);
        self.readiness.send_if_modified(|readiness| {
            if readiness.passed_over.contains(&runtime) {
                return false;
            }
            tracing::warn!(sequence = sequence.get(), runtime, "cluster: the stream holds records of a runtime this node does not run; passing over them (another node's config names it)");
            readiness.passed_over.insert(runtime);
            true
        });
    }

    /// The module `fingerprint`: the compilation a runtime of this node runs (a runtime
    /// declaring its module, or many runtimes on one module, compile nothing), else compiled
    /// from this node's store, else from the bucket (then kept).
    async fn load_module(
        &self,
        appliers: &Appliers,
        fingerprint: &ModuleFingerprint,
    ) -> Result<GuestModule, BoxError> {
        if let Some(module) = appliers.runtimes.running_module(fingerprint) {
            return Ok(module);
        }
        let wasm = match appliers.modules.get(fingerprint) {
            Ok(wasm) => wasm,
            Err(_) => {
                let wasm = self.get_module(fingerprint).await?;
                appliers.modules.put(&wasm)?;
                wasm
            }
        };
        let engine = appliers.engine.clone();
        let module =
            tokio::task::spawn_blocking(move || GuestModule::new(&engine, &wasm)).await??;
        Ok(module)
    }

    /// Notes that `applied` is applied; once the node has caught up the first time, settles
    /// its runtimes' modules (in the background: that publishes, and waits for this loop).
    fn note_applied(
        self: &Arc<Self>,
        appliers: &Arc<Appliers>,
        log: &Arc<Log>,
        applied: LogPosition,
    ) {
        let stream_last = LogPosition::new(
            self.stream_last
                .fetch_max(applied.get(), Ordering::Relaxed)
                .max(applied.get()),
        );
        let metrics = log.metrics();
        metrics.applied.set(gauge(applied.get()));
        metrics.stream_last.set(gauge(stream_last.get()));
        metrics
            .apply_lag_sequences
            .set(gauge(stream_last.since(applied)));
        if applied >= self.joined_at && !self.settling.swap(true, Ordering::Relaxed) {
            let cluster = Arc::clone(self);
            let (appliers, log) = (Arc::clone(appliers), Arc::clone(log));
            let span = tracing::info_span!("cluster_modules");
            tokio::spawn(
                async move { cluster.settle_modules(&appliers, &log).await }.instrument(span),
            );
        }
        self.update_readiness(applied, stream_last);
    }

    /// Recomputes readiness after `applied`.
    pub(super) fn update_readiness(&self, applied: LogPosition, stream_last: LogPosition) {
        self.readiness.send_if_modified(|readiness| {
            // Read under the readiness lock: the apply loop and the end of settling update it
            // on different threads, and a `settled` read before the other's update would undo
            // it (a node caught up, settled, and not ready until the next record).
            let settled = self.settled.load(Ordering::Relaxed);
            let ready = readiness.broken.is_none()
                && readiness.refused.is_none()
                && readiness.behind.is_none()
                && settled
                && applied >= self.joined_at;
            let changed = readiness.applied != applied || readiness.ready != ready;
            readiness.applied = applied;
            readiness.stream_last = stream_last;
            if ready && !readiness.ready {
                tracing::info!(applied = applied.get(), "cluster: caught up; ready");
            }
            readiness.ready = ready;
            changed
        });
    }

    /// Stops applying for good: the node is not ready, takes no ingest, and says why.
    pub(super) fn break_off(&self, halt: Halt) {
        tracing::error!(reason = %halt, halt = halt.kind(), stream = %self.stream, "cluster: this node stopped applying the stream and is not ready; it keeps serving what it has");
        self.stream_log
            .refuse(format!("this node stopped applying the stream: {halt}"));
        self.readiness.send_modify(|readiness| {
            readiness.ready = false;
            readiness.broken = Some(halt);
        });
    }
}

/// Applies `record` at `sequence` to `registered`, again while the runtime is unavailable (a
/// fault of this node), at most [`APPLY_ATTEMPTS`] times; `Err` says why the node must stop
/// applying.
async fn apply_record(
    registered: &Registered,
    record: Record,
    sequence: LogPosition,
) -> Result<(), Halt> {
    let mut attempt = 0;
    loop {
        match registered.handle.apply(record.clone(), sequence).await {
            Ok(()) => return Ok(()),
            Err(error @ ApplyError::Unavailable { .. }) if attempt < APPLY_ATTEMPTS => {
                attempt += 1;
                tracing::warn!(%error, sequence = sequence.get(), attempt, "cluster: applying again");
                tokio::time::sleep(RETRY).await;
            }
            Err(error) => {
                return Err(Halt::Apply {
                    sequence,
                    source: Arc::new(error),
                })
            }
        }
    }
}

/// Applies a record of several runtimes' batches at `sequence`: each runtime its own part, side
/// by side, and the position counts as applied once all have. No snapshot is cut meanwhile; a
/// part that cannot be applied leaves the record half applied, and none is cut from then on
/// ([`crate::runtime::registry::CutsHeld::tear`]).
async fn apply_shared(
    appliers: &Appliers,
    log: &Log,
    sequence: LogPosition,
    parts: Vec<(Registered, Vec<(u32, BatchEntry)>)>,
) -> Result<(), Halt> {
    let mut held = appliers.runtimes.hold_cuts().await;
    let turn = log.turn(Some(sequence), 1).await;
    let applied = parts.into_iter().map(|(registered, batches)| async move {
        let record = Record::Batches {
            batches,
            shared: true,
        };
        let applied = apply_record(&registered, record, sequence).await;
        (registered.handle.name().to_owned(), applied)
    });
    let mut failed = None;
    for (runtime, applied) in futures_util::future::join_all(applied).await {
        if let Err(halt) = applied {
            held.tear(&runtime, &halt.to_string());
            failed.get_or_insert(halt);
        }
    }
    match failed {
        None => {
            drop(turn);
            Ok(())
        }
        Some(reason) => {
            // The position stays unapplied: the runtimes that applied their part keep it, and
            // a restart applies the record again from a snapshot cut before it.
            turn.abandon();
            Err(reason)
        }
    }
}

/// `n` as a gauge's value.
fn gauge(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}
