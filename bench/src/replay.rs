//! `replay`: preload N events, then time a client from connect (with a cursor just before
//! them) to receiving the last one.

use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context as _};
use viewtape_tests::{http::HttpConn, EventStream, Feed};

use crate::args::Args;
use crate::target::{cpu_seconds, Target};

/// Lines per ingest request while preloading (~50 B each, well under the 1 MiB body limit).
const PRELOAD_BATCH: usize = 5_000;

/// What to run.
#[derive(Debug)]
pub struct Options {
    events: u64,
    runs: usize,
}

impl Options {
    /// `--events` (1..=10M, default 100k), `--runs` (1..=50, default 7).
    ///
    /// # Errors
    /// On out-of-bounds values.
    pub fn from_args(args: &Args) -> anyhow::Result<Self> {
        Ok(Self {
            events: args.num("events", 100_000u64, 1, 10_000_000)?,
            runs: args.num("runs", 7usize, 1, 50)?,
        })
    }
}

/// Runs it and prints the figures.
///
/// # Errors
/// On server errors, or a replay that is not exactly the preloaded events.
pub async fn run(target: &Target, options: &Options) -> anyhow::Result<()> {
    let mut conn = HttpConn::connect(target.addr).await?;
    let mut feed = Feed::new(&[
        "ACME", "BOLT", "CORE", "DASH", "EXPO", "FIZZ", "GLOW", "HALO",
    ]);
    ingest_batch(&mut conn, &feed.batch(1)).await?;

    // The cursor of the newest event before the preload (a fresh server: the only one).
    let cursor = target.head_cursor().await?;

    let preload = Instant::now();
    let mut left = options.events;
    while left > 0 {
        let n = left.min(PRELOAD_BATCH as u64);
        ingest_batch(&mut conn, &feed.batch(n as usize)).await?;
        left -= n;
    }
    let last = cursor.offset() + options.events;
    eprintln!(
        "preloaded {} events in {:?}; replaying after {cursor}",
        options.events,
        preload.elapsed()
    );

    let cursor_text = cursor.to_string();
    let mut times = Vec::with_capacity(options.runs);
    for run in 0..options.runs {
        let cpu_before = target.pid.map(cpu_seconds).transpose()?;
        let start = Instant::now();
        let mut stream = EventStream::connect(
            target.addr,
            "/views/prices/events",
            &[("Last-Event-ID", &cursor_text)],
        )
        .await?;
        let mut first_byte = None;
        let mut received = 0u64;
        let mut bytes = 0u64;
        let mut last_id_ok = false;
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
                    if event.event != "update" {
                        failure.get_or_insert_with(|| format!("unexpected {event:?}"));
                    }
                    received += 1;
                    bytes += event.data.len() as u64;
                    if received == options.events {
                        last_id_ok = event
                            .id
                            .and_then(|id| viewtape_tests::cursor_offset(id).ok())
                            == Some(last);
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
        ensure!(last_id_ok, "run {run}: the last event is not offset {last}");
        let cpu = match (cpu_before, target.pid) {
            (Some(before), Some(pid)) => format!(
                " server_cpu_ms={:.1}",
                (cpu_seconds(pid)? - before) * 1000.0
            ),
            _ => String::new(),
        };
        println!(
            "replay run={run} events={} data_bytes={bytes} first_event_ms={:.2} total_ms={:.2} events_per_s={:.0}{cpu}",
            options.events,
            first_byte.unwrap_or_default().as_secs_f64() * 1000.0,
            took.as_secs_f64() * 1000.0,
            options.events as f64 / took.as_secs_f64()
        );
        times.push(took);
    }
    times.sort();
    println!(
        "replay summary: events={} runs={} median_ms={:.2} min_ms={:.2} max_ms={:.2}",
        options.events,
        options.runs,
        times[times.len() / 2].as_secs_f64() * 1000.0,
        times[0].as_secs_f64() * 1000.0,
        times[times.len() - 1].as_secs_f64() * 1000.0
    );
    Ok(())
}

/// One ingest into `demo` on a keep-alive connection; anything but 200 is an error.
pub(crate) async fn ingest_batch(conn: &mut HttpConn, body: &str) -> anyhow::Result<()> {
    let resp = conn
        .send("POST", "/runtimes/demo/ingest", &[], body.as_bytes())
        .await
        .context("ingest")?;
    if resp.status() != 200 {
        bail!("ingest: status {}: {}", resp.status(), resp.text());
    }
    Ok(())
}
