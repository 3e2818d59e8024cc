//! Counters for `GET /metrics`, rendered in the Prometheus text format.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Mutex;

use crate::hub::Hub;
use crate::runtime::RuntimeHandle;

/// Server-level counters. Journal and runtime counters are read from their
/// owners when rendering.
#[derive(Debug, Default)]
pub struct Metrics {
    /// Open SSE connections.
    pub connections: AtomicI64,
    /// SSE connections refused at the connection limit.
    pub connections_refused: AtomicU64,
    /// Frames written to subscribers.
    pub delivered: AtomicU64,
    /// Streams that resumed from a valid cursor.
    pub resumes: AtomicU64,
    /// Streams that started from the view's state (no cursor).
    pub state_starts: AtomicU64,
    resets: Mutex<BTreeMap<&'static str, u64>>,
    /// Ingest batches accepted.
    pub ingest_accepted: AtomicU64,
    /// Ingest batches rejected (guest refused or failed, body too large).
    pub ingest_rejected: AtomicU64,
}

impl Metrics {
    /// Counts a reset by reason.
    pub fn count_reset(&self, reason: &'static str) {
        let mut resets = self
            .resets
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        *resets.entry(reason).or_default() += 1;
    }

    /// The Prometheus text exposition of every counter.
    pub fn render(&self, hub: &Hub, runtimes: &[RuntimeHandle]) -> String {
        let mut out = String::with_capacity(4096);
        let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
        gauge(
            &mut out,
            "viewtape_sse_connections",
            "Open SSE connections.",
            self.connections.load(Ordering::Relaxed),
        );
        counter(
            &mut out,
            "viewtape_sse_connections_refused_total",
            "SSE connections refused at the limit.",
            load(&self.connections_refused),
        );
        counter(
            &mut out,
            "viewtape_events_published_total",
            "Events published to views.",
            load(&hub.stats().published),
        );
        counter(
            &mut out,
            "viewtape_events_cursorless_total",
            "Events published without a cursor (journal sealed or disabled).",
            load(&hub.stats().cursorless),
        );
        counter(
            &mut out,
            "viewtape_events_delivered_total",
            "Frames written to SSE subscribers.",
            load(&self.delivered),
        );

        header(&mut out, "viewtape_streams_total", "SSE streams by how they started: resumed from a cursor, from state, or reset (by reason).", "counter");
        let _ = writeln!(
            out,
            "viewtape_streams_total{{outcome=\"resumed\"}} {}",
            load(&self.resumes)
        );
        let _ = writeln!(
            out,
            "viewtape_streams_total{{outcome=\"state\"}} {}",
            load(&self.state_starts)
        );
        for (reason, count) in self
            .resets
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .iter()
        {
            let _ = writeln!(
                out,
                "viewtape_streams_total{{outcome=\"reset\",reason=\"{reason}\"}} {count}"
            );
        }

        header(
            &mut out,
            "viewtape_ingest_batches_total",
            "Ingest batches by result.",
            "counter",
        );
        let _ = writeln!(
            out,
            "viewtape_ingest_batches_total{{result=\"accepted\"}} {}",
            load(&self.ingest_accepted)
        );
        let _ = writeln!(
            out,
            "viewtape_ingest_batches_total{{result=\"rejected\"}} {}",
            load(&self.ingest_rejected)
        );

        let stats = hub.journal().stats();
        counter(
            &mut out,
            "viewtape_journal_appends_total",
            "Records appended (offsets issued).",
            stats.appends,
        );
        counter(
            &mut out,
            "viewtape_journal_cursorless_after_seal_total",
            "Appends refused because the journal was sealed.",
            stats.cursorless_after_seal,
        );
        counter(
            &mut out,
            "viewtape_journal_gaps_total",
            "Gaps marked.",
            stats.gaps_marked,
        );
        header(
            &mut out,
            "viewtape_journal_pruned_total",
            "Records pruned, by cause.",
            "counter",
        );
        for (cause, n) in [
            ("age", stats.pruned_age),
            ("count", stats.pruned_count),
            ("bytes", stats.pruned_bytes),
        ] {
            let _ = writeln!(
                out,
                "viewtape_journal_pruned_total{{cause=\"{cause}\"}} {n}"
            );
        }
        header(
            &mut out,
            "viewtape_journal_replays_total",
            "Journal replays, by outcome.",
            "counter",
        );
        let _ = writeln!(
            out,
            "viewtape_journal_replays_total{{outcome=\"served\"}} {}",
            stats.replays_served
        );
        for (reason, n) in [
            ("disabled", stats.replays_refused_disabled),
            ("stale_epoch", stats.replays_refused_stale_epoch),
            ("ahead", stats.replays_refused_ahead),
            ("expired", stats.replays_refused_expired),
            ("gap", stats.replays_refused_gap),
        ] {
            let _ = writeln!(
                out,
                "viewtape_journal_replays_total{{outcome=\"refused\",reason=\"{reason}\"}} {n}"
            );
        }

        header(
            &mut out,
            "viewtape_runtime_batches_total",
            "Batches committed per runtime.",
            "counter",
        );
        for runtime in runtimes {
            let _ = writeln!(
                out,
                "viewtape_runtime_batches_total{{runtime=\"{}\"}} {}",
                runtime.name(),
                load(&runtime.stats().batches)
            );
        }
        header(
            &mut out,
            "viewtape_runtime_guest_failures_total",
            "Batches a guest failed (trap, timeout, memory, rejection).",
            "counter",
        );
        for runtime in runtimes {
            let _ = writeln!(
                out,
                "viewtape_runtime_guest_failures_total{{runtime=\"{}\"}} {}",
                runtime.name(),
                load(&runtime.stats().failures)
            );
        }
        header(
            &mut out,
            "viewtape_runtime_restarts_total",
            "Guest instances re-created after a failure.",
            "counter",
        );
        for runtime in runtimes {
            let _ = writeln!(
                out,
                "viewtape_runtime_restarts_total{{runtime=\"{}\"}} {}",
                runtime.name(),
                load(&runtime.stats().restarts)
            );
        }
        header(
            &mut out,
            "viewtape_runtime_gaps_total",
            "Gaps reported by guests or lost pull-source batches.",
            "counter",
        );
        for runtime in runtimes {
            let _ = writeln!(
                out,
                "viewtape_runtime_gaps_total{{runtime=\"{}\"}} {}",
                runtime.name(),
                load(&runtime.stats().gaps)
            );
        }

        header(
            &mut out,
            "viewtape_view_retained_records",
            "Records retained per view.",
            "gauge",
        );
        for (view, n) in hub.journal().entry_counts_now() {
            let _ = writeln!(out, "viewtape_view_retained_records{{view=\"{view}\"}} {n}");
        }
        out
    }
}

fn header(out: &mut String, name: &str, help: &str, kind: &str) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
}

fn counter(out: &mut String, name: &str, help: &str, value: u64) {
    header(out, name, help, "counter");
    let _ = writeln!(out, "{name} {value}");
}

fn gauge(out: &mut String, name: &str, help: &str, value: i64) {
    header(out, name, help, "gauge");
    let _ = writeln!(out, "{name} {value}");
}
