//! `viewtape-bench`: load for a viewtape server, on loopback only, bounded in count and time.
//!
//! ```text
//! viewtape-bench --help              the benchmarks
//! viewtape-bench <command> --help    one benchmark's options, their bounds and defaults
//! ```
//!
//! Every command line is parsed by [`cli::Cli`]: a subcommand per benchmark whose options are
//! the `Options` of its module, plus the options several share (a running server with `--addr
//! 127.0.0.1:PORT [--pid PID]`, or a spawned `target/<profile>/viewtape serve --demo-rate 0
//! [--server-arg …]`, or the nchan peer with `--peer nchan --peer-url http://127.0.0.1:PORT`;
//! `--pin`; `--threads`).
//!
//! Input goes through `POST /runtimes/demo/ingest` as ticker NDJSON with a global `seq`;
//! subscribers are raw TCP + minimal HTTP/1.1 + SSE parsing (the `viewtape-tests` harness), so
//! thousands fit next to the server on a 2-core box; with `--tls` the same over tokio-rustls,
//! or HTTP/2 streams through hyper's client ([`transport`]). Latency is measured
//! publish→receive: the publisher notes the send time of every `seq`, subscribers look it up on
//! receipt.
//!
//! Against nchan the same ticks are published as one `POST /pub/prices` each (body = the tick
//! JSON; nchan assigns `<time>:<tag>` ids), subscribers follow the eventsource `/sub/prices`
//! and resume with `Last-Event-ID` set to the id nchan reported for the warm-up publish.
//!
//! `durable` measures acknowledged (fsynced) ingest: viewtape's `POST /runtimes/<runtime>/ingest`
//! against a real `nats-server` with JetStream (`sync_interval: always`), alternately in one
//! invocation with `--compare`; `--pin` runs the server under `taskset -c 0` and the bench on
//! CPU 1. See [`durable`].
//!
//! `restart` always spawns its own servers (fresh data directories): it ingests `--events`,
//! `kill -9`s the server and times the restart that replays them from the log, beside a
//! restart with an empty log. See [`restart`].
//!
//! `deploy` always spawns its own server (with an admin token): it ingests into `demo` at a
//! fixed rate and deploys a new ticker build to `demo` again and again, timing each deploy
//! and the ingest acks while one is in flight. See [`deploy`].

mod cli;
mod cluster;
mod deploy;
mod durable;
mod fanout;
mod floor;
mod histogram;
mod idle;
mod jetstream;
mod patterns;
mod pin;
mod publish;
mod replay;
mod restart;
mod stalled;
mod stop;
mod subscribers;
mod target;
mod tls;
mod transport;

use anyhow::Context as _;
use clap::error::ErrorKind::ArgumentConflict;
use clap::{CommandFactory as _, FromArgMatches as _};

use crate::cli::{Cli, Command, Load};
use crate::target::Target;

fn main() -> anyhow::Result<()> {
    let mut command = Cli::command();
    let matches = command.get_matches_mut();
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    if let Err(e) = cli.validate() {
        // Refused like a parse error, with the benchmark's usage.
        let benchmark = matches
            .subcommand_name()
            .and_then(|name| command.find_subcommand_mut(name));
        let message = format!("{e:#}");
        match benchmark {
            Some(benchmark) => benchmark.error(ArgumentConflict, message).exit(),
            None => command.error(ArgumentConflict, message).exit(),
        }
    }
    match cli.command {
        Command::Floor(options) => floor::run(&options),
        Command::Load(load) => run(load),
    }
}

/// Runs one benchmark on a client runtime of `--threads` workers.
fn run(load: Load) -> anyhow::Result<()> {
    // `--pin` pins this process to one CPU before any thread exists; kept to the end.
    let pinned = match load.pinning() {
        Some((pin, addr)) => pin::pin_before_runtime(pin, addr)?,
        None => None,
    };
    let threads = load.client().threads(pinned.is_some());
    let nofile = target::raise_nofile()?;
    eprintln!("RLIMIT_NOFILE soft limit: {nofile}");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .enable_all()
        .build()
        .context("tokio runtime")?;
    let result = runtime.block_on(load_server(load, nofile));
    drop(pinned);
    result
}

/// The benchmark itself; `nofile` is the file-descriptor limit.
async fn load_server(load: Load, nofile: u64) -> anyhow::Result<()> {
    match load {
        Load::Durable(options) => durable::run(&options).await,
        Load::Restart(options) => restart::run(&options).await,
        Load::Cluster(options) => cluster::run(&options).await,
        Load::Stop(options) => stop::run(&options).await,
        Load::Deploy(options) => deploy::run(&options).await,
        Load::Patterns(options) => patterns::run(&options).await,
        Load::Fanout(options) => {
            let target = Target::start(&options.target).await?;
            with_logs(&target, fanout::run(&target, &options).await)
        }
        Load::Replay(options) => {
            let target = Target::start(&options.target).await?;
            with_logs(&target, replay::run(&target, &options).await)
        }
        Load::Idle(options) => {
            options.check_nofile(nofile)?;
            let target = Target::start(&options.target).await?;
            with_logs(&target, idle::run(&target, &options).await)
        }
        Load::Stalled(options) => {
            let target = Target::start(&options.target).await?;
            with_logs(&target, stalled::run(&target, &options).await)
        }
    }
}

/// A benchmark's `result`, after printing the spawned server's stderr when it failed.
fn with_logs(target: &Target, result: anyhow::Result<()>) -> anyhow::Result<()> {
    if result.is_err() {
        if let Some(logs) = target.logs() {
            eprintln!("---- spawned server stderr (tail) ----\n{logs}");
        }
    }
    result
}
