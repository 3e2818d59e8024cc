//! `stalled`: fills a view with a large state, opens N subscribers that never read, and reports
//! what they cost the server in resident memory. Needs a runtime that publishes what it is told:
//! the `misbehave` fixture (`server/guests/misbehave.wasm`), configured as runtime `m` with view
//! `big` (see docs/benchmarks-history.md, "Hostile clients", for the config).

use std::time::Duration;

use anyhow::{bail, ensure};
use clap::Args;
use tokio::io::AsyncWriteExt as _;
use viewtape_tests::feed::big_state_batches;
use viewtape_tests::http::{connect_with_recv_buffer, request};

use crate::cli::{u64_in, usize_in, ClientOptions};
use crate::target::{rss_kib, Target, TargetOptions};
use crate::transport::Transport;

/// What to run.
#[derive(Debug, Args)]
pub struct Options {
    /// Subscribers that never read (1..=1,000)
    #[arg(long, default_value_t = 30, value_parser = usize_in(1..=1_000))]
    subscribers: usize,
    /// Keys of the large state (1..=100,000)
    #[arg(long, default_value_t = 2_000, value_parser = usize_in(1..=100_000))]
    keys: usize,
    /// Bytes per value (1..=1 MiB)
    #[arg(long, default_value_t = 20_000, value_parser = usize_in(1..=1 << 20))]
    size: usize,
    /// Seconds the subscribers stay before the server's RSS is read (0..=60)
    #[arg(long, default_value_t = 1, value_parser = u64_in(0..=60))]
    hold_seconds: u64,
    #[command(flatten)]
    pub(crate) target: TargetOptions,
    #[command(flatten)]
    pub(crate) client: ClientOptions,
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
