//! The measurement: one workload against one peer, in a closed loop (as fast as acks come) or
//! an open loop (at a fixed rate), counted into a [`Tally`] and an [`Outcome`].

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use tokio::task::JoinSet;

use super::options::{Kind, Options, Peer, Workload};
use super::peers::Peers;
use super::sender::{Ack, Sender};
use super::IO_TIMEOUT;
use crate::histogram::Histogram;
use crate::target::cpu_seconds;

/// Counts of one measurement (or one producer's share).
#[derive(Debug, Default, Clone)]
pub(super) struct Tally {
    pub(super) batches: u64,
    pub(super) events: u64,
    pub(super) resent: u64,
    pub(super) gaps: u64,
    pub(super) fsync_acks: u64,
    /// Ack latency, µs.
    pub(super) latency: Histogram,
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
pub(super) struct Outcome {
    pub(super) tally: Tally,
    pub(super) elapsed: Duration,
    /// Server CPU time / elapsed, when its pid is known.
    pub(super) server_cores: Option<f64>,
    /// Latency workload: batches scheduled, and those never acked.
    pub(super) offered: u64,
    pub(super) unsent: u64,
}

impl Outcome {
    pub(super) fn batches_per_s(&self) -> f64 {
        self.tally.batches as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    pub(super) fn events_per_s(&self) -> f64 {
        self.tally.events as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    pub(super) fn ms(&self, q: f64) -> f64 {
        self.tally.latency.quantile(q) as f64 / 1000.0
    }

    pub(super) fn max_ms(&self) -> f64 {
        self.tally.latency.max() as f64 / 1000.0
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
pub(super) async fn measure(
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
