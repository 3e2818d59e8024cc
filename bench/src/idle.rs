//! `idle`: opens N idle SSE streams (resuming at the head, so nothing is sent but heartbeats)
//! and reports the server's resident memory per stream: a connection each over plain HTTP/1.1
//! or `--tls h1`, 256 streams to a connection with `--tls h2`.

use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use clap::Args;
use viewtape_tests::Feed;

use crate::cli::{u64_in, usize_in, ClientOptions, PinOptions};
use crate::publish::Publisher;
use crate::target::{rss_kib, Target, TargetOptions};
use crate::transport::{connect_all, Transport, H2_STREAMS_PER_CONNECTION};

/// What to run.
#[derive(Debug, Args)]
pub struct Options {
    /// Idle streams (1..=50,000; must fit under the file-descriptor limit)
    #[arg(long, default_value_t = 10_000, value_parser = usize_in(1..=50_000))]
    connections: usize,
    /// Seconds the streams stay open before the server's RSS is read (0..=600)
    #[arg(long, default_value_t = 3, value_parser = u64_in(0..=600))]
    hold_seconds: u64,
    #[command(flatten)]
    pub(crate) target: TargetOptions,
    #[command(flatten)]
    pub(crate) pin: PinOptions,
    #[command(flatten)]
    pub(crate) client: ClientOptions,
}

impl Options {
    /// Whether `--connections` fit under the soft `RLIMIT_NOFILE` `nofile` (with 100 to spare).
    ///
    /// # Errors
    /// When they do not.
    pub fn check_nofile(&self, nofile: u64) -> anyhow::Result<()> {
        let connections = self.connections;
        if connections as u64 + 100 > nofile {
            bail!(
                "--connections {connections} needs RLIMIT_NOFILE > {}, have {nofile}",
                connections + 100
            );
        }
        Ok(())
    }
}

/// Runs it and prints the figures.
///
/// # Errors
/// Without a server pid (`--pid` or a spawned server), or on connection errors.
pub async fn run(target: &Target, options: &Options) -> anyhow::Result<()> {
    let Some(pid) = target.pid else {
        bail!("idle needs the server's pid: pass --pid with --addr, or let the tool spawn it");
    };
    let mut publisher = Publisher::connect(target, 1).await?;
    publisher.publish(&mut Feed::new(&["ACME"]), 1).await?;
    let head = publisher.head_id(target).await?;
    // Warm the server's connection path first, so one-time allocations are not counted.
    let path = target.events_path();
    drop(connect_all(&target.dialer, path, 100, &head).await?);
    tokio::time::sleep(Duration::from_millis(500)).await;

    let before = rss_kib(pid)?;
    let socket_pages_before = tcp_memory_pages()?;
    let start = Instant::now();
    let streams = connect_all(&target.dialer, path, options.connections, &head)
        .await
        .context("opening idle connections")?;
    let opened_in = start.elapsed();
    tokio::time::sleep(Duration::from_secs(options.hold_seconds)).await;
    let after = rss_kib(pid)?;
    let socket_pages = tcp_memory_pages()?.saturating_sub(socket_pages_before);
    let per = (after.saturating_sub(before)) as f64 * 1024.0 / options.connections as f64;
    let connections = match target.transport() {
        Transport::TlsH2 => options.connections.div_ceil(H2_STREAMS_PER_CONNECTION),
        Transport::Plain | Transport::TlsH1 => options.connections,
    };
    println!(
        "idle peer={:?} transport={} streams={} connections={connections} opened_in_ms={:.0} server_rss_kib before={before} after={after} per_stream_bytes={per:.0} ({:.2} KB)",
        target.peer,
        target.transport().name(),
        options.connections,
        opened_in.as_secs_f64() * 1000.0,
        per / 1000.0
    );
    // The kernel's TCP buffer memory (`/proc/net/sockstat`, both ends of every loopback
    // connection, in pages of 4 KiB), beside the server's own.
    println!(
        "idle kernel_tcp_mem_pages_added={socket_pages} per_connection_bytes={:.0}",
        socket_pages as f64 * 4096.0 / options.connections as f64
    );
    // Every connection is still open and healthy.
    let closed = streams.iter().filter(|s| s.is_closed()).count();
    if closed > 0 {
        println!("idle closed_by_server={closed}");
    }
    drop(streams);
    Ok(())
}

/// The pages of memory TCP sockets hold now, machine-wide (`mem` of the `TCP:` line of
/// `/proc/net/sockstat`).
fn tcp_memory_pages() -> anyhow::Result<u64> {
    let sockstat = std::fs::read_to_string("/proc/net/sockstat").context("/proc/net/sockstat")?;
    sockstat
        .lines()
        .find_map(|line| {
            let fields = line.strip_prefix("TCP:")?;
            let mut words = fields.split_whitespace();
            while let Some(word) = words.next() {
                if word == "mem" {
                    return words.next()?.parse().ok();
                }
            }
            None
        })
        .context("no TCP mem in /proc/net/sockstat")
}
