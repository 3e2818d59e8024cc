//! Start-up, in one place for every mode: a node with its local log, with the log off, or on a
//! cluster's stream.
//!
//! 1. Where the history starts: the newest valid snapshot and the local log
//!    ([`crate::recovery::begin`]), or, on a cluster, a snapshot of the stream's epoch and the
//!    stream ([`Cluster::begin`]).
//! 2. Every runtime's task, on the module that ran at the snapshot (from the module store, or
//!    on a cluster from its bucket) with the snapshot's guest state. Every module a config
//!    names is kept in the store, so that a later start finds the one that wrote the log.
//! 3. The log after the snapshot, applied: replayed from the local log
//!    ([`crate::recovery::replay`]), or, on a cluster, by the apply loop, which runs from here
//!    on.
//! 4. A module changed in the config while a single node was stopped is a deploy at start: the
//!    new build restores the state the old one saved, a deploy record marks the switch, and no
//!    subscriber sees a reset. Only a build that refuses the state starts fresh, with a gap on
//!    its own runtime's views. On a cluster the stream decides which module runs instead (see
//!    [`crate::cluster`]).

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use viewtape_journal::EventJournal;
use viewtape_snapshots::SnapshotDir;

use crate::catalog::{Catalog, CatalogError, Changed};
use crate::cluster::{Appliers, Cluster};
use crate::config::{Config, RuntimeSection};
use crate::deploy::Deployer;
use crate::host::{EngineConfig, GuestEngine, GuestModule};
use crate::hub::Hub;
use crate::log::{Declaring, Definition, Log, LogPosition, Logged};
use crate::runtime::registry::{ModuleFingerprint, ModuleStore, Runtimes};
use crate::runtime::{RuntimeConfig, RuntimeHalt, RuntimeHandle, RuntimeSnapshot};
use crate::snapshot::{RuntimeDump, Snapshots};

/// A started server's parts, before it listens.
#[derive(Debug)]
pub struct Started {
    /// Views and the journal.
    pub hub: Arc<Hub>,
    /// The runtimes, running.
    pub runtimes: Arc<Runtimes>,
    /// The log, writing (or the cluster's stream, applied).
    pub log: Arc<Log>,
    /// Snapshot actions.
    pub snapshots: Arc<Snapshots>,
    /// Module deploys.
    pub deployer: Arc<Deployer>,
    /// Runtime definitions.
    pub catalog: Arc<Catalog>,
    /// The node's cluster, when it is one of several sharing a stream.
    pub cluster: Option<Arc<Cluster>>,
}

/// A runtime about to start: what its config names, and what it starts from.
struct Planned<'a> {
    section: &'a RuntimeSection,
    /// The module its config names.
    configured: ModuleFingerprint,
    /// Its bytes.
    configured_wasm: Vec<u8>,
    /// The snapshot's record of it.
    dump: Option<RuntimeDump>,
}

/// Start-up steps 1 to 4 (see the module docs) over `data_dir`. Sources and the listener are
/// not started.
///
/// # Errors
/// The data directory or the log cannot be read, a guest module cannot be loaded or started.
pub async fn start(config: &Config, data_dir: &Path) -> anyhow::Result<Started> {
    let journal = Arc::new(EventJournal::new(config.journal.to_journal_config()));
    let hub = Arc::new(Hub::new(Arc::clone(&journal)));
    let dir = SnapshotDir::open(data_dir.join("snapshots"))?
        .with_keep_periodic(config.server.keep_snapshots);
    // A cluster's nodes share snapshots across data directories and check the stream's epoch.
    let (history, _) = crate::recovery::history::open(data_dir, &dir, &data_dir.join("log"))?;
    let dir = Arc::new(dir.with_history(history, config.cluster.nats_url.is_none()));
    if let Err(error) = dir.remove_temp_files() {
        tracing::warn!(%error, "could not remove leftover temporary snapshot files");
    }
    let cluster = match &config.cluster.nats_url {
        Some(url) => Some(Cluster::join(&config.cluster, url).await?),
        None => None,
    };
    let mut begun = match &cluster {
        None => crate::recovery::begin(&hub, &dir, &data_dir.join("log"), &config.log).await?,
        Some(cluster) => {
            let (restored, log) = cluster.begin(&hub, &dir).await?;
            crate::recovery::Begun::shared(restored, log)
        }
    };

    let (engine, modules) = engine_and_modules(config, data_dir)?;
    let kept = keep_configured_modules(config, &modules)?;
    let definitions = configured_definitions(config, &kept)?;
    let placed = Placed {
        hub: &hub,
        journal: &journal,
        modules: &modules,
        engine: &engine,
        cluster: cluster.as_deref(),
        // Where a runtime whose module cannot be read halts: the position the start begins at.
        at: begun.log.committed(),
    };
    let (runtimes, changed) = start_configured(config, kept, &mut begun, &placed).await?;
    runtimes.restore_deleted(std::mem::take(&mut begun.deleted));
    let runtimes = Arc::new(runtimes);
    let catalog = Arc::new(Catalog::new(
        engine.clone(),
        Arc::clone(&modules),
        Arc::clone(&runtimes),
        Arc::clone(&hub),
        Arc::clone(&begun.log),
        definitions.clone(),
        config.server.max_runtimes,
    ));
    start_defined(std::mem::take(&mut begun.dumps), &catalog, &placed).await?;
    let replayed = crate::recovery::replay(&mut begun, &hub, &catalog, &engine).await?;
    for (name, wasm) in changed {
        deploy_at_start(&runtimes, &name, &wasm, &engine).await?;
    }
    if cluster.is_none() {
        declare_configured(&definitions, &catalog).await?;
    }
    let snapshots = Arc::new(Snapshots::new(
        Arc::clone(&hub),
        dir,
        Arc::clone(&runtimes),
        Arc::clone(&begun.log),
    ));
    if replayed.needs_snapshot {
        let written = snapshots.write().await?;
        tracing::info!(file = %written.info.path().display(), "snapshot written at the log's new beginning");
    }
    if let Some(cluster) = &cluster {
        let appliers = Appliers {
            runtimes: Arc::clone(&runtimes),
            modules: Arc::clone(&modules),
            engine: engine.clone(),
            snapshots: Arc::clone(&snapshots),
            catalog: Arc::clone(&catalog),
            configured: definitions,
        };
        cluster.spawn_apply(appliers, Arc::clone(&begun.log));
    }
    let deployer = Arc::new(Deployer::new(
        engine,
        modules,
        Arc::clone(&runtimes),
        cluster.clone(),
    ));
    Ok(Started {
        hub,
        runtimes,
        log: begun.log,
        snapshots,
        deployer,
        catalog,
        cluster,
    })
}

/// What every runtime of a start is placed among: the views, the journal, the modules and
/// their engine, the cluster, and the log position the start begins at.
struct Placed<'a> {
    hub: &'a Arc<Hub>,
    journal: &'a Arc<EventJournal>,
    modules: &'a ModuleStore,
    engine: &'a GuestEngine,
    cluster: Option<&'a Cluster>,
    at: LogPosition,
}

/// The guest engine (its code cache the user's, shared by every node of a machine) and the
/// data directory's module store, which holds the built-ins' bytes to repair their files from.
fn engine_and_modules(
    config: &Config,
    data_dir: &Path,
) -> anyhow::Result<(GuestEngine, Arc<ModuleStore>)> {
    let engine = GuestEngine::new(EngineConfig {
        cache_dir: crate::host::cache_dir(|| {
            crate::host::user_cache_dir().or_else(|| Some(data_dir.join("cache")))
        }),
        pooled_instances: config.server.guest_instances,
        ..EngineConfig::default()
    })?;
    engine.compile_js_engine_ahead();
    let modules_dir = data_dir.join("modules");
    let modules =
        Arc::new(ModuleStore::open(&modules_dir).map_err(|error| {
            anyhow::anyhow!("cannot create {}: {error}", modules_dir.display())
        })?);
    for (_, wasm) in crate::config::BUILTIN_GUESTS {
        modules.know(Bytes::from_static(wasm));
    }
    Ok((engine, modules))
}

/// Starts the config's runtimes that no define record made (those start from their record,
/// [`start_defined`]) and no record deleted, each on the module that ran at the snapshot; the
/// runtimes, and the new modules to deploy once the log is replayed (by runtime).
async fn start_configured(
    config: &Config,
    kept: Vec<(ModuleFingerprint, Vec<u8>)>,
    begun: &mut crate::recovery::Begun,
    placed: &Placed<'_>,
) -> anyhow::Result<(Runtimes, BTreeMap<String, Vec<u8>>)> {
    let runtimes = Runtimes::default();
    let mut changed = BTreeMap::new();
    // Runtimes on the same module (the built-in ticker, say) share one compilation.
    let mut compiled = HashMap::new();
    for ((i, section), (fingerprint, wasm)) in config.runtimes.iter().enumerate().zip(kept) {
        if begun
            .dumps
            .get(&section.name)
            .is_some_and(|dump| dump.definition.is_some())
        {
            // A define record made it what it is: it starts from that, below.
            continue;
        }
        if begun.deleted.contains_key(&section.name) && !begun.dumps.contains_key(&section.name) {
            // A record deleted it: the config declares it again only if its declaration
            // changed (`declare_configured`).
            continue;
        }
        let planned = Planned {
            section,
            configured: fingerprint,
            configured_wasm: wasm,
            dump: begun.dumps.remove(&section.name),
        };
        for view in &section.views {
            placed.hub.declare(view);
        }
        let configured = planned.configured.clone();
        let (module, restore, config_changed) =
            first_module(&planned, &mut compiled, placed).await?;
        let runtime_config = RuntimeConfig {
            guest_config: Bytes::from(section.guest_config()),
            limits: section.limits.to_limits(),
            schemas: section
                .load_schemas(i)
                .map_err(|problem| anyhow::anyhow!("{}: {}", problem.key, problem.message))?,
            ..RuntimeConfig::new(section.name.clone(), section.views.iter().cloned())
        };
        let handle = RuntimeHandle::spawn(
            module,
            runtime_config,
            restore,
            Arc::clone(placed.journal),
            Arc::clone(placed.hub),
            Arc::clone(&begun.log),
        )
        .await
        .map_err(|error| anyhow::anyhow!("runtime {:?} failed to start: {error}", section.name))?;
        if config_changed {
            changed.insert(section.name.clone(), planned.configured_wasm);
        }
        runtimes.insert(handle, configured, None);
    }
    Ok((runtimes, changed))
}

/// Starts each runtime a define record made, as the snapshot holds it, on the build that ran
/// then (a module that cannot be read halts that runtime alone, [`module_or_halt`]).
async fn start_defined(
    dumps: BTreeMap<String, RuntimeDump>,
    catalog: &Catalog,
    placed: &Placed<'_>,
) -> anyhow::Result<()> {
    for dump in dumps.into_values() {
        let Some(definition) = dump.definition else {
            continue;
        };
        // The build that ran at the snapshot (older snapshots kept the defined one beside it).
        let definition = definition.running(&dump.module);
        let mut saved = dump.saved;
        let read = defined_module(&definition, placed.modules, placed.engine, placed.cluster).await;
        let module = module_or_halt(
            placed.engine,
            &dump.name,
            &dump.module,
            read,
            &mut saved,
            placed.at,
        );
        catalog
            .start(&dump.name, definition, module, saved)
            .await
            .map_err(|error| anyhow::anyhow!("{error}"))?;
    }
    Ok(())
}

/// The module a snapshot's defined runtime runs: from the store, else the cluster's bucket.
async fn defined_module(
    definition: &Definition,
    modules: &ModuleStore,
    engine: &GuestEngine,
    cluster: Option<&Cluster>,
) -> anyhow::Result<GuestModule> {
    let fingerprint = &definition.module;
    let wasm = match (modules.get(fingerprint), cluster) {
        (Ok(wasm), _) => wasm,
        (Err(error), None) => {
            anyhow::bail!(
                "module {fingerprint} is not in {}: {error}",
                modules.dir().display()
            )
        }
        (Err(_), Some(cluster)) => {
            let wasm = cluster
                .get_module(fingerprint)
                .await
                .map_err(|error| anyhow::anyhow!("module {fingerprint}: {error}"))?;
            modules.put(&wasm)?;
            wasm
        }
    };
    Ok(GuestModule::new(engine, &wasm)?)
}

/// The config's `[[runtime]]`s as definitions, on the modules `kept` for them (in order).
fn configured_definitions(
    config: &Config,
    kept: &[(ModuleFingerprint, Vec<u8>)],
) -> anyhow::Result<BTreeMap<String, Definition>> {
    let mut definitions = BTreeMap::new();
    for ((i, section), (fingerprint, _)) in config.runtimes.iter().enumerate().zip(kept) {
        let definition = section
            .definition(i, fingerprint.clone())
            .map_err(|problem| anyhow::anyhow!("{}: {}", problem.key, problem.message))?;
        definitions.insert(section.name.clone(), definition);
    }
    Ok(definitions)
}

/// The log wins: a `[[runtime]]` of the config is declared by a record only when the log never
/// saw that runtime, or when the config's declaration of it changed since the start that last
/// declared it ([`Definition::declared`]). A change through the API — a deploy, a `PUT`, a
/// `DELETE` — stands until then. (On a cluster the stream decides: `Cluster::settle_modules`.)
async fn declare_configured(
    configured: &BTreeMap<String, Definition>,
    catalog: &Catalog,
) -> anyhow::Result<()> {
    for (name, definition) in configured {
        let running = catalog.runtimes().get(name);
        let defined = running.as_ref().and_then(|running| running.definition());
        let deleted = catalog.runtimes().deleted(name);
        let logged = match (&running, &defined) {
            (Some(_), Some(defined)) => Logged::Defined(defined),
            (Some(_), None) => Logged::AsConfigured,
            (None, _) => Logged::Absent(deleted.as_deref()),
        };
        match definition.declaring(logged) {
            Declaring::Keep => continue,
            skipped @ Declaring::Skip { .. } => {
                tracing::info!(runtime = %name, "config declaration {skipped}");
                continue;
            }
            Declaring::Declare => {}
        }
        let declaration = Definition {
            declared: Some(definition.digest()),
            ..definition.clone()
        };
        match catalog.put(name, declaration).await {
            Ok((Changed::Unchanged, _)) => {}
            Ok(_) => {
                tracing::info!(runtime = %name, "the config's declaration of this runtime changed since it was last declared: declared by a record")
            }
            // Another runtime, made through the API, has its views now: the log's wins.
            Err(CatalogError::Conflict { .. }) | Err(CatalogError::Refused { .. }) => {
                tracing::warn!(runtime = %name, "the config's runtime cannot be declared again: the log's runtimes stand")
            }
            Err(error) => return Err(anyhow::anyhow!("{error}")),
        }
    }
    Ok(())
}

/// The module each `[[runtime]]` names, in order, read once and kept in the store: its
/// fingerprint and its bytes.
fn keep_configured_modules(
    config: &Config,
    modules: &ModuleStore,
) -> anyhow::Result<Vec<(ModuleFingerprint, Vec<u8>)>> {
    config
        .runtimes
        .iter()
        .map(|section| {
            let wasm = section.wasm_bytes().map_err(|error| {
                anyhow::anyhow!(
                    "runtime {:?}: cannot read {}: {error}",
                    section.name,
                    section.wasm
                )
            })?;
            let fingerprint = modules.put(&wasm).map_err(|error| {
                anyhow::anyhow!(
                    "runtime {:?}: cannot keep its module in {}: {error}",
                    section.name,
                    modules.dir().display()
                )
            })?;
            Ok((fingerprint, wasm))
        })
        .collect()
}

/// The module a runtime's task starts on, the state it restores, and whether its config names
/// another module than when the state was saved (a deploy at start follows the replay). A
/// module the snapshot's state belongs to that cannot be read halts the runtime
/// ([`module_or_halt`]).
async fn first_module(
    planned: &Planned<'_>,
    compiled: &mut HashMap<ModuleFingerprint, GuestModule>,
    placed: &Placed<'_>,
) -> anyhow::Result<(GuestModule, Option<RuntimeSnapshot>, bool)> {
    let (modules, engine, cluster, at) = (placed.modules, placed.engine, placed.cluster, placed.at);
    let name = &planned.section.name;
    let mut compile = |wasm: &[u8]| -> anyhow::Result<GuestModule> {
        let fingerprint = ModuleFingerprint::of(wasm);
        if let Some(module) = compiled.get(&fingerprint) {
            return Ok(module.clone());
        }
        let module = GuestModule::new(engine, wasm)
            .map_err(|error| anyhow::anyhow!("runtime {name:?}: {error}"))?;
        compiled.insert(fingerprint, module.clone());
        Ok(module)
    };
    let Some(dump) = &planned.dump else {
        return Ok((compile(&planned.configured_wasm)?, None, false));
    };
    let mut saved = dump.saved.clone();
    let kept = match modules.get(&dump.module) {
        Ok(wasm) => Ok(wasm),
        Err(_) if dump.module == planned.configured => Ok(planned.configured_wasm.clone()),
        Err(error) => Err(error),
    };
    if let Some(cluster) = cluster {
        // The stream decides: the module it ran at the snapshot, which another node may have
        // brought; the apply loop checks the config against the stream.
        let wasm = match kept {
            Ok(wasm) => Ok(wasm),
            Err(error) => cluster.get_module(&dump.module).await.map_err(|fetch| {
                anyhow::anyhow!(
                    "it is neither in {} ({error}) nor in the cluster's bucket ({fetch})",
                    modules.dir().display()
                )
            }),
        };
        let read = match wasm {
            Ok(wasm) => {
                modules.put(&wasm)?;
                compile(&wasm)
            }
            Err(error) => Err(error),
        };
        let module = module_or_halt(engine, name, &dump.module, read, &mut saved, at);
        return Ok((module, Some(saved), false));
    }
    let base = dump.configured.as_ref().unwrap_or(&dump.module);
    let config_changed = *base != planned.configured;
    let read = match kept {
        Ok(wasm) => compile(&wasm),
        Err(_) if config_changed => {
            // Kept by an older viewtape, which did not keep configured modules: the new build
            // takes the state over at once; a log after the snapshot cannot be replayed by it
            // and fails closed.
            tracing::warn!(runtime = %name, module = %dump.module, "the module that saved the state is not kept; the configured one takes the state over before the log is replayed");
            return Ok((compile(&planned.configured_wasm)?, Some(saved), true));
        }
        Err(error) => Err(anyhow::anyhow!(
            "{} cannot be read: {error}",
            modules.path(&dump.module).display()
        )),
    };
    let module = module_or_halt(engine, name, &dump.module, read, &mut saved, at);
    Ok((module, Some(saved), config_changed))
}

/// Runtime `name`'s module `fingerprint` as `read` at a start. One that cannot be read or
/// loaded halts that runtime alone at `at` ([`RuntimeHalt::unreadable`]): it starts on a
/// stand-in that never runs, every other runtime starts as ever. A runtime halted for that
/// reason alone runs on from its state once its module reads again.
fn module_or_halt(
    engine: &GuestEngine,
    name: &str,
    fingerprint: &ModuleFingerprint,
    read: anyhow::Result<GuestModule>,
    saved: &mut RuntimeSnapshot,
    at: LogPosition,
) -> GuestModule {
    let waiting = saved
        .halted
        .as_ref()
        .is_some_and(|halt| halt.unreadable.as_ref() == Some(fingerprint));
    match read {
        Ok(module) => {
            if waiting {
                tracing::info!(runtime = %name, module = %fingerprint, "the module of the halted runtime reads again: it runs on from its state");
                saved.halted = None;
            }
            module
        }
        Err(error) => {
            tracing::error!(runtime = %name, module = %fingerprint, %error, "the runtime's module cannot be loaded: this runtime is halted on this node; every other runtime starts");
            if saved.halted.is_none() {
                saved.halted = Some(RuntimeHalt {
                    position: at,
                    reason: format!("its module {fingerprint} cannot be loaded here (missing or damaged, with no copy to repair it from; the server log says why); keep its bytes again (POST /admin/modules) and restart, and it runs on from its state"),
                    lost: 0,
                    unreadable: Some(fingerprint.clone()),
                });
            }
            GuestModule::unavailable(engine, fingerprint.clone())
        }
    }
}

/// Deploys the module the config names now to runtime `name`, whose state an older build
/// saved.
async fn deploy_at_start(
    runtimes: &Runtimes,
    name: &str,
    wasm: &[u8],
    engine: &GuestEngine,
) -> anyhow::Result<()> {
    let Some(registered) = runtimes.get(name) else {
        return Ok(());
    };
    let module = GuestModule::new(engine, wasm)
        .map_err(|error| anyhow::anyhow!("runtime {name:?}: {error}"))?;
    let deployed = registered
        .handle
        .deploy_at_start(module)
        .await
        .map_err(|error| {
            anyhow::anyhow!("runtime {name:?}: the configured module cannot start: {error}")
        })?;
    match deployed.fresh {
        true => {
            tracing::warn!(runtime = name, module = %deployed.module, previous = %deployed.previous, "the config names a new module, which refuses the saved state: the runtime starts fresh, with a gap on its own views")
        }
        false => {
            tracing::info!(runtime = name, module = %deployed.module, previous = %deployed.previous, position = ?deployed.position.map(|p| p.get()), "the config names a new module: deployed at start, the state carried over")
        }
    }
    Ok(())
}
