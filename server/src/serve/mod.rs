//! `viewtape serve`: start-up, the running server, and graceful shutdown; [`serve`] reads
//! start → listen → stop.
//!
//! ## Start-up
//!
//! 1. Read the config (or take the embedded default).
//! 2. The snapshot, the runtimes and the log after it, in every mode
//!    ([`crate::serve::start::start`]): the same epoch, offsets and frames as before
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
//!
//! | file | job |
//! |---|---|
//! | this one | [`serve`]: start, listen, stop, in that order |
//! | `process` | what the process holds: the data directory's lock; SIGXFSZ ignored, SIGINT and SIGTERM counted, SIGHUP reloads |
//! | [`start`] | start-up in every mode: the snapshot, the runtimes, the log after it |
//! | `tasks` | what runs beside the listener: pull sources, the demo feed, periodic and shared snapshots |
//! | `listen` | the router with auth, TLS and the admin routes; bind, announce, serve until a stop signal |
//! | `stop` | after the listener closed: the tasks stopped, the exact snapshot |
//! | `demo` | the demo feed |

use std::net::SocketAddr;
use std::path::PathBuf;

use crate::config::Config;

mod demo;
mod listen;
mod process;
pub mod start;
mod stop;
mod tasks;

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
    // Start.
    process::ignore_file_size_signal();
    let _lock = process::lock_data_dir(&options.data_dir)?;
    let started = start::start(&options.config, &options.data_dir).await?;
    let mut tasks = tasks::Tasks::sources(&options.config, &started);
    let app = listen::App::new(&options, &started)?;
    tasks.spawn_rest(&options, &started);
    // Listen, until a stop signal has drained the listener.
    listen::listen(&options, &started, app).await?;
    // Stop, holding the exact snapshot's cut until the process ends.
    let _cut = stop::stop(tasks, &started).await;
    Ok(())
}
