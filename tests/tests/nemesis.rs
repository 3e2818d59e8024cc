//! The nemesis (DESIGN §19), short: three `nats-server`s as one JetStream cluster, three
//! viewtape nodes behind link proxies, producers and readers through random nodes, and a minute
//! of seeded faults — `kill -9` and `SIGSTOP` of NATS servers (the stream's leader on purpose),
//! `kill -9` of nodes, links that blackhole or close. Then every acknowledged batch must be on
//! every node's tape once, in order, the tapes identical, and no held cursor reset.
//!
//! `VIEWTAPE_SEED` picks the schedule (default below), `VIEWTAPE_NEMESIS_SECS` its length (60),
//! `VIEWTAPE_NEMESIS_FAULTS` the kinds (`kill-nats,kill-leader,pause-nats,kill-node,blackhole,
//! close-link`; all by default). `scripts/nemesis --seed N --duration 20m` runs a long one.

use viewtape_tests::nemesis::{self, Settings};

/// The CI run's seed, unless `VIEWTAPE_SEED` names another.
const SEED: u64 = 19;
/// The CI run's seconds of faults, unless `VIEWTAPE_NEMESIS_SECS` says otherwise.
const SECS: u64 = 60;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_broken_on_purpose_loses_nothing_and_tells_one_story() -> anyhow::Result<()> {
    let settings = Settings::from_env(SEED, SECS)?;
    let report = nemesis::run(&settings).await?;
    println!("{report}");
    let failures = report.failures();
    anyhow::ensure!(
        failures.is_empty(),
        "the nemesis found (seed {}; rerun with VIEWTAPE_SEED={}): {}",
        settings.seed,
        settings.seed,
        failures.join(", ")
    );
    Ok(())
}
