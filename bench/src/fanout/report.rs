//! The figures of a fanout run: what the subscribers saw, collected once the readers stopped,
//! and the report printed from them.

use std::sync::atomic::Ordering;
use std::time::Duration;

use super::plan::Plan;
use super::Options;
use crate::histogram::Histogram;
use crate::subscribers::Shared;
use crate::target::Target;

/// What the subscribers saw, once their readers stopped.
#[derive(Debug)]
pub(super) struct Outcome {
    /// Deliveries over the window and the drain.
    pub(super) delivered: u64,
    /// How long the drain took.
    pub(super) drained_in: Duration,
    /// Subscribers that received exactly what they were owed.
    pub(super) complete: usize,
    /// Events, over all subscribers, that were not the `seq` due.
    pub(super) violations: u64,
    pub(super) errors: Vec<String>,
    pub(super) order_errors: Vec<String>,
    /// Publish→receive latency, µs.
    pub(super) hist: Histogram,
}

impl Outcome {
    /// Reads the subscribers' counts off `shared`, the `published` ticks from `first_seq` on
    /// owed as `plan` says.
    pub(super) fn collect(
        shared: &Shared,
        plan: &Plan,
        first_seq: u64,
        published: u64,
        delivered: u64,
        drained_in: Duration,
    ) -> Self {
        // Each subscriber received exactly what it was owed (its last count, stored as it stopped).
        let complete = shared
            .received
            .iter()
            .enumerate()
            .filter(|(i, r)| {
                r.load(Ordering::Relaxed) == plan.expected_for(*i, first_seq, published)
            })
            .count();
        let violations = shared.violations.load(Ordering::Relaxed);
        let errors = shared.errors.lock().map(|e| e.clone()).unwrap_or_default();
        let order_errors = shared
            .order_errors
            .lock()
            .map(|e| e.clone())
            .unwrap_or_default();
        let hist = shared
            .histograms
            .lock()
            .map(|h| h.clone())
            .unwrap_or_default();
        Self {
            delivered,
            drained_in,
            complete,
            violations,
            errors,
            order_errors,
            hist,
        }
    }
}

/// A run's figures: the publishing window, the server's and the client's cost, and the
/// subscribers' [`Outcome`].
pub(super) struct Figures<'a> {
    pub(super) published: u64,
    pub(super) requests: u64,
    pub(super) publish_took: Duration,
    /// Deliveries the window owed, over all subscribers.
    pub(super) expected: u64,
    /// Published events that reach at least one subscriber.
    pub(super) reaching: u64,
    /// Deliveries made when publishing stopped.
    pub(super) delivered_at_end: u64,
    pub(super) outcome: &'a Outcome,
    /// Server RSS (KiB) before connecting, connected, and after publishing, when its pid is
    /// known.
    pub(super) rss: (Option<u64>, Option<u64>, Option<u64>),
    /// Server CPU seconds over the publishing window, when its pid is known.
    pub(super) cpu: Option<f64>,
    /// The bench's own CPU seconds over the publishing window.
    pub(super) client_cpu: f64,
}

impl Figures<'_> {
    /// Prints the `fanout …` lines.
    pub(super) fn print(&self, target: &Target, options: &Options, plan: &Plan) {
        self.print_deliveries(target, options, plan);
        self.print_costs(options);
    }

    /// The window, the deliveries and whether they were lossless, the latency.
    fn print_deliveries(&self, target: &Target, options: &Options, plan: &Plan) {
        let Self {
            published,
            requests,
            publish_took,
            expected,
            reaching,
            delivered_at_end,
            outcome,
            ..
        } = *self;
        let Outcome {
            delivered,
            drained_in,
            complete,
            violations,
            ref errors,
            ref hist,
            ..
        } = *outcome;
        let ms = |us: u64| us as f64 / 1000.0;

        println!(
            "fanout peer={:?} transport={} subscribers={} keys={} narrow={} subscribed_keys={} rate={} seconds={} published={published} requests={requests} publish_rate_held={:.0}/s",
            target.peer,
            target.transport().name(),
            options.subscribers,
            plan.keys(),
            options.narrow,
            plan.subscribed_keys(options.subscribers),
            options.rate,
            options.seconds,
            published as f64 / publish_took.as_secs_f64()
        );
        println!(
            "fanout deliveries_in_window={delivered_at_end} deliveries_per_s={:.0} sustained_per_s={:.0} expected={expected} delivered_total={delivered} backlog_at_end={} drained_in_ms={:.0} lossless={}",
            delivered_at_end as f64 / publish_took.as_secs_f64(),
            // Everything delivered, over publishing plus the drain (the rate actually kept up).
            delivered as f64 / (publish_took + drained_in).as_secs_f64(),
            expected.saturating_sub(delivered_at_end),
            drained_in.as_secs_f64() * 1000.0,
            delivered == expected
                && complete == options.subscribers
                && violations == 0
                && errors.is_empty()
        );
        println!(
            "fanout events_reaching_subscribers={reaching} expected_per_event={:.3} subscribers_complete={complete}/{} seq_violations={violations}",
            expected as f64 / published.max(1) as f64,
            options.subscribers
        );
        println!(
            "fanout latency_ms p50={:.2} p90={:.2} p99={:.2} p999={:.2} max={:.2} samples={}",
            ms(hist.quantile(0.5)),
            ms(hist.quantile(0.9)),
            ms(hist.quantile(0.99)),
            ms(hist.quantile(0.999)),
            ms(hist.max()),
            hist.samples()
        );
    }

    /// The server's memory and CPU, the bench's own CPU, and the subscribers' errors.
    fn print_costs(&self, options: &Options) {
        let Self {
            published,
            publish_took,
            delivered_at_end,
            outcome,
            rss: (rss_before, rss_connected, rss_loaded),
            cpu,
            client_cpu,
            ..
        } = *self;
        let errors = &outcome.errors;
        let order_errors = &outcome.order_errors;
        if let (Some(before), Some(connected), Some(loaded)) =
            (rss_before, rss_connected, rss_loaded)
        {
            println!(
                "fanout server_rss_kib before={before} connected={connected} loaded={loaded} per_subscriber_kib={:.1}",
                connected.saturating_sub(before) as f64 / options.subscribers as f64
            );
        }
        if let Some(cpu) = cpu {
            // The server's CPU over the publishing window, per delivery made in it and per event
            // published in it.
            println!(
                "fanout server_cpu_s={cpu:.2} server_cpu_share={:.0}% server_cpu_us_per_delivery={:.2} server_cpu_us_per_event={:.2}",
                cpu / publish_took.as_secs_f64() * 100.0,
                cpu * 1e6 / delivered_at_end.max(1) as f64,
                cpu * 1e6 / published.max(1) as f64
            );
        }
        // The client shares the machine: when it is saturated, latency is the client's, not the
        // server's.
        println!(
            "fanout client_cpu_s={client_cpu:.2} client_cpu_share={:.0}% load_average={}",
            client_cpu / publish_took.as_secs_f64() * 100.0,
            std::fs::read_to_string("/proc/loadavg")
                .unwrap_or_default()
                .split_whitespace()
                .take(3)
                .collect::<Vec<_>>()
                .join(",")
        );
        if !errors.is_empty() {
            println!(
                "fanout subscriber_errors={} first={:?}",
                errors.len(),
                errors[0]
            );
        }
        if let Some(first) = order_errors.first() {
            println!(
                "fanout subscribers_out_of_order={} first={first:?}",
                order_errors.len()
            );
        }
    }
}
