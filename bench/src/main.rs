//! `viewtape-bench`: load for a viewtape server, on loopback only, bounded in count and time.
//!
//! ```text
//! viewtape-bench fanout --subscribers N --rate R --seconds S [--batch-ms 5] [--tls h1|h2] [--pin]
//!                        [--keys K] [--narrow]   (events over K keys; --narrow: subscriber i
//!                        follows only key i mod K, ?keys=; bench/src/fanout.rs)
//! viewtape-bench replay --events 100000 [--runs 7] [--tls h1|h2]
//! viewtape-bench idle   --connections 10000 [--hold-seconds 3] [--tls h1|h2] [--pin]
//! viewtape-bench stalled --subscribers 30 [--keys 2000 --size 20000 --hold-seconds 1]
//! viewtape-bench cluster [--nodes 3 --producers 16 --seconds 10 --rate 100 --subscribers 600]
//! viewtape-bench durable [--compare | --peer jetstream] [--workload acks|bulk|latency]
//!                        [--seconds 10 --runs 3 --rate 1000] [--nats-server PATH] [--pin]
//!                        (acknowledged durable ingest beside NATS JetStream: bench/src/durable.rs)
//! viewtape-bench restart [--events 1000000 --events-per-batch 1000 --runs 3 --producers 4]
//!                        (start-up after kill -9: log replay vs an empty log; bench/src/restart.rs)
//! viewtape-bench deploy  [--deploys 10 --rate 500 --connections 4 --max-seconds 300]
//!                        (live module deploys under open-loop ingest; bench/src/deploy.rs)
//! viewtape-bench stop    [--clients 1000 --stalled 30 --spread-seconds 5]
//!                        (a graceful stop with stalled clients, reconnect spread; bench/src/stop.rs)
//! viewtape-bench floor   [--port 0 --max-seconds 600] [--io-uring]
//!                        (a peer that only writes each message to every socket, with
//!                        --io-uring in one submission: the floor under fanout --peer nchan;
//!                        bench/src/floor.rs)
//! common: --addr 127.0.0.1:PORT [--pid PID]   (a running server; PID for RSS/CPU)
//!         or nothing: spawns target/<profile>/viewtape serve --demo-rate 0 [--server-arg …]
//!         or --peer nchan --peer-url http://127.0.0.1:PORT [--pid WORKER_PID]
//!            (nginx + nchan from bench/peers/nchan.sh; same workloads, same bounds)
//!         --tls h1|h2   (spawned viewtape) HTTPS: a self-signed certificate, the config given
//!                       with --server-arg=--config (or none) plus tls_cert/tls_key; subscribers
//!                       speak HTTP/1.1 over TLS (a connection each) or HTTP/2 (256 streams to
//!                       a connection); ingest and the tape stay HTTP/1.1 (over TLS)
//!         --pin         (durable, fanout, idle) server on CPU 0, bench on CPU 1 (bench/src/pin.rs)
//!         --threads 2   client runtime worker threads (1 with --pin)
//!         --publishers 8   fanout/replay: publish connections for nchan (one message per POST)
//! ```
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

mod args;
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

use anyhow::{bail, Context as _};

use crate::args::Args;
use crate::target::Target;

const USAGE: &str = "usage: viewtape-bench <fanout|replay|idle|stalled|cluster|durable|restart|deploy|stop|floor> [options]; see the module docs in bench/src/main.rs";

fn main() -> anyhow::Result<()> {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let Some((command, rest)) = argv.split_first() else {
        bail!("{USAGE}");
    };
    if command == "-h" || command == "--help" {
        println!("{USAGE}");
        return Ok(());
    }
    let args = Args::parse(rest)?;
    if command == "floor" {
        let options = floor::Options::from_args(&args)?;
        args.finish()?;
        return floor::run(&options);
    }
    // `--pin` pins this process to one CPU before any thread exists; kept to the end.
    let pinned = match command.as_str() {
        "durable" | "fanout" | "idle" => pin::pin_before_runtime(&args)?,
        _ => None,
    };
    let threads = args.num("threads", if pinned.is_some() { 1 } else { 2 }, 1, 64)?;
    let nofile = target::raise_nofile()?;
    eprintln!("RLIMIT_NOFILE soft limit: {nofile}");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .enable_all()
        .build()
        .context("tokio runtime")?;
    let result = runtime.block_on(async move {
        if command == "durable" {
            let options = durable::Options::from_args(&args)?;
            args.finish()?;
            return durable::run(&options).await;
        }
        if command == "restart" {
            let options = restart::Options::from_args(&args)?;
            args.finish()?;
            return restart::run(&options).await;
        }
        if command == "cluster" {
            let options = cluster::Options::from_args(&args)?;
            args.finish()?;
            return cluster::run(&options).await;
        }
        if command == "stop" {
            let options = stop::Options::from_args(&args)?;
            args.finish()?;
            return stop::run(&options).await;
        }
        if command == "deploy" {
            let options = deploy::Options::from_args(&args)?;
            args.finish()?;
            return deploy::run(&options).await;
        }
        let target_and_run = async {
            let target = Target::from_args(&args).await?;
            let result = match command.as_str() {
                "fanout" => {
                    let options = fanout::Options::from_args(&args)?;
                    args.finish()?;
                    fanout::run(&target, &options).await
                }
                "replay" => {
                    let options = replay::Options::from_args(&args)?;
                    args.finish()?;
                    replay::run(&target, &options).await
                }
                "idle" => {
                    let options = idle::Options::from_args(&args, nofile)?;
                    args.finish()?;
                    idle::run(&target, &options).await
                }
                "stalled" => {
                    let options = stalled::Options::from_args(&args)?;
                    args.finish()?;
                    stalled::run(&target, &options).await
                }
                other => bail!("unknown command {other:?}; {USAGE}"),
            };
            if result.is_err() {
                if let Some(logs) = target.logs() {
                    eprintln!("---- spawned server stderr (tail) ----\n{logs}");
                }
            }
            result
        };
        target_and_run.await
    });
    drop(pinned);
    result
}
