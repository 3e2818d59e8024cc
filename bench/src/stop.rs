//! `stop`: what a graceful stop costs its clients, with clients that stopped reading.
//!
//! ```text
//! viewtape-bench stop [--clients 1000] [--stalled 30] [--spread-seconds 5]
//! ```
//!
//! Always spawns its own two servers (the `viewtape-tests` harness), each running the
//! `misbehave` fixture as runtime `m` with views `big` and `state` and `[server]
//! reconnect_spread` = `--spread-seconds`: node A, which is stopped, and node B, where A's
//! clients come back. `big` on A holds a 4 MB state, so that `--stalled` subscribers of it that
//! never read (4 KiB receive buffers) leave A's writes to them blocked; `--clients` subscribers
//! follow `state` on A and read.
//!
//! Then SIGTERM to A. Measured: the stop's duration (SIGTERM to the exit status), and for every
//! reading client when its stream ended, the `retry:` hint it got last, and when, after waiting
//! that hint as an `EventSource` does, its new stream on B answered `200` — all relative to the
//! SIGTERM. Printed: the reconnects' spread (min, p10, p50, p90, max) and their peak per 100 ms
//! beside what an even spread over the window would give.

use std::time::{Duration, Instant};

use anyhow::{ensure, Context as _};
use clap::Args;
use tokio::io::AsyncWriteExt as _;
use tokio::task::JoinSet;
use viewtape_tests::http::connect_with_recv_buffer;
use viewtape_tests::stream::EventStream;
use viewtape_tests::Server;

use crate::cli::{u64_in, usize_in, ClientOptions};

/// What to run.
#[derive(Debug, Args)]
pub struct Options {
    /// Reading subscribers of `state` on the node that stops (1..=5,000)
    #[arg(long, default_value_t = 1_000, value_parser = usize_in(1..=5_000))]
    clients: usize,
    /// Subscribers of `big` that never read (0..=1,000)
    #[arg(long, default_value_t = 30, value_parser = usize_in(0..=1_000))]
    stalled: usize,
    /// The servers' `reconnect_spread`, in seconds (1..=60)
    #[arg(long, default_value_t = 5, value_parser = u64_in(1..=60))]
    spread_seconds: u64,
    #[command(flatten)]
    pub(crate) client: ClientOptions,
}

/// A node running the fixture with the spread.
async fn node(options: &Options) -> anyhow::Result<(Server, tempfile::NamedTempFile)> {
    let wasm = viewtape_tests::server::guest_wasm("misbehave");
    let config = viewtape_tests::server::config_file(&format!(
        "[server]\nreconnect_spread = \"{}s\"\nwrite_timeout = \"60s\"\ndrain_timeout = \"30s\"\n\
         [[runtime]]\nname = \"m\"\nwasm = \"{}\"\nviews = [\"big\", \"state\"]\n",
        options.spread_seconds,
        wasm.display()
    ))?;
    let path = config.path().display().to_string();
    let server = Server::start(&["--config", &path, "--demo-rate", "0"]).await?;
    Ok((server, config))
}

/// Runs it and prints the figures.
///
/// # Errors
/// When a server does not start, a client cannot connect or the stop fails.
pub async fn run(options: &Options) -> anyhow::Result<()> {
    let (mut stopped, _config_a) = node(options).await?;
    let (other, _config_b) = node(options).await?;
    for batch in viewtape_tests::feed::big_state_batches(200, 20_000) {
        let reply = stopped.ingest("m", &batch).await?;
        ensure!(reply.status() == 200, "filling the state: {}", reply.text());
    }
    let mut stalled = Vec::with_capacity(options.stalled);
    for _ in 0..options.stalled {
        let mut stream = connect_with_recv_buffer(stopped.addr(), 4096).await?;
        stream
            .write_all(b"GET /views/big/events HTTP/1.1\r\nHost: bench\r\n\r\n")
            .await?;
        stalled.push(stream);
    }
    let mut readers = Vec::with_capacity(options.clients);
    for _ in 0..options.clients {
        readers.push(EventStream::connect(stopped.addr(), "/views/state/events", &[]).await?);
    }
    tokio::time::sleep(Duration::from_millis(500)).await;

    let signalled = Instant::now();
    stopped.terminate()?;
    let other_addr = other.addr();
    let mut clients = JoinSet::new();
    for mut reader in readers {
        clients.spawn(async move {
            while reader.next_within(Duration::from_secs(30)).await?.is_some() {}
            let ended = signalled.elapsed();
            let hint = Duration::from_millis(reader.retry().context("no retry hint")?);
            tokio::time::sleep(hint).await;
            EventStream::connect(other_addr, "/views/state/events", &[]).await?;
            anyhow::Ok((ended, hint, signalled.elapsed()))
        });
    }
    let exit = stopped.wait_exit(Duration::from_secs(30)).await?;
    let took = signalled.elapsed();
    ensure!(exit.success(), "the stopped node exited with {exit}");
    let mut ends = Vec::new();
    let mut arrivals = Vec::new();
    while let Some(result) = clients.join_next().await {
        let (ended, _hint, arrived) = result??;
        ends.push(ended);
        arrivals.push(arrived);
    }
    drop(stalled);
    ends.sort_unstable();
    arrivals.sort_unstable();
    let pick = |sorted: &[Duration], q: f64| sorted[((sorted.len() - 1) as f64 * q) as usize];
    let bucket = Duration::from_millis(100);
    let mut per_bucket = std::collections::BTreeMap::<u128, usize>::new();
    for arrival in &arrivals {
        *per_bucket
            .entry(arrival.as_millis() / bucket.as_millis())
            .or_default() += 1;
    }
    let peak = per_bucket.values().copied().max().unwrap_or(0);
    let even = options.clients as f64 / (options.spread_seconds as f64 * 10.0);
    println!(
        "stop with {} stalled and {} reading subscribers: exited {:.0} ms after SIGTERM; every stream ended by {:.0} ms",
        options.stalled,
        options.clients,
        took.as_secs_f64() * 1e3,
        pick(&ends, 1.0).as_secs_f64() * 1e3
    );
    println!(
        "reconnects on the other node, s after SIGTERM: min {:.2} p10 {:.2} p50 {:.2} p90 {:.2} max {:.2}; peak {peak} per 100 ms (even over {} s: {even:.0})",
        pick(&arrivals, 0.0).as_secs_f64(),
        pick(&arrivals, 0.1).as_secs_f64(),
        pick(&arrivals, 0.5).as_secs_f64(),
        pick(&arrivals, 0.9).as_secs_f64(),
        pick(&arrivals, 1.0).as_secs_f64(),
        options.spread_seconds
    );
    Ok(())
}
