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
//!
//! | file | job |
//! |---|---|
//! | this one | [`Options`] and [`run`]: warm up, subscribe, publish, drain |
//! | `plan` | which key each tick carries, which ticks each subscriber is owed |
//! | `report` | what the subscribers saw, and the `fanout …` lines printed from it |

mod plan;
mod report;

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
use plan::Plan;
use report::{Figures, Outcome};

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
    let streams = subscribe(target, options, &plan, &head).await?;
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
    let (published, requests, publish_took) =
        publish(&shared, &mut publisher, &mut feed, options, max_events).await?;
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
    let drain_for = Duration::from_secs(options.drain_seconds);
    let (delivered, drained_in) =
        drain(&shared, readers, expected, delivered_at_end, drain_for).await?;
    let outcome = Outcome::collect(&shared, &plan, first_seq, published, delivered, drained_in);
    Figures {
        published,
        requests,
        publish_took,
        expected,
        reaching,
        delivered_at_end,
        outcome: &outcome,
        rss: (rss_before, rss_connected, rss_loaded),
        cpu,
        client_cpu,
    }
    .print(target, options, &plan);
    let errors = &outcome.errors;
    ensure!(
        errors.len() < options.subscribers,
        "every subscriber failed: {:?}",
        errors.first()
    );
    Ok(())
}

/// Opens the `--subscribers` streams (narrowed with `--narrow`), resuming after `head`.
async fn subscribe(
    target: &Target,
    options: &Options,
    plan: &Plan,
    head: &str,
) -> anyhow::Result<Vec<Subscription>> {
    let connecting = Instant::now();
    let streams = if options.narrow {
        connect_narrowed(target, plan, options.subscribers, head).await?
    } else {
        connect_all(
            &target.dialer,
            target.events_path(),
            options.subscribers,
            head,
        )
        .await?
    };
    eprintln!(
        "{} subscribers connected in {:?}",
        options.subscribers,
        connecting.elapsed()
    );
    Ok(streams)
}

/// Publishes `--rate` events/s in a batch every `--batch-ms` for `--seconds` (at most
/// `max_events`), noting each `seq`'s send time in `shared`; returns the events published, the
/// requests they took and how long publishing took.
async fn publish(
    shared: &Shared,
    publisher: &mut Publisher,
    feed: &mut Feed,
    options: &Options,
    max_events: u64,
) -> anyhow::Result<(u64, u64, Duration)> {
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
        requests += publisher.publish(feed, due as usize).await?;
        published += due;
    }
    let publish_took = publish_start.elapsed();
    Ok((published, requests, publish_took))
}

/// Waits up to `drain_for` for the deliveries still owed (`expected`, of which
/// `delivered_at_end` had arrived when publishing stopped), then stops the readers; returns
/// the deliveries made and how long the drain took.
async fn drain(
    shared: &Shared,
    readers: Readers,
    expected: u64,
    delivered_at_end: u64,
    drain_for: Duration,
) -> anyhow::Result<(u64, Duration)> {
    let drain_start = Instant::now();
    let mut delivered = delivered_at_end;
    while delivered < expected && drain_start.elapsed() < drain_for {
        tokio::time::sleep(Duration::from_millis(20)).await;
        delivered = shared.delivered();
    }
    let drained_in = drain_start.elapsed();
    shared.stop.store(true, Ordering::Relaxed);
    readers.join().await?;
    Ok((delivered, drained_in))
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
}
