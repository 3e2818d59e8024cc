//! The router and what it serves with — auth, TLS, the admin routes — and the listening itself:
//! bind, announce, serve until a stop signal, drain.

use std::sync::Arc;

use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::process::{reload_on_hangup, stop_signals};
use super::start::Started;
use super::ServeOptions;
use crate::auth::Auth;
use crate::http::admin::Admin;
use crate::http::{app, AppState};
use crate::listener::tls::Tls;

/// What the router needs, made before the server listens.
pub(super) struct App {
    state: AppState,
    admin: Option<Arc<Admin>>,
    tls: Option<Arc<Tls>>,
    /// Reloads the certificate and the auth keys on SIGHUP while the server listens.
    reloads: JoinHandle<()>,
    /// Turns `true` at the first stop signal: streams end, `/readyz` turns `503`.
    shutdown: watch::Sender<bool>,
}

impl App {
    /// Loads auth (warning when it is off beyond loopback) and the TLS certificate, starts the
    /// SIGHUP reloads, and makes the router's state and the admin routes (with
    /// `VIEWTAPE_ADMIN_TOKEN`).
    ///
    /// # Errors
    /// The auth keys, the certificate or the SIGHUP handler cannot be loaded.
    pub(super) fn new(options: &ServeOptions, started: &Started) -> anyhow::Result<Self> {
        let config = &options.config;
        let (shutdown, shutdown_rx) = watch::channel(false);
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
            Arc::clone(&started.hub),
            Arc::clone(&started.runtimes),
            started.log.metrics(),
            auth,
            config.server.clone(),
            shutdown_rx,
        );
        let cluster = &started.cluster;
        let state = match cluster {
            Some(cluster) => state.in_cluster(Arc::clone(cluster)),
            None => state,
        };
        let admin = Admin::from_env(
            Arc::clone(&started.catalog),
            Arc::clone(&started.snapshots),
            Arc::clone(&started.deployer),
        )
        .map(|admin| match cluster {
            Some(cluster) => admin.in_cluster(Arc::clone(cluster)),
            None => admin,
        })
        .map(Arc::new);
        Ok(Self {
            state,
            admin,
            tls,
            reloads,
            shutdown,
        })
    }
}

/// Registers the stop signals, binds, prints `viewtape listening on …` and `viewtape data in …`,
/// and serves until the first SIGINT or SIGTERM has drained the listener (a second one stops
/// waiting).
///
/// # Errors
/// The signal handlers cannot be installed, the address cannot be bound, or the listener fails.
pub(super) async fn listen(
    options: &ServeOptions,
    started: &Started,
    parts: App,
) -> anyhow::Result<()> {
    let App {
        state,
        admin,
        tls,
        reloads,
        shutdown: shutdown_tx,
    } = parts;
    let metrics = Arc::clone(&state.metrics);
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
    let hub = &started.hub;
    tracing::info!(
        %addr,
        runtimes = ?started.runtimes.names(),
        views = ?hub.views().iter().map(|v| v.name().to_owned()).collect::<Vec<_>>(),
        epoch = %hub.journal().epoch().await,
        data_dir = %options.data_dir.display(),
        "viewtape serving"
    );

    let limits = crate::listener::Limits::from(&options.config.server);
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
    Ok(())
}
