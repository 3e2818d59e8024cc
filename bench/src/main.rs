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
//! or HTTP/2 streams through hyper's client ([`transport`]). Latency is measured publish→receive: the
//! publisher notes the send time of every `seq`, subscribers look it up on receipt.
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
use clap::{CommandFactory as _, Parser as _};

use crate::cli::{Cli, Command};
use crate::target::Target;

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    if let Err(e) = cli.validate() {
        Cli::command()
            .error(clap::error::ErrorKind::ArgumentConflict, format!("{e:#}"))
            .exit();
    }
    let command = match cli.command {
        Command::Floor(options) => return floor::run(&options),
        command => command,
    };
    // `--pin` pins this process to one CPU before any thread exists; kept to the end.
    let pinned = match command.pinning() {
        Some((pin, addr)) => pin::pin_before_runtime(pin, addr)?,
        None => None,
    };
    let threads = command
        .client()
        .map_or(1, |client| client.threads(pinned.is_some()));
    let nofile = target::raise_nofile()?;
    eprintln!("RLIMIT_NOFILE soft limit: {nofile}");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .enable_all()
        .build()
        .context("tokio runtime")?;
    let result = runtime.block_on(run(command, nofile));
    drop(pinned);
    result
}

/// Runs one benchmark on the client runtime; `nofile` is the file-descriptor limit.
async fn run(command: Command, nofile: u64) -> anyhow::Result<()> {
    match command {
        Command::Durable(options) => durable::run(&options).await,
        Command::Restart(options) => restart::run(&options).await,
        Command::Cluster(options) => cluster::run(&options).await,
        Command::Stop(options) => stop::run(&options).await,
        Command::Deploy(options) => deploy::run(&options).await,
        Command::Floor(options) => floor::run(&options),
        Command::Fanout(options) => {
            let target = Target::start(&options.target).await?;
            with_logs(&target, fanout::run(&target, &options).await)
        }
        Command::Replay(options) => {
            let target = Target::start(&options.target).await?;
            with_logs(&target, replay::run(&target, &options).await)
        }
        Command::Idle(options) => {
            options.check_nofile(nofile)?;
            let target = Target::start(&options.target).await?;
            with_logs(&target, idle::run(&target, &options).await)
        }
        Command::Stalled(options) => {
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
