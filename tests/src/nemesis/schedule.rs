//! The fault schedule: from a seed, a list of steps, each one or two faults held a few seconds
//! and then healed, with time to recover before the next. The same seed and duration give the
//! same schedule; what the cluster does under it (who leads the stream when the leader is
//! killed) is the run's own.

use std::fmt;
use std::time::Duration;

use anyhow::bail;

use super::prng::Prng;

/// The kinds of fault, as `VIEWTAPE_NEMESIS_FAULTS` names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum FaultKind {
    /// `kill -9` of a NATS server, then a restart on its ports and store.
    KillNats,
    /// `kill -9` of the server leading the stream (whichever it is then), then a restart.
    KillLeader,
    /// `SIGSTOP` of a NATS server, then `SIGCONT`.
    PauseNats,
    /// `kill -9` of a viewtape node, then a restart on its data directory and port.
    KillNode,
    /// A node's link to its own NATS server stops forwarding, connections left open; healed.
    Blackhole,
    /// A node's link to its own NATS server drops its connections and refuses new ones; healed.
    CloseLink,
}

impl FaultKind {
    /// Every kind, in the order of the report.
    pub const ALL: [Self; 6] = [
        Self::KillNats,
        Self::KillLeader,
        Self::PauseNats,
        Self::KillNode,
        Self::Blackhole,
        Self::CloseLink,
    ];

    /// Its name in `VIEWTAPE_NEMESIS_FAULTS` and the report.
    pub fn name(self) -> &'static str {
        match self {
            Self::KillNats => "kill-nats",
            Self::KillLeader => "kill-leader",
            Self::PauseNats => "pause-nats",
            Self::KillNode => "kill-node",
            Self::Blackhole => "blackhole",
            Self::CloseLink => "close-link",
        }
    }

    /// Whether it takes a NATS server away (at most one such fault at a time: two of three
    /// would take the stream's quorum, which is unavailability by design, not a finding).
    pub fn takes_nats(self) -> bool {
        matches!(self, Self::KillNats | Self::KillLeader | Self::PauseNats)
    }

    /// Whether it breaks a node's link to NATS.
    pub fn is_link(self) -> bool {
        matches!(self, Self::Blackhole | Self::CloseLink)
    }

    /// The kinds a comma-separated list names (`all` or empty: every kind).
    ///
    /// # Errors
    /// On an unknown name.
    pub fn parse_list(text: &str) -> anyhow::Result<Vec<Self>> {
        let text = text.trim();
        if text.is_empty() || text == "all" {
            return Ok(Self::ALL.to_vec());
        }
        let mut kinds = Vec::new();
        for name in text.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            let Some(kind) = Self::ALL.into_iter().find(|k| k.name() == name) else {
                let known: Vec<_> = Self::ALL.iter().map(|k| k.name()).collect();
                bail!("unknown fault kind {name:?}; known: {}", known.join(", "));
            };
            if !kinds.contains(&kind) {
                kinds.push(kind);
            }
        }
        Ok(kinds)
    }
}

impl fmt::Display for FaultKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One fault: its kind and its target, a NATS server's or a node's index (for
/// [`FaultKind::KillLeader`], the server is found when the fault starts).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fault {
    /// What is done.
    pub kind: FaultKind,
    /// To which server (NATS faults) or node (node and link faults).
    pub target: usize,
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.kind {
            FaultKind::KillLeader => f.write_str("kill-leader"),
            FaultKind::KillNats | FaultKind::PauseNats => {
                write!(f, "{} n{}", self.kind, self.target)
            }
            _ => write!(f, "{} node{}", self.kind, self.target),
        }
    }
}

/// One step: faults applied together, held, healed together, then time to recover.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    /// One or two faults.
    pub faults: Vec<Fault>,
    /// How long they last.
    pub hold: Duration,
    /// The quiet after healing, before the next step.
    pub recover: Duration,
}

impl Step {
    /// The step's kind as the report groups it: one fault's kind, or two joined by `+`.
    pub fn label(&self) -> String {
        let mut kinds: Vec<_> = self.faults.iter().map(|f| f.kind.name()).collect();
        kinds.sort_unstable();
        kinds.join("+")
    }
}

/// Hold bounds, in milliseconds.
const HOLD_MS: (u64, u64) = (2_000, 6_000);
/// Recovery bounds, in milliseconds.
const RECOVER_MS: (u64, u64) = (3_000, 8_000);
/// One step in this many has two faults at once.
const DOUBLE_ONE_IN: u64 = 4;

/// The steps for `seed` that fill `duration` (each step's hold and recovery counted), drawing
/// from `kinds` over `servers` NATS servers and `nodes` viewtape nodes. Each step's first fault
/// comes from a shuffled bag of the kinds, refilled when empty, so that a short run still
/// meets every kind; a second fault, when there is one, is any kind.
pub fn plan(
    seed: u64,
    duration: Duration,
    kinds: &[FaultKind],
    servers: usize,
    nodes: usize,
) -> Vec<Step> {
    let mut rng = Prng::new(seed);
    let mut steps = Vec::new();
    let mut planned = Duration::ZERO;
    let mut bag: Vec<FaultKind> = Vec::new();
    let target = |rng: &mut Prng, kind: FaultKind| Fault {
        kind,
        target: if kind.takes_nats() {
            rng.index(servers)
        } else {
            rng.index(nodes)
        },
    };
    // Bounded: every step takes at least the shortest hold and recovery.
    while planned < duration && steps.len() < 100_000 && !kinds.is_empty() {
        if bag.is_empty() {
            bag = kinds.to_vec();
            // Fisher–Yates.
            for i in (1..bag.len()).rev() {
                bag.swap(i, rng.index(i + 1));
            }
        }
        let Some(kind) = bag.pop() else { break };
        let first = target(&mut rng, kind);
        let mut faults = vec![first];
        if rng.one_in(DOUBLE_ONE_IN) {
            let kind = kinds[rng.index(kinds.len())];
            let second = target(&mut rng, kind);
            let both_nats = first.kind.takes_nats() && second.kind.takes_nats();
            // Two faults of one node's links would both hit the link it uses: one at a time.
            let same = second.target == first.target
                && (second.kind == first.kind || (first.kind.is_link() && second.kind.is_link()));
            if !both_nats && !same {
                faults.push(second);
            }
        }
        let hold = Duration::from_millis(rng.between(HOLD_MS.0, HOLD_MS.1));
        let recover = Duration::from_millis(rng.between(RECOVER_MS.0, RECOVER_MS.1));
        planned += hold + recover;
        steps.push(Step {
            faults,
            hold,
            recover,
        });
    }
    steps
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_names_one_schedule_that_never_takes_two_nats_servers() {
        let a = plan(42, Duration::from_secs(600), &FaultKind::ALL, 3, 3);
        assert_eq!(a, plan(42, Duration::from_secs(600), &FaultKind::ALL, 3, 3));
        assert_ne!(a, plan(43, Duration::from_secs(600), &FaultKind::ALL, 3, 3));
        assert!(a.iter().any(|s| s.faults.len() == 2));
        for step in &a {
            assert!(
                step.faults.iter().filter(|f| f.kind.takes_nats()).count() <= 1,
                "{step:?}"
            );
        }
        let short = plan(19, Duration::from_secs(60), &FaultKind::ALL, 3, 3);
        for kind in FaultKind::ALL {
            assert!(
                short.iter().any(|s| s.faults[0].kind == kind),
                "{kind} in {short:?}"
            );
        }
        let only = plan(1, Duration::from_secs(60), &[FaultKind::KillNode], 3, 3);
        assert!(only
            .iter()
            .flat_map(|s| &s.faults)
            .all(|f| f.kind == FaultKind::KillNode));
        assert_eq!(
            FaultKind::parse_list("kill-node, blackhole").ok(),
            Some(vec![FaultKind::KillNode, FaultKind::Blackhole])
        );
        assert!(FaultKind::parse_list("nope").is_err());
        assert_eq!(
            FaultKind::parse_list("").ok(),
            Some(FaultKind::ALL.to_vec())
        );
    }
}
