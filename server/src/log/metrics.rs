//! The log's metrics: what `/metrics` renders of the log and of a cluster's stream.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use viewtape_snapshots::log::{GroupWritten, Observer};

use super::check::Checked;
use super::{gauge, Break};

/// The kinds of records a cluster's node counts; `batches` are several batches a node gathered
/// into one message, `passed_over` records of a runtime this node does not run.
pub const RECORD_KINDS: [&str; 8] = [
    "batch",
    "batches",
    "deploy",
    "define",
    "retire",
    "restore",
    "foreign",
    "passed_over",
];

/// The log's metrics, kept up to date by the log; `/metrics` renders them.
#[derive(Clone, Debug)]
pub struct LogMetrics {
    /// The last durable position.
    pub position: Gauge,
    /// Bytes in the log's segments.
    pub bytes: Gauge,
    /// Segment files.
    pub segments: Gauge,
    /// Records appended.
    pub records: Counter,
    /// Group commits synced to the device.
    pub fsyncs: Counter,
    /// How long each sync took.
    pub fsync_seconds: Histogram,
    /// Records replayed at start.
    pub replayed: Counter,
    /// Bytes of torn tails cut at start.
    pub repaired_bytes: Counter,
    /// Times continuity broke and a fresh epoch was taken, by cause.
    pub fail_closed: Family<[(&'static str, &'static str); 1], Counter>,
    /// Files of another history set aside at start, by kind (segment, snapshot, watermark).
    pub foreign: Family<[(&'static str, &'static str); 1], Counter>,
    /// On a cluster: the last stream sequence this node applied.
    pub applied: Gauge,
    /// On a cluster: the stream's last sequence, as last seen.
    pub stream_last: Gauge,
    /// On a cluster: sequences the stream holds that this node has not applied.
    pub apply_lag_sequences: Gauge,
    /// On a cluster: how long ago the last applied record was published.
    pub apply_lag_seconds: Gauge<f64, std::sync::atomic::AtomicU64>,
    /// On a cluster: records applied, by kind (one of [`RECORD_KINDS`]).
    pub records_by_kind: Family<[(&'static str, &'static str); 1], Counter>,
    /// On a cluster: 1 for each task whose lease this node holds (the demo feed, a file source).
    pub leases_held: Family<[(&'static str, String); 1], Gauge>,
    /// On a cluster: checks of what this node applied against the other nodes, by outcome
    /// ([`Checked::OUTCOMES`]).
    pub checks: Family<[(&'static str, &'static str); 1], Counter>,
}

impl Default for LogMetrics {
    fn default() -> Self {
        let fail_closed = Family::<[(&'static str, &'static str); 1], Counter>::default();
        // Present from the start, at 0, so that a dashboard sees every cause and kind.
        for cause in Break::ALL {
            drop(fail_closed.get_or_create(&[("cause", cause.as_str())]));
        }
        let foreign = Family::<[(&'static str, &'static str); 1], Counter>::default();
        for kind in ["segment", "snapshot", "watermark"] {
            drop(foreign.get_or_create(&[("kind", kind)]));
        }
        let records_by_kind = Family::<[(&'static str, &'static str); 1], Counter>::default();
        for kind in RECORD_KINDS {
            drop(records_by_kind.get_or_create(&[("kind", kind)]));
        }
        let checks = Family::<[(&'static str, &'static str); 1], Counter>::default();
        for outcome in Checked::OUTCOMES {
            drop(checks.get_or_create(&[("outcome", outcome)]));
        }
        Self {
            checks,
            foreign,
            position: Gauge::default(),
            bytes: Gauge::default(),
            segments: Gauge::default(),
            records: Counter::default(),
            fsyncs: Counter::default(),
            // 50 µs … ~1.6 s.
            fsync_seconds: Histogram::new(exponential_buckets(0.000_05, 2.0, 16)),
            replayed: Counter::default(),
            repaired_bytes: Counter::default(),
            fail_closed,
            applied: Gauge::default(),
            stream_last: Gauge::default(),
            apply_lag_sequences: Gauge::default(),
            apply_lag_seconds: Gauge::default(),
            records_by_kind,
            leases_held: Family::default(),
        }
    }
}

impl LogMetrics {
    /// Counts a record a cluster's node applied, of `kind` (one of [`RECORD_KINDS`]).
    pub fn counted_record(&self, kind: &'static str) {
        debug_assert!(RECORD_KINDS.contains(&kind));
        self.records_by_kind.get_or_create(&[("kind", kind)]).inc();
    }

    /// Counts a check of what this node applied.
    pub fn checked(&self, checked: &Checked) {
        self.checks
            .get_or_create(&[("outcome", checked.as_str())])
            .inc();
    }

    /// Counts a break of continuity.
    pub fn failed_closed(&self, cause: Break) {
        self.fail_closed
            .get_or_create(&[("cause", cause.as_str())])
            .inc();
    }

    /// Counts a file of another history set aside.
    pub fn foreign(&self, kind: &'static str) {
        self.foreign.get_or_create(&[("kind", kind)]).inc();
    }

    pub(super) fn observer(&self) -> Observer {
        let metrics = self.clone();
        Box::new(move |group: GroupWritten| {
            metrics.records.inc_by(group.records);
            metrics.bytes.inc_by(gauge(group.bytes));
            metrics.position.set(gauge(group.next.prev().get()));
            if group.new_segment {
                metrics.segments.inc();
            }
            if let Some(sync) = group.sync {
                metrics.fsyncs.inc();
                metrics.fsync_seconds.observe(sync.as_secs_f64());
            }
        })
    }
}
