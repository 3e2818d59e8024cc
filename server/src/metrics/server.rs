//! The server-level metrics, registered in the order `/metrics` lists them, and the labels of
//! how a stream started.

use std::fmt;

use prometheus_client::encoding::{EncodeLabel, EncodeLabelSet, LabelSetEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;

use super::Metrics;

/// A family of counters with one label.
type Labelled = Family<[(&'static str, &'static str); 1], Counter>;

impl Metrics {
    /// Registers the server-level metrics; `ingest` holds `ingest_accepted` and
    /// `ingest_rejected`, `transports` the connections by transport.
    pub(super) fn register_server(
        &mut self,
        ingest: &Labelled,
        transports: &Labelled,
        passes: &Labelled,
    ) {
        self.registry.register(
            "viewtape_sse_connections",
            "Open SSE connections",
            self.connections.clone(),
        );
        self.registry.register(
            "viewtape_sse_connections_refused",
            "SSE connections refused at the limit",
            self.connections_refused.clone(),
        );
        self.registry.register(
            "viewtape_events_delivered",
            "Frames written to SSE subscribers",
            self.delivered.clone(),
        );
        self.registry.register(
            "viewtape_sse_pass_outcomes",
            "Chunks a view's fan-out pass wrote whole to a parked subscriber's socket (written), and subscribers it handed back to their own task: the socket took part of the chunk (partial), none of it or failed (full), or more than one chunk was due (behind)",
            passes.clone(),
        );
        self.registry.register(
            "viewtape_streams",
            "SSE streams by how they started: resumed from a cursor, from state, or reset (by reason)",
            self.streams.clone(),
        );
        self.registry.register(
            "viewtape_ingest_batches",
            "Ingest batches by result",
            ingest.clone(),
        );
        self.registry.register(
            "viewtape_http_connections",
            "HTTP connections by the transport that served them: lean (plain GETs, SSE, over TCP or TLS), hyper (from the first HTTP/1.1 request the lean transport declines) or h2 (HTTP/2, negotiated over TLS)",
            transports.clone(),
        );
        self.registry.register(
            "viewtape_http_connections_refused",
            "Connections refused at max_http_connections",
            self.http_refused.clone(),
        );
        self.registry.register(
            "viewtape_accept_errors",
            "Failed accepts (out of file descriptors, mostly)",
            self.accept_errors.clone(),
        );
        self.registry.register(
            "viewtape_ready",
            "1 while /readyz answers 200 (a cluster node caught up and applying; not stopping), else 0; as of this scrape",
            self.ready.clone(),
        );
        self.registry.register(
            "viewtape_cluster_halted",
            "On a cluster: 1 for the reason this node stopped applying the stream for good (the `halt` of /readyz: uncovered, gone, recreated, format, unreadable, module, restore, apply), 0 for the others; as of this scrape",
            self.halted.clone(),
        );
        self.registry.register(
            "viewtape_tls_handshake_failures",
            "TLS handshakes that failed or did not finish within header_timeout",
            self.tls_failures.clone(),
        );
    }
}

/// What a view's fan-out pass did for its parked subscribers (`viewtape_sse_pass_outcomes_total`).
#[derive(Clone, Debug)]
pub struct PassOutcomes {
    /// A chunk written whole.
    pub written: Counter,
    /// Handed back with the rest of a chunk the socket took part of.
    pub partial: Counter,
    /// Handed back: the socket took none of the chunk, or failed.
    pub full: Counter,
    /// Handed back: more than one chunk was due, a frame sent shared, or a cursor refused.
    pub behind: Counter,
}

impl PassOutcomes {
    /// The four members of `family`, created up front so that they show 0.
    pub(super) fn new(family: &Labelled) -> Self {
        let member = |outcome| family.get_or_create_owned(&[("outcome", outcome)]);
        Self {
            written: member("written"),
            partial: member("partial"),
            full: member("full"),
            behind: member("behind"),
        }
    }
}

/// How a stream started: the labels of `viewtape_streams_total`. Only a reset has a reason,
/// and the other starts carry no empty `reason` label.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub(super) enum StreamStart {
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
