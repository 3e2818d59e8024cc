//! Step 3 of start-up: every intact record after the snapshot, replayed through the runtimes
//! (side by side, committing in log order), then the writer started after the last one.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::Arc;

use viewtape_snapshots::log::{LogDamageKind, LogDir, LogError};

use super::{Begun, Plan, RecoveryError};
use crate::catalog::Catalog;
use crate::host::{GuestEngine, GuestModule};
use crate::hub::Hub;
use crate::log::{Break, DefineEntry, DeployEntry, Entry, Log, LogPosition};
use crate::runtime::handle::{Applied, Record};
use crate::runtime::registry::ModuleStore;
use crate::runtime::RuntimeHandle;

/// How [`replay`] ended.
#[derive(Debug, Default)]
pub struct Replayed {
    /// Records replayed.
    pub records: u64,
    /// Set when continuity broke: the cause (the metric's label) and where the files went.
    pub failed_closed: Option<(Break, Vec<PathBuf>)>,
    /// The next start needs a snapshot at the log's new beginning: write one now.
    pub needs_snapshot: bool,
}

/// Replays the log after the snapshot through `runtimes` and starts the writer; see the module
/// docs.
///
/// # Errors
/// The log cannot be read (an I/O error, not damage), set aside, or started.
pub async fn replay(
    begun: &mut Begun,
    hub: &Hub,
    catalog: &Catalog,
    engine: &GuestEngine,
) -> Result<Replayed, RecoveryError> {
    let Some(plan) = begun.plan.take() else {
        return Ok(Replayed::default());
    };
    let log = Arc::clone(&begun.log);
    let started = std::time::Instant::now();
    let mut replayed = Replayed::default();
    let mut broken = plan.broken_before.clone();
    if broken.is_none() {
        broken = replay_records(&plan, &log, catalog, engine, &mut replayed.records).await?;
    }
    if broken.is_none() && plan.no_snapshot && replayed.records > 0 {
        broken = Some((
            Break::Missing,
            "no snapshot holds the epoch of the logged history".to_owned(),
        ));
    }
    if broken.is_none() {
        if let Some(damage) = plan.scan.first_damage() {
            let cause = match damage.kind {
                LogDamageKind::Missing { .. } => Break::Missing,
                _ => Break::Corrupt,
            };
            broken = Some((cause, format!("{}: {damage}", damage.path.display())));
        }
    }
    // What the intact records prove is kept: the end's break comes after their replay.
    if broken.is_none() {
        broken = plan.broken_at_end.clone();
    }
    let mut next = plan.scan.next().max(plan.from.next());
    if let Some((cause, what)) = broken {
        let kept = plan.dir.set_aside_all()?;
        hub.journal()
            .hydrate(hub.journal().dump().await, false)
            .await;
        hub.wake_all();
        // Positions are never reused, not even those of set-aside records, nor those of
        // records that went missing.
        next = next.max(log.committed().next()).max(plan.used.next());
        log.metrics().failed_closed(cause);
        tracing::error!(
            %cause,
            problem = %what,
            proven_through = log.committed().get(),
            kept = ?kept,
            epoch = %hub.journal().epoch().await,
            "log continuity is broken: taking a fresh epoch from here (clients get a reset); the log starts over, its files are kept"
        );
        replayed.failed_closed = Some((cause, kept));
    } else if replayed.records > 0 {
        tracing::info!(
            records = replayed.records,
            through = next.prev().get(),
            seconds = started.elapsed().as_secs_f64(),
            "log replayed"
        );
    }
    // The epoch lives in snapshots: the first life writes one before it issues an offset.
    replayed.needs_snapshot =
        replayed.failed_closed.is_some() || plan.unpositioned || plan.no_snapshot;
    log.skip_to(next.prev());
    let lineage = viewtape_snapshots::log::Lineage {
        history: plan.history,
        epoch: hub.journal().epoch().await.to_bits(),
    };
    log.set_lineage(lineage, plan.watermark);
    log.start_writer(&plan.dir, next, plan.segment_bytes)?;
    Ok(replayed)
}

/// Switches `runtime` to the module a logged deploy installed, from the store; a module the
/// store no longer holds whole halts that runtime alone.
async fn replay_deploy(
    runtime: &RuntimeHandle,
    deploy: DeployEntry,
    position: LogPosition,
    modules: &ModuleStore,
    engine: &GuestEngine,
) -> Result<(), (Break, String)> {
    let loaded = modules
        .get(&deploy.module)
        .map_err(|error| format!("{}: {error}", modules.path(&deploy.module).display()))
        .and_then(|wasm| GuestModule::new(engine, &wasm).map_err(|error| error.to_string()));
    let record = match loaded {
        Ok(module) => Record::Deploy(deploy, module),
        Err(error) => Record::Halt(format!(
            "the module its logged deploy installed cannot be loaded: {}: {error}",
            deploy.module
        )),
    };
    runtime
        .apply(record, position)
        .await
        .map_err(|error| (error.cause(), error.to_string()))
}

/// Creates or replaces the runtime a logged define record names, on its module from the
/// store.
async fn replay_define(
    catalog: &Catalog,
    define: DefineEntry,
    position: LogPosition,
    engine: &GuestEngine,
) -> Result<(), (Break, String)> {
    let fingerprint = define.definition.module.clone();
    let module = catalog
        .modules()
        .get(&fingerprint)
        .map_err(|error| error.to_string())
        .and_then(|wasm| GuestModule::new(engine, &wasm).map_err(|error| error.to_string()))
        .map_err(|error| {
            (
                Break::Module,
                format!(
                    "log position {position}: runtime {:?} runs module {fingerprint}: {error}",
                    define.runtime
                ),
            )
        })?;
    catalog
        .apply_define(define, module, position)
        .await
        .map_err(|error| (Break::Module, format!("log position {position}: {error}")))
}

/// Records a replay has handed to their runtimes and not yet settled: the runtimes run ahead
/// of each other, on every core, and commit in position order.
const REPLAY_AHEAD: usize = 64;

/// Replays every intact record after `plan.from`. Returns the break that stopped it, if any.
async fn replay_records(
    plan: &Plan,
    log: &Log,
    catalog: &Catalog,
    engine: &GuestEngine,
    count: &mut u64,
) -> Result<Option<(Break, String)>, RecoveryError> {
    let (runtimes, modules) = (catalog.runtimes(), catalog.modules());
    // Records are read on a blocking thread and handed over one at a time.
    let (tx, mut rx) = tokio::sync::mpsc::channel::<(LogPosition, Vec<u8>)>(REPLAY_AHEAD);
    let dir = LogDir::open_existing(plan.dir.path())?;
    let from = plan.from;
    let reader = tokio::task::spawn_blocking(move || {
        dir.read_after(from, |record| {
            tx.blocking_send((record.position, record.payload))
                .map_err(|_| LogError::Stopped)
        })
    });
    let mut ahead = Ahead {
        log,
        applying: VecDeque::new(),
        count,
    };
    let mut expected = plan.from.next();
    let mut broken = None;
    while let Some((position, payload)) = rx.recv().await {
        if position != expected {
            broken = Some((
                Break::Missing,
                format!(
                    "log position {position} follows {} (records are missing)",
                    expected.prev()
                ),
            ));
            break;
        }
        expected = expected.next();
        let entry = match Entry::decode(&payload) {
            Ok(entry) => entry,
            Err(error) => {
                broken = Some((
                    Break::Corrupt,
                    format!("log position {position} does not decode: {error}"),
                ));
                break;
            }
        };
        // A runtime defined or deleted: everything before it first.
        let entry = match entry {
            Entry::Define(define) => {
                let settled = match ahead.settle(0).await {
                    Ok(()) => replay_define(catalog, define, position, engine).await,
                    broke => broke,
                };
                match settled {
                    Ok(()) => *ahead.count += 1,
                    Err(error) => {
                        broken = Some(error);
                        break;
                    }
                }
                continue;
            }
            Entry::Retire(retire) => {
                let settled = match ahead.settle(0).await {
                    Ok(()) => catalog
                        .apply_retire(retire, position)
                        .await
                        .map_err(|error| {
                            (Break::Module, format!("log position {position}: {error}"))
                        }),
                    broke => broke,
                };
                match settled {
                    Ok(()) => *ahead.count += 1,
                    Err(error) => {
                        broken = Some(error);
                        break;
                    }
                }
                continue;
            }
            entry => entry,
        };
        let runtime = match entry.runtime().map(|name| (name, runtimes.get(name))) {
            Some((_, Some(runtime))) => runtime,
            Some((name, None)) => {
                broken = Some((
                    Break::Module,
                    format!("log position {position} belongs to runtime {name:?}, which is not configured"),
                ));
                break;
            }
            None => {
                broken = Some((
                    Break::Corrupt,
                    format!("log position {position} holds a record of a cluster's stream (a restore, or batches of several runtimes), which a local log never does"),
                ));
                break;
            }
        };
        let settled = match entry {
            Entry::Batch(batch) => {
                // Handed over here, in position order; settled below, in the same order.
                let applied = runtime
                    .handle
                    .hand_over(Record::Batch(batch), position)
                    .await;
                ahead.applying.push_back((position, applied));
                ahead.settle(REPLAY_AHEAD - 1).await
            }
            // A deploy switches its runtime's module: everything before it first.
            Entry::Deploy(deploy) => match ahead.settle(0).await {
                Ok(()) => replay_deploy(&runtime.handle, deploy, position, modules, engine)
                    .await
                    .map(|()| *ahead.count += 1)
                    .map_err(|(cause, error)| (cause, format!("log position {position}: {error}"))),
                broke => broke,
            },
            // Refused above: a restore belongs to no runtime.
            Entry::Restore(_) => Ok(()),
            // Taken above.
            Entry::Define(_) | Entry::Retire(_) => Ok(()),
            Entry::Batches(_) => Err((
                Break::Corrupt,
                format!("log position {position} holds batches gathered for a cluster's stream, which a local log never does"),
            )),
        };
        if let Err(error) = settled {
            broken = Some(error);
            break;
        }
    }
    // An earlier record's break comes first: what is still in flight is settled before a
    // break found here is reported.
    if let Err(error) = ahead.settle(0).await {
        broken = Some(error);
    }
    drop(rx);
    match reader.await? {
        Ok(()) | Err(LogError::Stopped) => Ok(broken),
        Err(error) => Err(error.into()),
    }
}

/// Records handed to their runtimes (their tasks apply them without being polled), settled in
/// position order.
struct Ahead<'a> {
    log: &'a Log,
    applying: VecDeque<(LogPosition, Applied)>,
    count: &'a mut u64,
}

impl Ahead<'_> {
    /// Settles records, in order, until at most `left` are in flight. The first that failed
    /// abandons those behind it (their runtimes undo them) and is returned.
    async fn settle(&mut self, left: usize) -> Result<(), (Break, String)> {
        while self.applying.len() > left {
            let Some((position, applied)) = self.applying.pop_front() else {
                break;
            };
            if let Err(error) = applied.await {
                self.log.abandon_turns(true);
                for (_, behind) in self.applying.drain(..) {
                    let _ = behind.await;
                }
                self.log.abandon_turns(false);
                return Err((error.cause(), format!("log position {position}: {error}")));
            }
            *self.count += 1;
        }
        Ok(())
    }
}
