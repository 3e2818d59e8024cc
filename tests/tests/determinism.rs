//! The determinism suite, against the real binary: what a guest publishes is a function of the
//! log, whatever its instance's history.
//!
//! Two servers with the same runtimes take the same random batches, from one seed: the built-in
//! ticker, the built-in JSON guest and a JavaScript guest written to stress what an instance's
//! history could change — a module-level variable, a `Set` and a `Map` made per batch, a
//! prototype changed by the module, `async`/`await` and promise jobs, garbage for the
//! collector. One server runs uninterrupted. The other is killed with `kill -9`, stopped
//! gracefully and snapshotted at random points, and each time restarts from its newest
//! snapshot and its log — or, with its newest snapshot deleted, from an older one and more of
//! its log. Every frame of every view must then be the same on both: its offset,
//! its kind and its data, byte for byte.
//!
//! A cluster's nodes, one of them killed, another joining late, take the same batches through
//! random nodes, and must serve the same frames alike.
//!
//! `VIEWTAPE_SEED=N` runs seed `N` (the failure message names the seed it ran) and
//! `VIEWTAPE_STEPS=N` takes `N` steps; CI runs a short fixed one.

use anyhow::{ensure, Context as _};
use viewtape_tests::cluster::{applied, position, CONVERGE};
use viewtape_tests::server::{config_file, ADMIN_TOKEN_ENV};
use viewtape_tests::{expect, NatsServer, Server};

const TOKEN: &str = "determinism-token";

/// Steps a run takes: a batch each, and on the interrupted server maybe a crash, a graceful
/// restart or a snapshot. `VIEWTAPE_STEPS=N` takes `N` (a longer run than CI's).
const STEPS: usize = 40;

/// The JavaScript guest. Everything it publishes depends on its state and the batch only if
/// every batch starts from the state the last one saved: `calls` is 1 and `seen` holds this
/// batch's words in every batch, however long the instance lived before.
const STRESS_JS: &str = r#"
let calls = 0;
const seen = new Set();
Array.prototype.total = function () { return this.reduce((a, b) => a + b, 0); };
const later = async (value) => { await null; return value; };

export function init() { return { batches: 0, sum: 0, words: {} }; }

export async function onBatch(state, input, ctx) {
  calls += 1;
  const numbers = [];
  for (const line of input.split('\n').filter(Boolean)) {
    const [word, n] = line.split(' ');
    seen.add(word);
    numbers.push(Number(n));
    state.words[word] = (state.words[word] ?? 0) + Number(n);
  }
  // Garbage, which the collector finds where the heap's history puts it.
  let junk = [];
  for (let i = 0; i < 300 * numbers.length; i++) junk.push({ i, text: 'x'.repeat(i % 40) });
  junk = null;
  state.batches += 1;
  state.sum += await later(numbers.total());
  const words = new Map(Object.entries(state.words));
  ctx.publish('stress', 'summary', {
    calls, seen: seen.size, batches: state.batches, sum: state.sum, words: words.size,
  });
  await Promise.resolve();
  for (const word of seen) ctx.publish('stress', `word:${word}`, words.get(word));
  return state;
}
"#;

/// SplitMix64: the run's choices, from its seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `0..n`.
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// A batch for one of the runtimes, and that runtime; `seq` numbers the ticker's ticks.
fn batch(rng: &mut Rng, seq: &mut u64) -> (&'static str, String) {
    let lines = 1 + rng.below(20);
    match rng.below(3) {
        0 => {
            let body = (0..lines)
                .map(|_| {
                    *seq += 1;
                    format!(
                        "{{\"symbol\":\"S{}\",\"price\":{}.25,\"seq\":{seq}}}\n",
                        rng.below(12),
                        rng.below(1000)
                    )
                })
                .collect();
            ("demo", body)
        }
        1 => {
            let body = (0..lines)
                .map(|_| {
                    let key = format!("k{}", rng.below(30));
                    match rng.below(5) {
                        0 => format!("{{\"view\":\"notes\",\"key\":\"{key}\",\"delete\":true}}\n"),
                        _ => format!(
                            "{{\"view\":\"notes\",\"key\":\"{key}\",\"value\":{{\"n\":{}}}}}\n",
                            rng.below(100)
                        ),
                    }
                })
                .collect();
            ("notes", body)
        }
        _ => {
            let body = (0..lines)
                .map(|_| format!("w{} {}\n", rng.below(15), rng.below(50)))
                .collect();
            ("stress", body)
        }
    }
}

/// Every frame of `view`'s tape on `server`: its offset, its kind and its data.
async fn frames(server: &Server, view: &str) -> anyhow::Result<Vec<(u64, String, String)>> {
    // The offset the view is at: where its state transfer is synced.
    let mut live = server.sse(&format!("/views/{view}/events"), &[]).await?;
    let (_, synced) = live.until_synced(10_000).await?;
    let head = u64::from(expect::cursor_of(&synced)?.offset());
    let mut stream = server
        .sse(&format!("/views/{view}/events?from=tape"), &[])
        .await?;
    let mut frames = Vec::new();
    while frames.last().is_none_or(|(offset, _, _)| *offset < head) {
        let event = stream.next_event().await?;
        let offset = u64::from(expect::cursor_of(&event)?.offset());
        frames.push((offset, event.event, event.data));
    }
    Ok(frames)
}

/// The server's snapshot files, oldest first (their names sort by when they were written).
fn snapshot_files(server: &Server) -> anyhow::Result<Vec<std::path::PathBuf>> {
    let mut files: Vec<_> = std::fs::read_dir(server.data_dir().join("snapshots"))?
        .map(|entry| entry.map(|entry| entry.path()))
        .collect::<Result<_, _>>()?;
    files.retain(|path| path.extension().is_some_and(|ext| ext == "vtsnap"));
    files.sort();
    Ok(files)
}

async fn ingest(server: &Server, runtime: &str, body: &str) -> anyhow::Result<()> {
    let resp = server.ingest(runtime, body).await?;
    ensure!(resp.status() == 200, "{} {}", resp.status(), resp.text());
    Ok(())
}

/// The config of the runtimes, the stress guest written into `dir`.
fn runtimes(dir: &std::path::Path) -> anyhow::Result<tempfile::NamedTempFile> {
    let js = dir.join("stress.js");
    std::fs::write(&js, STRESS_JS)?;
    config_file(&format!(
        "[server]\nsnapshot_interval = \"0s\"\n\n\
         [[runtime]]\nname = \"demo\"\nmodule = \"builtin:ticker\"\nviews = [\"prices\"]\n\n\
         [[runtime]]\nname = \"notes\"\nmodule = \"builtin:json\"\nviews = [\"notes\"]\n\n\
         [[runtime]]\nname = \"stress\"\nmodule = {:?}\nviews = [\"stress\"]\n",
        js.display().to_string()
    ))
}

async fn run(seed: u64) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let config = runtimes(dir.path())?;
    let path = config.path().display().to_string();
    let args = ["--config", &path, "--demo-rate", "0"];
    let env = [(ADMIN_TOKEN_ENV, TOKEN)];
    let steady = Server::start_with_env(&args, &env).await?;
    let mut interrupted = Server::start_with_env(&args, &env).await?;
    let mut rng = Rng(seed);
    let mut seq = 0;
    let mut interruptions = Vec::new();
    for step in 0..steps(STEPS)? {
        let (runtime, body) = batch(&mut rng, &mut seq);
        ingest(&steady, runtime, &body).await?;
        ingest(&interrupted, runtime, &body)
            .await
            .with_context(|| format!("step {step}, after {interruptions:?}"))?;
        match rng.below(12) {
            0 | 1 => {
                interrupted.restart().await?;
                interruptions.push(format!("{step}: kill -9"));
            }
            2 => {
                interrupted.stop_graceful().await?;
                interrupted.restart().await?;
                interruptions.push(format!("{step}: graceful restart"));
            }
            5 => {
                // Back to an older snapshot: the newest is gone, so the log replays from the
                // one before it.
                interrupted.kill9().await?;
                let mut snapshots = snapshot_files(&interrupted)?;
                if snapshots.len() > 1 {
                    let newest = snapshots.pop().context("a snapshot")?;
                    std::fs::remove_file(&newest)?;
                    interruptions.push(format!("{step}: kill -9, an older snapshot"));
                } else {
                    interruptions.push(format!("{step}: kill -9"));
                }
                interrupted.restart().await?;
            }
            3 | 4 => {
                let resp = interrupted
                    .admin(TOKEN, "POST", "/admin/snapshot", &[], b"")
                    .await?;
                ensure!(resp.status() == 200, "{} {}", resp.status(), resp.text());
                interruptions.push(format!("{step}: snapshot"));
            }
            _ => {}
        }
    }
    // Shown with `--no-capture`: what the run did.
    eprintln!("interruptions: {interruptions:?}");
    for view in ["prices", "notes", "stress"] {
        let expected = frames(&steady, view).await?;
        ensure!(!expected.is_empty(), "{view}: no frames");
        let got = frames(&interrupted, view).await?;
        ensure!(
            got == expected,
            "{view}, interrupted at {interruptions:?}:\n got {got:?}\n expected {expected:?}"
        );
    }
    // The module-level variable counted this batch's call only.
    let stress = steady.get("/views/stress").await?.json()?;
    ensure!(stress["entries"]["summary"]["calls"] == 1, "{stress}");
    Ok(())
}

/// The run's seed: `VIEWTAPE_SEED`, or CI's.
fn seed() -> anyhow::Result<u64> {
    match std::env::var("VIEWTAPE_SEED") {
        Ok(seed) => seed.parse().context("VIEWTAPE_SEED is a number"),
        Err(_) => Ok(20261207),
    }
}

/// `VIEWTAPE_STEPS`, or `default`.
fn steps(default: usize) -> anyhow::Result<usize> {
    match std::env::var("VIEWTAPE_STEPS") {
        Ok(steps) => steps.parse().context("VIEWTAPE_STEPS is a number"),
        Err(_) => Ok(default),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frames_are_the_same_however_often_the_server_was_interrupted() -> anyhow::Result<()> {
    let seed = seed()?;
    run(seed).await.with_context(|| format!("seed {seed}"))
}

/// Steps of the cluster's run (`VIEWTAPE_STEPS` too).
const CLUSTER_STEPS: usize = 24;

/// The same batches through random nodes of a cluster on one NATS server: a node killed with
/// `kill -9` at random points restarts from a snapshot (its own or a shared one) and the
/// stream, snapshots are taken and shared, and a node joins late from a shared snapshot. Every
/// node then serves every view's frames alike, byte for byte.
async fn run_cluster(seed: u64) -> anyhow::Result<()> {
    let nats = NatsServer::start().await?;
    let dir = tempfile::tempdir()?;
    let config = runtimes(dir.path())?;
    let (path, url) = (config.path().display().to_string(), nats.url());
    let args = ["--config", &path, "--demo-rate", "0", "--nats", &url];
    let env = [(ADMIN_TOKEN_ENV, TOKEN)];
    let mut nodes = Vec::new();
    for _ in 0..2 {
        let node = Server::start_with_env(&args, &env).await?;
        node.ready(CONVERGE).await?;
        nodes.push(node);
    }
    let mut rng = Rng(seed);
    let (mut seq, mut last) = (0, 0);
    let mut events = Vec::new();
    for step in 0..steps(CLUSTER_STEPS)? {
        let (runtime, body) = batch(&mut rng, &mut seq);
        let via = rng.below(nodes.len() as u64) as usize;
        let resp = nodes[via].ingest(runtime, &body).await?;
        ensure!(
            resp.status() == 200,
            "step {step} via node {via}, after {events:?}: {} {}",
            resp.status(),
            resp.text()
        );
        last = position(&resp.json()?)?;
        match rng.below(10) {
            0 | 1 => {
                nodes[1].restart().await?;
                nodes[1].ready(CONVERGE).await?;
                events.push(format!("{step}: kill -9"));
            }
            2 => {
                let resp = nodes[via]
                    .admin(TOKEN, "POST", "/admin/snapshot", &[], b"")
                    .await?;
                ensure!(resp.status() == 200, "{} {}", resp.status(), resp.text());
                events.push(format!("{step}: snapshot through node {via}"));
            }
            3 if nodes.len() < 3 => {
                let late = Server::start_with_env(&args, &env).await?;
                late.ready(CONVERGE).await?;
                nodes.push(late);
                events.push(format!("{step}: a node joined"));
            }
            _ => {}
        }
    }
    eprintln!("cluster events: {events:?}");
    for node in &nodes {
        applied(node, last).await?;
    }
    for view in ["prices", "notes", "stress"] {
        let expected = frames(&nodes[0], view).await?;
        ensure!(!expected.is_empty(), "{view}: no frames");
        for (i, node) in nodes.iter().enumerate().skip(1) {
            let got = frames(node, view).await?;
            ensure!(
                got == expected,
                "{view} on node {i}, after {events:?}:\n got {got:?}\n expected {expected:?}"
            );
        }
    }
    // And the nodes' own checks of each other found them alike.
    let mut agreed = 0.0;
    for node in &nodes {
        let checks = |outcome| format!("viewtape_cluster_checks_total{{outcome=\"{outcome}\"}}");
        agreed += node.metric(&checks("agreed")).await?;
        ensure!(
            node.metric(&checks("differed")).await? == 0.0,
            "{}",
            node.logs()
        );
        ensure!(node.get("/readyz").await?.json()?.get("halted").is_none());
    }
    ensure!(agreed >= 1.0, "no check was compared");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_node_of_a_cluster_serves_the_same_frames() -> anyhow::Result<()> {
    let seed = seed()?;
    run_cluster(seed)
        .await
        .with_context(|| format!("seed {seed}"))
}
