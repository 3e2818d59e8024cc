//! The nemesis (DESIGN §19): a cluster is trusted when it has been broken on purpose, often and
//! reproducibly. Three `nats-server`s as one JetStream cluster (the stream at `replicas = 3`,
//! every write fsynced), three viewtape nodes that reach NATS only through link proxies the
//! harness controls, producers through random nodes with idempotent stamps, readers holding
//! cursors across reconnects to random nodes — and, from a seed, `kill -9` and `SIGSTOP` of any
//! NATS server (the stream's leader on purpose), `kill -9` of any node, links that stop
//! forwarding without closing, links that close, restarts. Then everything is healed, the nodes
//! converge, and [`check`] holds what was acknowledged and served to the invariants.
//!
//! | file | job |
//! |---|---|
//! | this one | [`Settings`], the [`Testbed`], [`run`]: start, faults, heal, converge, read, check |
//! | `nats_cluster` | three `nats-server`s as one cluster: kill, pause, restart; the stream's leader |
//! | `proxy` | a TCP link per (node, NATS server): forward, blackhole, close |
//! | `nodes` | the viewtape nodes on their links; kill and restart on the same port |
//! | `producer` | batches with producer stamps, retried until acknowledged; refusal windows |
//! | `reader` | SSE readers holding cursors across reconnects; resets and breaks |
//! | `schedule` | the fault kinds and the seeded schedule of steps |
//! | `faults` | applying and healing a step's faults |
//! | `check` | the invariants and the report table |
//! | `prng` | the seeded xorshift every choice comes from |

pub mod check;
pub mod faults;
pub mod nats_cluster;
pub mod nodes;
pub mod prng;
pub mod producer;
pub mod proxy;
pub mod reader;
pub mod schedule;

use std::time::{Duration, Instant};

use anyhow::Context as _;

pub use check::Report;
pub use schedule::FaultKind;

use check::{Observed, Tape};
use nats_cluster::NatsCluster;
use nodes::{Nodes, VIEW};
use prng::Prng;

/// NATS servers and viewtape nodes: three of each, so one of each may be lost.
const SIZE: usize = 3;
/// How long the nodes may take to agree once everything is healed and the producers stopped.
const CONVERGE: Duration = Duration::from_secs(90);
/// Quiet before the first fault, so the workload's first batches are in.
const WARM_UP: Duration = Duration::from_secs(3);
/// The most frames a tape may hold for the checker to read it.
const MAX_FRAMES: usize = 10_000_000;

/// What a run does.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Every choice's seed (`VIEWTAPE_SEED`).
    pub seed: u64,
    /// How long faults are injected (`VIEWTAPE_NEMESIS_SECS`).
    pub duration: Duration,
    /// The kinds drawn from (`VIEWTAPE_NEMESIS_FAULTS`, comma-separated; all by default).
    pub kinds: Vec<FaultKind>,
    /// Producers.
    pub producers: usize,
    /// Readers.
    pub readers: usize,
}

impl Settings {
    /// From the environment, with `seed` and `secs` as the defaults.
    ///
    /// # Errors
    /// When a variable is set to something unreadable.
    pub fn from_env(seed: u64, secs: u64) -> anyhow::Result<Self> {
        let number = |name: &str, default: u64| -> anyhow::Result<u64> {
            match std::env::var(name) {
                Ok(text) => text
                    .trim()
                    .parse()
                    .with_context(|| format!("{name}={text:?}")),
                Err(_) => Ok(default),
            }
        };
        Ok(Self {
            seed: number("VIEWTAPE_SEED", seed)?,
            duration: Duration::from_secs(number("VIEWTAPE_NEMESIS_SECS", secs)?),
            kinds: FaultKind::parse_list(
                &std::env::var("VIEWTAPE_NEMESIS_FAULTS").unwrap_or_default(),
            )?,
            producers: 3,
            readers: 3,
        })
    }
}

/// The processes a run breaks.
#[derive(Debug)]
pub struct Testbed {
    /// The NATS cluster.
    pub nats: NatsCluster,
    /// The viewtape nodes and their links.
    pub nodes: Nodes,
    /// The harness's own JetStream client, straight to the servers (stream info).
    pub js: async_nats::jetstream::Context,
}

/// Runs the nemesis with `settings`; the report, whatever it found.
///
/// # Errors
/// When the testbed does not start (a run that found something returns `Ok` with failures).
pub async fn run(settings: &Settings) -> anyhow::Result<Report> {
    let nats = NatsCluster::start(SIZE).await?;
    let js = nats_cluster::operator(&nats.urls()).await?;
    let nodes = Nodes::start(&nats, SIZE).await?;
    let mut bed = Testbed { nats, nodes, js };
    let plan = schedule::plan(
        settings.seed,
        settings.duration,
        &settings.kinds,
        SIZE,
        SIZE,
    );
    eprintln!(
        "nemesis: seed {} · {} steps over {:?}",
        settings.seed,
        plan.len(),
        settings.duration
    );

    let started = Instant::now();
    let (stop, stopping) = tokio::sync::watch::channel(false);
    let addrs = bed.nodes.addrs.clone();
    let producers: Vec<_> = (0..settings.producers)
        .map(|i| {
            let rng = Prng::fork(settings.seed, 1_000 + i as u64);
            tokio::spawn(producer::run(
                format!("p{i}"),
                addrs.clone(),
                rng,
                started,
                stopping.clone(),
            ))
        })
        .collect();
    let readers: Vec<_> = (0..settings.readers)
        .map(|i| {
            let rng = Prng::fork(settings.seed, 2_000 + i as u64);
            tokio::spawn(reader::run(
                format!("r{i}"),
                addrs.clone(),
                rng,
                started,
                stopping.clone(),
            ))
        })
        .collect();

    tokio::time::sleep(WARM_UP).await;
    let mut steps = Vec::new();
    for step in &plan {
        // A step that overran (a slow restart) shortens the schedule, never lengthens the run.
        if started.elapsed() > settings.duration + WARM_UP {
            break;
        }
        let record = faults::run_step(&mut bed, step, started).await;
        eprintln!(
            "nemesis: {:>6.1?} {} — healed at {:.1?}{}",
            record.started,
            record.faults.join(" + "),
            record.healed,
            if record.errors.is_empty() {
                String::new()
            } else {
                format!(" ({})", record.errors.join("; "))
            }
        );
        steps.push(record);
    }

    let mut unsettled = faults::heal_all(&mut bed).await;
    for (node, server) in bed.nodes.servers.iter().enumerate() {
        if let Err(e) = server.ready(CONVERGE).await {
            unsettled.push(format!(
                "node{node} not ready after healing: {}",
                first_line(&format!("{e:#}"))
            ));
        }
    }
    stop.send_replace(true);
    let mut producer_logs = Vec::new();
    for task in producers {
        producer_logs.push(task.await.context("a producer panicked")?);
    }
    let mut reader_logs = Vec::new();
    for task in readers {
        reader_logs.push(task.await.context("a reader panicked")?);
    }
    let last = producer_logs
        .iter()
        .flat_map(|p| &p.acks)
        .filter_map(|a| a.position)
        .max()
        .unwrap_or(0);
    unsettled.extend(converge(&bed, last).await);
    let mut tapes = Vec::new();
    for server in &bed.nodes.servers {
        tapes.push(read_tape(server).await);
    }
    let observed = Observed {
        seed: settings.seed,
        duration: settings.duration,
        elapsed: started.elapsed(),
        steps,
        producers: producer_logs,
        readers: reader_logs,
        tapes,
        unsettled,
    };
    Ok(Report::new(&observed))
}

fn first_line(text: &str) -> &str {
    text.lines().next().unwrap_or_default()
}

/// Waits until every node has applied all the stream holds (at least `last`, the last
/// acknowledged position) and they agree; what did not, when they do not in time.
async fn converge(bed: &Testbed, last: u64) -> Vec<String> {
    let deadline = Instant::now() + CONVERGE;
    let mut seen = Vec::new();
    while Instant::now() < deadline {
        seen.clear();
        for server in &bed.nodes.servers {
            let body = match server.get("/readyz").await.and_then(|r| r.json()) {
                Ok(body) => body,
                Err(e) => serde_json::json!({ "error": format!("{e:#}") }),
            };
            seen.push(body);
        }
        let applied: Vec<_> = seen.iter().map(|b| b["applied"].as_u64()).collect();
        let caught_up = seen.iter().all(|b| {
            b["ready"] == true
                && b["applied"]
                    .as_u64()
                    .is_some_and(|a| a >= last && Some(a) >= b["stream_last"].as_u64())
        });
        if caught_up && applied.windows(2).all(|w| w[0] == w[1]) {
            return Vec::new();
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    seen.iter()
        .enumerate()
        .map(|(node, body)| format!("node{node} did not converge within {CONVERGE:?} (last acknowledged {last}): {body}"))
        .collect()
}

/// A node's whole tape of the view, from its first retained frame to its head.
async fn read_tape(server: &crate::Server) -> Tape {
    let read = async {
        let mut stream = server
            .sse(&format!("/views/{VIEW}/events?from=tape&until=head"), &[])
            .await?;
        let mut frames = Vec::new();
        while let Some(event) = stream.next_within(crate::http::READ_TIMEOUT).await? {
            match event.event.as_str() {
                "update" | "delete" => frames.push((event.id.unwrap_or_default(), event.data)),
                other => anyhow::bail!("the tape replay sent a {other} event: {}", event.data),
            }
            anyhow::ensure!(frames.len() <= MAX_FRAMES, "more than {MAX_FRAMES} frames");
        }
        Ok(frames)
    };
    read.await.map_err(|e: anyhow::Error| format!("{e:#}"))
}
