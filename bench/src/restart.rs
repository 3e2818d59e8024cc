//! `restart`: what replaying the log costs at start-up.
//!
//! ```text
//! viewtape-bench restart [--events 1000000] [--events-per-batch 1000] [--runs 3]
//!     [--producers 4] [--ingest-seconds 600]
//! ```
//!
//! Always spawns its own server (`target/<profile>/viewtape serve` through the
//! `viewtape-tests` harness: `$VIEWTAPE_BIN`, `VIEWTAPE_NO_BUILD=1`), with a config written to
//! a temp dir:
//!
//! - `[server] snapshot_interval = "0s"`: no periodic snapshots, so after a `kill -9` the only
//!   snapshot is the one the first start writes (at the log's beginning) and the restart
//!   replays every logged batch through the guests.
//! - runtimes `demo`, `r1`, …, `r<N-1>` (`--producers N`), each the built-in ticker into
//!   `prices`. The ticker skips a tick whose `seq` is not above the highest it has seen, and
//!   concurrent requests into one runtime may be taken in any order, so producer `i` has a
//!   runtime of its own (`demo` for producer 0) with its own dense `seq` 1, 2, 3, …. Producers
//!   take batch numbers from one counter until `--events` are sent; the last batch may be
//!   short. Every answer must be a 200 whose `events.prices` equals the batch size.
//! - everything else at its defaults: `[log] fsync = "always"`, and the journal's retention
//!   (100,000 records per view): the journal keeps only the newest of a big preload, but the
//!   replay still runs every logged batch through its guest and into the journal, so its cost
//!   hardly depends on retention.
//!
//! Per run, each on a fresh data directory (a harness temp dir under `$TMPDIR`):
//!
//! 1. baseline: start, `kill -9`, time the restart (an empty log: start-up without replay);
//! 2. loaded: start, ingest `--events` in batches of `--events-per-batch`, `kill -9`, time the
//!    restart.
//!
//! A restart is timed around [`Server::restart`]: from spawning the process to its stdout line
//! `viewtape listening on …`, which the server prints after the replay (the harness allows it
//! 60 s). The server's CPU time (user + system, `/proc/<pid>/stat`) read right then is the
//! start-up's CPU. The records replayed are read from the server's `log replayed … records=N`
//! line (absent: 0) and checked against `viewtape_log_replayed_records` in `/metrics` and the
//! number of acknowledged batches (one log record each). After the loaded restart one tick
//! with an old `seq` must be skipped (the guest state came back) and one with the next `seq`
//! taken.
//!
//! The log is replayed from the page cache (written moments before): a warm-cache figure.
//! Replay events/s are `events / (restart − baseline)` of the medians: the replay's share.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context as _};
use clap::Args;
use tokio::task::JoinSet;
use viewtape_tests::feed::{price_of, tick};
use viewtape_tests::http::HttpConn;
use viewtape_tests::Server;

use crate::cli::{u64_in, usize_in, ClientOptions};
use crate::target::cpu_seconds;

/// Most runtimes `viewtape serve` can host (its pool of guest instances).
const MAX_PRODUCERS: usize = 64;
/// The replayed-records series in `/metrics`.
const REPLAYED_METRIC: &str = "viewtape_log_replayed_records_total";

/// What to run.
#[derive(Debug, Args)]
pub struct Options {
    /// Events ingested before the loaded restart (1..=10,000,000)
    #[arg(long, default_value_t = 1_000_000, value_parser = u64_in(1..=10_000_000))]
    events: u64,
    /// Events per ingest batch, one log record each (1..=10,000)
    #[arg(long = "events-per-batch", value_name = "N", default_value_t = 1_000,
          value_parser = usize_in(1..=10_000))]
    batch: usize,
    /// Runs, each on fresh data directories (1..=20)
    #[arg(long, default_value_t = 3, value_parser = usize_in(1..=20))]
    runs: usize,
    /// Producers, each into a runtime of its own (1..=64)
    #[arg(long, default_value_t = 4, value_parser = usize_in(1..=MAX_PRODUCERS as u64))]
    producers: usize,
    /// The bound on each preload, in seconds (1..=3,600)
    #[arg(long, default_value_t = 600, value_parser = u64_in(1..=3_600))]
    ingest_seconds: u64,
    #[command(flatten)]
    pub(crate) client: ClientOptions,
}

impl Options {
    fn batches(&self) -> u64 {
        self.events.div_ceil(self.batch as u64)
    }
}

/// The runtime producer `i` ingests into.
fn runtime_name(i: usize) -> String {
    if i == 0 {
        "demo".to_owned()
    } else {
        format!("r{i}")
    }
}

/// The spawned server's config: no periodic snapshots, one ticker runtime per producer.
fn config_text(producers: usize) -> String {
    let mut text = String::from(
        "# written by viewtape-bench restart\n\n[server]\nsnapshot_interval = \"0s\"\n",
    );
    for i in 0..producers {
        text.push_str(&format!(
            "\n[[runtime]]\nname = \"{}\"\nwasm = \"builtin:ticker\"\nviews = [\"prices\"]\n",
            runtime_name(i)
        ));
    }
    text
}

/// One batch body: `n` ticks of symbol `P<producer>` with `seq`s `first..first + n`.
fn ticks(producer: usize, first: u64, n: u64) -> String {
    let symbol = format!("P{producer}");
    let mut body = String::with_capacity(n as usize * 48);
    for seq in first..first + n {
        body.push_str(&tick(&symbol, price_of(seq), seq));
    }
    body
}

/// `events.prices` of a 200, or an error naming the status.
fn events_taken(what: &str, resp: &viewtape_tests::Response) -> anyhow::Result<u64> {
    if resp.status() != 200 {
        bail!("{what}: status {}: {:.300}", resp.status(), resp.text());
    }
    Ok(resp.json()?["events"]["prices"].as_u64().unwrap_or(0))
}

/// Drops ANSI escape sequences (`ESC [ … letter`): the server's log may be coloured.
fn strip_ansi(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// `records=N` of the `log replayed` line; `Ok(None)` without such a line.
fn replayed_records(logs: &str) -> anyhow::Result<Option<u64>> {
    let logs = strip_ansi(logs);
    let Some(line) = logs.lines().find(|l| l.contains("log replayed")) else {
        return Ok(None);
    };
    let value = line
        .split_whitespace()
        .find_map(|field| field.strip_prefix("records="))
        .with_context(|| format!("no records= in {line:?}"))?;
    value
        .parse()
        .map(Some)
        .with_context(|| format!("records={value:?} in {line:?}"))
}

/// Bytes of the files in `<data-dir>/log` (one level of subdirectories too).
fn log_bytes(server: &Server) -> u64 {
    fn walk(dir: &std::path::Path, depth: u32) -> u64 {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return 0;
        };
        entries
            .flatten()
            .map(|e| match e.metadata() {
                Ok(m) if m.is_dir() && depth > 0 => walk(&e.path(), depth - 1),
                Ok(m) if m.is_file() => m.len(),
                _ => 0,
            })
            .sum()
    }
    walk(&server.data_dir().join("log"), 1)
}

/// What one producer sent.
#[derive(Debug, Default)]
struct Sent {
    batches: u64,
    events: u64,
    /// The next `seq` of its runtime.
    next_seq: u64,
}

/// Ingests `options.events` through `options.producers` keep-alive connections.
async fn preload(server: &Server, options: &Options) -> anyhow::Result<Vec<Sent>> {
    let total = options.batches();
    let next_batch = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + Duration::from_secs(options.ingest_seconds);
    let mut tasks = JoinSet::new();
    for producer in 0..options.producers {
        let next_batch = Arc::clone(&next_batch);
        let addr = server.addr();
        let (events, batch) = (options.events, options.batch as u64);
        tasks.spawn(async move {
            let path = format!("/runtimes/{}/ingest", runtime_name(producer));
            let mut conn = HttpConn::connect(addr).await?;
            let mut sent = Sent {
                next_seq: 1,
                ..Sent::default()
            };
            loop {
                let index = next_batch.fetch_add(1, Ordering::Relaxed);
                if index >= total {
                    return anyhow::Ok((producer, sent));
                }
                ensure!(
                    Instant::now() < deadline,
                    "the preload took over --ingest-seconds"
                );
                let n = batch.min(events - index * batch);
                let body = ticks(producer, sent.next_seq, n);
                let resp = conn.send("POST", &path, &[], body.as_bytes()).await?;
                let taken = events_taken(&format!("POST {path}"), &resp)?;
                ensure!(
                    taken == n,
                    "POST {path}: events.prices {taken}, expected {n}: {:.300}",
                    resp.text()
                );
                sent.next_seq += n;
                sent.batches += 1;
                sent.events += n;
            }
        });
    }
    let mut all: Vec<Sent> = (0..options.producers).map(|_| Sent::default()).collect();
    while let Some(joined) = tasks.join_next().await {
        let (producer, sent) = joined.context("producer task")??;
        all[producer] = sent;
    }
    Ok(all)
}

/// One timed restart.
#[derive(Debug)]
struct Restart {
    seconds: f64,
    cpu_seconds: f64,
    records: u64,
}

/// `kill -9`, then times the restart and reads what it replayed.
async fn crash_and_restart(server: &mut Server) -> anyhow::Result<Restart> {
    server.kill9().await?;
    let start = Instant::now();
    server.restart().await?;
    let seconds = start.elapsed().as_secs_f64();
    let cpu_seconds = cpu_seconds(server.pid())?;
    let records = replayed_records(&server.logs())?.unwrap_or(0);
    let metric = server.metric(REPLAYED_METRIC).await?;
    ensure!(
        metric == records as f64,
        "the log says {records} records replayed, {REPLAYED_METRIC} says {metric}"
    );
    Ok(Restart {
        seconds,
        cpu_seconds,
        records,
    })
}

/// Baseline: a restart with an empty log.
async fn baseline(config: &str) -> anyhow::Result<Restart> {
    let mut server = Server::start(&["--config", config]).await?;
    let result = crash_and_restart(&mut server).await;
    finish(server, result).await
}

/// Loaded: preload, crash, restart; checks the replay.
async fn loaded(config: &str, options: &Options, run: usize) -> anyhow::Result<Restart> {
    let mut server = Server::start(&["--config", config]).await?;
    let result = async {
        let t0 = Instant::now();
        let sent = preload(&server, options).await?;
        let ingest = t0.elapsed().as_secs_f64();
        let batches: u64 = sent.iter().map(|s| s.batches).sum();
        let events: u64 = sent.iter().map(|s| s.events).sum();
        ensure!(
            (batches, events) == (options.batches(), options.events),
            "sent {batches} batches / {events} events, expected {} / {}",
            options.batches(),
            options.events
        );
        let bytes = log_bytes(&server);
        eprintln!(
            "run {run}: ingested {events} events in {batches} batches in {ingest:.2} s \
             ({:.0} events/s, {} producers); log {:.1} MiB",
            events as f64 / ingest,
            options.producers,
            bytes as f64 / (1 << 20) as f64
        );
        let restart = crash_and_restart(&mut server).await?;
        ensure!(
            restart.records == batches,
            "run {run}: {} records replayed, {batches} batches acknowledged",
            restart.records
        );
        // The guest state came back: an old seq is skipped, the next one taken.
        let (producer, last) = sent
            .iter()
            .enumerate()
            .max_by_key(|(_, s)| s.next_seq)
            .map(|(i, s)| (i, s.next_seq))
            .context("no producer")?;
        let name = runtime_name(producer);
        let old = events_taken(
            "ingest an old seq",
            &server.ingest(&name, &ticks(producer, last - 1, 1)).await?,
        )?;
        let new = events_taken(
            "ingest the next seq",
            &server.ingest(&name, &ticks(producer, last, 1)).await?,
        )?;
        ensure!(
            (old, new) == (0, 1),
            "run {run}: after the restart {name} took {old} of an old seq and {new} of the next \
             (expected 0 and 1): its state was not replayed"
        );
        println!(
            "restart run={run} kind=loaded events={events} batches={batches} records={} \
             log_mib={:.1} ingest_s={ingest:.2} restart_ms={:.1} startup_cpu_ms={:.1}",
            restart.records,
            bytes as f64 / (1 << 20) as f64,
            restart.seconds * 1000.0,
            restart.cpu_seconds * 1000.0
        );
        Ok(restart)
    }
    .await;
    finish(server, result).await
}

/// Stops the server (reaped before its temp dir goes); prints its log tail on failure.
async fn finish(mut server: Server, result: anyhow::Result<Restart>) -> anyhow::Result<Restart> {
    if result.is_err() {
        eprintln!("---- spawned server stderr (tail) ----\n{}", server.logs());
    }
    let _ = server.kill9().await;
    result
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    match values.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => values[n / 2],
        n => (values[n / 2 - 1] + values[n / 2]) / 2.0,
    }
}

/// Runs it and prints the figures.
///
/// # Errors
/// On server errors, a refused or short batch, or a replay that is not every batch.
pub async fn run(options: &Options) -> anyhow::Result<()> {
    let dir = tempfile::Builder::new()
        .prefix("viewtape-bench-config-")
        .tempdir()
        .context("temp dir for the server config")?;
    let path = dir.path().join("restart.toml");
    std::fs::write(&path, config_text(options.producers))
        .with_context(|| format!("write {}", path.display()))?;
    let config = path.display().to_string();

    let (mut base, mut load) = (Vec::new(), Vec::new());
    let mut records = 0;
    for run in 0..options.runs {
        let b = baseline(&config).await?;
        ensure!(
            b.records == 0,
            "run {run}: the baseline replayed {} records",
            b.records
        );
        println!(
            "restart run={run} kind=baseline records=0 restart_ms={:.1} startup_cpu_ms={:.1}",
            b.seconds * 1000.0,
            b.cpu_seconds * 1000.0
        );
        base.push(b);
        let l = loaded(&config, options, run).await?;
        records = l.records;
        load.push(l);
    }
    let base_s = median(base.iter().map(|r| r.seconds).collect());
    let load_s = median(load.iter().map(|r| r.seconds).collect());
    let base_cpu = median(base.iter().map(|r| r.cpu_seconds).collect());
    let load_cpu = median(load.iter().map(|r| r.cpu_seconds).collect());
    let replay_s = load_s - base_s;
    println!(
        "restart summary: events={} events_per_batch={} producers={} records={records} runs={} \
         baseline_restart_s={base_s:.3} restart_s={load_s:.3} replay_s={replay_s:.3} \
         baseline_cpu_s={base_cpu:.3} restart_cpu_s={load_cpu:.3} \
         events_per_s_restart={:.0} events_per_s_replay={:.0}",
        options.events,
        options.batch,
        options.producers,
        options.runs,
        options.events as f64 / load_s,
        if replay_s > 0.0 {
            options.events as f64 / replay_s
        } else {
            f64::NAN
        }
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_and_bodies() {
        let text = config_text(2);
        assert!(text.contains("snapshot_interval = \"0s\""));
        assert!(text.contains("name = \"demo\""));
        assert!(text.contains("name = \"r1\""));
        assert_eq!(ticks(3, 7, 2).lines().count(), 2);
        assert!(ticks(3, 7, 2).contains("\"seq\":8"));
    }

    #[test]
    fn reads_the_replay_line() {
        let plain = "2025 INFO viewtape_server::recovery: log replayed records=1000 through=1001\n";
        assert_eq!(replayed_records(plain).unwrap(), Some(1000));
        let coloured = "\u{1b}[32m INFO\u{1b}[0m log replayed \u{1b}[3mrecords\u{1b}[0m\u{1b}[2m=\u{1b}[0m42 \u{1b}[3mthrough\u{1b}[0m\u{1b}[2m=\u{1b}[0m43\n";
        assert_eq!(replayed_records(coloured).unwrap(), Some(42));
        assert_eq!(replayed_records("nothing here\n").unwrap(), None);
        assert!(replayed_records("log replayed records=x\n").is_err());
    }

    #[test]
    fn options() -> anyhow::Result<()> {
        let options = |line: &str| match crate::cli::parse(&format!("restart {line}"))?.command {
            crate::cli::Command::Load(crate::cli::Load::Restart(options)) => Ok(options),
            other => bail!("not restart: {other:?}"),
        };
        let o = options("--events 2500")?;
        assert_eq!(o.batches(), 3);
        assert_eq!(
            (o.batch, o.runs, o.producers, o.ingest_seconds),
            (1000, 3, 4, 600)
        );
        assert_eq!(options("--events-per-batch 7")?.batch, 7);
        assert!(options("--producers 65").is_err());
        assert!((median(vec![3.0, 1.0, 2.0]) - 2.0).abs() < 1e-12);
        assert!((median(vec![4.0, 1.0]) - 2.5).abs() < 1e-12);
        Ok(())
    }
}
