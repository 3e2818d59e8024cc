//! `replay`: preload N events, then time a client from connect (with a cursor just before
//! them: `Last-Event-ID`, a viewtape cursor or an nchan `<time>:<tag>` id) to receiving the
//! last one.

use std::time::{Duration, Instant};

use anyhow::{bail, ensure};
use clap::Args;
use viewtape_tests::feed::scan_seq;
use viewtape_tests::Feed;

use crate::cli::{u64_in, usize_in, ClientOptions};
use crate::publish::{PublishOptions, Publisher, INGEST_BATCH};
use crate::target::{cpu_seconds, Peer, Target, TargetOptions};
use crate::transport::connect_all;

/// What to run.
#[derive(Debug, Args)]
pub struct Options {
    /// Events preloaded, then replayed (1..=10,000,000)
    #[arg(long, default_value_t = 100_000, value_parser = u64_in(1..=10_000_000))]
    events: u64,
    /// Timed replays (1..=50)
    #[arg(long, default_value_t = 7, value_parser = usize_in(1..=50))]
    runs: usize,
    #[command(flatten)]
    publish: PublishOptions,
    #[command(flatten)]
    pub(crate) target: TargetOptions,
    #[command(flatten)]
    pub(crate) client: ClientOptions,
}

/// Runs it and prints the figures.
///
/// # Errors
/// On server errors, or a replay that is not exactly the preloaded events.
pub async fn run(target: &Target, options: &Options) -> anyhow::Result<()> {
    let mut publisher = Publisher::connect(target, options.publish.publishers).await?;
    let mut feed = Feed::new(&[
        "ACME", "BOLT", "CORE", "DASH", "EXPO", "FIZZ", "GLOW", "HALO",
    ]);
    publisher.publish(&mut feed, 1).await?;

    // The id of the newest event before the preload.
    let cursor = publisher.head_id(target).await?;
    let first_seq = feed.next_seq();

    let preload = Instant::now();
    let mut left = options.events;
    while left > 0 {
        let n = left.min(INGEST_BATCH as u64);
        publisher.publish(&mut feed, n as usize).await?;
        left -= n;
    }
    let last_seq = feed.next_seq() - 1;
    // viewtape: the last event's cursor offset is known exactly.
    let last_offset = match target.peer {
        Peer::Viewtape => Some(viewtape_tests::cursor_offset(&cursor)? + options.events),
        Peer::Nchan => None,
    };
    eprintln!(
        "preloaded {} events in {:?}; replaying after {cursor}",
        options.events,
        preload.elapsed()
    );

    let cursor_text = cursor;
    let kind = target.event_type();
    let mut times = Vec::with_capacity(options.runs);
    for run in 0..options.runs {
        let cpu_before = target.pid.map(cpu_seconds).transpose()?;
        let start = Instant::now();
        let Some(mut stream) = connect_all(&target.dialer, target.events_path(), 1, &cursor_text)
            .await?
            .pop()
        else {
            bail!("run {run}: no stream");
        };
        let mut first_byte = None;
        let mut received = 0u64;
        let mut bytes = 0u64;
        let mut last_id_ok = last_offset.is_none();
        let (mut min_seq, mut max_seq) = (u64::MAX, 0u64);
        let mut failure = None;
        let deadline = start + Duration::from_secs(120);
        while received < options.events {
            ensure!(
                Instant::now() < deadline,
                "run {run}: replay took over 120 s"
            );
            let more = stream
                .read_with(Duration::from_secs(10), |event| {
                    if first_byte.is_none() {
                        first_byte = Some(start.elapsed());
                    }
                    if event.event != kind {
                        failure.get_or_insert_with(|| format!("unexpected {event:?}"));
                    }
                    received += 1;
                    bytes += event.data.len() as u64;
                    let seq = scan_seq(event.data).unwrap_or(0);
                    min_seq = min_seq.min(seq);
                    max_seq = max_seq.max(seq);
                    if received == options.events && last_offset.is_some() {
                        last_id_ok = event
                            .id
                            .and_then(|id| viewtape_tests::cursor_offset(id).ok())
                            == last_offset;
                    }
                })
                .await?;
            if let Some(failure) = failure.take() {
                bail!("run {run}: {failure}");
            }
            if !more {
                bail!("run {run}: stream ended after {received} events");
            }
        }
        let took = start.elapsed();
        ensure!(
            last_id_ok,
            "run {run}: the last event is not offset {last_offset:?}"
        );
        ensure!(
            (min_seq, max_seq) == (first_seq, last_seq),
            "run {run}: replayed seq {min_seq}..={max_seq}, expected {first_seq}..={last_seq}"
        );
        let cpu = match (cpu_before, target.pid) {
            (Some(before), Some(pid)) => format!(
                " server_cpu_ms={:.1}",
                (cpu_seconds(pid)? - before) * 1000.0
            ),
            _ => String::new(),
        };
        println!(
            "replay peer={:?} transport={} run={run} events={} data_bytes={bytes} first_event_ms={:.2} total_ms={:.2} events_per_s={:.0}{cpu}",
            target.peer,
            target.transport().name(),
            options.events,
            first_byte.unwrap_or_default().as_secs_f64() * 1000.0,
            took.as_secs_f64() * 1000.0,
            options.events as f64 / took.as_secs_f64()
        );
        times.push(took);
    }
    times.sort();
    println!(
        "replay summary: peer={:?} transport={} events={} runs={} median_ms={:.2} min_ms={:.2} max_ms={:.2}",
        target.peer,
        target.transport().name(),
        options.events,
        options.runs,
        times[times.len() / 2].as_secs_f64() * 1000.0,
        times[0].as_secs_f64() * 1000.0,
        times[times.len() - 1].as_secs_f64() * 1000.0
    );
    Ok(())
}
