//! Failed accepts, reported once per episode; connections past the limit, refused.

use std::time::Instant;

use tokio::net::TcpStream;

use super::write::answer_and_close;
use super::{Limits, ACCEPT_CALM, ACCEPT_REPORT_EVERY};

/// An episode of failing accepts: one line when it starts, one every [`ACCEPT_REPORT_EVERY`]
/// while it lasts, one when it is over.
pub(super) struct AcceptTrouble {
    since_report: u64,
    last_report: Instant,
    last_failure: Instant,
}

impl AcceptTrouble {
    pub(super) fn new() -> Self {
        let now = Instant::now();
        Self {
            since_report: 0,
            last_report: now,
            last_failure: now,
        }
    }

    pub(super) fn failed(&mut self, error: &std::io::Error) {
        let now = Instant::now();
        self.since_report += 1;
        self.last_failure = now;
        if now - self.last_report >= ACCEPT_REPORT_EVERY {
            tracing::warn!(%error, failures = self.since_report, "accepting connections still fails");
            (self.since_report, self.last_report) = (0, now);
        }
    }

    /// Over once accepting has not failed for [`ACCEPT_CALM`]: the first accepts after descriptors
    /// run out often fail again at once, and that is the same episode.
    pub(super) fn is_over(&self) -> bool {
        self.last_failure.elapsed() >= ACCEPT_CALM
    }
}

/// Answers a connection past the limit with `503` and closes it, without reading a request.
pub(super) async fn refuse(stream: TcpStream, limits: Limits) {
    let body = format!(
        "{{\"error\":\"unavailable\",\"message\":\"too many connections (limit {})\"}}",
        limits.max_connections
    );
    answer_and_close(
        stream,
        "503 Service Unavailable",
        "retry-after: 1\r\n",
        &body,
        limits,
    )
    .await;
}
