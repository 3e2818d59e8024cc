//! The command line: one subcommand per benchmark ([`Command`]), whose options are the
//! `Options` struct of that benchmark's module, read by its `run` as parsed.
//!
//! Options several benchmarks take are structs here, flattened into each of them:
//! [`ClientOptions`] (every benchmark with a client runtime), [`PinOptions`] (`durable`, `fanout`,
//! `idle`) and [`ServerOptions`] (`durable`, and through [`crate::target::TargetOptions`] the
//! benchmarks that load one server). Every count and time is bounded by its value parser; a
//! combination of flags that cannot run is refused by [`Cli::validate`] before anything starts.
//!
//! A flag given twice takes its last value; a repeatable one (`--server-arg`, `--node-arg`)
//! keeps every value, and its values may start with `-` (`--server-arg --config`).

use std::net::SocketAddr;
use std::ops::RangeInclusive;

use clap::builder::RangedU64ValueParser;
use clap::{ArgAction, Args, Parser, Subcommand};
use viewtape_tests::http::ensure_loopback;

use crate::{
    cluster, deploy, durable, fanout, floor, idle, patterns, replay, restart, stalled, stop,
};

/// Load for a viewtape server, on loopback only, bounded in count and time.
///
/// Input goes through `POST /runtimes/demo/ingest` as ticker NDJSON with a global `seq`;
/// latency is measured publish to receive. Against nginx + nchan (`--peer nchan`, from
/// bench/peers/nchan.sh) the same workloads run with the same bounds.
#[derive(Debug, Parser)]
#[command(name = "viewtape-bench", args_override_self = true)]
pub struct Cli {
    /// The benchmark.
    #[command(subcommand)]
    pub command: Command,
}

impl Cli {
    /// Refuses combinations of flags that cannot run (each benchmark's `validate`).
    ///
    /// # Errors
    /// Naming the flags that do not go together.
    pub fn validate(&self) -> anyhow::Result<()> {
        match &self.command {
            Command::Load(Load::Fanout(options)) => options.target.validate(),
            Command::Load(Load::Replay(options)) => options.target.validate(),
            Command::Load(Load::Idle(options)) => options.target.validate(),
            Command::Load(Load::Stalled(options)) => options.target.validate(),
            Command::Load(Load::Durable(options)) => options.validate(),
            Command::Load(
                Load::Cluster(_)
                | Load::Restart(_)
                | Load::Deploy(_)
                | Load::Stop(_)
                | Load::Patterns(_),
            )
            | Command::Floor(_) => Ok(()),
        }
    }
}

/// The subcommands: the benchmarks, and the floor peer.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// A benchmark.
    #[command(flatten)]
    Load(Load),
    /// A peer that only writes each message to every socket, speaking nchan's protocol: the
    /// floor under `fanout --peer nchan`.
    Floor(floor::Options),
}

/// The benchmarks: each loads servers from a client runtime.
#[derive(Debug, Subcommand)]
pub enum Load {
    /// N subscribers follow `prices` while a publisher ingests R events/s for S seconds:
    /// deliveries/s, publish→receive latency, the backlog after publishing stops.
    Fanout(fanout::Options),
    /// Preload N events, then time a client from connect (a cursor just before them) to the
    /// last one.
    Replay(replay::Options),
    /// N idle SSE streams: the server's resident memory per stream.
    Idle(idle::Options),
    /// Subscribers that never read a large state: what they cost the server in memory (needs
    /// the `misbehave` fixture as runtime `m` with view `big`).
    Stalled(stalled::Options),
    /// Replicas on one JetStream stream beside a single node on its own log: acked ingest,
    /// apply lag, deliveries over 1..N nodes (spawns nats-server and the nodes).
    Cluster(cluster::Options),
    /// Acknowledged (fsynced) ingest, viewtape beside NATS JetStream.
    Durable(durable::Options),
    /// Start-up after `kill -9`: log replay against an empty log (spawns its own servers).
    Restart(restart::Options),
    /// Live module deploys under open-loop ingest (spawns its own server).
    Deploy(deploy::Options),
    /// A graceful stop with stalled clients: the stop's duration and the reconnects' spread
    /// (spawns its own two servers).
    Stop(stop::Options),
    /// Durable ingest into many new pattern views beside one existing view, and the memory per
    /// pattern view (spawns its own server).
    Patterns(patterns::Options),
}

impl Load {
    /// `--pin` and the address of a running server, for the benchmarks that take `--pin`.
    pub fn pinning(&self) -> Option<(&PinOptions, Option<SocketAddr>)> {
        match self {
            Self::Fanout(options) => Some((&options.pin, options.target.server.addr)),
            Self::Idle(options) => Some((&options.pin, options.target.server.addr)),
            Self::Durable(options) => Some((&options.pin, options.server.addr)),
            Self::Replay(_)
            | Self::Stalled(_)
            | Self::Cluster(_)
            | Self::Restart(_)
            | Self::Deploy(_)
            | Self::Stop(_)
            | Self::Patterns(_) => None,
        }
    }

    /// The client runtime's options.
    pub fn client(&self) -> &ClientOptions {
        match self {
            Self::Fanout(options) => &options.client,
            Self::Replay(options) => &options.client,
            Self::Idle(options) => &options.client,
            Self::Stalled(options) => &options.client,
            Self::Cluster(options) => &options.client,
            Self::Durable(options) => &options.client,
            Self::Restart(options) => &options.client,
            Self::Deploy(options) => &options.client,
            Self::Stop(options) => &options.client,
            Self::Patterns(options) => &options.client,
        }
    }
}

/// The load client's own runtime.
#[derive(Debug, Args)]
#[command(next_help_heading = "Load client")]
pub struct ClientOptions {
    /// Client runtime worker threads (1..=64) [default: 2, or 1 with --pin]
    #[arg(long, value_name = "N", value_parser = usize_in(1..=64))]
    pub threads: Option<usize>,
}

impl ClientOptions {
    /// `--threads`, or its default: 1 when this process is pinned to one CPU, else 2.
    pub fn threads(&self, pinned: bool) -> usize {
        self.threads.unwrap_or(if pinned { 1 } else { 2 })
    }
}

/// `--pin`: server and bench on a CPU each.
#[derive(Debug, Args)]
#[command(next_help_heading = "Load client")]
pub struct PinOptions {
    /// The spawned server on CPU 0 (under `taskset -c 0`), this tool on CPU 1, so a
    /// side-by-side run does not depend on how the scheduler shares two cores;
    /// `--pin=false` turns it off
    #[arg(long, value_name = "BOOL", action = ArgAction::Set, num_args = 0..=1,
          require_equals = true, default_missing_value = "true", default_value_t = false,
          hide_default_value = true, hide_possible_values = true)]
    pub pin: bool,
}

/// A viewtape already running, or the one this tool spawns (`target/<profile>/viewtape serve
/// --demo-rate 0` through the `viewtape-tests` harness: `$VIEWTAPE_BIN`, `VIEWTAPE_NO_BUILD=1`).
#[derive(Debug, Args)]
#[command(next_help_heading = "Server under test")]
pub struct ServerOptions {
    /// A running viewtape to load instead of spawning one (loopback only)
    #[arg(long, value_name = "IP:PORT", value_parser = loopback_addr)]
    pub addr: Option<SocketAddr>,
    /// The server's process id, for its RSS and CPU time (known for a spawned server)
    #[arg(long)]
    pub pid: Option<u32>,
    /// An argument for the spawned `viewtape serve`, repeated for more:
    /// `--server-arg=--config --server-arg=FILE`
    #[arg(
        long = "server-arg",
        value_name = "ARG",
        allow_hyphen_values = true,
        conflicts_with = "addr"
    )]
    pub server_args: Vec<String>,
}

/// The parser of a count flag, bounded to `range`.
pub fn usize_in(range: RangeInclusive<u64>) -> RangedU64ValueParser<usize> {
    RangedU64ValueParser::new().range(range)
}

/// The parser of a `u64` flag (seconds, rates), bounded to `range`.
pub fn u64_in(range: RangeInclusive<u64>) -> RangedU64ValueParser<u64> {
    RangedU64ValueParser::new().range(range)
}

/// A socket address on loopback: the only kind this tool loads.
fn loopback_addr(text: &str) -> anyhow::Result<SocketAddr> {
    let addr: SocketAddr = text.parse()?;
    ensure_loopback(addr)?;
    Ok(addr)
}

/// One command line (without the program name), parsed and validated as `main` does.
#[cfg(test)]
pub(crate) fn parse(line: &str) -> anyhow::Result<Cli> {
    let cli =
        Cli::try_parse_from(std::iter::once("viewtape-bench").chain(line.split_whitespace()))?;
    cli.validate()?;
    Ok(cli)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory as _;

    /// The command lines BENCHMARKS.md, bench/peers/*.sh and the module docs give, one per
    /// line, shell variables filled in (`$C` is `--server-arg=--config --server-arg=FILE`,
    /// `[--tls h1|h2]` both ways, `--log fsync|os|off` each): renaming or re-bounding a flag
    /// they use fails here.
    const QUOTED: &[&str] = &[
        // Lean transport: the three workloads side by side.
        "idle --connections 10000 --hold-seconds 3 --server-arg=--config --server-arg=/tmp/vt-20k.toml",
        "fanout --subscribers 1000 --rate 50 --seconds 10 --server-arg=--config --server-arg=/tmp/vt-20k.toml",
        "fanout --subscribers 1000 --rate 2000 --seconds 8 --drain-seconds 20 --server-arg=--config --server-arg=/tmp/vt-20k.toml",
        "idle --connections 10000 --server-arg=--config --server-arg=/tmp/vt-20k.toml",
        "fanout --subscribers 100 --rate 50 --seconds 10",
        "fanout --subscribers 1000 --rate 4000 --seconds 8",
        "replay --events 100000 --runs 7",
        // First measurement.
        "fanout --subscribers 100 --rate 50 --seconds 15 --server-arg=--config --server-arg=viewtape-bench.toml",
        "fanout --subscribers 1000 --rate 50 --seconds 15 --server-arg=--config --server-arg=viewtape-bench.toml",
        "idle --connections 10000 --hold-seconds 3 --server-arg=--config --server-arg=viewtape-bench.toml",
        "replay --events 10000 --runs 7 --server-arg=--config --server-arg=viewtape-bench.toml",
        "replay --events 100000 --runs 7 --server-arg=--config --server-arg=viewtape-bench.toml",
        "fanout --subscribers 1000 --rate 500 --seconds 10 --drain-seconds 20 --server-arg=--config --server-arg=viewtape-bench.toml",
        // Stalled subscribers.
        "stalled --subscribers 30 --server-arg=--config --server-arg=/tmp/vt-stalled.toml",
        "stalled --subscribers 30 --keys 2000 --size 20000 --hold-seconds 1",
        // Graceful stop.
        "stop --clients 1000 --stalled 30 --spread-seconds 5",
        // Durable ingest and restart.
        "durable --compare --pin --runs 3 --seconds 5",
        "durable --workload bulk --runs 3 --seconds 5 --log fsync",
        "durable --workload bulk --runs 3 --seconds 5 --log os",
        "durable --workload bulk --runs 3 --seconds 5 --log off",
        "restart --events 1000000 --runs 3",
        "durable --workload acks --runs 1 --seconds 5 --log fsync",
        "durable --workload acks --runs 1 --seconds 5 --log fsync-nowatermark",
        "durable --workload latency --rate 1000 --seconds 5 --runs 3 --addr 127.0.0.1:4000 --pid 4242",
        "durable --peer jetstream --workload latency --rate 1000 --seconds 5 --runs 3",
        "durable --workload bulk --pin --runs 3 --seconds 5",
        "durable --peer viewtape --workload bulk --pin --runs 3 --seconds 5",
        "durable --peer viewtape --workload bulk --pin --runs 3 --seconds 5 --wasm /tmp/ticker-untyped.wasm",
        "restart --runs 5",
        "restart --events 1000000 --events-per-batch 1000 --runs 3 --producers 4 --ingest-seconds 600",
        // Deploys.
        "deploy --deploys 10",
        "deploy --deploys 5",
        "deploy --deploys 5 --cluster 3",
        "deploy --deploys 10 --rate 500 --connections 4 --max-seconds 300",
        // TLS.
        "idle --connections 5000 --hold-seconds 3 --pin",
        "idle --connections 5000 --hold-seconds 3 --tls h1 --pin",
        "idle --connections 5000 --hold-seconds 3 --tls h2 --pin",
        "fanout --subscribers 1000 --rate 200 --seconds 10 --drain-seconds 20 --pin",
        "fanout --subscribers 1000 --rate 200 --seconds 10 --drain-seconds 20 --tls h1 --pin",
        "fanout --subscribers 1000 --rate 200 --seconds 10 --drain-seconds 20 --tls h2 --pin",
        // Cluster.
        "cluster",
        "cluster --nodes 3 --producers 16 --seconds 10 --rate 1500 --subscribers 1000",
        "cluster --nodes 3 --producers 16 --seconds 5 --rate 8000 --subscribers 1000",
        "cluster --nodes 1 --producers 64 --seconds 10 --rate 100 --subscribers 10",
        "cluster --nodes 1 --producers 64 --seconds 10 --rate 100 --subscribers 10 --node-arg=--config --node-arg=/tmp/one.toml",
        // Keys and narrowed subscribers.
        "fanout --subscribers 1000 --keys 5000 --rate 200 --seconds 20 --drain-seconds 20 --pin",
        "fanout --subscribers 1000 --keys 5000 --rate 200 --seconds 20 --drain-seconds 20 --pin --narrow",
        "fanout --subscribers 1000 --rate 50 --seconds 15 --pin --server-arg=--config --server-arg=/tmp/vt.toml",
        "fanout --subscribers 1000 --keys 5000 --rate 200 --seconds 15 --pin --narrow --server-arg=--config --server-arg=/tmp/vt.toml",
        "idle --connections 15000 --hold-seconds 3 --pin --server-arg=--config --server-arg=/tmp/vt.toml",
        // Against nchan and the floor.
        "fanout --subscribers 1000 --rate 50 --seconds 15 --pin --peer nchan --peer-url http://127.0.0.1:8081 --pid 4242",
        "idle --connections 15000 --hold-seconds 3 --pin --peer nchan --peer-url http://127.0.0.1:8081 --pid 4242",
        "fanout --peer nchan --peer-url http://127.0.0.1:8081 --pid 4242 --subscribers 1000 --rate 50 --seconds 10",
        "idle --peer nchan --peer-url http://127.0.0.1:8081 --pid 4242 --connections 10000",
        "fanout --subscribers 1000 --rate 50 --seconds 15 --peer nchan --peer-url http://127.0.0.1:8081 --pid 4242",
        "fanout --subscribers 1000 --rate 25 --seconds 10 --drain-seconds 20 --peer nchan --peer-url http://127.0.0.1:8081 --pid 4242",
        "idle --connections 10000 --hold-seconds 3 --peer nchan --peer-url http://127.0.0.1:8081 --pid 4242",
        "replay --events 10000 --runs 7 --peer nchan --peer-url http://127.0.0.1:8081 --pid 4242",
        "floor --max-seconds 120",
        // The modules' usage lines, every flag spelled out.
        "fanout --subscribers 100 --rate 50 --seconds 10 --batch-ms 5 --tls h1 --pin --keys 10 --narrow",
        "replay --events 100000 --runs 7 --tls h2 --publishers 8",
        "replay --addr 127.0.0.1:8080 --pid 4242 --threads 2",
        "idle --connections 10000 --hold-seconds 3 --tls h2 --pin --threads 1",
        "durable --compare --workload acks --seconds 10 --runs 3 --rate 1000 --nats-server nats-server --pin",
        "durable --peer viewtape --workload latency --max-batches 10000000 --drain-seconds 10 --runtimes shared --log os --producers 8 --events-per-batch 1 --nats-connections 1 --server-arg --demo-rate --server-arg 0",
        "durable --workload bulk --runtimes per-producer --log fsync --wasm builtin:ticker",
        "cluster --nodes 3 --producers 16 --seconds 10 --rate 100 --subscribers 600 --nats-server nats-server --node-arg --config --node-arg /tmp/one.toml",
        "deploy --deploys 10 --rate 500 --connections 4 --max-seconds 300 --cluster 3 --nats-server nats-server",
        "floor --port 0 --max-seconds 600 --io-uring",
    ];

    /// A benchmark's command line, parsed.
    fn load(line: &str) -> anyhow::Result<Load> {
        match parse(line)?.command {
            Command::Load(load) => Ok(load),
            Command::Floor(_) => anyhow::bail!("not a benchmark: {line}"),
        }
    }

    #[test]
    fn the_command_is_well_formed() {
        Cli::command().debug_assert();
    }

    #[test]
    fn every_quoted_command_parses() {
        for line in QUOTED {
            if let Err(e) = parse(line) {
                panic!("viewtape-bench {line}: {e:#}");
            }
        }
    }

    #[test]
    fn unknown_flags_positionals_and_missing_values_are_refused() {
        assert!(parse("fanout --nope 1").is_err());
        assert!(parse("fanout extra").is_err());
        assert!(parse("fanout --rate").is_err());
        assert!(parse("nothing").is_err());
        // `--pin` belongs to the benchmarks that pin; `--threads` to those with a runtime.
        assert!(parse("cluster --pin").is_err());
        assert!(parse("floor --threads 1").is_err());
    }

    #[test]
    fn switches_take_an_optional_value_after_equals() -> anyhow::Result<()> {
        let pin = |line: &str| -> anyhow::Result<bool> {
            let load = load(line)?;
            let (pin, _) = load.pinning().ok_or_else(|| anyhow::anyhow!("no --pin"))?;
            Ok(pin.pin)
        };
        assert!(pin("idle --pin")?);
        assert!(pin("idle --pin=true")?);
        assert!(!pin("idle --pin=false")?);
        assert!(!pin("idle")?);
        assert!(pin("idle --pin --connections 5")?);
        assert!(parse("idle --pin=maybe").is_err());
        Ok(())
    }

    #[test]
    fn threads_default_by_pinning_and_are_bounded() -> anyhow::Result<()> {
        let threads = |line: &str, pinned: bool| -> anyhow::Result<usize> {
            Ok(load(line)?.client().threads(pinned))
        };
        assert_eq!(threads("replay", false)?, 2);
        assert_eq!(threads("fanout --pin", true)?, 1);
        assert_eq!(threads("stop --threads 4", false)?, 4);
        assert!(parse("stop --threads 0").is_err());
        assert!(parse("stop --threads 65").is_err());
        Ok(())
    }

    #[test]
    fn a_repeated_flag_takes_its_last_value() -> anyhow::Result<()> {
        let load = load("restart --threads 3 --threads 5")?;
        assert_eq!(load.client().threads, Some(5));
        Ok(())
    }

    #[test]
    fn server_args_keep_every_value_and_need_a_spawned_server() -> anyhow::Result<()> {
        let Load::Replay(options) =
            load("replay --server-arg --config --server-arg=/tmp/a.toml --server-arg x")?
        else {
            anyhow::bail!("not replay");
        };
        assert_eq!(
            options.target.server.server_args,
            ["--config", "/tmp/a.toml", "x"]
        );
        assert!(parse("replay --addr 127.0.0.1:1 --server-arg x").is_err());
        assert!(parse("durable --addr 127.0.0.1:1 --server-arg x").is_err());
        assert!(parse("durable --addr 10.0.0.1:80").is_err());
        assert!(parse("replay --addr 10.0.0.1:80").is_err());
        assert!(parse("replay --addr nowhere").is_err());
        Ok(())
    }
}
