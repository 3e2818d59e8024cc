//! `cluster`: replicas on one JetStream stream, beside a single node on its own log, in one run
//! (a real `nats-server` with every write fsynced, and real `viewtape serve` processes).
//!
//! 1. **Ingest**: `--producers` closed-loop producers, one tick per batch, for `--seconds`,
//!    into a single node with its local log (`fsync = "always"`), then into a node of a
//!    cluster of `--nodes` (each batch published to the stream and applied by that node before
//!    its `200`): acknowledged batches per second and ack latency.
//! 2. **Apply lag**: a subscriber on every node of the cluster, `--rate` ticks/s into the first
//!    node for `--seconds`: per tick, the time from its arrival on the first node to its
//!    arrival on each other node.
//! 3. **Deliveries**: `--subscribers` spread evenly over 1, 2, …, `--nodes` nodes, `--rate`
//!    ticks/s into the first for `--seconds`: deliveries per second over all of them, and
//!    whether every subscriber got every tick.
//!
//! ```text
//! viewtape-bench cluster [--nodes 3] [--producers 16] [--seconds 10] [--rate 100]
//!                        [--subscribers 600] [--nats-server nats-server] [--node-arg ARG ...]
//! ```
//!
//! `--node-arg` passes an argument to every cluster node (e.g. `--config` a file whose
//! `[cluster] batches_per_message = 1` publishes every batch as its own message).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context as _};
use clap::Args;
use tokio::task::JoinSet;
use viewtape_tests::feed::scan_seq;
use viewtape_tests::http::HttpConn;
use viewtape_tests::{EventStream, Feed, NatsServer, Server};

use crate::cli::{u64_in, usize_in, ClientOptions};
use crate::histogram::Histogram;

/// What to run.
#[derive(Debug, Args)]
pub struct Options {
    /// Nodes of the cluster (1..=5)
    #[arg(long, default_value_t = 3, value_parser = usize_in(1..=5))]
    nodes: usize,
    /// Closed-loop producers of the ingest part (1..=256)
    #[arg(long, default_value_t = 16, value_parser = usize_in(1..=256))]
    producers: usize,
    /// Seconds of each part (1..=120)
    #[arg(long, default_value_t = 10, value_parser = u64_in(1..=120))]
    seconds: u64,
    /// Ticks per second of the apply-lag and deliveries parts (1..=10,000)
    #[arg(long, default_value_t = 100, value_parser = u64_in(1..=10_000))]
    rate: u64,
    /// Subscribers of the deliveries part (1..=5,000)
    #[arg(long, default_value_t = 600, value_parser = usize_in(1..=5_000))]
    subscribers: usize,
    /// The nats-server binary
    #[arg(long, value_name = "PATH", default_value = viewtape_tests::nats::DEFAULT_BIN)]
    nats_server: String,
    /// An argument for every cluster node, repeated for more:
    /// `--node-arg=--config --node-arg=FILE`
    #[arg(long = "node-arg", value_name = "ARG", allow_hyphen_values = true)]
    node_args: Vec<String>,
    #[command(flatten)]
    pub(crate) client: ClientOptions,
}

/// Runs the three parts and prints their figures.
///
/// # Errors
/// When a server does not start or a request fails.
pub async fn run(options: &Options) -> anyhow::Result<()> {
    let window = Duration::from_secs(options.seconds);

    let single = Server::start(&["--demo-rate", "0"]).await?;
    let local = ingest(single.addr(), options.producers, window).await?;
    drop(single);
    let nats = NatsServer::start_with(&options.nats_server, false).await?;
    nats.check_sync_always().await?;
    let mut nodes = Vec::new();
    let url = nats.url();
    for _ in 0..options.nodes {
        let mut args = vec!["--nats", &url, "--demo-rate", "0"];
        args.extend(options.node_args.iter().map(String::as_str));
        let node = Server::start(&args).await?;
        node.ready(Duration::from_secs(30)).await?;
        nodes.push(node);
    }
    let shared = ingest(nodes[0].addr(), options.producers, window).await?;
    for (name, figures) in [("local_log", &local), ("jetstream", &shared)] {
        println!(
            "cluster ingest log={name} producers={} acks_per_s={:.0} ack_ms p50={:.2} p99={:.2} max={:.2}",
            options.producers,
            figures.acks as f64 / window.as_secs_f64(),
            ms(figures.latency.quantile(0.5)),
            ms(figures.latency.quantile(0.99)),
            ms(figures.latency.max()),
        );
    }

    let addrs: Vec<SocketAddr> = nodes.iter().map(Server::addr).collect();
    if addrs.len() > 1 {
        let lags = apply_lag(&addrs, options.rate, window).await?;
        for (k, lag) in lags.iter().enumerate() {
            println!(
                "cluster apply_lag node=1->{} ms p50={:.2} p99={:.2} max={:.2} samples={}",
                k + 2,
                ms(lag.quantile(0.5)),
                ms(lag.quantile(0.99)),
                ms(lag.max()),
                lag.samples()
            );
        }
    }
    for n in 1..=addrs.len() {
        let (delivered, expected, took) =
            deliveries(&addrs[..n], options.subscribers, options.rate, window).await?;
        println!(
            "cluster deliveries nodes={n} subscribers={} rate={} offered_per_s={} deliveries_per_s={:.0} took_s={:.2} lossless={}",
            options.subscribers,
            options.rate,
            options.rate * options.subscribers as u64,
            delivered as f64 / took.as_secs_f64(),
            took.as_secs_f64(),
            delivered == expected
        );
    }
    Ok(())
}

fn ms(us: u64) -> f64 {
    us as f64 / 1000.0
}

/// What closed-loop producers got.
#[derive(Debug, Default)]
struct Acked {
    acks: u64,
    latency: Histogram,
}

/// `producers` connections, each posting one tick per batch and waiting for its `200`, for
/// `window`. Each producer is an idempotent producer of its own, so the guest's single `seq`
/// does not order them: the ticks are of one symbol per producer, numbered by it.
async fn ingest(addr: SocketAddr, producers: usize, window: Duration) -> anyhow::Result<Acked> {
    let until = Instant::now() + window;
    let mut tasks = JoinSet::new();
    let next = Arc::new(AtomicU64::new(1));
    for _ in 0..producers {
        let next = Arc::clone(&next);
        tasks.spawn(async move {
            let mut conn = HttpConn::connect(addr).await?;
            let mut acked = Acked::default();
            while Instant::now() < until {
                // One global, dense seq across producers, taken in order of sending; a batch
                // that arrives after a higher seq is a redelivery to the ticker and yields no
                // event, which is fine here: the log and the ack are what is measured.
                let seq = next.fetch_add(1, Ordering::Relaxed);
                let body = viewtape_tests::feed::tick("ACME", 1.0, seq);
                let sent = Instant::now();
                let resp = conn
                    .send("POST", "/runtimes/demo/ingest", &[], body.as_bytes())
                    .await?;
                if resp.status() != 200 {
                    bail!("ingest: {}: {}", resp.status(), resp.text());
                }
                acked.acks += 1;
                acked.latency.record(sent.elapsed().as_micros() as u64);
            }
            anyhow::Ok(acked)
        });
    }
    let mut all = Acked::default();
    while let Some(done) = tasks.join_next().await {
        let acked = done.context("producer task")??;
        all.acks += acked.acks;
        all.latency.merge(&acked.latency);
    }
    Ok(all)
}

/// Publishes `rate` ticks/s for `window` into `addr`, one batch every 10 ms; returns the
/// number sent (`rate` × the window's seconds).
async fn feed_at(addr: SocketAddr, rate: u64, window: Duration) -> anyhow::Result<u64> {
    let mut conn = HttpConn::connect(addr).await?;
    let mut feed = Feed::new(&["ACME", "BOLT", "CORE"]);
    feed.set_next_seq(next_seq(addr).await?);
    let start = Instant::now();
    let mut sent = 0u64;
    let total = rate * window.as_secs();
    let mut tick = tokio::time::interval(Duration::from_millis(10));
    while sent < total {
        tick.tick().await;
        let due = ((start.elapsed().as_secs_f64() * rate as f64) as u64).min(total) - sent;
        if due == 0 {
            continue;
        }
        let resp = conn
            .send(
                "POST",
                "/runtimes/demo/ingest",
                &[],
                feed.batch(due as usize).as_bytes(),
            )
            .await?;
        ensure!(resp.status() == 200, "ingest: {}", resp.text());
        sent += due;
    }
    Ok(sent)
}

/// The `seq` the ticker takes next on the node at `addr` (one past the highest it holds).
async fn next_seq(addr: SocketAddr) -> anyhow::Result<u64> {
    let state = viewtape_tests::http::request(addr, "GET", "/views/prices", &[], b"")
        .await?
        .json()?;
    let newest = state["entries"]
        .as_object()
        .map(|entries| entries.values().filter_map(|t| t["seq"].as_u64()).max())
        .unwrap_or_default()
        .unwrap_or(0);
    Ok(newest + 1)
}

/// A stream of `prices` at the node's head (nothing replayed).
async fn at_head(addr: SocketAddr) -> anyhow::Result<EventStream> {
    let state = viewtape_tests::http::request(addr, "GET", "/views/prices", &[], b"")
        .await?
        .json()?;
    let cursor = state["cursor"].as_str().context("no cursor")?.to_owned();
    EventStream::connect(addr, "/views/prices/events", &[("Last-Event-ID", &cursor)]).await
}

/// Reads `stream` until `count` ticks arrived or `until`, calling `seen(seq)` on each.
async fn follow(
    mut stream: EventStream,
    count: u64,
    until: Instant,
    mut seen: impl FnMut(u64),
) -> anyhow::Result<u64> {
    let mut got = 0;
    while got < count && Instant::now() < until {
        let read = stream
            .read_with(Duration::from_millis(100), |event| {
                if let Some(seq) = scan_seq(event.data) {
                    got += 1;
                    seen(seq);
                }
            })
            .await;
        match read {
            Ok(true) => {}
            Ok(false) => bail!("the stream ended"),
            Err(e) if e.to_string().contains(" within ") => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}

/// Part 2: per other node, the lag of each tick behind its arrival on the first node.
async fn apply_lag(
    addrs: &[SocketAddr],
    rate: u64,
    window: Duration,
) -> anyhow::Result<Vec<Histogram>> {
    let origin = Instant::now();
    let first = next_seq(addrs[0]).await?;
    let count = rate * window.as_secs();
    let until = origin + window + Duration::from_secs(10);
    let mut arrivals = Vec::new();
    let mut readers = JoinSet::new();
    for (k, &addr) in addrs.iter().enumerate() {
        let stream = at_head(addr).await?;
        let times: Arc<Vec<AtomicU64>> = Arc::new((0..count).map(|_| AtomicU64::new(0)).collect());
        arrivals.push(Arc::clone(&times));
        readers.spawn(async move {
            let got = follow(stream, count, until, |seq| {
                let now = origin.elapsed().as_micros() as u64;
                if let Some(slot) = seq.checked_sub(first).and_then(|i| times.get(i as usize)) {
                    slot.store(now.max(1), Ordering::Relaxed);
                }
            })
            .await?;
            anyhow::Ok((k, got))
        });
    }
    feed_at(addrs[0], rate, window).await?;
    while let Some(done) = readers.join_next().await {
        let (k, got) = done.context("reader")??;
        ensure!(got == count, "node {} got {got} of {count} ticks", k + 1);
    }
    let lags = arrivals[1..]
        .iter()
        .map(|times| {
            let mut lag = Histogram::default();
            for (there, here) in times.iter().zip(arrivals[0].iter()) {
                let (there, here) = (there.load(Ordering::Relaxed), here.load(Ordering::Relaxed));
                if there != 0 && here != 0 {
                    lag.record(there.saturating_sub(here));
                }
            }
            lag
        })
        .collect();
    Ok(lags)
}

/// Part 3: `subscribers` over `addrs`, ticks into the first; (delivered, expected, the time
/// from the first tick sent to the last delivered).
async fn deliveries(
    addrs: &[SocketAddr],
    subscribers: usize,
    rate: u64,
    window: Duration,
) -> anyhow::Result<(u64, u64, Duration)> {
    let count = rate * window.as_secs();
    let until = Instant::now() + window + Duration::from_secs(10);
    let mut readers = JoinSet::new();
    for i in 0..subscribers {
        let stream = at_head(addrs[i % addrs.len()]).await?;
        readers.spawn(follow(stream, count, until, |_| {}));
    }
    let start = Instant::now();
    let sent = feed_at(addrs[0], rate, window).await?;
    let mut delivered = 0;
    while let Some(done) = readers.join_next().await {
        delivered += done.context("reader")??;
    }
    Ok((delivered, sent * subscribers as u64, start.elapsed()))
}
