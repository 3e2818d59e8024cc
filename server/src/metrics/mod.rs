//! The metrics of `GET /metrics`, encoded by `prometheus-client` in the Prometheus text format
//! (version 0.0.4).
//!
//! Server-level counters are `prometheus-client` metrics kept here. Counters with another owner
//! (the hub's, the journal's, each runtime's) and the records each view retains are read from
//! that owner on every scrape by a collector registered next to them, so there is one registry
//! and one encoding, and nothing is copied between scrapes.
//!
//! Counters are registered without `_total`: the encoder appends it to counter names (and the
//! library refuses names that already end in it). The registry also appends a full stop to help
//! texts given to [`Registry::register`]; a collector writes its help texts as they are.
//!
//! | file | job |
//! |---|---|
//! | this one | [`Metrics`]: the server-level metrics, the one registry, the rendering |
//! | `server` | the server-level metrics registered, and the labels of a stream's start |
//! | `owners` | the collector that reads the hub's, the journal's and the runtimes' counters |
//! | `log` | the log's metrics and a cluster's, kept up to date by their owners, registered |

use std::fmt;
use std::sync::Arc;

use prometheus_client::encoding::prometheus_text;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::hub::Hub;
use crate::log::LogMetrics;
use crate::runtime::registry::Runtimes;

mod log;
mod owners;
mod server;

use self::log::register_log;
use owners::OwnerCounters;
pub use server::PassOutcomes;
use server::StreamStart;

/// Server-level metrics, and the registry that encodes them with the counters read from their
/// owners.
#[derive(Debug)]
pub struct Metrics {
    /// Open SSE connections.
    pub connections: Gauge,
    /// SSE connections refused at the connection limit.
    pub connections_refused: Counter,
    /// Frames written to subscribers.
    pub delivered: Counter,
    /// What views' passes did for their parked subscribers.
    pub pass: PassOutcomes,
    /// Streams that resumed from a valid cursor.
    pub resumes: Counter,
    /// Streams that started from the view's state (no cursor).
    pub state_starts: Counter,
    /// Ingest batches accepted.
    pub ingest_accepted: Counter,
    /// Ingest batches rejected (guest refused or failed, body too large).
    pub ingest_rejected: Counter,
    /// `viewtape_ready`: set by whoever renders the metrics, from what `/readyz` says.
    pub ready: Gauge,
    /// `viewtape_cluster_halted`, by `reason`: 1 for the kind of halt `/readyz` names, 0 for the
    /// others; set with [`Metrics::set_halt`] by whoever renders the metrics.
    halted: Family<[(&'static str, &'static str); 1], Gauge>,
    /// HTTP connections served by the lean transport.
    pub lean_connections: Counter,
    /// HTTP connections handed to hyper.
    pub hyper_connections: Counter,
    /// HTTP/2 connections (over TLS, served by hyper).
    pub h2_connections: Counter,
    /// TLS handshakes that failed or timed out.
    pub tls_failures: Counter,
    /// Connections refused at `max_http_connections`.
    pub http_refused: Counter,
    /// Failed accepts (out of file descriptors, mostly).
    pub accept_errors: Counter,
    /// Every stream by how it started; `resumes` and `state_starts` are two of its members, and
    /// resets join it by reason as they happen.
    streams: Family<StreamStart, Counter>,
    registry: Registry,
}

impl Metrics {
    /// The `Content-Type` of [`Metrics::render`]'s output, the classic Prometheus text format
    /// (0.0.4) rather than OpenMetrics: every scraper reads it (Prometheus asks for OpenMetrics
    /// first and takes this), and its `# HELP`/`# TYPE` lines keep the `_total` names of
    /// counters, which OpenMetrics would drop.
    pub const CONTENT_TYPE: &'static str = prometheus_text::CONTENT_TYPE;

    /// Metrics for a server whose other counters `hub`, `runtimes` and the log own.
    pub fn new(hub: Arc<Hub>, runtimes: Arc<Runtimes>, log: &LogMetrics) -> Self {
        let streams = Family::<StreamStart, Counter>::default();
        let ingest = Family::<[(&str, &str); 1], Counter>::default();
        let transports = Family::<[(&str, &str); 1], Counter>::default();
        let passes = Family::<[(&str, &str); 1], Counter>::default();
        let mut metrics = Self {
            connections: Gauge::default(),
            connections_refused: Counter::default(),
            delivered: Counter::default(),
            pass: PassOutcomes::new(&passes),
            // Created up front, so that they show 0 before the first stream or batch.
            resumes: streams.get_or_create_owned(&StreamStart::Resumed),
            state_starts: streams.get_or_create_owned(&StreamStart::State),
            ingest_accepted: ingest.get_or_create_owned(&[("result", "accepted")]),
            ingest_rejected: ingest.get_or_create_owned(&[("result", "rejected")]),
            lean_connections: transports.get_or_create_owned(&[("transport", "lean")]),
            hyper_connections: transports.get_or_create_owned(&[("transport", "hyper")]),
            h2_connections: transports.get_or_create_owned(&[("transport", "h2")]),
            tls_failures: Counter::default(),
            http_refused: Counter::default(),
            accept_errors: Counter::default(),
            ready: Gauge::default(),
            halted: Family::default(),
            streams,
            registry: Registry::default(),
        };
        metrics.register_server(&ingest, &transports, &passes);
        metrics
            .registry
            .register_collector(Box::new(OwnerCounters { hub, runtimes }));
        register_log(&mut metrics.registry, log);
        metrics
    }

    /// Sets `viewtape_cluster_halted` for each of `kinds` (every kind of halt there is, so that
    /// a dashboard sees each one, at 0) from the kind `/readyz` names now (`None` while the
    /// node applies, or is not a cluster's).
    pub fn set_halt(&self, kinds: &[&'static str], halt: Option<&str>) {
        for &kind in kinds {
            let halted = Some(kind) == halt;
            self.halted
                .get_or_create(&[("reason", kind)])
                .set(i64::from(halted));
        }
    }

    /// Counts a stream reset by `reason`.
    pub fn count_reset(&self, reason: &'static str) {
        self.streams
            .get_or_create(&StreamStart::Reset(reason))
            .inc();
    }

    /// Every metric in the Prometheus text format ([`Metrics::CONTENT_TYPE`]).
    ///
    /// # Errors
    /// Only if encoding fails, which writing into a `String` does not.
    pub fn render(&self) -> Result<String, fmt::Error> {
        let mut out = String::with_capacity(4096);
        prometheus_text::encode(&mut out, &self.registry)?;
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use viewtape_journal::{EventJournal, JournalConfig};

    fn metrics() -> Metrics {
        let hub = Arc::new(Hub::new(Arc::new(EventJournal::new(
            JournalConfig::default(),
        ))));
        Metrics::new(hub, Arc::default(), &LogMetrics::default())
    }

    /// Every `# TYPE` line of a render, in order.
    fn types(text: &str) -> Vec<&str> {
        text.lines().filter(|l| l.starts_with("# TYPE ")).collect()
    }

    #[test]
    fn metrics_keep_their_names_types_and_help() {
        let metrics = metrics();
        // As `/metrics` does before each render.
        metrics.set_halt(&["uncovered"], None);
        let text = metrics.render().unwrap();
        // The names and types dashboards and the end-to-end tests query, in this file's order.
        let expected = [
            "viewtape_sse_connections gauge",
            "viewtape_sse_connections_refused_total counter",
            "viewtape_events_delivered_total counter",
            "viewtape_sse_pass_outcomes_total counter",
            "viewtape_streams_total counter",
            "viewtape_ingest_batches_total counter",
            "viewtape_http_connections_total counter",
            "viewtape_http_connections_refused_total counter",
            "viewtape_accept_errors_total counter",
            "viewtape_ready gauge",
            "viewtape_cluster_halted gauge",
            "viewtape_tls_handshake_failures_total counter",
            "viewtape_log_position gauge",
            "viewtape_log_bytes gauge",
            "viewtape_log_segments gauge",
            "viewtape_log_records_total counter",
            "viewtape_log_fsyncs_total counter",
            "viewtape_log_fsync_seconds histogram",
            "viewtape_log_replayed_records_total counter",
            "viewtape_log_repaired_bytes_total counter",
            "viewtape_log_fail_closed_total counter",
            "viewtape_foreign_files_total counter",
            "viewtape_cluster_applied_sequence gauge",
            "viewtape_cluster_stream_last_sequence gauge",
            "viewtape_cluster_apply_lag_sequences gauge",
            "viewtape_cluster_apply_lag_seconds gauge",
            "viewtape_cluster_records_total counter",
            "viewtape_cluster_checks_total counter",
            // viewtape_cluster_lease_held appears with the first task run once per cluster.
            "viewtape_events_published_total counter",
            "viewtape_events_cursorless_total counter",
            "viewtape_journal_appends_total counter",
            "viewtape_journal_cursorless_after_seal_total counter",
            "viewtape_journal_gaps_total counter",
            "viewtape_journal_pruned_total counter",
            "viewtape_journal_replays_total counter",
            "viewtape_runtime_batches_total counter",
            "viewtape_runtime_guest_failures_total counter",
            "viewtape_runtime_gaps_total counter",
            "viewtape_runtime_deploys_total counter",
            "viewtape_runtime_halted gauge",
            "viewtape_view_retained_records gauge",
            "viewtape_view_subscribers gauge",
        ]
        .map(|t| format!("# TYPE {t}"));
        assert_eq!(types(&text), expected, "{text}");
        for line in [
            "# HELP viewtape_sse_connections Open SSE connections.",
            "# HELP viewtape_sse_connections_refused_total SSE connections refused at the limit.",
            "# HELP viewtape_streams_total SSE streams by how they started: resumed from a cursor, from state, or reset (by reason).",
            "# HELP viewtape_ingest_batches_total Ingest batches by result.",
            "# HELP viewtape_journal_replays_total Journal replays, by outcome.",
            "viewtape_sse_connections 0",
            "viewtape_sse_connections_refused_total 0",
            "viewtape_sse_pass_outcomes_total{outcome=\"written\"} 0",
            "viewtape_sse_pass_outcomes_total{outcome=\"behind\"} 0",
            "viewtape_streams_total{outcome=\"resumed\"} 0",
            "viewtape_streams_total{outcome=\"state\"} 0",
            "viewtape_ingest_batches_total{result=\"accepted\"} 0",
            "viewtape_ingest_batches_total{result=\"rejected\"} 0",
            "viewtape_journal_pruned_total{cause=\"bytes\"} 0",
            "viewtape_journal_replays_total{outcome=\"served\"} 0",
            "viewtape_journal_replays_total{outcome=\"refused\",reason=\"stale_epoch\"} 0",
            // Every kind of record a cluster's node applies, at 0 from the start.
            "viewtape_cluster_records_total{kind=\"batch\"} 0",
            "viewtape_cluster_records_total{kind=\"batches\"} 0",
            "viewtape_cluster_records_total{kind=\"deploy\"} 0",
            "viewtape_cluster_records_total{kind=\"define\"} 0",
            "viewtape_cluster_records_total{kind=\"retire\"} 0",
            "viewtape_cluster_records_total{kind=\"restore\"} 0",
            "viewtape_cluster_records_total{kind=\"foreign\"} 0",
            "viewtape_cluster_records_total{kind=\"passed_over\"} 0",
        ] {
            assert!(text.lines().any(|l| l == line), "no {line:?} in\n{text}");
        }
        assert!(!text.contains(".."), "{text}");
        assert!(!text.contains("# EOF"), "{text}");
    }

    #[test]
    fn the_halt_readyz_names_is_the_one_labelled_1() {
        const KINDS: [&str; 3] = ["uncovered", "gone", "format"];
        let metrics = metrics();
        metrics.set_halt(&KINDS, None);
        let text = metrics.render().unwrap();
        for kind in KINDS {
            let line = format!("viewtape_cluster_halted{{reason=\"{kind}\"}} 0");
            assert!(text.lines().any(|l| l == line), "no {line:?} in\n{text}");
        }
        metrics.set_halt(&KINDS, Some("gone"));
        let text = metrics.render().unwrap();
        assert!(text
            .lines()
            .any(|l| l == "viewtape_cluster_halted{reason=\"gone\"} 1"));
        let ones = text
            .lines()
            .filter(|l| l.starts_with("viewtape_cluster_halted{") && l.ends_with(" 1"));
        assert_eq!(ones.count(), 1, "{text}");
        metrics.set_halt(&KINDS, None);
        assert!(!metrics
            .render()
            .unwrap()
            .lines()
            .any(|l| l.starts_with("viewtape_cluster_halted{") && l.ends_with(" 1")));
    }

    #[test]
    fn metrics_count_server_events() {
        let metrics = metrics();
        metrics.connections.inc();
        metrics.connections.inc();
        metrics.connections.dec();
        metrics.connections_refused.inc();
        metrics.delivered.inc_by(5);
        metrics.resumes.inc();
        metrics.state_starts.inc();
        metrics.count_reset("malformed");
        metrics.count_reset("malformed");
        metrics.count_reset("lagged");
        metrics.ingest_accepted.inc();
        metrics.ingest_rejected.inc_by(2);
        let text = metrics.render().unwrap();
        for line in [
            "viewtape_sse_connections 1",
            "viewtape_sse_connections_refused_total 1",
            "viewtape_events_delivered_total 5",
            "viewtape_streams_total{outcome=\"resumed\"} 1",
            "viewtape_streams_total{outcome=\"state\"} 1",
            "viewtape_streams_total{outcome=\"reset\",reason=\"malformed\"} 2",
            "viewtape_streams_total{outcome=\"reset\",reason=\"lagged\"} 1",
            "viewtape_ingest_batches_total{result=\"accepted\"} 1",
            "viewtape_ingest_batches_total{result=\"rejected\"} 2",
        ] {
            assert!(text.lines().any(|l| l == line), "no {line:?} in\n{text}");
        }
    }
}
