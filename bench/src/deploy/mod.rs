//! `deploy`: what deploying a new module to a running runtime costs, and what it does to ingest.
//!
//! ```text
//! viewtape-bench deploy [--deploys 10] [--rate 500] [--connections 4] [--max-seconds 300]
//!                       [--cluster 0|3] [--nats-server nats-server]
//! ```
//!
//! Always spawns its own server (`viewtape serve --demo-rate 0`, a fresh data directory, the
//! default config: runtime `demo` = the built-in ticker into view `prices`) with
//! `VIEWTAPE_ADMIN_TOKEN` set to a token made up for the run. With `--cluster N`, a real
//! `nats-server` (`sync_interval: always`) and `N` nodes on it; ingest and deploys go to the
//! first, and a deploy's latency includes the record's round trip through the stream and its
//! apply on that node.
//!
//! - Ingest: an open loop of 1-event batches into `POST /runtimes/demo/ingest` at `--rate`
//!   batches/s for the whole run (a tokio interval schedules them; whichever of the
//!   `--connections` keep-alive connections is free sends the next one; each batch's latency
//!   counts from its scheduled time, so batches queued behind a paused runtime show the
//!   pause). The ticker keeps one `seq` for the feed and skips non-increasing ones, so `seq`s
//!   come from one counter locked across the request write; a batch the ticker skipped anyway
//!   (`events.prices: 0`, the server reordered two connections) is sent again with a fresh
//!   `seq` and counted as `resent`. Every 200 must say `events.prices: 1` in the end.
//! - Deploys: after a 2 s warm-up, `--deploys` times, one after the other with 1 s between
//!   them: `PUT /admin/runtimes/demo/module` with `server/guests/ticker.wasm` plus a custom
//!   section `build` holding the deploy's number (8 bytes LE), so each one is a different,
//!   valid module (the same module again would be a no-op). Its latency is the whole PUT:
//!   compile, store, the swap between two batches and the durable log record. Each answer
//!   must be a 200 with a log `position`, a new `module`, and as `previous` the module the
//!   deploy before installed.
//!
//! Report: deploy latency p50/max; ingest ack latency p50/p99/max of the batches in flight
//! while a deploy was (scheduled before the PUT's answer and acked after it was sent) beside
//! those of every other batch after the warm-up; the longest gap between consecutive acks that
//! overlaps a deploy, beside the longest one that does not.
//!
//! Bounds: at most `--rate × --max-seconds` batches are scheduled and the run stops scheduling
//! at `--max-seconds` (a run that has not finished its deploys by then fails); every request
//! write/read is bounded (a PUT by [`DEPLOY_TIMEOUT`]); the connections must drain their
//! last batches within [`DRAIN_TIMEOUT`].
//!
//! | file | job |
//! |---|---|
//! | this one | [`Options`] and [`run`]: the servers, the ingest connections, the deploys |
//! | `analysis` | the batches split by deploy in flight, the ack gaps, the printed report |

mod analysis;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context as _};
use clap::Args;
use tokio::task::JoinSet;
use viewtape_tests::feed::{price_of, tick};
use viewtape_tests::server::{guest_wasm, with_custom_section, ADMIN_TOKEN_ENV};
use viewtape_tests::{http, NatsServer, Server};

use crate::cli::{u64_in, usize_in, ClientOptions};
use crate::durable::{parse_ingest_ack, IngestConn};

/// The runtime deployed to and ingested into (the default config's).
const RUNTIME: &str = "demo";
/// Ingest before the first deploy.
const WARM_UP: Duration = Duration::from_secs(2);
/// Between one deploy's answer and the next PUT; also ingest after the last one.
const BETWEEN: Duration = Duration::from_secs(1);
/// One PUT, start to answer.
const DEPLOY_TIMEOUT: Duration = Duration::from_secs(60);
/// The connections' last batches, after scheduling stopped.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(40);
/// A batch the ticker skipped is sent again at most this often.
const MAX_RESENDS: u32 = 1000;
/// The custom section's name in each deployed module.
const SECTION_NAME: &str = "build";

/// What to run.
#[derive(Debug, Args)]
pub struct Options {
    /// Deploys, one after another (1..=100)
    #[arg(long, default_value_t = 10, value_parser = u64_in(1..=100))]
    deploys: u64,
    /// Ingest batches per second, open loop (1..=5,000)
    #[arg(long, default_value_t = 500, value_parser = u64_in(1..=5_000))]
    rate: u64,
    /// Keep-alive ingest connections (1..=64)
    #[arg(long, default_value_t = 4, value_parser = usize_in(1..=64))]
    connections: usize,
    /// The bound on the whole run, in seconds (5..=3,600)
    #[arg(long, default_value_t = 300, value_parser = u64_in(5..=3_600))]
    max_seconds: u64,
    /// Deploy through a node of a cluster of this many nodes on JetStream (0..=5; 0: one node
    /// on its local log)
    #[arg(long, value_name = "NODES", default_value_t = 0, value_parser = usize_in(0..=5))]
    cluster: usize,
    /// The nats-server binary (with --cluster)
    #[arg(long, value_name = "PATH", default_value = "nats-server")]
    nats_server: String,
    #[command(flatten)]
    pub(crate) client: ClientOptions,
}

/// One acknowledged batch; times since the open loop's start.
#[derive(Debug, Clone, Copy)]
struct Batch {
    scheduled: Duration,
    acked: Duration,
    resent: u32,
}

impl Batch {
    fn latency(&self) -> Duration {
        self.acked.saturating_sub(self.scheduled)
    }
}

/// One deploy's PUT, start to answer, since the open loop's start.
#[derive(Debug, Clone)]
struct Deploy {
    start: Duration,
    end: Duration,
    position: u64,
    module: String,
}

impl Deploy {
    /// Whether `from..to` overlaps this deploy.
    fn overlaps(&self, from: Duration, to: Duration) -> bool {
        from < self.end && to > self.start
    }
}

/// Sends scheduled batches on one connection until the schedule ends.
async fn ingest_worker(
    mut conn: IngestConn,
    start: Instant,
    schedule: Arc<tokio::sync::Mutex<tokio::sync::mpsc::UnboundedReceiver<Instant>>>,
    seq: Arc<tokio::sync::Mutex<u64>>,
) -> anyhow::Result<Vec<Batch>> {
    let mut batches = Vec::new();
    loop {
        let next = schedule.lock().await.recv().await;
        let Some(scheduled) = next else {
            return Ok(batches);
        };
        let resent = send_one(&mut conn, &seq).await?;
        batches.push(Batch {
            scheduled: scheduled.saturating_duration_since(start),
            acked: start.elapsed(),
            resent,
        });
    }
}

/// Sends one 1-event batch until the ticker takes it; how often it was sent again.
async fn send_one(conn: &mut IngestConn, seq: &tokio::sync::Mutex<u64>) -> anyhow::Result<u32> {
    let path = format!("/runtimes/{RUNTIME}/ingest");
    let mut resent = 0;
    loop {
        {
            let mut last = seq.lock().await;
            *last += 1;
            let body = tick("ACME", price_of(*last), *last);
            conn.write(&path, body.as_bytes()).await?;
        }
        let (status, body) = conn.read().await?;
        if status != 200 {
            bail!(
                "POST {path}: status {status}: {:.300}",
                String::from_utf8_lossy(&body)
            );
        }
        let events = parse_ingest_ack(&body)?.events;
        if events == 1 {
            return Ok(resent);
        }
        ensure!(
            events == 0,
            "POST {path}: events.prices {events} for one tick"
        );
        resent += 1;
        ensure!(
            resent <= MAX_RESENDS,
            "a batch was skipped {MAX_RESENDS} times"
        );
    }
}

/// Schedules `rate` batches/s until `stop` or `max_seconds`; how many it scheduled.
async fn schedule(
    tx: tokio::sync::mpsc::UnboundedSender<Instant>,
    rate: u64,
    max_seconds: u64,
    stop: Arc<AtomicBool>,
) -> u64 {
    let total = rate.saturating_mul(max_seconds);
    let mut interval = tokio::time::interval(Duration::from_nanos(1_000_000_000 / rate));
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let mut sent = 0;
    while sent < total && !stop.load(Ordering::Relaxed) {
        let at = interval.tick().await;
        if tx.send(at.into_std()).is_err() {
            break; // every connection ended: the join says why
        }
        sent += 1;
    }
    sent
}

/// The deploys, one after the other; times relative to `start`.
async fn deploy_all(
    server: &Server,
    token: &str,
    options: &Options,
    start: Instant,
) -> anyhow::Result<Vec<Deploy>> {
    let base = std::fs::read(guest_wasm("ticker")).context("read the ticker module")?;
    let bearer = format!("Bearer {token}");
    let path = format!("/admin/runtimes/{RUNTIME}/module");
    let deadline = start + Duration::from_secs(options.max_seconds);
    let mut deploys: Vec<Deploy> = Vec::new();
    tokio::time::sleep(WARM_UP).await;
    for build in 1..=options.deploys {
        ensure!(
            Instant::now() + BETWEEN < deadline,
            "deploy {build} of {} would run past --max-seconds {}",
            options.deploys,
            options.max_seconds
        );
        let wasm = with_custom_section(&base, SECTION_NAME, &build.to_le_bytes());
        let t0 = start.elapsed();
        let resp = tokio::time::timeout(
            DEPLOY_TIMEOUT,
            http::request(
                server.addr(),
                "PUT",
                &path,
                &[
                    ("Authorization", &bearer),
                    ("Content-Type", "application/wasm"),
                ],
                &wasm,
            ),
        )
        .await
        .with_context(|| format!("deploy {build}: no answer within {DEPLOY_TIMEOUT:?}"))??;
        let t1 = start.elapsed();
        ensure!(
            resp.status() == 200,
            "deploy {build}: status {}: {:.300}",
            resp.status(),
            resp.text()
        );
        let body = resp.json()?;
        let position = body["position"].as_u64().with_context(|| {
            format!("deploy {build}: no log position (was it a no-op?): {body}")
        })?;
        let module = body["module"].as_str().unwrap_or_default().to_owned();
        let previous = body["previous"].as_str().unwrap_or_default();
        ensure!(
            !module.is_empty() && module != previous && body["runtime"] == RUNTIME,
            "deploy {build}: unexpected answer {body}"
        );
        if let Some(before) = deploys.last() {
            ensure!(
                previous == before.module,
                "deploy {build}: previous {previous:?}, but deploy {} installed {:?}",
                build - 1,
                before.module
            );
        }
        deploys.push(Deploy {
            start: t0,
            end: t1,
            position,
            module,
        });
        tokio::time::sleep(BETWEEN).await;
    }
    Ok(deploys)
}

/// A token for this run only.
fn make_token() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("viewtape-bench-{}-{nanos:x}", std::process::id())
}

/// Runs it and prints the figures.
///
/// # Errors
/// On server errors, a refused or skipped batch, a failed or no-op deploy, or a run past its
/// bounds.
pub async fn run(options: &Options) -> anyhow::Result<()> {
    let token = make_token();
    let nats = match options.cluster {
        0 => None,
        _ => Some(NatsServer::start_with(&options.nats_server, false).await?),
    };
    let url = nats.as_ref().map(NatsServer::url);
    let args: Vec<&str> = match &url {
        Some(url) => vec!["--nats", url],
        None => Vec::new(),
    };
    let mut others = Vec::new();
    for _ in 1..options.cluster {
        others.push(Server::start_with_env(&args, &[(ADMIN_TOKEN_ENV, &token)]).await?);
    }
    let mut server = Server::start_with_env(&args, &[(ADMIN_TOKEN_ENV, &token)]).await?;
    for node in others.iter().chain([&server]) {
        if nats.is_some() {
            node.ready(Duration::from_secs(30)).await?;
        }
    }
    eprintln!(
        "spawned viewtape (pid {}) on {}; {} deploys to {RUNTIME} while ingesting {}/s on {} \
         connections",
        server.pid(),
        server.addr(),
        options.deploys,
        options.rate,
        options.connections
    );
    let result = measure(&server, &token, options).await;
    if result.is_err() {
        eprintln!("---- spawned server stderr (tail) ----\n{}", server.logs());
    }
    let _ = server.kill9().await;
    for mut node in others {
        let _ = node.kill9().await;
    }
    result
}

async fn measure(server: &Server, token: &str, options: &Options) -> anyhow::Result<()> {
    let seq = Arc::new(tokio::sync::Mutex::new(0u64));
    let mut conns = Vec::with_capacity(options.connections);
    for _ in 0..options.connections {
        let mut conn = IngestConn::connect(server.addr()).await?;
        // One untimed batch per connection: connections and runtime warm.
        send_one(&mut conn, &seq).await.context("warm-up batch")?;
        conns.push(conn);
    }
    let start = Instant::now();
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<Instant>();
    let rx = Arc::new(tokio::sync::Mutex::new(rx));
    let mut workers = JoinSet::new();
    for conn in conns {
        workers.spawn(ingest_worker(
            conn,
            start,
            Arc::clone(&rx),
            Arc::clone(&seq),
        ));
    }
    let stop = Arc::new(AtomicBool::new(false));
    let scheduler = tokio::spawn(schedule(
        tx,
        options.rate,
        options.max_seconds,
        Arc::clone(&stop),
    ));
    let deploys = deploy_all(server, token, options, start).await;
    stop.store(true, Ordering::Relaxed);
    let offered = scheduler.await.context("scheduler task")?;
    let scheduled_for = start.elapsed();
    // The schedule is closed: the connections send what is queued, then end.
    let mut batches = Vec::new();
    let drained = tokio::time::timeout(DRAIN_TIMEOUT, async {
        while let Some(joined) = workers.join_next().await {
            batches.extend(joined.context("ingest task")??);
        }
        anyhow::Ok(())
    })
    .await;
    let drain_s = start.elapsed().saturating_sub(scheduled_for).as_secs_f64();
    let deploys = deploys?;
    match drained {
        Ok(result) => result?,
        Err(_) => {
            workers.abort_all();
            bail!("the ingest connections did not drain within {DRAIN_TIMEOUT:?}");
        }
    }
    ensure!(
        batches.len() as u64 == offered,
        "{offered} batches scheduled, {} acked",
        batches.len()
    );
    ensure!(
        scheduled_for < Duration::from_secs(options.max_seconds),
        "the run reached --max-seconds {}",
        options.max_seconds
    );

    analysis::print_report(options, &batches, &deploys, scheduled_for, drain_s);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_and_bounds() -> anyhow::Result<()> {
        let options = |line: &str| match crate::cli::parse(&format!("deploy {line}"))?.command {
            crate::cli::Command::Load(crate::cli::Load::Deploy(options)) => Ok(options),
            other => bail!("not deploy: {other:?}"),
        };
        let o = options("--deploys 3")?;
        assert_eq!((o.deploys, o.rate, o.connections), (3, 500, 4));
        assert_eq!(
            (o.max_seconds, o.cluster, o.nats_server.as_str()),
            (300, 0, "nats-server")
        );
        assert!(options("--rate 0").is_err());
        assert!(options("--max-seconds 4").is_err());
        assert!(options("--cluster 6").is_err());
        Ok(())
    }
}
