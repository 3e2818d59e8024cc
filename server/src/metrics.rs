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

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{
    prometheus_text, DescriptorEncoder, EncodeLabel, EncodeLabelSet, EncodeMetric, LabelSetEncoder,
};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::TypedMetric;
use prometheus_client::registry::Registry;

use crate::hub::Hub;
use crate::log::LogMetrics;
use crate::registry::Runtimes;
use crate::runtime::RuntimeStats;

/// Registers the log's metrics (kept up to date by the log itself).
fn register_log(registry: &mut Registry, log: &LogMetrics) {
    registry.register(
        "viewtape_log_position",
        "The last durable log position",
        log.position.clone(),
    );
    registry.register(
        "viewtape_log_bytes",
        "Bytes in the log's segment files",
        log.bytes.clone(),
    );
    registry.register(
        "viewtape_log_segments",
        "Log segment files",
        log.segments.clone(),
    );
    registry.register(
        "viewtape_log_records",
        "Records appended to the log",
        log.records.clone(),
    );
    registry.register(
        "viewtape_log_fsyncs",
        "Group commits synced to the device",
        log.fsyncs.clone(),
    );
    registry.register(
        "viewtape_log_fsync_seconds",
        "Time each log sync took",
        log.fsync_seconds.clone(),
    );
    registry.register(
        "viewtape_log_replayed_records",
        "Log records replayed at start",
        log.replayed.clone(),
    );
    registry.register(
        "viewtape_log_repaired_bytes",
        "Bytes of torn tails cut off the log at start (never acknowledged)",
        log.repaired_bytes.clone(),
    );
    registry.register(
        "viewtape_log_fail_closed",
        "Times log continuity broke and a fresh epoch was taken, by cause (corrupt, missing, digest, module, boot)",
        log.fail_closed.clone(),
    );
    registry.register(
        "viewtape_foreign_files",
        "Files of another data directory's history set aside at start (never replayed or adopted), by kind (segment, snapshot, watermark)",
        log.foreign.clone(),
    );
    registry.register(
        "viewtape_cluster_applied_sequence",
        "On a cluster: the last stream sequence this node applied",
        log.applied.clone(),
    );
    registry.register(
        "viewtape_cluster_stream_last_sequence",
        "On a cluster: the stream's last sequence, as last seen",
        log.stream_last.clone(),
    );
    registry.register(
        "viewtape_cluster_apply_lag_sequences",
        "On a cluster: sequences the stream holds that this node has not applied",
        log.apply_lag_sequences.clone(),
    );
    registry.register(
        "viewtape_cluster_apply_lag_seconds",
        "On a cluster: how long ago the last record this node applied was published",
        log.apply_lag_seconds.clone(),
    );
    registry.register(
        "viewtape_cluster_records",
        "On a cluster: records applied, by kind (batch, deploy, restore, foreign)",
        log.records_by_kind.clone(),
    );
    registry.register(
        "viewtape_cluster_lease_held",
        "On a cluster: 1 for each task whose lease this node holds (the demo feed, file sources)",
        log.leases_held.clone(),
    );
}

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
        let connections = Gauge::default();
        let connections_refused = Counter::default();
        let delivered = Counter::default();
        let streams = Family::<StreamStart, Counter>::default();
        let ingest = Family::<[(&str, &str); 1], Counter>::default();
        let transports = Family::<[(&str, &str); 1], Counter>::default();

        let mut registry = Registry::default();
        registry.register(
            "viewtape_sse_connections",
            "Open SSE connections",
            connections.clone(),
        );
        registry.register(
            "viewtape_sse_connections_refused",
            "SSE connections refused at the limit",
            connections_refused.clone(),
        );
        registry.register(
            "viewtape_events_delivered",
            "Frames written to SSE subscribers",
            delivered.clone(),
        );
        registry.register(
            "viewtape_streams",
            "SSE streams by how they started: resumed from a cursor, from state, or reset (by reason)",
            streams.clone(),
        );
        registry.register(
            "viewtape_ingest_batches",
            "Ingest batches by result",
            ingest.clone(),
        );
        registry.register(
            "viewtape_http_connections",
            "HTTP connections by the transport that served them: lean (plain GETs, SSE, over TCP or TLS), hyper (from the first HTTP/1.1 request the lean transport declines) or h2 (HTTP/2, negotiated over TLS)",
            transports.clone(),
        );
        let http_refused = Counter::default();
        registry.register(
            "viewtape_http_connections_refused",
            "Connections refused at max_http_connections",
            http_refused.clone(),
        );
        let accept_errors = Counter::default();
        registry.register(
            "viewtape_accept_errors",
            "Failed accepts (out of file descriptors, mostly)",
            accept_errors.clone(),
        );
        let ready = Gauge::default();
        registry.register(
            "viewtape_ready",
            "1 while /readyz answers 200 (a cluster node caught up and applying; not stopping), else 0; as of this scrape",
            ready.clone(),
        );
        let tls_failures = Counter::default();
        registry.register(
            "viewtape_tls_handshake_failures",
            "TLS handshakes that failed or did not finish within header_timeout",
            tls_failures.clone(),
        );
        registry.register_collector(Box::new(OwnerCounters { hub, runtimes }));
        register_log(&mut registry, log);

        Self {
            connections,
            connections_refused,
            delivered,
            // Created up front, so that they show 0 before the first stream or batch.
            resumes: streams.get_or_create_owned(&StreamStart::Resumed),
            state_starts: streams.get_or_create_owned(&StreamStart::State),
            ingest_accepted: ingest.get_or_create_owned(&[("result", "accepted")]),
            ingest_rejected: ingest.get_or_create_owned(&[("result", "rejected")]),
            lean_connections: transports.get_or_create_owned(&[("transport", "lean")]),
            hyper_connections: transports.get_or_create_owned(&[("transport", "hyper")]),
            h2_connections: transports.get_or_create_owned(&[("transport", "h2")]),
            tls_failures,
            http_refused,
            accept_errors,
            ready,
            streams,
            registry,
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

/// How a stream started: the labels of `viewtape_streams_total`. Only a reset has a reason,
/// and the other starts carry no empty `reason` label.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
enum StreamStart {
    Resumed,
    State,
    Reset(&'static str),
}

impl EncodeLabelSet for StreamStart {
    fn encode(&self, encoder: &mut LabelSetEncoder) -> fmt::Result {
        let (outcome, reason) = match self {
            Self::Resumed => ("resumed", None),
            Self::State => ("state", None),
            Self::Reset(reason) => ("reset", Some(*reason)),
        };
        ("outcome", outcome).encode(encoder.encode_label())?;
        match reason {
            Some(reason) => ("reason", reason).encode(encoder.encode_label()),
            None => Ok(()),
        }
    }
}

/// Reads the counters the hub, the journal and the runtimes own, on every scrape.
#[derive(Debug)]
struct OwnerCounters {
    hub: Arc<Hub>,
    runtimes: Arc<Runtimes>,
}

impl Collector for OwnerCounters {
    fn encode(&self, mut encoder: DescriptorEncoder) -> fmt::Result {
        let load = |counter: &AtomicU64| ConstCounter::new(counter.load(Ordering::Relaxed));
        let hub = self.hub.stats();
        let e = &mut encoder;
        one(
            e,
            "viewtape_events_published",
            "Events published to views.",
            load(&hub.published),
        )?;
        one(
            e,
            "viewtape_events_cursorless",
            "Events published without a cursor (journal sealed or disabled).",
            load(&hub.cursorless),
        )?;

        let journal = self.hub.journal().stats();
        one(
            e,
            "viewtape_journal_appends",
            "Records appended (offsets issued).",
            ConstCounter::new(journal.appends),
        )?;
        one(
            e,
            "viewtape_journal_cursorless_after_seal",
            "Appends refused because the journal was sealed.",
            ConstCounter::new(journal.cursorless_after_seal),
        )?;
        one(
            e,
            "viewtape_journal_gaps",
            "Gaps marked.",
            ConstCounter::new(journal.gaps_marked),
        )?;
        family(
            e,
            "viewtape_journal_pruned",
            "Records pruned, by cause.",
            [
                ("age", journal.pruned_age),
                ("count", journal.pruned_count),
                ("bytes", journal.pruned_bytes),
            ]
            .map(|(cause, n)| ([("cause", cause)], ConstCounter::new(n))),
        )?;
        let served = [("served", None, journal.replays_served)];
        let refused = [
            ("disabled", journal.replays_refused_disabled),
            ("stale_epoch", journal.replays_refused_stale_epoch),
            ("ahead", journal.replays_refused_ahead),
            ("expired", journal.replays_refused_expired),
            ("gap", journal.replays_refused_gap),
        ]
        .map(|(reason, n)| ("refused", Some(reason), n));
        family(
            e,
            "viewtape_journal_replays",
            "Journal replays, by outcome.",
            served
                .into_iter()
                .chain(refused)
                .map(|(outcome, reason, n)| {
                    let mut labels = vec![("outcome", outcome)];
                    labels.extend(reason.map(|reason| ("reason", reason)));
                    (labels, ConstCounter::new(n))
                }),
        )?;

        let per_runtime = |counter: fn(&RuntimeStats) -> &AtomicU64| {
            self.runtimes.iter().map(move |(name, runtime)| {
                ([("runtime", name)], load(counter(runtime.handle.stats())))
            })
        };
        family(
            e,
            "viewtape_runtime_batches",
            "Batches committed per runtime.",
            per_runtime(|stats| &stats.batches),
        )?;
        family(
            e,
            "viewtape_runtime_guest_failures",
            "Batches a guest failed (trap, timeout, memory, rejection).",
            per_runtime(|stats| &stats.failures),
        )?;
        family(
            e,
            "viewtape_runtime_restarts",
            "Guest instances re-created after a failure.",
            per_runtime(|stats| &stats.restarts),
        )?;
        family(
            e,
            "viewtape_runtime_gaps",
            "Gaps reported by guests or lost pull-source batches.",
            per_runtime(|stats| &stats.gaps),
        )?;
        family(
            e,
            "viewtape_runtime_deploys",
            "Modules deployed to a runtime (live, at start, or applied from the log).",
            per_runtime(|stats| &stats.deploys),
        )?;

        family(
            e,
            "viewtape_view_retained_records",
            "Records retained per view.",
            self.hub
                .journal()
                .entry_counts_now()
                .into_iter()
                .map(|(view, n)| ([("view", view)], ConstGauge::new(n))),
        )?;
        let views = self.hub.views();
        family(
            e,
            "viewtape_view_subscribers",
            "SSE subscribers open per view (their sum is viewtape_sse_connections).",
            views
                .iter()
                .map(|view| ([("view", view.name())], ConstGauge::new(view.subscribers()))),
        )
    }
}

/// Encodes a metric without labels.
fn one<M: EncodeMetric + TypedMetric>(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    metric: M,
) -> fmt::Result {
    metric.encode(encoder.encode_descriptor(name, help, None, M::TYPE)?)
}

/// Encodes a metric with one sample per label set.
fn family<S: EncodeLabelSet, M: EncodeMetric + TypedMetric>(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    samples: impl IntoIterator<Item = (S, M)>,
) -> fmt::Result {
    let mut metric = encoder.encode_descriptor(name, help, None, M::TYPE)?;
    for (labels, sample) in samples {
        sample.encode(metric.encode_family(&labels)?)?;
    }
    Ok(())
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
        let text = metrics().render().unwrap();
        // The names and types dashboards and the end-to-end tests query, in this file's order.
        let expected = [
            "viewtape_sse_connections gauge",
            "viewtape_sse_connections_refused_total counter",
            "viewtape_events_delivered_total counter",
            "viewtape_streams_total counter",
            "viewtape_ingest_batches_total counter",
            "viewtape_http_connections_total counter",
            "viewtape_http_connections_refused_total counter",
            "viewtape_accept_errors_total counter",
            "viewtape_ready gauge",
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
            "viewtape_runtime_restarts_total counter",
            "viewtape_runtime_gaps_total counter",
            "viewtape_runtime_deploys_total counter",
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
            "viewtape_streams_total{outcome=\"resumed\"} 0",
            "viewtape_streams_total{outcome=\"state\"} 0",
            "viewtape_ingest_batches_total{result=\"accepted\"} 0",
            "viewtape_ingest_batches_total{result=\"rejected\"} 0",
            "viewtape_journal_pruned_total{cause=\"bytes\"} 0",
            "viewtape_journal_replays_total{outcome=\"served\"} 0",
            "viewtape_journal_replays_total{outcome=\"refused\",reason=\"stale_epoch\"} 0",
        ] {
            assert!(text.lines().any(|l| l == line), "no {line:?} in\n{text}");
        }
        assert!(!text.contains(".."), "{text}");
        assert!(!text.contains("# EOF"), "{text}");
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

    #[tokio::test]
    async fn metrics_read_the_hub_on_every_scrape() {
        use bytes::Bytes;

        use crate::host::{EventKind, GuestBatch, GuestEvent};
        use crate::runtime::BatchSink;

        let hub = Arc::new(Hub::new(Arc::new(EventJournal::new(
            JournalConfig::default(),
        ))));
        let metrics = Metrics::new(Arc::clone(&hub), Arc::default(), &LogMetrics::default());
        let before = metrics.render().unwrap();
        assert!(
            before
                .lines()
                .any(|l| l == "viewtape_events_published_total 0"),
            "{before}"
        );
        let events = (0..3)
            .map(|i| GuestEvent {
                view: Arc::from("v"),
                key: format!("k{i}"),
                kind: EventKind::Update,
                payload: Bytes::from_static(b"{}"),
            })
            .collect();
        hub.commit(
            "test",
            GuestBatch::of_events(events),
            crate::log::unix_ms_now(),
        )
        .await;
        let after = metrics.render().unwrap();
        for line in [
            "viewtape_events_published_total 3",
            "viewtape_journal_appends_total 3",
            "viewtape_view_retained_records{view=\"v\"} 3",
        ] {
            assert!(after.lines().any(|l| l == line), "no {line:?} in\n{after}");
        }
    }
}
