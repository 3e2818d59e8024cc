//! `viewtape serve`: start-up, the running server, and graceful shutdown.
//!
//! ## Start-up
//!
//! 1. Read the config (or take the embedded default).
//! 2. Restore the newest valid snapshot from `<data-dir>/snapshots`: an exact
//!    one keeps its epoch — once; it is marked consumed before any offset is
//!    issued, so a crash later in this life cannot hand its epoch to the
//!    next — and anything else takes a fresh epoch.
//! 3. Compile every runtime's module once and start its task, restoring the
//!    guest's state when the snapshot's module fingerprint matches.
//! 4. Bind, print `viewtape listening on http://ADDR/` as the first line of
//!    stdout, and serve.
//!
//! ## Shutdown
//!
//! On SIGINT or SIGTERM: stop the demo feed and sources, close every SSE
//! stream and stop accepting, take the consistency cut (each runtime between
//! batches), `seal`, dump, release the cut, write the exact snapshot, exit.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use tokio::sync::{watch, Semaphore};
use tokio::task::JoinHandle;
use tracing::Instrument;
use viewtape_journal::{EventJournal, JournalSnapshot};
use viewtape_snapshots::{SnapshotDir, SnapshotMeta};

use crate::config::Config;
use crate::host::{EngineConfig, GuestEngine, GuestModule};
use crate::http::{app, AppState};
use crate::hub::{Hub, ViewStateDump};
use crate::metrics::Metrics;
use crate::runtime::{RuntimeConfig, RuntimeHandle, RuntimeSnapshot};
use crate::source::{spawn_file_tail, FileTail, FileTailConfig, SourceCheckpoint};

/// How `viewtape serve` was invoked.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// Where to listen.
    pub listen: SocketAddr,
    /// Where snapshots live.
    pub data_dir: PathBuf,
    /// The config; `Config::default()` is the embedded demo.
    pub config: Config,
    /// Synthetic ticks per second into the `demo` runtime; 0 turns it off.
    pub demo_rate: u32,
}

/// What a snapshot file holds: the journal, every view's state, and every
/// runtime's guest state and source position.
#[derive(Debug, Serialize, Deserialize)]
pub struct SnapshotBody {
    /// The journal dump.
    pub journal: JournalSnapshot,
    /// Every view's state.
    pub views: Vec<ViewStateDump>,
    /// Every runtime's state.
    pub runtimes: Vec<RuntimeDump>,
}

/// One runtime in a snapshot.
#[derive(Debug, Serialize, Deserialize)]
pub struct RuntimeDump {
    /// The runtime's name.
    pub name: String,
    /// Fingerprint of the module the state belongs to.
    pub module: String,
    /// The guest's saved state.
    pub state: Bytes,
    /// The pull source's position, if any.
    pub checkpoint: Option<SourceCheckpoint>,
}

/// A stable fingerprint of a module: its CRC-32C and length.
pub fn module_fingerprint(wasm: &[u8]) -> String {
    format!("crc32c:{:08x}:{}", crc32c::crc32c(wasm), wasm.len())
}

struct Runtime {
    handle: RuntimeHandle,
    module: String,
}

/// Runs the server until SIGINT or SIGTERM.
///
/// # Errors
/// Start-up failures: the data directory, a guest module, the listener.
pub async fn serve(options: ServeOptions) -> anyhow::Result<()> {
    let config = &options.config;
    let journal = Arc::new(EventJournal::new(config.journal.to_journal_config()));
    let hub = Arc::new(Hub::new(Arc::clone(&journal)));
    let snapshots = Arc::new(
        SnapshotDir::open(options.data_dir.join("snapshots"))?
            .with_keep_periodic(config.server.keep_snapshots),
    );
    let _ = snapshots.remove_temp_files();

    let mut restored_runtimes = restore_at_start(&hub, &snapshots).await?;

    let engine = GuestEngine::new(EngineConfig::default())?;
    let mut runtimes: BTreeMap<String, Runtime> = BTreeMap::new();
    let mut sources: Vec<JoinHandle<()>> = Vec::new();
    for section in &config.runtimes {
        let wasm = section.wasm_bytes().map_err(|error| {
            anyhow::anyhow!(
                "runtime {:?}: cannot read {}: {error}",
                section.name,
                section.wasm
            )
        })?;
        let fingerprint = module_fingerprint(&wasm);
        let module = GuestModule::new(&engine, &wasm)
            .map_err(|error| anyhow::anyhow!("runtime {:?}: {error}", section.name))?;
        for view in &section.views {
            hub.declare(view);
        }
        let restore = match restored_runtimes.remove(&section.name) {
            Some(dump) if dump.module == fingerprint => Some(RuntimeSnapshot {
                state: dump.state,
                checkpoint: dump.checkpoint,
            }),
            Some(dump) => {
                tracing::warn!(
                    runtime = %section.name,
                    snapshot_module = %dump.module,
                    module = %fingerprint,
                    "snapshot holds state for a different module; starting the guest fresh and marking a gap"
                );
                journal.mark_gap().await;
                None
            }
            None => None,
        };
        let checkpoint = restore.as_ref().and_then(|r| r.checkpoint);
        let runtime_config = RuntimeConfig {
            guest_config: Bytes::from(section.config.clone().into_bytes()),
            limits: section.limits.to_limits(),
            ..RuntimeConfig::new(section.name.clone())
        };
        let handle = RuntimeHandle::spawn(
            module,
            runtime_config,
            restore,
            Arc::clone(&journal),
            Arc::clone(&hub),
        )
        .await
        .map_err(|error| anyhow::anyhow!("runtime {:?} failed to start: {error}", section.name))?;
        if let Some(source) = &section.source {
            let position = checkpoint.map(|SourceCheckpoint::FileTail(position)| position);
            let tail = FileTail::new(FileTailConfig::new(source.file.clone()), position);
            sources.push(spawn_file_tail(handle.clone(), tail));
        }
        runtimes.insert(
            section.name.clone(),
            Runtime {
                handle,
                module: fingerprint,
            },
        );
    }

    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    let metrics = Arc::new(Metrics::default());
    let handles: BTreeMap<String, RuntimeHandle> = runtimes
        .iter()
        .map(|(n, r)| (n.clone(), r.handle.clone()))
        .collect();
    let state = AppState {
        hub: Arc::clone(&hub),
        runtimes: Arc::new(handles),
        metrics,
        config: Arc::new(config.server.clone()),
        connections: Arc::new(Semaphore::new(config.server.max_connections)),
        shutdown: shutdown_rx,
        admin: Arc::new(crate::admin::Admin::from_env(
            Arc::clone(&snapshots),
            runtime_list(&runtimes),
        )),
    };

    if options.demo_rate > 0 {
        if let Some(demo) = runtimes.get("demo") {
            sources.push(crate::demo::spawn_feed(
                demo.handle.clone(),
                Arc::clone(&hub),
                options.demo_rate,
            ));
        }
    }
    let periodic = (!config.server.snapshot_interval.is_zero()).then(|| {
        spawn_periodic_snapshots(
            config.server.snapshot_interval,
            Arc::clone(&hub),
            Arc::clone(&snapshots),
            runtime_list(&runtimes),
        )
    });

    let signal = shutdown_signal()?;
    let listener = tokio::net::TcpListener::bind(options.listen).await?;
    let addr = listener.local_addr()?;
    println!("viewtape listening on http://{addr}/");
    tracing::info!(
        %addr,
        runtimes = ?runtimes.keys().collect::<Vec<_>>(),
        views = ?hub.views().iter().map(|v| v.name().to_owned()).collect::<Vec<_>>(),
        epoch = %journal.epoch().await,
        data_dir = %options.data_dir.display(),
        "viewtape serving"
    );

    let router = app(state.clone());
    crate::listener::serve(listener, router, state, async move {
        signal.await;
        tracing::info!("shutting down: closing streams and sealing");
        let _ = shutdown_tx.send(true);
        // Keep the sender alive so streams see `true`, not a closed channel.
        std::mem::forget(shutdown_tx);
    })
    .await?;

    for source in sources {
        source.abort();
    }
    if let Some(periodic) = periodic {
        periodic.abort();
    }
    let written = write_snapshot(&hub, &snapshots, &runtime_list(&runtimes), true).await?;
    tracing::info!(file = %written.info.path().display(), "exact snapshot written; bye");
    Ok(())
}

/// Start-up step 2: restores the newest valid snapshot into `hub` by the one-life rule
/// ([`SnapshotDir::load_for_start`]: an exact snapshot is consumed before its epoch is adopted;
/// anything else takes a fresh epoch), logging every file it passed over. Returns the runtimes'
/// dumps by name, for their tasks to start from. Call it before any offset is issued.
///
/// # Errors
/// When the snapshot directory cannot be read.
pub async fn restore_at_start(
    hub: &Hub,
    snapshots: &SnapshotDir,
) -> Result<BTreeMap<String, RuntimeDump>, viewtape_snapshots::SnapshotError> {
    let start = snapshots.load_for_start::<SnapshotBody>()?;
    for skipped in &start.skipped {
        tracing::warn!(file = %skipped.path.display(), error = %skipped.error, "snapshot skipped; falling back to an older one");
    }
    if let Some(error) = &start.consume_error {
        tracing::warn!(%error, "could not mark the exact snapshot consumed; taking a fresh epoch");
    }
    let Some(loaded) = start.loaded else {
        return Ok(BTreeMap::new());
    };
    let body = loaded.body;
    hub.restore(body.journal, start.adopt_epoch, body.views)
        .await;
    tracing::info!(
        file = %loaded.info.path().display(),
        exact = start.adopt_epoch,
        epoch = %hub.journal().epoch().await,
        "restored snapshot"
    );
    Ok(body
        .runtimes
        .into_iter()
        .map(|r| (r.name.clone(), r))
        .collect())
}

fn runtime_list(runtimes: &BTreeMap<String, Runtime>) -> Vec<(String, RuntimeHandle, String)> {
    runtimes
        .iter()
        .map(|(name, r)| (name.clone(), r.handle.clone(), r.module.clone()))
        .collect()
}

/// A snapshot [`write_snapshot`] wrote.
#[derive(Debug)]
pub(crate) struct WrittenSnapshot {
    /// The file.
    pub(crate) info: viewtape_snapshots::SnapshotInfo,
    /// Journal records it holds.
    pub(crate) records: usize,
}

/// Takes the consistency cut, dumps, and writes a snapshot. For `exact`,
/// the journal is sealed inside the cut first.
///
/// `runtimes` is `(name, handle, module fingerprint)` **in name order**: every
/// cut (this one, a live restore) pauses runtimes in that one order, so two
/// cuts never wait on each other's runtimes crosswise.
pub(crate) async fn write_snapshot(
    hub: &Hub,
    snapshots: &Arc<SnapshotDir>,
    runtimes: &[(String, RuntimeHandle, String)],
    exact: bool,
) -> anyhow::Result<WrittenSnapshot> {
    let mut dumps = Vec::with_capacity(runtimes.len());
    let mut paused = Vec::with_capacity(runtimes.len());
    for (name, handle, module) in runtimes {
        let (saved, release) = handle.pause().await?;
        paused.push(release);
        dumps.push(RuntimeDump {
            name: name.clone(),
            module: module.clone(),
            state: saved.state,
            checkpoint: saved.checkpoint,
        });
    }
    if exact {
        hub.journal().seal();
    }
    let journal = hub.journal().dump().await;
    let views = hub.dump_states();
    drop(paused);
    let records = journal.record_count();
    let body = SnapshotBody {
        journal,
        views,
        runtimes: dumps,
    };
    let meta = if exact {
        SnapshotMeta::exact_now()
    } else {
        SnapshotMeta::periodic_now()
    };
    let snapshots = Arc::clone(snapshots);
    let info = tokio::task::spawn_blocking(move || {
        let info = snapshots.write(&body, &meta)?;
        let _ = snapshots.prune();
        Ok::<_, anyhow::Error>(info)
    })
    .await??;
    Ok(WrittenSnapshot { info, records })
}

fn spawn_periodic_snapshots(
    every: Duration,
    hub: Arc<Hub>,
    snapshots: Arc<SnapshotDir>,
    runtimes: Vec<(String, RuntimeHandle, String)>,
) -> JoinHandle<()> {
    let span = tracing::info_span!("periodic_snapshots");
    tokio::spawn(
        async move {
            let mut ticker = tokio::time::interval(every);
            ticker.tick().await;
            loop {
                ticker.tick().await;
                match write_snapshot(&hub, &snapshots, &runtimes, false).await {
                    Ok(written) => tracing::debug!(file = %written.info.path().display(), "periodic snapshot written"),
                    Err(error) => tracing::warn!(%error, "periodic snapshot failed"),
                }
            }
        }
        .instrument(span),
    )
}

/// Registers SIGINT and SIGTERM handlers now, and returns a future that
/// resolves on the first of them. Registering before the server announces
/// its address means a signal sent right after that line is never the
/// default (killing) action.
///
/// # Errors
/// The handlers cannot be installed.
fn shutdown_signal() -> std::io::Result<impl std::future::Future<Output = ()>> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let mut interrupt = signal(SignalKind::interrupt())?;
        let mut terminate = signal(SignalKind::terminate())?;
        Ok(async move {
            tokio::select! {
                _ = interrupt.recv() => {}
                _ = terminate.recv() => {}
            }
        })
    }
    #[cfg(not(unix))]
    {
        Ok(async {
            let _ = tokio::signal::ctrl_c().await;
        })
    }
}
