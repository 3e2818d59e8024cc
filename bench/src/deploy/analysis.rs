//! What a deploy run's batches and deploys say: the batches split by whether a deploy was in
//! flight, the longest ack gaps, and the `deploy …` lines printed from them.

use std::time::Duration;

use super::{Batch, Deploy, Options, WARM_UP};
use crate::histogram::Histogram;

/// Ack latencies (µs) of one class of batches.
#[derive(Debug, Default)]
struct Class {
    latency: Histogram,
}

impl Class {
    fn record(&mut self, batch: &Batch) {
        self.latency
            .record(u64::try_from(batch.latency().as_micros()).unwrap_or(u64::MAX));
    }

    fn describe(&self) -> String {
        format!(
            "batches={} p50_ms={:.2} p99_ms={:.2} max_ms={:.2}",
            self.latency.samples(),
            self.latency.quantile(0.5) as f64 / 1000.0,
            self.latency.quantile(0.99) as f64 / 1000.0,
            self.latency.max() as f64 / 1000.0
        )
    }
}

/// The batches split by whether a deploy was in flight, and the longest ack gaps.
#[derive(Debug, Default)]
struct Analysis {
    /// Overlapping a deploy.
    during: Class,
    /// After the warm-up, overlapping none.
    quiet: Class,
    /// Per deploy: batches overlapping it, their largest latency, the longest ack gap.
    per_deploy: Vec<(u64, Duration, Duration)>,
    /// Longest gap between consecutive acks overlapping a deploy / after the warm-up, none.
    gap_during: Duration,
    gap_quiet: Duration,
}

fn analyse(batches: &[Batch], deploys: &[Deploy], warm_up: Duration) -> Analysis {
    let mut a = Analysis {
        per_deploy: vec![(0, Duration::ZERO, Duration::ZERO); deploys.len()],
        ..Analysis::default()
    };
    for batch in batches {
        let mut during = false;
        for (d, per) in deploys.iter().zip(a.per_deploy.iter_mut()) {
            if d.overlaps(batch.scheduled, batch.acked) {
                during = true;
                per.0 += 1;
                per.1 = per.1.max(batch.latency());
            }
        }
        if during {
            a.during.record(batch);
        } else if batch.scheduled >= warm_up {
            a.quiet.record(batch);
        }
    }
    let mut acks: Vec<Duration> = batches.iter().map(|b| b.acked).collect();
    acks.sort_unstable();
    for pair in acks.windows(2) {
        let (from, to) = (pair[0], pair[1]);
        let gap = to - from;
        let mut during = false;
        for (d, per) in deploys.iter().zip(a.per_deploy.iter_mut()) {
            if d.overlaps(from, to) {
                during = true;
                per.2 = per.2.max(gap);
            }
        }
        if during {
            a.gap_during = a.gap_during.max(gap);
        } else if from >= warm_up {
            a.gap_quiet = a.gap_quiet.max(gap);
        }
    }
    a
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Nearest-rank quantile of `values` (sorted here); NaN when empty.
fn quantile(values: &[f64], q: f64) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((q.clamp(0.0, 1.0) * sorted.len() as f64).ceil() as usize).max(1);
    sorted[rank - 1]
}

/// Prints one line per deploy, then the summary, the deploy latency, the ingest ack latency
/// without and with a deploy in flight, and the longest ack gaps.
pub(super) fn print_report(
    options: &Options,
    batches: &[Batch],
    deploys: &[Deploy],
    scheduled_for: Duration,
    drain_s: f64,
) {
    let a = analyse(batches, deploys, WARM_UP);
    let resent: u64 = batches.iter().map(|b| u64::from(b.resent)).sum();
    for (i, (d, per)) in deploys.iter().zip(&a.per_deploy).enumerate() {
        println!(
            "deploy n={} deploy_ms={:.1} position={} module={} batches_during={} \
             ack_max_ms={:.2} max_ack_gap_ms={:.2}",
            i + 1,
            ms(d.end - d.start),
            d.position,
            d.module,
            per.0,
            ms(per.1),
            ms(per.2)
        );
    }
    let latencies: Vec<f64> = deploys.iter().map(|d| ms(d.end - d.start)).collect();
    println!(
        "deploy summary: deploys={} rate={} connections={} batches={} resent={resent} \
         run_s={:.1} drain_s={drain_s:.3}",
        deploys.len(),
        options.rate,
        options.connections,
        batches.len(),
        scheduled_for.as_secs_f64()
    );
    println!(
        "deploy latency: p50_ms={:.1} max_ms={:.1}",
        quantile(&latencies, 0.5),
        quantile(&latencies, 1.0)
    );
    println!(
        "ingest quiet (no deploy in flight, after warm-up): {}",
        a.quiet.describe()
    );
    println!("ingest during deploys: {}", a.during.describe());
    println!(
        "longest ack gap: during_deploys_ms={:.2} quiet_ms={:.2}",
        ms(a.gap_during),
        ms(a.gap_quiet)
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(ms: u64) -> Duration {
        Duration::from_millis(ms)
    }

    #[test]
    fn splits_batches_and_gaps_by_deploy() {
        let deploys = vec![Deploy {
            start: d(3000),
            end: d(3100),
            position: 1,
            module: "m".to_owned(),
        }];
        let batch = |s, a| Batch {
            scheduled: d(s),
            acked: d(a),
            resent: 0,
        };
        let batches = vec![
            batch(1000, 1001), // warm-up: neither class
            batch(2500, 2502),
            batch(2990, 2995),
            batch(3050, 3150), // in flight during the deploy
            batch(3200, 3204),
        ];
        let a = analyse(&batches, &deploys, d(2000));
        assert_eq!(a.during.latency.samples(), 1);
        assert_eq!(a.during.latency.max(), 100_000);
        assert_eq!(a.quiet.latency.samples(), 3);
        assert_eq!(a.quiet.latency.max(), 5_000);
        assert_eq!(a.per_deploy, vec![(1, d(100), d(155))]);
        assert_eq!(a.gap_during, d(155));
        assert_eq!(a.gap_quiet, d(493));
    }

    #[test]
    fn quantiles() {
        assert!((quantile(&[3.0, 1.0, 2.0], 0.5) - 2.0).abs() < 1e-12);
        assert!((quantile(&[3.0, 1.0, 2.0], 1.0) - 3.0).abs() < 1e-12);
        assert!(quantile(&[], 0.5).is_nan());
    }
}
