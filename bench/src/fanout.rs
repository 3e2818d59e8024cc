//! `fanout`: N subscribers follow `prices` while a publisher ingests R events/s for S seconds.
//!
//! Reports the publish rate held, deliveries/s, publish→receive latency (p50/p99/max), and the
//! backlog: how many deliveries were still owed when publishing stopped, and how long they took
//! to drain (bounded by `--drain-seconds`). Subscribers speak HTTP/1.1 over TCP, or with
//! `--tls h1|h2` HTTP/1.1 or HTTP/2 over TLS ([`crate::transport`]); plain ones are read by one
//! thread polling every socket ([`crate::subscribers`]).
//!
//! Keys: the publisher cycles its ticks over ten symbols, or with `--keys K` over `K` symbols
//! `S00000`, `S00001`, … (then it first publishes one tick per key, so the view holds all `K`
//! keys before anyone subscribes). Tick `seq` `s` carries key `(s - 1) mod K`.
//!
//! Narrowed subscribers: with `--narrow`, subscriber `i` follows
//! `/views/prices/events?keys=<key i mod K>` instead of the whole view, so an event reaches only
//! the subscribers of its key (with 1,000 subscribers and `--keys 5000`, a fifth of the events
//! reach one subscriber each, the others none). Without it, every event reaches every subscriber.
//!
//! Lossless means: every subscriber received exactly the events of its keys published in the
//! window, in order — each checks that the `seq`s it receives are the next ones due to it
//! (`+1` on the full stream, `+K` on a narrowed one: a key's ticks are `K` apart), and the
//! deliveries add up to what the window owed ([`Plan::expected_for`]); no subscriber failed.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context as _};
use clap::Args;
use viewtape_tests::Feed;

use crate::cli::{u64_in, usize_in, ClientOptions, PinOptions};
use crate::publish::{PublishOptions, Publisher};
use crate::subscribers::{Readers, SeqCheck, Shared, Tally};
use crate::target::{cpu_seconds, rss_kib, Peer, Target, TargetOptions};
use crate::transport::{connect_all, Subscription, Transport};

/// The symbols the publisher cycles over without `--keys`.
const DEFAULT_SYMBOLS: [&str; 10] = [
    "ACME", "BOLT", "CORE", "DASH", "EXPO", "FIZZ", "GLOW", "HALO", "IRIS", "JADE",
];

/// Most keys `--keys` spreads the events over.
const MAX_KEYS: usize = 100_000;

/// Narrowed streams opened at once (as [`connect_all`] does for full ones).
const CONNECT_CONCURRENCY: usize = 256;

/// What to run.
#[derive(Debug, Args)]
pub struct Options {
    /// Subscribers following `prices` (1..=50,000)
    #[arg(long, default_value_t = 100, value_parser = usize_in(1..=50_000))]
    subscribers: usize,
    /// Events published per second (1..=10,000,000)
    #[arg(long, default_value_t = 50, value_parser = u64_in(1..=10_000_000))]
    rate: u64,
    /// Seconds of publishing (1..=600)
    #[arg(long, default_value_t = 10, value_parser = u64_in(1..=600))]
    seconds: u64,
    /// The publish tick: one ingest batch every this many milliseconds (1..=1000)
    #[arg(long, default_value_t = 5, value_parser = u64_in(1..=1000))]
    batch_ms: u64,
    /// Seconds allowed for the backlog to drain after publishing stops (0..=600)
    #[arg(long, default_value_t = 10, value_parser = u64_in(0..=600))]
    drain_seconds: u64,
    #[command(flatten)]
    publish: PublishOptions,
    /// Distinct keys the events are spread over, `S00000`, `S00001`, … (1..=100,000)
    /// [default: ten symbols]
    #[arg(long, value_parser = usize_in(1..=MAX_KEYS as u64))]
    keys: Option<usize>,
    /// Subscriber i follows only key i mod K (`?keys=`) instead of the whole view
    #[arg(long, value_name = "BOOL", action = clap::ArgAction::Set, num_args = 0..=1,
          require_equals = true, default_missing_value = "true", default_value_t = false,
          hide_default_value = true, hide_possible_values = true)]
    narrow: bool,
    #[command(flatten)]
    pub(crate) target: TargetOptions,
    #[command(flatten)]
    pub(crate) pin: PinOptions,
    #[command(flatten)]
    pub(crate) client: ClientOptions,
}

/// Which key each tick carries and which ticks each subscriber is owed.
#[derive(Debug, Clone)]
struct Plan {
    /// The keys in the order the feed cycles over them: `seq` `s` carries
    /// `symbols[(s - 1) % K]` (as [`Feed::symbol_of`]).
    symbols: Vec<String>,
    /// Subscriber `i` follows `symbols[i % K]` only.
    narrow: bool,
}

impl Plan {
    /// The ten default symbols, or `keys` symbols `S00000`, `S00001`, ….
    fn new(keys: Option<usize>, narrow: bool) -> Self {
        let symbols = match keys {
            None => DEFAULT_SYMBOLS.iter().map(|s| (*s).to_owned()).collect(),
            Some(k) => (0..k.max(1)).map(|i| format!("S{i:05}")).collect(),
        };
        Self { symbols, narrow }
    }

    /// `K`, the number of keys.
    fn keys(&self) -> u64 {
        self.symbols.len().max(1) as u64
    }

    /// A feed cycling over the keys, starting at `seq` 1.
    fn feed(&self) -> Feed {
        let symbols: Vec<&str> = self.symbols.iter().map(String::as_str).collect();
        Feed::new(&symbols)
    }

    /// The index of the key tick `seq` carries.
    fn key_of_seq(&self, seq: u64) -> u64 {
        seq.saturating_sub(1) % self.keys()
    }

    /// The index of the one key subscriber `index` follows; `None`: it follows every key.
    fn key_of_subscriber(&self, index: usize) -> Option<u64> {
        self.narrow.then(|| index as u64 % self.keys())
    }

    /// The SSE path subscriber `index` opens: `base`, narrowed to its key with `--narrow`.
    fn path(&self, base: &str, index: usize) -> String {
        match self.key_of_subscriber(index) {
            None => base.to_owned(),
            Some(key) => format!("{base}?keys={}", self.symbols[key as usize]),
        }
    }

    /// How far apart the `seq`s a subscriber receives are: 1 on the full stream, `K` on a
    /// narrowed one.
    fn stride(&self) -> u64 {
        if self.narrow {
            self.keys()
        } else {
            1
        }
    }

    /// The first `seq` at or after `first` that subscriber `index` receives.
    fn first_seq_for(&self, index: usize, first: u64) -> u64 {
        match self.key_of_subscriber(index) {
            None => first,
            Some(key) => {
                let k = self.keys();
                first + (key + k - self.key_of_seq(first)) % k
            }
        }
    }

    /// Of the `published` ticks from `seq` `first` on, how many subscriber `index` receives.
    fn expected_for(&self, index: usize, first: u64, published: u64) -> u64 {
        let offset = self.first_seq_for(index, first) - first;
        if offset >= published {
            0
        } else {
            (published - offset - 1) / self.stride() + 1
        }
    }

    /// How many distinct keys `subscribers` follow (every key on full streams).
    fn subscribed_keys(&self, subscribers: usize) -> u64 {
        if self.narrow {
            (subscribers as u64).min(self.keys())
        } else {
            self.keys()
        }
    }

    /// Of the `published` ticks from `seq` `first` on, how many reach at least one of
    /// `subscribers` (all of them on full streams).
    fn events_reaching(&self, subscribers: usize, first: u64, published: u64) -> u64 {
        if !self.narrow {
            return if subscribers == 0 { 0 } else { published };
        }
        // Subscribers 0..K follow the distinct keys; the rest repeat them.
        (0..subscribers.min(self.symbols.len()))
            .map(|index| self.expected_for(index, first, published))
            .sum()
    }
}

/// Runs it and prints the figures.
///
/// # Errors
/// On server or connection errors, and `--narrow` against nchan or over HTTP/2.
pub async fn run(target: &Target, options: &Options) -> anyhow::Result<()> {
    let plan = Plan::new(options.keys, options.narrow);
    if options.narrow {
        ensure!(
            target.peer == Peer::Viewtape,
            "--narrow needs viewtape (nchan has no narrowed streams)"
        );
        ensure!(
            target.transport() != Transport::TlsH2,
            "--narrow opens a path per subscriber, HTTP/1.1 only: use --tls h1 or no --tls"
        );
    }
    let max_events = options.rate.saturating_mul(options.seconds) + 1;
    let mut publisher = Publisher::connect(target, options.publish.publishers).await?;
    let mut feed = plan.feed();
    // Warm-up gives the head cursor subscribers resume from (so none of them starts with a
    // state transfer or a replay): one event, or with `--keys` one per key so the view holds
    // every key before anyone subscribes.
    let warm_up = match options.keys {
        Some(_) => plan.symbols.len(),
        None => 1,
    };
    publisher.publish(&mut feed, warm_up).await?;
    let head = publisher.head_id(target).await?;
    let first_seq = feed.next_seq();

    let shared = Arc::new(Shared::new(options.subscribers, first_seq + max_events));

    let rss_before = target.pid.map(rss_kib).transpose()?;
    let connecting = Instant::now();
    let streams = if options.narrow {
        connect_narrowed(target, &plan, options.subscribers, &head).await?
    } else {
        connect_all(
            &target.dialer,
            target.events_path(),
            options.subscribers,
            &head,
        )
        .await?
    };
    eprintln!(
        "{} subscribers connected in {:?}",
        options.subscribers,
        connecting.elapsed()
    );
    let rss_connected = target.pid.map(rss_kib).transpose()?;

    let tallies = (0..streams.len())
        .map(|i| {
            let check = SeqCheck::new(plan.first_seq_for(i, first_seq), plan.stride());
            Tally::new(i, target.event_type(), check)
        })
        .collect();
    let readers = Readers::start(target.transport(), streams, tallies, &shared)?;

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
    // What the window owes: every subscriber, every tick of its keys.
    let expected: u64 = (0..options.subscribers)
        .map(|i| plan.expected_for(i, first_seq, published))
        .sum();
    let reaching = plan.events_reaching(options.subscribers, first_seq, published);
    let delivered_at_end = shared.delivered();
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
        delivered = shared.delivered();
    }
    let drained_in = drain_start.elapsed();
    shared.stop.store(true, Ordering::Relaxed);
    readers.join().await?;
    // Each subscriber received exactly what it was owed (its last count, stored as it stopped).
    let complete = shared
        .received
        .iter()
        .enumerate()
        .filter(|(i, r)| r.load(Ordering::Relaxed) == plan.expected_for(*i, first_seq, published))
        .count();
    let violations = shared.violations.load(Ordering::Relaxed);
    let errors = shared.errors.lock().map(|e| e.clone()).unwrap_or_default();
    let order_errors = shared
        .order_errors
        .lock()
        .map(|e| e.clone())
        .unwrap_or_default();
    let hist = shared
        .histograms
        .lock()
        .map(|h| h.clone())
        .unwrap_or_default();
    let ms = |us: u64| us as f64 / 1000.0;

    println!(
        "fanout peer={:?} transport={} subscribers={} keys={} narrow={} subscribed_keys={} rate={} seconds={} published={published} requests={requests} publish_rate_held={:.0}/s",
        target.peer,
        target.transport().name(),
        options.subscribers,
        plan.keys(),
        options.narrow,
        plan.subscribed_keys(options.subscribers),
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
        delivered == expected
            && complete == options.subscribers
            && violations == 0
            && errors.is_empty()
    );
    println!(
        "fanout events_reaching_subscribers={reaching} expected_per_event={:.3} subscribers_complete={complete}/{} seq_violations={violations}",
        expected as f64 / published.max(1) as f64,
        options.subscribers
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
        // The server's CPU over the publishing window, per delivery made in it and per event
        // published in it.
        println!(
            "fanout server_cpu_s={cpu:.2} server_cpu_share={:.0}% server_cpu_us_per_delivery={:.2} server_cpu_us_per_event={:.2}",
            cpu / publish_took.as_secs_f64() * 100.0,
            cpu * 1e6 / delivered_at_end.max(1) as f64,
            cpu * 1e6 / published.max(1) as f64
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
    if let Some(first) = order_errors.first() {
        println!(
            "fanout subscribers_out_of_order={} first={first:?}",
            order_errors.len()
        );
    }
    ensure!(
        errors.len() < options.subscribers,
        "every subscriber failed: {:?}",
        errors.first()
    );
    Ok(())
}

/// Opens subscriber `i`'s narrowed stream ([`Plan::path`]) for each `i` in `0..n`, resuming
/// after `cursor`, at most [`CONNECT_CONCURRENCY`] at a time; returned in subscriber order.
/// HTTP/1.1 only (a connection each).
///
/// # Errors
/// When any stream cannot be opened.
async fn connect_narrowed(
    target: &Target,
    plan: &Plan,
    n: usize,
    cursor: &str,
) -> anyhow::Result<Vec<Subscription>> {
    let mut streams: Vec<Option<Subscription>> = (0..n).map(|_| None).collect();
    let mut pending = tokio::task::JoinSet::new();
    let mut started = 0;
    let mut opened = 0;
    while opened < n {
        while started < n && pending.len() < CONNECT_CONCURRENCY {
            let dialer = target.dialer.clone();
            let path = plan.path(target.events_path(), started);
            let cursor = cursor.to_owned();
            let index = started;
            pending.spawn(async move {
                let headers = [("Last-Event-ID", cursor.as_str())];
                let stream = dialer.event_stream(&path, &headers).await;
                (index, stream.with_context(|| format!("GET {path}")))
            });
            started += 1;
        }
        let Some(done) = pending.join_next().await else {
            break;
        };
        let (index, stream) = done.context("connect task")?;
        let stream = stream.with_context(|| format!("subscriber {} of {n}", index + 1))?;
        streams[index] = Some(Subscription::H1(stream));
        opened += 1;
    }
    let streams: Vec<Subscription> = streams.into_iter().flatten().collect();
    if streams.len() != n {
        bail!("opened {} of {n} narrowed streams", streams.len());
    }
    Ok(streams)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(line: &str) -> anyhow::Result<Options> {
        match crate::cli::parse(&format!("fanout {line}"))?.command {
            crate::cli::Command::Load(crate::cli::Load::Fanout(options)) => Ok(options),
            other => bail!("not fanout: {other:?}"),
        }
    }

    #[test]
    fn parses_keys_and_narrow() -> anyhow::Result<()> {
        let o = options("--subscribers 1000 --keys 5000 --narrow")?;
        assert_eq!((o.subscribers, o.keys, o.narrow), (1000, Some(5000), true));
        let o = options("--rate 5")?;
        assert_eq!((o.keys, o.narrow), (None, false));
        // A switch takes no value: the next flag stays a flag.
        let o = options("--narrow --keys 5")?;
        assert_eq!((o.keys, o.narrow), (Some(5), true));
        assert!(options("--keys 0").is_err());
        assert!(options("--keys 100001").is_err());
        assert!(options("--keys many").is_err());
        assert!(options("--narrow=maybe").is_err());
        Ok(())
    }

    #[test]
    fn defaults_and_bounds() -> anyhow::Result<()> {
        let o = options("")?;
        assert_eq!(
            (
                o.subscribers,
                o.rate,
                o.seconds,
                o.batch_ms,
                o.drain_seconds
            ),
            (100, 50, 10, 5, 10)
        );
        assert_eq!(o.publish.publishers, 8);
        assert_eq!(o.target.peer, Peer::Viewtape);
        assert!(o.target.tls.is_none() && !o.pin.pin);
        assert!(options("--subscribers 50001").is_err());
        assert!(options("--rate 0").is_err());
        assert!(options("--seconds 601").is_err());
        assert!(options("--batch-ms 0").is_err());
        assert!(options("--drain-seconds 0").is_ok());
        assert!(options("--publishers 65").is_err());
        Ok(())
    }

    #[test]
    fn target_combinations() -> anyhow::Result<()> {
        let o = options("--tls h2")?;
        assert_eq!(o.target.transport(), crate::transport::Transport::TlsH2);
        assert!(options("--tls h3").is_err());
        assert!(options("--tls plain").is_err());
        assert!(options("--tls h1 --addr 127.0.0.1:1").is_err());
        assert!(options("--peer nchan").is_err());
        assert!(options("--peer nchan --peer-url http://127.0.0.1:1 --addr 127.0.0.1:2").is_err());
        assert!(options("--peer nchan --peer-url http://127.0.0.1:1 --tls h1").is_err());
        assert!(options("--peer nchan --peer-url http://127.0.0.1:1 --server-arg x").is_err());
        assert!(options("--peer nchan --peer-url http://10.0.0.1:1").is_err());
        assert!(options("--peer-url http://127.0.0.1:1").is_err());
        assert!(options("--peer jetstream").is_err());
        let o = options("--peer nchan --peer-url http://localhost:81/ --pid 7")?;
        assert_eq!(o.target.peer_url.map(|a| a.port()), Some(81));
        assert_eq!(o.target.server.pid, Some(7));
        Ok(())
    }

    #[test]
    fn keys_follow_the_feed() {
        let default = Plan::new(None, false);
        assert_eq!(default.symbols, DEFAULT_SYMBOLS);
        let plan = Plan::new(Some(5000), true);
        assert_eq!(plan.keys(), 5000);
        assert_eq!(plan.symbols[0], "S00000");
        assert_eq!(plan.symbols[4999], "S04999");
        let feed = plan.feed();
        for seq in [1, 2, 4999, 5000, 5001, 12_345] {
            assert_eq!(
                feed.symbol_of(seq),
                plan.symbols[plan.key_of_seq(seq) as usize]
            );
        }
        assert_eq!(
            plan.path("/views/prices/events", 5001),
            "/views/prices/events?keys=S00001"
        );
        assert_eq!(
            Plan::new(Some(5000), false).path("/views/prices/events", 7),
            "/views/prices/events"
        );
        assert_eq!(plan.subscribed_keys(1000), 1000);
        assert_eq!(plan.subscribed_keys(7000), 5000);
        assert_eq!(Plan::new(Some(5000), false).subscribed_keys(10), 5000);
    }

    /// [`Plan::expected_for`] and [`Plan::events_reaching`] against counting tick by tick.
    #[test]
    fn expected_deliveries_match_a_count() {
        for (keys, narrow) in [
            (Some(7), true),
            (Some(7), false),
            (None, true),
            (Some(1), true),
        ] {
            let plan = Plan::new(keys, narrow);
            for subscribers in [1, 3, 7, 10, 16] {
                for first in [1, 2, 8, 11] {
                    for published in [0, 1, 5, 7, 20, 23] {
                        let seqs = first..first + published;
                        let mut reaching = 0;
                        for i in 0..subscribers {
                            let mine: Vec<u64> = seqs
                                .clone()
                                .filter(|&s| {
                                    plan.key_of_subscriber(i)
                                        .is_none_or(|k| k == plan.key_of_seq(s))
                                })
                                .collect();
                            assert_eq!(plan.expected_for(i, first, published), mine.len() as u64);
                            if let Some(&s) = mine.first() {
                                assert_eq!(plan.first_seq_for(i, first), s);
                            }
                            // Consecutive ticks of one subscriber are `stride` apart.
                            assert!(mine.windows(2).all(|w| w[1] - w[0] == plan.stride()));
                        }
                        for s in seqs {
                            reaching += u64::from((0..subscribers).any(|i| {
                                plan.key_of_subscriber(i)
                                    .is_none_or(|k| k == plan.key_of_seq(s))
                            }));
                        }
                        assert_eq!(
                            plan.events_reaching(subscribers, first, published),
                            reaching,
                            "{keys:?} {narrow} {subscribers} {first} {published}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn one_key_of_5000_gets_a_fifth() {
        let plan = Plan::new(Some(5000), true);
        let published = 50_000;
        let expected: u64 = (0..1000)
            .map(|i| plan.expected_for(i, 5001, published))
            .sum();
        assert_eq!(expected, 10_000);
        assert_eq!(plan.events_reaching(1000, 5001, published), 10_000);
        let full = Plan::new(Some(5000), false);
        let expected: u64 = (0..1000)
            .map(|i| full.expected_for(i, 5001, published))
            .sum();
        assert_eq!(expected, 50_000_000);
    }
}
