//! `patterns`: durable ingest into many new views of one pattern (`room.*`, one event each)
//! beside the same number of events into one existing view, and the server's resident memory
//! per pattern view. Spawns its own server (the harness's: a free loopback port, a temporary
//! data directory, the demo feed off) and creates both runtimes through the admin API.

use std::time::{Duration, Instant};

use anyhow::{ensure, Context as _};
use clap::Args;
use viewtape_tests::server::ADMIN_TOKEN_ENV;
use viewtape_tests::{http, Server};

use crate::cli::{usize_in, ClientOptions};
use crate::target::rss_kib;

const TOKEN: &str = "patterns-bench";

/// What to run.
#[derive(Debug, Args)]
pub struct Options {
    /// New pattern views, one event each (1..=1,000,000)
    #[arg(long, default_value_t = 100_000, value_parser = usize_in(1..=1_000_000))]
    views: usize,
    /// Lines per ingest request (1..=10,000)
    #[arg(long, default_value_t = 1_000, value_parser = usize_in(1..=10_000))]
    batch: usize,
    #[command(flatten)]
    pub(crate) client: ClientOptions,
}

/// Runs it and prints the figures.
///
/// # Errors
/// When the server does not start, or refuses a request.
pub async fn run(options: &Options) -> anyhow::Result<()> {
    let server = Server::start_with_env(&[], &[(ADMIN_TOKEN_ENV, TOKEN)]).await?;
    define(&server, "rooms", r#"["room.*"]"#).await?;
    define(&server, "one", r#"["single"]"#).await?;
    // Warm the ingest path and the existing view.
    ingest(
        &server,
        "one",
        (0..options.batch).map(|i| line("single", i)),
    )
    .await?;
    tokio::time::sleep(Duration::from_millis(300)).await;

    let before = rss_kib(server.pid())?;
    let patterns = timed(&server, "rooms", options, |i| format!("room.{i}")).await?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let after = rss_kib(server.pid())?;
    let listed = server.get("/views").await?.text();
    ensure!(
        listed.contains(&format!("\"room.{}\"", options.views - 1)),
        "the last pattern view is not listed"
    );
    let single = timed(&server, "one", options, |_| "single".to_owned()).await?;
    let per_view = (after.saturating_sub(before)) as f64 * 1024.0 / options.views as f64;
    println!(
        "patterns: {} new views, {} lines per request: {:.0} events/s; one existing view: {:.0} events/s (ratio {:.2})",
        options.views,
        options.batch,
        patterns,
        single,
        patterns / single
    );
    println!(
        "patterns: RSS {before} KiB -> {after} KiB: {per_view:.0} bytes per pattern view (one key each)"
    );
    Ok(())
}

/// `PUT /admin/runtimes/{runtime}`: a `builtin:json` runtime of `views`.
async fn define(server: &Server, runtime: &str, views: &str) -> anyhow::Result<()> {
    let body = format!(r#"{{"module":"builtin:json","views":{views}}}"#);
    let auth = format!("Bearer {TOKEN}");
    let path = format!("/admin/runtimes/{runtime}");
    let resp = http::request(
        server.addr(),
        "PUT",
        &path,
        &[("Authorization", &auth)],
        body.as_bytes(),
    )
    .await?;
    ensure!(resp.status() == 201, "{} {}", resp.status(), resp.text());
    Ok(())
}

/// One `builtin:json` line of key `k{i}` in `view`.
fn line(view: &str, i: usize) -> String {
    format!("{{\"view\":\"{view}\",\"key\":\"k{i}\",\"value\":{{\"n\":{i}}}}}\n")
}

/// One acknowledged ingest request of `lines`.
async fn ingest(
    server: &Server,
    runtime: &str,
    lines: impl Iterator<Item = String>,
) -> anyhow::Result<()> {
    let body: String = lines.collect();
    let resp = server.ingest(runtime, &body).await?;
    ensure!(resp.status() == 200, "{} {}", resp.status(), resp.text());
    Ok(())
}

/// Ingests `options.views` events, event `i` to the view `view(i)`, in requests of
/// `options.batch` lines; events per second.
async fn timed(
    server: &Server,
    runtime: &str,
    options: &Options,
    view: impl Fn(usize) -> String,
) -> anyhow::Result<f64> {
    let start = Instant::now();
    let mut sent = 0;
    while sent < options.views {
        let end = (sent + options.batch).min(options.views);
        ingest(server, runtime, (sent..end).map(|i| line(&view(i), i)))
            .await
            .with_context(|| format!("events {sent}..{end}"))?;
        sent = end;
    }
    Ok(options.views as f64 / start.elapsed().as_secs_f64())
}
