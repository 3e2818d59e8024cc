//! `viewtape serve`: start-up, the running server, and graceful shutdown.
//!
//! ## Start-up
//!
//! 1. Read the config (or take the embedded default).
//! 2. The snapshot, the runtimes and the log after it, in every mode
//!    ([`crate::startup::start`]): the same epoch, offsets and frames as before
//!    the stop, whatever the stop was; or a fresh epoch where continuity cannot
//!    be proven, followed at once by a snapshot.
//! 3. Start the pull sources and the demo feed (on a cluster, once per cluster:
//!    on the node holding each one's lease).
//! 4. Bind, print `viewtape listening on http://ADDR/` as the first line of
//!    stdout and `viewtape data in DIR` as the second, and serve.
//!
//! ## Shutdown
//!
//! On SIGINT or SIGTERM: `/readyz` turns `503` and every SSE stream ends with a
//! spread `retry:` hint; requests with bodies get at most `[server]
//! drain_timeout` (a second signal stops waiting), then the listener closes
//! (`crate::listener`); stop the demo feed and sources; take the consistency
//! cut (each runtime between batches), `seal`, dump, release the cut, write the
//! exact snapshot, exit.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::auth::Auth;
use crate::cluster::Cluster;
use crate::config::Config;
use crate::http::admin::Admin;
use crate::http::{app, AppState};
use crate::log::Log;
use crate::registry::Runtimes;
use crate::source::{FileTail, FileTailConfig, SourceCheckpoint};
use crate::startup::{start, Started};
use crate::tls::Tls;

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

/// Runs the server until SIGINT or SIGTERM.
///
/// # Errors
/// Start-up failures: the data directory, a guest module, the listener.
pub async fn serve(options: ServeOptions) -> anyhow::Result<()> {
    let config = &options.config;
    #[cfg(unix)]
    // SAFETY: installs the ignore disposition for one signal, before any thread of ours could
    // depend on it; no handler code runs. A write past RLIMIT_FSIZE then fails with EFBIG, which
    // the log handles, instead of killing the process.
    unsafe {
        libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
    }
    let _lock = lock_data_dir(&options.data_dir)?;
    let Started {
        hub,
        runtimes,
        log,
        snapshots,
        deployer,
        cluster,
    } = start(config, &options.data_dir).await?;
    let journal = Arc::clone(hub.journal());
    let mut sources = start_sources(config, &runtimes, cluster.as_ref(), &log);

    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    let secret = std::env::var(crate::auth::SECRET_ENV).ok();
    let auth = Auth::load(&config.auth, secret.as_deref())?.map(Arc::new);
    match &auth {
        Some(_) => tracing::info!("auth on: every view but [auth] public_views needs a token"),
        None if !options.listen.ip().is_loopback() => tracing::warn!(
            listen = %options.listen,
            "AUTH IS OFF and the server listens beyond loopback: anyone who can reach it reads every view and pushes into every runtime; set {} or [auth] public_keys",
            crate::auth::SECRET_ENV
        ),
        None => {}
    }
    let tls = match (&config.server.tls_cert, &config.server.tls_key) {
        (Some(cert), Some(key)) => Some(Arc::new(Tls::load(cert, key)?)),
        _ => None,
    };
    let reloads = reload_on_hangup(tls.clone(), auth.clone())?;
    let state = AppState::new(
        Arc::clone(&hub),
        Arc::clone(&runtimes),
        log.metrics(),
        auth,
        config.server.clone(),
        shutdown_rx,
    );
    let state = match &cluster {
        Some(cluster) => state.in_cluster(Arc::clone(cluster)),
        None => state,
    };
    let metrics = Arc::clone(&state.metrics);
    let admin = Admin::from_env(Arc::clone(&runtimes), Arc::clone(&snapshots), deployer)
        .map(|admin| match &cluster {
            Some(cluster) => admin.in_cluster(Arc::clone(cluster)),
            None => admin,
        })
        .map(Arc::new);

    if let Some(demo) = runtimes.get("demo").filter(|_| options.demo_rate > 0) {
        let (handle, hub, rate) = (demo.handle.clone(), Arc::clone(&hub), options.demo_rate);
        let feed = move || crate::demo::spawn_feed(handle.clone(), Arc::clone(&hub), rate);
        sources.push(match &cluster {
            // Once per cluster: the node holding its lease feeds it.
            Some(cluster) => cluster.spawn_once("demo-feed".into(), Arc::clone(&log), feed),
            None => feed(),
        });
    }
    let periodic = (!config.server.snapshot_interval.is_zero())
        .then(|| snapshots.spawn_periodic(config.server.snapshot_interval));
    let sharing = cluster
        .as_ref()
        .map(|cluster| cluster.spawn_share(&snapshots));

    let signals = stop_signals()?;
    let listener = tokio::net::TcpListener::bind(options.listen)
        .await
        .map_err(|error| anyhow::anyhow!("cannot listen on {}: {error}", options.listen))?;
    let addr = listener.local_addr()?;
    let scheme = if tls.is_some() { "https" } else { "http" };
    println!("viewtape listening on {scheme}://{addr}/");
    let data_dir = std::fs::canonicalize(&options.data_dir).unwrap_or(options.data_dir.clone());
    println!(
        "viewtape data in {} (snapshots, log, deployed modules)",
        data_dir.display()
    );
    tracing::info!(
        %addr,
        runtimes = ?runtimes.names(),
        views = ?hub.views().iter().map(|v| v.name().to_owned()).collect::<Vec<_>>(),
        epoch = %journal.epoch().await,
        data_dir = %options.data_dir.display(),
        "viewtape serving"
    );

    let limits = crate::listener::Limits::from(&config.server);
    let (mut first, mut second) = (signals.clone(), signals);
    let shutdown = async {
        let _ = first.wait_for(|n| *n >= 1).await;
        tracing::info!("shutting down: closing streams and sealing");
        let _ = shutdown_tx.send(true);
    };
    let abandon = async {
        let _ = second.wait_for(|n| *n >= 2).await;
    };
    crate::listener::serve(
        listener,
        app(state, admin),
        metrics,
        limits,
        tls,
        shutdown,
        abandon,
    )
    .await?;
    reloads.abort();

    for source in sources {
        source.abort();
    }
    for task in [periodic, sharing].into_iter().flatten() {
        task.abort();
    }
    // Requests that outlived the drain may still be waiting on a runtime: the exact snapshot's
    // cut stays held until the process ends, so none of them commits after it.
    let _cut = match snapshots.write_exact().await {
        Ok((written, cut)) => {
            tracing::info!(file = %written.info.path().display(), "exact snapshot written; bye");
            Some(cut)
        }
        // A full disk, say: the stop still ends cleanly. With positions, every acknowledged
        // batch is in the log (or the stream) and the next start replays it.
        Err(error) if log.position().is_some() => {
            tracing::error!(%error, "could not write the exact snapshot at stop; everything acknowledged is in the log and replays at the next start; bye");
            None
        }
        Err(error) => {
            tracing::error!(%error, "could not write the exact snapshot at stop; with the log off, the next start takes a fresh epoch from the last snapshot; bye");
            None
        }
    };
    Ok(())
}

/// Starts each runtime's pull source where the applied history left it: on a cluster, once
/// per cluster, on the node holding its lease, from the checkpoint of the last record applied
/// when it takes the lease.
fn start_sources(
    config: &Config,
    runtimes: &Runtimes,
    cluster: Option<&Arc<Cluster>>,
    log: &Arc<Log>,
) -> Vec<JoinHandle<()>> {
    let mut sources = Vec::new();
    for section in &config.runtimes {
        let (Some(source), Some(registered)) = (&section.source, runtimes.get(&section.name))
        else {
            continue;
        };
        let (handle, file) = (registered.handle.clone(), source.file.clone());
        let follow = move || {
            let (handle, file) = (handle.clone(), file.clone());
            tokio::spawn(async move {
                let position = match handle.save().await {
                    Ok(saved) => saved
                        .checkpoint
                        .map(|SourceCheckpoint::FileTail(position)| position),
                    Err(error) => {
                        tracing::debug!(%error, "runtime stopped; its file source does not start");
                        return;
                    }
                };
                let tail = FileTail::new(FileTailConfig::new(file), position);
                // Ends when the runtime stops, or is aborted with this task.
                handle.follow(tail).await;
            })
        };
        sources.push(match cluster {
            Some(cluster) => {
                cluster.spawn_once(format!("source-{}", section.name), Arc::clone(log), follow)
            }
            None => follow(),
        });
    }
    sources
}

/// Takes `<data-dir>/viewtape.lock` for this process (an OS file lock, released when the
/// process ends, however it ends), so that two servers never share one data directory.
///
/// # Errors
/// The directory cannot be created, or another process holds the lock (named with its pid).
fn lock_data_dir(dir: &std::path::Path) -> anyhow::Result<std::fs::File> {
    use std::io::{Read as _, Seek as _, Write as _};
    std::fs::create_dir_all(dir)
        .map_err(|error| anyhow::anyhow!("cannot create data dir {}: {error}", dir.display()))?;
    let path = dir.join("viewtape.lock");
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(|error| anyhow::anyhow!("cannot open {}: {error}", path.display()))?;
    if let Err(error) = file.try_lock() {
        let mut holder = String::new();
        let _ = file.read_to_string(&mut holder);
        let holder = holder.trim();
        let holder = if holder.is_empty() { "unknown" } else { holder };
        anyhow::bail!(
            "data dir {} is in use by another viewtape (pid {holder}): one server per data \
             directory ({error})",
            dir.display()
        );
    }
    file.set_len(0)?;
    file.rewind()?;
    writeln!(file, "{}", std::process::id())?;
    file.sync_all()?;
    Ok(file)
}

/// On every SIGHUP, reads the TLS certificate and key and the auth key file again. What cannot
/// be loaded is logged and the settings in use stay.
///
/// # Errors
/// The handler cannot be installed.
fn reload_on_hangup(
    tls: Option<Arc<Tls>>,
    auth: Option<Arc<Auth>>,
) -> std::io::Result<JoinHandle<()>> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let mut hangups = signal(SignalKind::hangup())?;
        Ok(tokio::spawn(async move {
            while hangups.recv().await.is_some() {
                if let Some(tls) = &tls {
                    match tls.reload() {
                        Ok(()) => tracing::info!("SIGHUP: TLS certificate and key reloaded"),
                        Err(error) => {
                            tracing::error!(%error, "SIGHUP: TLS certificate not reloaded; the one in use stays")
                        }
                    }
                }
                if let Some(auth) = &auth {
                    match auth.reload() {
                        Ok(keys) => tracing::info!(keys, "SIGHUP: auth keys reloaded"),
                        Err(error) => {
                            tracing::error!(%error, "SIGHUP: auth keys not reloaded; the ones in use stay")
                        }
                    }
                }
            }
        }))
    }
    #[cfg(not(unix))]
    {
        let _ = (tls, auth);
        Ok(tokio::spawn(async {}))
    }
}

/// Registers SIGINT and SIGTERM handlers now and counts the signals: the first asks for a
/// graceful stop, a second for not waiting on in-flight requests. Registering before the
/// server announces its address means a signal sent right after that line is never the default
/// (killing) action.
///
/// # Errors
/// The handlers cannot be installed.
fn stop_signals() -> std::io::Result<watch::Receiver<u32>> {
    let (count, counted) = watch::channel(0u32);
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let mut interrupt = signal(SignalKind::interrupt())?;
        let mut terminate = signal(SignalKind::terminate())?;
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = interrupt.recv() => {}
                    _ = terminate.recv() => {}
                }
                count.send_modify(|n| *n += 1);
            }
        });
    }
    #[cfg(not(unix))]
    tokio::spawn(async move {
        while tokio::signal::ctrl_c().await.is_ok() {
            count.send_modify(|n| *n += 1);
        }
    });
    Ok(counted)
}
