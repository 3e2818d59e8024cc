//! The `durable` command line: which peers, which workloads and their shapes, and the config
//! of the producer runtimes a spawned viewtape gets (`--runtimes per-producer`).

use anyhow::bail;
use clap::{Args, ValueEnum};

use crate::cli::{u64_in, usize_in, ClientOptions, PinOptions, ServerOptions};

/// Most runtimes `viewtape serve` can host (its pool of guest instances).
const MAX_RUNTIMES: usize = 64;

/// The system under test.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(super) enum Peer {
    /// A spawned `viewtape serve`, or the one at --addr
    Viewtape,
    /// A spawned nats-server with JetStream
    #[value(name = "jetstream")]
    JetStream,
}

impl Peer {
    pub(super) fn name(self) -> &'static str {
        match self {
            Self::Viewtape => "viewtape",
            Self::JetStream => "jetstream",
        }
    }
}

/// What a workload measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    /// Closed loop, small batches: acknowledged batches/s.
    Acks,
    /// Closed loop, big batches: acknowledged events/s.
    Bulk,
    /// Open loop at a fixed rate: ack latency.
    Latency,
}

impl Kind {
    /// Default (producers, events per batch).
    fn defaults(self) -> (usize, usize) {
        match self {
            Self::Acks => (64, 1),
            Self::Bulk => (8, 1000),
            Self::Latency => (64, 1),
        }
    }
}

/// `--workload`: one [`Kind`], or all three in turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(super) enum Workloads {
    /// Acks, bulk and latency in turn
    All,
    /// 64 producers x 1-event batches, closed loop: acknowledged batches/s
    Acks,
    /// 8 producers x 1000-event batches, closed loop: acknowledged events/s
    Bulk,
    /// Open loop at --rate 1-event batches/s on 64 connections: ack latency
    Latency,
}

impl Workloads {
    fn kinds(self) -> Vec<Kind> {
        match self {
            Self::All => vec![Kind::Acks, Kind::Bulk, Kind::Latency],
            Self::Acks => vec![Kind::Acks],
            Self::Bulk => vec![Kind::Bulk],
            Self::Latency => vec![Kind::Latency],
        }
    }
}

/// Which viewtape runtimes the producers ingest into (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(super) enum Runtimes {
    /// `bench-p<i>` for producer `i`, each with its own `seq` (at most 64 producers)
    PerProducer,
    /// `demo` for all, one `seq` counter, resends after skips
    Shared,
}

/// The spawned server's `[log]` (`--log`, per-producer mode).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(super) enum Log {
    /// Synced before the 200 (`fsync = "always"`)
    Fsync,
    /// The same without the end-of-log watermark: what it costs
    FsyncNowatermark,
    /// Handed to the OS (`fsync = "os"`)
    Os,
    /// No log (`enabled = false`): what the log costs
    Off,
}

/// The runtime producer `i` ingests into with `--runtimes per-producer`.
pub(super) fn producer_runtime(i: usize) -> String {
    format!("bench-p{i}")
}

/// The spawned server's config for `--runtimes per-producer`: `n` producer runtimes, every
/// one the built-in ticker into `prices` (no `demo`: the server's pool holds 64 guest
/// instances, one per runtime).
pub(super) fn per_producer_config(n: usize, log: Log, wasm: &str) -> String {
    let mut text = String::from("# written by viewtape-bench durable --runtimes per-producer\n");
    text.push_str(match log {
        Log::Off => "\n[log]\nenabled = false\n",
        Log::FsyncNowatermark => "\n[log]\nfsync = \"always\"\nwatermark = false\n",
        Log::Os => "\n[log]\nfsync = \"os\"\n",
        Log::Fsync => "\n[log]\nfsync = \"always\"\n",
    });
    for i in 0..n {
        text.push_str(&format!(
            "\n[[runtime]]\nname = \"{}\"\nwasm = {wasm:?}\nviews = [\"prices\"]\n",
            producer_runtime(i)
        ));
    }
    text
}

/// One workload with its shape.
#[derive(Debug, Clone, Copy)]
pub(super) struct Workload {
    pub(super) kind: Kind,
    pub(super) producers: usize,
    pub(super) events: usize,
}

impl Workload {
    pub(super) fn label(&self, rate: u64) -> String {
        let (p, k) = (self.producers, self.events);
        let ev = if k == 1 { "event" } else { "events" };
        match self.kind {
            Kind::Acks => format!("acks: {p} producers x {k} {ev}"),
            Kind::Bulk => format!("bulk: {p} producers x {k} {ev}"),
            Kind::Latency => format!("latency: {rate}/s x {k} {ev}, {p} conns"),
        }
    }
}

/// What to run.
#[derive(Debug, Args)]
pub struct Options {
    /// Both peers in one invocation, in turn
    #[arg(long, value_name = "BOOL", conflicts_with = "peer", action = clap::ArgAction::Set,
          num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value_t = false,
          hide_default_value = true, hide_possible_values = true)]
    compare: bool,
    /// The peer measured [default: viewtape]
    #[arg(long, value_enum)]
    peer: Option<Peer>,
    /// The workloads run
    #[arg(long, value_enum, default_value_t = Workloads::All)]
    workload: Workloads,
    /// Producers of the one --workload (1..=1024) [default: 64, 8 for bulk]
    #[arg(long, value_parser = usize_in(1..=1024))]
    producers: Option<usize>,
    /// Events per batch of the one --workload (1..=10,000) [default: 1, 1000 for bulk]
    #[arg(long = "events-per-batch", value_name = "K", value_parser = usize_in(1..=10_000))]
    events: Option<usize>,
    /// Seconds per workload and run (1..=600)
    #[arg(long, default_value_t = 10, value_parser = u64_in(1..=600))]
    pub(super) seconds: u64,
    /// Runs; the table shows their medians (1..=100)
    #[arg(long, default_value_t = 3, value_parser = usize_in(1..=100))]
    pub(super) runs: usize,
    /// Batches per second of the latency workload (1..=100,000)
    #[arg(long, default_value_t = 1000, value_parser = u64_in(1..=100_000))]
    pub(super) rate: u64,
    /// The bound on batches per workload and run (1..=1,000,000,000)
    #[arg(long, default_value_t = 10_000_000, value_parser = u64_in(1..=1_000_000_000))]
    pub(super) max_batches: u64,
    /// Seconds the latency workload waits for acks after its last send (0..=600)
    #[arg(long, default_value_t = 10, value_parser = u64_in(0..=600))]
    pub(super) drain_seconds: u64,
    /// Which viewtape runtimes the producers ingest into
    #[arg(long, value_enum, default_value_t = Runtimes::PerProducer)]
    pub(super) runtimes: Runtimes,
    /// The nats-server binary
    #[arg(long, value_name = "PATH", default_value = "nats-server")]
    pub(super) nats_server: String,
    /// NATS client connections the producers share (1..=1024)
    #[arg(long, default_value_t = 1, value_parser = usize_in(1..=1024))]
    pub(super) nats_connections: usize,
    /// The spawned viewtape's `[log]` (per-producer runtimes)
    #[arg(long, value_enum, default_value_t = Log::Fsync)]
    pub(super) log: Log,
    /// The producer runtimes' module (per-producer runtimes): `builtin:<guest>`, or a file,
    /// relative to where the bench runs
    #[arg(long, value_name = "FILE", default_value = "builtin:ticker", value_parser = module_arg)]
    pub(super) wasm: String,
    #[command(flatten)]
    pub(crate) server: ServerOptions,
    #[command(flatten)]
    pub(crate) pin: PinOptions,
    #[command(flatten)]
    pub(crate) client: ClientOptions,
}

/// A module as the spawned server's config names it: a built-in as it is, a file as an absolute
/// path (the config is written in a directory of its own, where a relative path would not
/// resolve).
fn module_arg(text: &str) -> Result<String, String> {
    if text.starts_with("builtin:") {
        return Ok(text.to_owned());
    }
    let path = std::path::absolute(text).map_err(|error| format!("{text}: {error}"))?;
    Ok(path.display().to_string())
}

impl Options {
    /// The peers measured, in the order they take turns.
    pub(super) fn peers(&self) -> Vec<Peer> {
        match (self.compare, self.peer) {
            (true, _) => vec![Peer::Viewtape, Peer::JetStream],
            (false, peer) => vec![peer.unwrap_or(Peer::Viewtape)],
        }
    }

    /// The workloads run, each with `--producers` and `--events-per-batch` or its defaults.
    pub(super) fn workloads(&self) -> Vec<Workload> {
        self.workload
            .kinds()
            .into_iter()
            .map(|kind| {
                let (p, k) = kind.defaults();
                Workload {
                    kind,
                    producers: self.producers.unwrap_or(p),
                    events: self.events.unwrap_or(k),
                }
            })
            .collect()
    }

    /// Most producers of any workload.
    pub(super) fn most_producers(&self) -> usize {
        self.workloads()
            .iter()
            .map(|w| w.producers)
            .max()
            .unwrap_or(1)
    }

    /// Refuses flags that contradict each other.
    ///
    /// # Errors
    /// `--producers`/`--events-per-batch` with every workload; with `--runtimes
    /// per-producer`, more producers than runtimes or a `--config` of the caller's.
    pub fn validate(&self) -> anyhow::Result<()> {
        if self.workload == Workloads::All && (self.producers.is_some() || self.events.is_some()) {
            bail!("--producers / --events-per-batch shape one workload: add --workload acks|bulk|latency");
        }
        if self.runtimes == Runtimes::PerProducer && self.most_producers() > MAX_RUNTIMES {
            bail!("--runtimes per-producer: at most {MAX_RUNTIMES} producers (viewtape serve pools {MAX_RUNTIMES} guest instances); use --runtimes shared for more");
        }
        if self.runtimes == Runtimes::PerProducer
            && self
                .server
                .server_args
                .iter()
                .any(|a| a == "--config" || a.starts_with("--config="))
        {
            bail!("--runtimes per-producer writes the server's --config; use --runtimes shared with your own");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_module_file_is_named_by_its_absolute_path_a_builtin_as_it_is() {
        assert_eq!(module_arg("builtin:ticker").unwrap(), "builtin:ticker");
        let named = module_arg("server/guests/ticker.wasm").unwrap();
        let here = std::env::current_dir().unwrap();
        assert_eq!(
            std::path::Path::new(&named),
            here.join("server/guests/ticker.wasm")
        );
    }

    #[test]
    fn per_producer_config_names_runtimes() {
        let text = per_producer_config(2, Log::Fsync, "builtin:ticker");
        assert!(
            text.contains("name = \"bench-p0\"\nwasm = \"builtin:ticker\"\nviews = [\"prices\"]")
        );
        assert!(text.contains("name = \"bench-p1\""));
        assert!(!text.contains("bench-p2"));
        assert_eq!(text.matches("[[runtime]]").count(), 2);
    }

    #[test]
    fn options_shape_the_workloads() -> anyhow::Result<()> {
        let parse = |line: &str| match crate::cli::parse(&format!("durable {line}"))?.command {
            crate::cli::Command::Load(crate::cli::Load::Durable(options)) => Ok(options),
            other => bail!("not durable: {other:?}"),
        };
        let o = parse("--compare --seconds 5 --runs 1")?;
        assert_eq!(o.peers(), vec![Peer::Viewtape, Peer::JetStream]);
        let workloads = o.workloads();
        assert_eq!(workloads.len(), 3);
        assert_eq!(workloads[1].producers, 8);
        assert_eq!(workloads[1].events, 1000);
        let o = parse("--peer jetstream --workload acks --producers 4")?;
        assert_eq!(o.peers(), vec![Peer::JetStream]);
        let workloads = o.workloads();
        assert_eq!((workloads[0].producers, workloads[0].events), (4, 1));
        assert!(parse("--producers 4").is_err());
        assert!(parse("--workload all --events-per-batch 4").is_err());
        assert!(parse("--compare --peer viewtape").is_err());
        assert!(parse("--peer nchan").is_err());
        assert!(parse("--workload acks --producers 65").is_err());
        assert!(parse("--workload acks --producers 65 --runtimes shared").is_ok());
        assert!(parse("--server-arg=--config --server-arg=x.toml").is_err());
        assert!(parse("--runtimes shared --server-arg=--config --server-arg=x.toml").is_ok());
        assert!(parse("--log fsync-nowatermark").is_ok());
        assert!(parse("--log sometimes").is_err());
        let o = parse("")?;
        assert_eq!(o.peers(), vec![Peer::Viewtape]);
        assert_eq!(
            (o.seconds, o.runs, o.rate, o.drain_seconds),
            (10, 3, 1000, 10)
        );
        assert_eq!((o.max_batches, o.nats_connections), (10_000_000, 1));
        assert_eq!(
            (o.runtimes, o.log, o.wasm.as_str()),
            (Runtimes::PerProducer, Log::Fsync, "builtin:ticker")
        );
        Ok(())
    }
}
