//! The report: one line per measurement as it ends, and the table of medians at the end.

use super::measure::Outcome;
use super::options::{Kind, Options, Peer, Runtimes, Workload};

pub(super) fn describe(workload: Workload, outcome: &Outcome) -> String {
    let t = &outcome.tally;
    let main = match workload.kind {
        Kind::Acks => format!("{:.0} batches/s", outcome.batches_per_s()),
        Kind::Bulk => format!("{:.0} events/s", outcome.events_per_s()),
        Kind::Latency => format!(
            "{:.0} acked/s of {} offered ({} unsent)",
            outcome.batches_per_s(),
            outcome.offered,
            outcome.unsent
        ),
    };
    let cpu = outcome
        .server_cores
        .map_or_else(|| "?".to_owned(), |c| format!("{c:.2}"));
    format!(
        "{main}; {} batches / {} events in {:.2} s; ack p50 {:.2} ms p99 {:.2} ms max {:.2} ms; \
         server cpu {cpu} cores; resent {} gaps {} fsync-acks {}",
        t.batches,
        t.events,
        outcome.elapsed.as_secs_f64(),
        outcome.ms(0.5),
        outcome.ms(0.99),
        outcome.max_ms(),
        t.resent,
        t.gaps,
        t.fsync_acks
    )
}

fn median(mut values: Vec<f64>) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    values.sort_by(f64::total_cmp);
    let mid = values.len() / 2;
    if values.len() % 2 == 1 {
        values[mid]
    } else {
        (values[mid - 1] + values[mid]) / 2.0
    }
}

/// Formats a figure compactly: thousands separated, or two decimals below 100.
fn figure(value: f64) -> String {
    if !value.is_finite() {
        return "-".to_owned();
    }
    if value.abs() < 100.0 {
        return format!("{value:.2}");
    }
    let digits = format!("{:.0}", value.abs());
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    if value < 0.0 {
        out.insert(0, '-');
    }
    out
}

/// A table row's name and how to read it off one outcome.
type Metric = (&'static str, fn(&Outcome) -> f64);

/// The table's rows: per workload, its metrics, each the median over the runs per peer.
fn rows(options: &Options, results: &[(Workload, Peer, Outcome)]) -> Vec<Row> {
    let mut rows: Vec<Row> = Vec::new();
    let column = |workload: &Workload, peer: Peer, f: fn(&Outcome) -> f64| {
        let values: Vec<f64> = results
            .iter()
            .filter(|(w, p, _)| w.kind == workload.kind && *p == peer)
            .map(|(_, _, o)| f(o))
            .collect();
        figure(median(values))
    };
    for workload in &options.workloads() {
        let label = workload.label(options.rate);
        let mut metrics: Vec<Metric> = match workload.kind {
            Kind::Acks => vec![
                ("batches/s", Outcome::batches_per_s),
                ("ack p99 ms", |o: &Outcome| o.ms(0.99)),
            ],
            Kind::Bulk => vec![
                ("events/s", Outcome::events_per_s),
                ("ack p99 ms", |o: &Outcome| o.ms(0.99)),
            ],
            Kind::Latency => vec![
                ("p50 ms", |o: &Outcome| o.ms(0.5)),
                ("p99 ms", |o: &Outcome| o.ms(0.99)),
                ("max ms", Outcome::max_ms),
                ("acked/s", Outcome::batches_per_s),
            ],
        };
        metrics.push(("server cpu cores", |o: &Outcome| {
            o.server_cores.unwrap_or(f64::NAN)
        }));
        for (i, (metric, f)) in metrics.into_iter().enumerate() {
            let name = if i == 0 { label.clone() } else { String::new() };
            let cells = options
                .peers()
                .iter()
                .map(|&peer| column(workload, peer, f))
                .collect();
            rows.push((name, metric, cells));
        }
    }
    rows
}

/// One table row: the workload's label (on its first row only), the metric, a cell per peer.
type Row = (String, &'static str, Vec<String>);

/// Prints the table of medians, then what the figures rest on.
pub(super) fn print_table(options: &Options, results: &[(Workload, Peer, Outcome)]) {
    let rows = rows(options, results);
    let label_width = rows.iter().map(|(n, _, _)| n.len()).max().unwrap_or(0);
    let metric_width = rows.iter().map(|(_, m, _)| m.len()).max().unwrap_or(0);
    let cell_width = 12;
    let mut header = format!("{:label_width$}  {:metric_width$}", "", "");
    for peer in &options.peers() {
        header.push_str(&format!("  {:>cell_width$}", peer.name()));
    }
    println!(
        "\ndurable ingest: medians of {} run(s), {} s per workload{}",
        options.runs,
        options.seconds,
        if options.pin.pin {
            ", server on CPU 0, bench on CPU 1"
        } else {
            ""
        }
    );
    println!("{header}");
    for (name, metric, cells) in rows {
        let mut line = format!("{name:label_width$}  {metric:metric_width$}");
        for cell in cells {
            line.push_str(&format!("  {cell:>cell_width$}"));
        }
        println!("{line}");
    }
    print_notes(options, results);
}

/// Prints, below the table, what the figures rest on: viewtape's runtimes and fsync acks,
/// the JetStream setup, and any batch the latency workload never got acked.
fn print_notes(options: &Options, results: &[(Workload, Peer, Outcome)]) {
    let resent: u64 = results.iter().map(|(_, _, o)| o.tally.resent).sum();
    let gaps: u64 = results.iter().map(|(_, _, o)| o.tally.gaps).sum();
    let unsent: u64 = results.iter().map(|(_, _, o)| o.unsent).sum();
    let (vt_acks, vt_fsync) = results
        .iter()
        .filter(|(_, p, _)| *p == Peer::Viewtape)
        .fold((0, 0), |(a, f), (_, _, o)| {
            (a + o.tally.batches, f + o.tally.fsync_acks)
        });
    if options.peers().contains(&Peer::Viewtape) {
        let durability = if vt_fsync == vt_acks {
            "every viewtape ack said durability=fsync".to_owned()
        } else if vt_fsync == 0 {
            "NO viewtape ack said durability=fsync: this server predates fsync acks, its figures are not durable ones".to_owned()
        } else {
            format!("only {vt_fsync} of {vt_acks} viewtape acks said durability=fsync")
        };
        let runtimes = match options.runtimes {
            Runtimes::PerProducer => {
                "one ticker runtime per producer (bench-p<i>), all into view prices"
            }
            Runtimes::Shared => "every producer into the demo runtime",
        };
        println!("viewtape: {runtimes}; {durability}; batches resent after a skip: {resent}, gaps reported: {gaps}");
    }
    if options.peers().contains(&Peer::JetStream) {
        println!("jetstream: nats-server with sync_interval: always (checked in /varz), file stream, 1 replica, {} client connection(s)", options.nats_connections);
    }
    if unsent > 0 {
        println!("latency: {unsent} scheduled batches were not acked within --drain-seconds");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn figures() {
        assert_eq!(figure(1234567.4), "1,234,567");
        assert_eq!(figure(12.345), "12.35");
        assert_eq!(figure(f64::NAN), "-");
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![4.0, 1.0]), 2.5);
    }
}
