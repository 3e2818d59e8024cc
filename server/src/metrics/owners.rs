//! The counters with another owner (the hub, the journal, each runtime) and the records each
//! view retains, read from their owner on every scrape.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::TypedMetric;

use crate::hub::Hub;
use crate::runtime::registry::Runtimes;
use crate::runtime::RuntimeStats;

/// Reads the counters the hub, the journal and the runtimes own, on every scrape.
#[derive(Debug)]
pub(super) struct OwnerCounters {
    pub(super) hub: Arc<Hub>,
    pub(super) runtimes: Arc<Runtimes>,
}

impl Collector for OwnerCounters {
    fn encode(&self, mut encoder: DescriptorEncoder) -> fmt::Result {
        let e = &mut encoder;
        self.encode_hub(e)?;
        self.encode_journal(e)?;
        self.encode_runtimes(e)?;
        self.encode_views(e)
    }
}

impl OwnerCounters {
    /// The hub's counters.
    fn encode_hub(&self, e: &mut DescriptorEncoder) -> fmt::Result {
        let hub = self.hub.stats();
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
        Ok(())
    }

    /// The journal's counters.
    fn encode_journal(&self, e: &mut DescriptorEncoder) -> fmt::Result {
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
        )
    }

    /// Each runtime's counters.
    fn encode_runtimes(&self, e: &mut DescriptorEncoder) -> fmt::Result {
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
            "viewtape_runtime_halted",
            "1 for a runtime halted on this node (it could not reproduce its logged history: /readyz says where and why), 0 for one that runs.",
            self.runtimes.iter().map(|(name, runtime)| {
                let halted = runtime.handle.stats().halted().is_some();
                ([("runtime", name)], ConstGauge::new(i64::from(halted)))
            }),
        )
    }

    /// The records each view retains, and its subscribers.
    fn encode_views(&self, e: &mut DescriptorEncoder) -> fmt::Result {
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

/// A counter's value now, as a sample.
fn load(counter: &AtomicU64) -> ConstCounter {
    ConstCounter::new(counter.load(Ordering::Relaxed))
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
    use std::sync::Arc;

    use viewtape_journal::{EventJournal, JournalConfig};

    use crate::hub::Hub;
    use crate::log::LogMetrics;
    use crate::metrics::Metrics;

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
            .map(|i| {
                GuestEvent::new(
                    Arc::from("v"),
                    format!("k{i}"),
                    EventKind::Update,
                    Bytes::from_static(b"{}"),
                )
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
