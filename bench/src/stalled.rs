//! `stalled`: fills a view with a large state, opens N subscribers that never read, and reports
//! what they cost the server in resident memory. Needs a runtime that publishes what it is told:
//! the `misbehave` fixture (`server/guests/misbehave.wasm`), configured as runtime `m` with view
//! `big` (see docs/benchmarks-history.md, "Hostile clients", for the config).

use std::time::Duration;

use anyhow::{bail, ensure};
use tokio::io::AsyncWriteExt as _;
use viewtape_tests::feed::big_state_batches;
use viewtape_tests::http::{connect_with_recv_buffer, request};

use crate::args::Args;
use crate::target::{rss_kib, Target};
use crate::transport::Transport;

/// What to run.
#[derive(Debug)]
pub struct Options {
    subscribers: usize,
    keys: usize,
    size: usize,
    hold_seconds: u64,
}

impl Options {
    /// `--subscribers` (1..=1,000, default 30), `--keys` (1..=100k, default 2,000), `--size`
    /// bytes per value (1..=1 MiB, default 20,000), `--hold-seconds` (0..=60, default 1).
    ///
    /// # Errors
    /// On out-of-bounds values.
    pub fn from_args(args: &Args) -> anyhow::Result<Self> {
        Ok(Self {
            subscribers: args.num("subscribers", 30usize, 1, 1_000)?,
            keys: args.num("keys", 2_000usize, 1, 100_000)?,
            size: args.num("size", 20_000usize, 1, 1 << 20)?,
            hold_seconds: args.num("hold-seconds", 1u64, 0, 60)?,
        })
    }
}

/// Runs it and prints the figures.
///
/// # Errors
/// Without a server pid, when the fixture runtime refuses the state, or on connection errors.
pub async fn run(target: &Target, options: &Options) -> anyhow::Result<()> {
    let Some(pid) = target.pid else {
        bail!("stalled needs the server's pid: pass --pid with --addr, or let the tool spawn it");
    };
    if target.transport() != Transport::Plain {
        bail!("stalled speaks plain HTTP/1.1 only: drop --tls");
    }
    for batch in big_state_batches(options.keys, options.size) {
        let reply = request(
            target.addr,
            "POST",
            "/runtimes/m/ingest",
            &[],
            batch.as_bytes(),
        )
        .await?;
        ensure!(
            reply.status() == 200,
            "filling the state: {} {:.200}",
            reply.status(),
            reply.text()
        );
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = rss_kib(pid)?;
    let mut stalled = Vec::with_capacity(options.subscribers);
    for _ in 0..options.subscribers {
        let mut stream = connect_with_recv_buffer(target.addr, 4096).await?;
        stream
            .write_all(b"GET /views/big/events HTTP/1.1\r\nHost: bench\r\n\r\n")
            .await?;
        stalled.push(stream);
    }
    tokio::time::sleep(Duration::from_secs(options.hold_seconds)).await;
    let after = rss_kib(pid)?;
    println!(
        "stalled subscribers={} state_bytes={} server_rss_kib before={before} after={after} grown_mib={:.1} per_subscriber_kib={:.0}",
        options.subscribers,
        options.keys * options.size,
        after.saturating_sub(before) as f64 / 1024.0,
        after.saturating_sub(before) as f64 / options.subscribers as f64
    );
    drop(stalled);
    Ok(())
}
