//! The checker: what the producers were told, what the readers were served and what each node's
//! tape holds, held to DESIGN §19's invariants, and the report table.
//!
//! - every acknowledged batch is on every node's tape exactly once, its lines together, and a
//!   producer's batches in the order they were acknowledged;
//! - the tapes are identical frame for frame (ids and data), and every frame a reader was
//!   served is the tape's frame under that id;
//! - no reader that kept its cursor got a `reset`, or a frame twice, or skipped one;
//! - how long ingest was refused after each fault, by kind (reported, not judged).

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::time::Duration;

use super::faults::StepRecord;
use super::producer::ProducerLog;
use super::reader::ReaderLog;

/// A tape as read from a node: (id, data) per frame, or why it could not be read.
pub type Tape = Result<Vec<(String, String)>, String>;

/// Everything a run produced, for [`Report::new`].
#[derive(Debug)]
pub struct Observed {
    /// The seed.
    pub seed: u64,
    /// The fault phase's length.
    pub duration: Duration,
    /// The whole run's length, since the workload began.
    pub elapsed: Duration,
    /// The steps as they ran.
    pub steps: Vec<StepRecord>,
    /// Each producer's log.
    pub producers: Vec<ProducerLog>,
    /// Each reader's log.
    pub readers: Vec<ReaderLog>,
    /// Each node's tape after convergence.
    pub tapes: Vec<Tape>,
    /// What did not converge (a node not ready, not caught up), and the harness's own trouble.
    pub unsettled: Vec<String>,
}

/// The verdict.
#[derive(Debug, Default)]
pub struct Report {
    header: String,
    /// Steps per kind, and each step's longest refusal (`true`: it had not ended by the run's end).
    by_kind: BTreeMap<String, Vec<(Duration, bool)>>,
    /// One line per step: when, what, its longest refusal.
    steps: Vec<String>,
    acknowledged: usize,
    frames: usize,
    duplicate_answers: usize,
    /// The invariants' failures, by name, each with its instances.
    failures: BTreeMap<&'static str, Vec<String>>,
    /// Resets by reason (all of them, also those that are failures).
    reset_reasons: BTreeMap<String, usize>,
    notes: Vec<String>,
}

/// `p0-12-3` → (`p0`, 12, 3).
fn parse_key(data: &str) -> Option<(String, u64, u64)> {
    let value: serde_json::Value = serde_json::from_str(data).ok()?;
    let key = value["key"].as_str()?;
    let mut parts = key.rsplitn(3, '-');
    let line = parts.next()?.parse().ok()?;
    let seq = parts.next()?.parse().ok()?;
    Some((parts.next()?.to_owned(), seq, line))
}

fn median(sorted: &[Duration]) -> Duration {
    // The lower median: of two steps, the shorter, so one outlier does not pass for typical.
    sorted
        .get(sorted.len().saturating_sub(1) / 2)
        .copied()
        .unwrap_or_default()
}

impl Report {
    /// Checks `observed`.
    pub fn new(observed: &Observed) -> Self {
        let mut report = Self {
            header: format!(
                "nemesis: seed {} · faults for {:?} · run {:.0?} · {} steps · {} producers · {} readers",
                observed.seed,
                observed.duration,
                observed.elapsed,
                observed.steps.len(),
                observed.producers.len(),
                observed.readers.len()
            ),
            ..Self::default()
        };
        report.refusals(observed);
        report.batches(observed);
        report.tapes(observed);
        report.readers(observed);
        for step in &observed.steps {
            for error in &step.errors {
                report.fail("harness", format!("at {:.1?}: {error}", step.started));
            }
        }
        for note in &observed.unsettled {
            report.fail("unsettled", note.clone());
        }
        for producer in &observed.producers {
            for anomaly in &producer.anomalies {
                report.fail("refused for good", format!("{}: {anomaly}", producer.id));
            }
        }
        report
    }

    fn fail(&mut self, invariant: &'static str, what: String) {
        self.failures.entry(invariant).or_default().push(what);
    }

    /// The names of the invariants that failed, each with its count; empty when all held.
    pub fn failures(&self) -> Vec<String> {
        self.failures
            .iter()
            .map(|(name, all)| format!("{name}: {}", all.len()))
            .collect()
    }

    /// Each step's longest refusal: of the refusals that began while it lasted or recovered.
    fn refusals(&mut self, observed: &Observed) {
        let windows: Vec<_> = observed
            .producers
            .iter()
            .flat_map(|p| &p.refusals)
            .map(|r| {
                let end = r.to.unwrap_or(observed.elapsed);
                (
                    r.failed_at,
                    end.saturating_sub(r.from),
                    r.to.is_none(),
                    r.first.as_str(),
                )
            })
            .collect();
        let first = observed
            .steps
            .first()
            .map_or(observed.elapsed, |s| s.started);
        let before: Vec<_> = windows
            .iter()
            .filter(|w| w.0 < first)
            .map(|w| (w.1, w.2))
            .collect();
        if !before.is_empty() {
            let longest = before.iter().copied().max().unwrap_or_default();
            self.by_kind
                .entry("(before any fault)".into())
                .or_default()
                .push(longest);
        }
        for (i, step) in observed.steps.iter().enumerate() {
            let end = observed
                .steps
                .get(i + 1)
                .map_or(Duration::MAX, |s| s.started);
            let worst = windows
                .iter()
                .filter(|w| w.0 >= step.started && w.0 < end)
                .max_by_key(|w| (w.1, w.2));
            let longest = worst.map(|w| (w.1, w.2)).unwrap_or_default();
            self.steps.push(format!(
                "| {:.1} s | {} | {:.1} s | {:.1} s{} | {} |",
                step.started.as_secs_f64(),
                step.faults.join(" + "),
                step.healed.saturating_sub(step.started).as_secs_f64(),
                longest.0.as_secs_f64(),
                if longest.1 { " (never ended)" } else { "" },
                worst.map_or("", |w| w.3),
            ));
            self.by_kind
                .entry(step.label.clone())
                .or_default()
                .push(longest);
        }
    }

    /// Acknowledged batches against every node's tape.
    fn batches(&mut self, observed: &Observed) {
        for producer in &observed.producers {
            self.acknowledged += producer.acks.len();
            self.duplicate_answers += producer.acks.iter().filter(|a| a.duplicate).count();
            self.frames += producer.acks.iter().map(|a| a.lines).sum::<u64>() as usize;
        }
        for (node, tape) in observed.tapes.iter().enumerate() {
            let Ok(tape) = tape else { continue };
            // (producer, seq) → (line → indexes on the tape)
            let mut at: HashMap<(String, u64), BTreeMap<u64, Vec<usize>>> = HashMap::new();
            for (index, (id, data)) in tape.iter().enumerate() {
                match parse_key(data) {
                    Some((p, seq, line)) => at
                        .entry((p, seq))
                        .or_default()
                        .entry(line)
                        .or_default()
                        .push(index),
                    None => self.fail(
                        "foreign frames",
                        format!("node{node} #{index} {id}: {data}"),
                    ),
                }
            }
            for producer in &observed.producers {
                let mut last_index = None;
                for ack in &producer.acks {
                    let lines = at
                        .remove(&(producer.id.clone(), ack.seq))
                        .unwrap_or_default();
                    let first = lines.get(&0).and_then(|v| v.first()).copied();
                    let present = (0..ack.lines).filter(|l| lines.contains_key(l)).count() as u64;
                    if present < ack.lines {
                        self.fail("lost", format!(
                            "node{node}: {}-{} (acked at {:.1?} by node{} at position {:?}) has {present} of {} lines",
                            producer.id, ack.seq, ack.at, ack.node, ack.position, ack.lines
                        ));
                    }
                    if lines.values().any(|v| v.len() > 1) {
                        self.fail(
                            "duplicated",
                            format!(
                                "node{node}: {}-{} appears {:?}",
                                producer.id, ack.seq, lines
                            ),
                        );
                    }
                    let together = lines.values().flatten().copied().collect::<Vec<_>>();
                    let apart = together.windows(2).any(|w| w[1] != w[0] + 1);
                    let early = matches!((last_index, first), (Some(l), Some(f)) if f < l);
                    if apart || early {
                        self.fail("disordered", format!(
                            "node{node}: {}-{} at {together:?}, after a later batch at {last_index:?}", producer.id, ack.seq
                        ));
                    }
                    last_index = first.or(last_index);
                }
            }
            // What is left was never acknowledged: allowed once (its outcome was unknown).
            for ((p, seq), lines) in at {
                let unacked = observed
                    .producers
                    .iter()
                    .any(|pr| pr.id == p && pr.unacked.is_some_and(|u| u.0 == seq));
                if lines.values().any(|v| v.len() > 1) {
                    self.fail(
                        "duplicated",
                        format!("node{node}: unacknowledged {p}-{seq} appears {lines:?}"),
                    );
                } else if !unacked {
                    self.fail(
                        "phantom",
                        format!("node{node}: {p}-{seq} was never sent as such"),
                    );
                }
            }
        }
    }

    /// The tapes, frame for frame against the first readable one.
    fn tapes(&mut self, observed: &Observed) {
        let mut reference: Option<(usize, &Vec<(String, String)>)> = None;
        for (node, tape) in observed.tapes.iter().enumerate() {
            match tape {
                Err(e) => self.fail("diverged", format!("node{node}: tape unreadable: {e}")),
                Ok(tape) => match reference {
                    None => reference = Some((node, tape)),
                    Some((first, reference)) => {
                        if let Some(i) = (0..tape.len().max(reference.len()))
                            .find(|&i| tape.get(i) != reference.get(i))
                        {
                            self.fail("diverged", format!(
                                "node{node} ({} frames) differs from node{first} ({} frames) at frame {i}: {:?} vs {:?}",
                                tape.len(), reference.len(), tape.get(i), reference.get(i)
                            ));
                        }
                    }
                },
            }
        }
        self.notes.push(format!(
            "tapes: {}",
            observed
                .tapes
                .iter()
                .map(|t| t
                    .as_ref()
                    .map_or("unreadable".into(), |t| format!("{} frames", t.len())))
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }

    /// What the readers were served, against the tape.
    fn readers(&mut self, observed: &Observed) {
        let tape: HashMap<&str, &str> = observed
            .tapes
            .iter()
            .find_map(|t| t.as_ref().ok())
            .map(|t| {
                t.iter()
                    .map(|(id, data)| (id.as_str(), data.as_str()))
                    .collect()
            })
            .unwrap_or_default();
        for reader in &observed.readers {
            for reset in &reader.resets {
                let reason = serde_json::from_str::<serde_json::Value>(&reset.data)
                    .ok()
                    .and_then(|d| d["reason"].as_str().map(str::to_owned))
                    .unwrap_or_else(|| "?".into());
                *self.reset_reasons.entry(reason).or_default() += 1;
                if reset.cursor.is_some() {
                    self.fail(
                        "reset",
                        format!(
                            "{} at {:.1?} by node{} resuming {:?}: {}",
                            reader.id, reset.at, reset.node, reset.cursor, reset.data
                        ),
                    );
                }
            }
            for gap in &reader.breaks {
                self.fail("reader break", format!("{}: {gap}", reader.id));
            }
            for (id, data) in &reader.frames {
                if !tape.is_empty() && tape.get(id.as_str()) != Some(&data.as_str()) {
                    self.fail(
                        "diverged",
                        format!(
                            "{} was served {id} {data}, the tape has {:?}",
                            reader.id,
                            tape.get(id.as_str())
                        ),
                    );
                }
            }
            self.notes.push(format!(
                "{}: {} frames in {} sessions, {} failed opens",
                reader.id,
                reader.frames.len(),
                reader.sessions,
                reader.failed_opens
            ));
        }
    }
}

/// How many instances of each failure the report lists.
const SHOWN: usize = 8;

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{}", self.header)?;
        writeln!(
            f,
            "| at | faults | held | longest refusal after | its first failure |"
        )?;
        writeln!(f, "|---:|---|---:|---:|---|")?;
        for step in &self.steps {
            writeln!(f, "{step}")?;
        }
        writeln!(f, "| fault kind | steps | refused: median | refused: max |")?;
        writeln!(f, "|---|---:|---:|---:|")?;
        for (kind, steps) in &self.by_kind {
            let mut spans: Vec<_> = steps.iter().map(|s| s.0).collect();
            spans.sort_unstable();
            let open = if steps.iter().any(|s| s.1) {
                " (never ended)"
            } else {
                ""
            };
            writeln!(
                f,
                "| {kind} | {} | {:.1} s | {:.1} s{open} |",
                steps.len(),
                median(&spans).as_secs_f64(),
                spans.last().copied().unwrap_or_default().as_secs_f64()
            )?;
        }
        let count = |name: &str| self.failures.get(name).map_or(0, Vec::len);
        writeln!(
            f,
            "acknowledged batches: {} ({} frames; {} answered as duplicates) · lost: {} · duplicated: {} · \
             disordered: {} · diverged: {} · resets: {} of held cursors ({:?}) · reader breaks: {}",
            self.acknowledged,
            self.frames,
            self.duplicate_answers,
            count("lost"),
            count("duplicated"),
            count("disordered"),
            count("diverged"),
            count("reset"),
            self.reset_reasons,
            count("reader break"),
        )?;
        for note in &self.notes {
            writeln!(f, "  {note}")?;
        }
        for (name, all) in &self.failures {
            writeln!(f, "FAILED {name}: {}", all.len())?;
            for what in all.iter().take(SHOWN) {
                writeln!(f, "  - {what}")?;
            }
            if all.len() > SHOWN {
                writeln!(f, "  … and {} more", all.len() - SHOWN)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_frame_names_its_batch() {
        let data = "{\"key\":\"p2-41-3\",\"value\":{\"p\":\"p2\",\"s\":41,\"i\":3}}";
        assert_eq!(parse_key(data), Some(("p2".into(), 41, 3)));
        assert_eq!(parse_key("{\"key\":\"x\"}"), None);
    }
}
