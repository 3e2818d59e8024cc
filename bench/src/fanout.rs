//! `fanout`: N subscribers follow `prices` while a publisher ingests R events/s for S seconds.
//!
//! Reports the publish rate held, deliveries/s, publish→receive latency (p50/p99/max), and the
//! backlog: how many deliveries were still owed when publishing stopped, and how long they took
//! to drain (bounded by `--drain-seconds`). Subscribers speak HTTP/1.1 over TCP, or with
//! `--tls h1|h2` HTTP/1.1 or HTTP/2 over TLS ([`crate::transport`]).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{ensure, Context as _};
use viewtape_tests::feed::scan_seq;
use viewtape_tests::Feed;

use crate::args::Args;
use crate::histogram::Histogram;
use crate::publish::Publisher;
use crate::target::{cpu_seconds, rss_kib, Target};
use crate::transport::{connect_all, Subscription};

/// What to run.
#[derive(Debug)]
pub struct Options {
    subscribers: usize,
    rate: u64,
    seconds: u64,
    batch_ms: u64,
    drain_seconds: u64,
    publishers: usize,
}

impl Options {
    /// `--subscribers` (1..=50k, default 100), `--rate` events/s (1..=10M, default 50),
    /// `--seconds` (1..=600, default 10), `--batch-ms` publish tick (1..=1000, default 5),
    /// `--drain-seconds` (0..=600, default 10), `--publishers` keep-alive publish connections
    /// for nchan, which takes one message per request (1..=64, default 8; viewtape ingests
    /// each tick's events as one NDJSON batch on one connection).
    ///
    /// # Errors
    /// On out-of-bounds values.
    pub fn from_args(args: &Args) -> anyhow::Result<Self> {
        Ok(Self {
            subscribers: args.num("subscribers", 100usize, 1, 50_000)?,
            rate: args.num("rate", 50u64, 1, 10_000_000)?,
            seconds: args.num("seconds", 10u64, 1, 600)?,
            batch_ms: args.num("batch-ms", 5u64, 1, 1000)?,
            drain_seconds: args.num("drain-seconds", 10u64, 0, 600)?,
            publishers: args.num("publishers", 8usize, 1, 64)?,
        })
    }
}

/// Shared between the publisher and the subscribers.
struct Shared {
    origin: Instant,
    /// Send time (ns since `origin`) per `seq`; 0 = not sent.
    sent_at: Vec<AtomicU64>,
    /// Per-subscriber delivery counts.
    received: Vec<AtomicU64>,
    stop: AtomicBool,
    histograms: Mutex<Histogram>,
    errors: Mutex<Vec<String>>,
}

/// Runs it and prints the figures.
///
/// # Errors
/// On server or connection errors.
pub async fn run(target: &Target, options: &Options) -> anyhow::Result<()> {
    let max_events = options.rate.saturating_mul(options.seconds) + 1;
    let mut publisher = Publisher::connect(target, options.publishers).await?;
    let mut feed = Feed::new(&[
        "ACME", "BOLT", "CORE", "DASH", "EXPO", "FIZZ", "GLOW", "HALO", "IRIS", "JADE",
    ]);
    // One warm-up event gives the head cursor subscribers resume from (so none of them
    // starts with a state transfer or a replay).
    publisher.publish(&mut feed, 1).await?;
    let head = publisher.head_id(target).await?;
    let first_seq = feed.next_seq();

    let shared = Arc::new(Shared {
        origin: Instant::now(),
        sent_at: (0..=first_seq + max_events)
            .map(|_| AtomicU64::new(0))
            .collect(),
        received: (0..options.subscribers)
            .map(|_| AtomicU64::new(0))
            .collect(),
        stop: AtomicBool::new(false),
        histograms: Mutex::new(Histogram::default()),
        errors: Mutex::new(Vec::new()),
    });

    let rss_before = target.pid.map(rss_kib).transpose()?;
    let connecting = Instant::now();
    let streams = connect_all(
        &target.dialer,
        target.events_path(),
        options.subscribers,
        &head,
    )
    .await?;
    eprintln!(
        "{} subscribers connected in {:?}",
        options.subscribers,
        connecting.elapsed()
    );
    let rss_connected = target.pid.map(rss_kib).transpose()?;

    let mut tasks = Vec::with_capacity(streams.len());
    for (i, stream) in streams.into_iter().enumerate() {
        let shared = Arc::clone(&shared);
        let kind = target.event_type();
        tasks.push(tokio::spawn(subscribe(i, stream, kind, shared)));
    }

    // Publish.
    let cpu_before = target.pid.map(cpu_seconds).transpose()?;
    let client_cpu_before = cpu_seconds(std::process::id())?;
    let publish_start = Instant::now();
    let publish_for = Duration::from_secs(options.seconds);
    let tick = Duration::from_millis(options.batch_ms);
    let mut published = 0u64;
    let mut requests = 0u64;
    let mut interval = tokio::time::interval(tick);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    while publish_start.elapsed() < publish_for && published < max_events {
        interval.tick().await;
        let due = ((publish_start.elapsed().as_secs_f64() * options.rate as f64) as u64)
            .min(max_events)
            .saturating_sub(published);
        if due == 0 {
            continue;
        }
        let now = shared.origin.elapsed().as_nanos() as u64;
        let start_seq = feed.next_seq();
        for seq in start_seq..start_seq + due {
            shared.sent_at[seq as usize].store(now.max(1), Ordering::Relaxed);
        }
        requests += publisher.publish(&mut feed, due as usize).await?;
        published += due;
    }
    let publish_took = publish_start.elapsed();
    let expected = published * options.subscribers as u64;
    let delivered_at_end: u64 = shared
        .received
        .iter()
        .map(|r| r.load(Ordering::Relaxed))
        .sum();
    let cpu = match (cpu_before, target.pid) {
        (Some(before), Some(pid)) => Some(cpu_seconds(pid)? - before),
        _ => None,
    };
    let rss_loaded = target.pid.map(rss_kib).transpose()?;
    let client_cpu = cpu_seconds(std::process::id())? - client_cpu_before;

    // Drain.
    let drain_start = Instant::now();
    let drain_for = Duration::from_secs(options.drain_seconds);
    let mut delivered = delivered_at_end;
    while delivered < expected && drain_start.elapsed() < drain_for {
        tokio::time::sleep(Duration::from_millis(20)).await;
        delivered = shared
            .received
            .iter()
            .map(|r| r.load(Ordering::Relaxed))
            .sum();
    }
    let drained_in = drain_start.elapsed();
    shared.stop.store(true, Ordering::Relaxed);
    for task in tasks {
        task.await.context("subscriber task")?;
    }
    let errors = shared.errors.lock().map(|e| e.clone()).unwrap_or_default();
    let hist = shared
        .histograms
        .lock()
        .map(|h| h.clone())
        .unwrap_or_default();
    let ms = |us: u64| us as f64 / 1000.0;

    println!(
        "fanout peer={:?} transport={} subscribers={} rate={} seconds={} published={published} requests={requests} publish_rate_held={:.0}/s",
        target.peer,
        target.transport().name(),
        options.subscribers,
        options.rate,
        options.seconds,
        published as f64 / publish_took.as_secs_f64()
    );
    println!(
        "fanout deliveries_in_window={delivered_at_end} deliveries_per_s={:.0} sustained_per_s={:.0} expected={expected} delivered_total={delivered} backlog_at_end={} drained_in_ms={:.0} lossless={}",
        delivered_at_end as f64 / publish_took.as_secs_f64(),
        // Everything delivered, over publishing plus the drain (the rate actually kept up).
        delivered as f64 / (publish_took + drained_in).as_secs_f64(),
        expected.saturating_sub(delivered_at_end),
        drained_in.as_secs_f64() * 1000.0,
        delivered == expected && errors.is_empty()
    );
    println!(
        "fanout latency_ms p50={:.2} p90={:.2} p99={:.2} p999={:.2} max={:.2} samples={}",
        ms(hist.quantile(0.5)),
        ms(hist.quantile(0.9)),
        ms(hist.quantile(0.99)),
        ms(hist.quantile(0.999)),
        ms(hist.max()),
        hist.samples()
    );
    if let (Some(before), Some(connected), Some(loaded)) = (rss_before, rss_connected, rss_loaded) {
        println!(
            "fanout server_rss_kib before={before} connected={connected} loaded={loaded} per_subscriber_kib={:.1}",
            connected.saturating_sub(before) as f64 / options.subscribers as f64
        );
    }
    if let Some(cpu) = cpu {
        // The server's CPU over the publishing window, per delivery made in it.
        println!(
            "fanout server_cpu_s={cpu:.2} server_cpu_share={:.0}% server_cpu_us_per_delivery={:.2}",
            cpu / publish_took.as_secs_f64() * 100.0,
            cpu * 1e6 / delivered_at_end.max(1) as f64
        );
    }
    // The client shares the machine: when it is saturated, latency is the client's, not the
    // server's.
    println!(
        "fanout client_cpu_s={client_cpu:.2} client_cpu_share={:.0}% load_average={}",
        client_cpu / publish_took.as_secs_f64() * 100.0,
        std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(",")
    );
    if !errors.is_empty() {
        println!(
            "fanout subscriber_errors={} first={:?}",
            errors.len(),
            errors[0]
        );
    }
    ensure!(
        errors.len() < options.subscribers,
        "every subscriber failed: {:?}",
        errors.first()
    );
    Ok(())
}

/// One subscriber: counts deliveries and records latencies until told to stop.
async fn subscribe(index: usize, mut stream: Subscription, kind: &str, shared: Arc<Shared>) {
    let mut hist = Histogram::default();
    let mut count = 0u64;
    let mut error = None;
    while !shared.stop.load(Ordering::Relaxed) {
        let mut now = 0u64;
        let result = stream
            .read_with(Duration::from_millis(100), |event| {
                if event.event != kind {
                    if error.is_none() {
                        error = Some(format!("subscriber {index}: unexpected {event:?}"));
                    }
                    return;
                }
                if now == 0 {
                    now = shared.origin.elapsed().as_nanos() as u64;
                }
                count += 1;
                if let Some(sent) = scan_seq(event.data)
                    .and_then(|seq| shared.sent_at.get(seq as usize))
                    .map(|t| t.load(Ordering::Relaxed))
                    .filter(|&t| t != 0)
                {
                    hist.record(now.saturating_sub(sent) / 1000);
                }
            })
            .await;
        shared.received[index].store(count, Ordering::Relaxed);
        match result {
            Ok(true) => {}
            Ok(false) => {
                error.get_or_insert_with(|| format!("subscriber {index}: stream ended"));
                break;
            }
            // A read timeout just means nothing arrived in 100 ms: check `stop` and go on.
            Err(e) if e.to_string().contains(" within ") => {}
            Err(e) => {
                error.get_or_insert_with(|| format!("subscriber {index}: {e:#}"));
                break;
            }
        }
        if error.is_some() {
            break;
        }
    }
    if let Ok(mut all) = shared.histograms.lock() {
        all.merge(&hist);
    }
    if let Some(error) = error {
        if let Ok(mut errors) = shared.errors.lock() {
            errors.push(error);
        }
    }
}
