//! Applying a step's faults to the testbed and healing them, each with what it did recorded:
//! which server a leader kill found, when the step began and ended, what failed to heal.

use std::time::{Duration, Instant};

use super::nats_cluster::Liveness;
use super::nodes::STREAM;
use super::proxy::LinkMode;
use super::schedule::{Fault, FaultKind, Step};
use super::Testbed;

/// A step as it ran.
#[derive(Debug, Clone)]
pub struct StepRecord {
    /// The step's kind (see [`Step::label`]).
    pub label: String,
    /// Each fault as applied, with its resolved target (`kill-leader n2 (leader)`).
    pub faults: Vec<String>,
    /// When its faults began, since the run began.
    pub started: Duration,
    /// When they were healed.
    pub healed: Duration,
    /// What failed to apply or heal (the harness's trouble, not the cluster's).
    pub errors: Vec<String>,
}

/// What a fault did, so that it can be undone.
#[derive(Debug, Clone, Copy)]
enum Applied {
    KilledNats(usize),
    PausedNats(usize),
    KilledNode(usize),
    Link { node: usize, server: usize },
}

/// Runs `step` on `bed`: applies its faults, holds them, heals them, waits out its recovery.
pub async fn run_step(bed: &mut Testbed, step: &Step, started: Instant) -> StepRecord {
    let mut record = StepRecord {
        label: step.label(),
        faults: Vec::new(),
        started: started.elapsed(),
        healed: Duration::ZERO,
        errors: Vec::new(),
    };
    let mut applied = Vec::new();
    for fault in &step.faults {
        match apply(bed, *fault).await {
            Ok((done, what)) => {
                applied.push(done);
                record.faults.push(what);
            }
            Err(e) => record.errors.push(format!("{fault}: {e:#}")),
        }
    }
    tokio::time::sleep(step.hold).await;
    for done in applied.into_iter().rev() {
        if let Err(e) = heal(bed, done).await {
            record.errors.push(format!("heal {done:?}: {e:#}"));
        }
    }
    record.healed = started.elapsed();
    tokio::time::sleep(step.recover).await;
    record
}

async fn apply(bed: &mut Testbed, fault: Fault) -> anyhow::Result<(Applied, String)> {
    match fault.kind {
        FaultKind::KillNats | FaultKind::KillLeader | FaultKind::PauseNats => {
            let leader = bed.nats.leader(&bed.js, STREAM).await;
            let (server, why) = match (fault.kind, leader) {
                (FaultKind::KillLeader, Some(leader)) => (leader, "the stream's leader"),
                (FaultKind::KillLeader, None) => (fault.target, "no leader known"),
                (_, Some(leader)) if leader == fault.target => (fault.target, "the leader"),
                (_, Some(_)) => (fault.target, "a follower"),
                (_, None) => (fault.target, "no leader known"),
            };
            let peer = &mut bed.nats.peers[server];
            if peer.liveness() != Liveness::Running {
                anyhow::bail!("{} is not running", peer.name);
            }
            let what = format!("{} {} ({why})", fault.kind, peer.name);
            if fault.kind == FaultKind::PauseNats {
                peer.pause()?;
                return Ok((Applied::PausedNats(server), what));
            }
            peer.kill().await?;
            Ok((Applied::KilledNats(server), what))
        }
        FaultKind::KillNode => {
            bed.nodes.kill(fault.target).await?;
            Ok((Applied::KilledNode(fault.target), fault.to_string()))
        }
        FaultKind::Blackhole | FaultKind::CloseLink => {
            // The link the node's NATS client is connected through (its client shuffles the
            // servers of its `nats_url`), else its own server's, the first it lists.
            let node = fault.target;
            let servers = bed.nats.peers.len();
            let in_use = (0..servers)
                .filter(|s| {
                    bed.nodes
                        .link(node, *s)
                        .is_some_and(|l| l.connections() > 0)
                })
                .max_by_key(|s| {
                    bed.nodes
                        .link(node, *s)
                        .map(super::proxy::Link::connections)
                });
            let server = in_use.unwrap_or(node % servers);
            let link = bed
                .nodes
                .link(node, server)
                .ok_or_else(|| anyhow::anyhow!("no link node{node}→n{server}"))?;
            link.set(match fault.kind {
                FaultKind::Blackhole => LinkMode::Blackhole,
                _ => LinkMode::Close,
            });
            Ok((
                Applied::Link { node, server },
                format!("{} node{node}→n{server}", fault.kind),
            ))
        }
    }
}

async fn heal(bed: &mut Testbed, applied: Applied) -> anyhow::Result<()> {
    match applied {
        Applied::KilledNats(server) => bed.nats.peers[server].restart().await,
        Applied::PausedNats(server) => bed.nats.peers[server].resume(),
        Applied::KilledNode(node) => bed.nodes.restart(node).await,
        Applied::Link { node, server } => {
            if let Some(link) = bed.nodes.link(node, server) {
                link.set(LinkMode::Forward);
            }
            Ok(())
        }
    }
}

/// Heals whatever is still broken (a heal that failed during its step): every NATS server
/// running, every link forwarding, every node up. Returns what still failed.
pub async fn heal_all(bed: &mut Testbed) -> Vec<String> {
    let mut errors = Vec::new();
    for peer in &mut bed.nats.peers {
        let result = match peer.liveness() {
            Liveness::Running => Ok(()),
            Liveness::Paused => peer.resume(),
            Liveness::Dead => peer.restart().await,
        };
        if let Err(e) = result {
            errors.push(format!("heal {}: {e:#}", peer.name));
        }
    }
    bed.nodes.heal_links();
    for node in 0..bed.nodes.addrs.len() {
        if !bed.nodes.is_up(node) {
            if let Err(e) = bed.nodes.restart(node).await {
                errors.push(format!("heal node{node}: {e:#}"));
            }
        }
    }
    errors
}
