//! Publishing to a cluster's stream: the connection every publish of a node shares, the message
//! ids it makes, the record format's header and versions, and the subjects records go on. The
//! stream's log ([`StreamLog`](super::StreamLog)) and its group commit (`gather`) both publish
//! through it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream;
use bytes::Bytes;
use tokio::sync::watch;

use super::LogPosition;

/// The header every record a node publishes carries, with the record format's version: a
/// message without it was not published by a node.
pub const RECORD_HEADER: &str = "Viewtape-Record";
/// The record format's version (the value of [`RECORD_HEADER`]).
pub const RECORD_VERSION: &str = "1";
/// The version of a record holding batches of several runtimes, which each apply theirs at its
/// position: a viewtape that reads only [`RECORD_VERSION`] stops at it and says to upgrade.
pub const SHARED_VERSION: &str = "2";

/// How often a wait on NATS looks at whether the connection is still up, besides the
/// client's events.
const LOST_POLL: Duration = Duration::from_secs(1);

/// A published record: where the stream put it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Published {
    /// Its stream sequence: its log position.
    pub sequence: LogPosition,
    /// JetStream already held a message with its id (at `sequence`).
    pub duplicate: bool,
}

/// Why a record was not published.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum PublishError {
    /// This node takes no records now, and says why (it stopped applying the stream, or it
    /// runs another build than the cluster).
    #[error("{0}")]
    Refusing(String),
    /// NATS is not connected.
    #[error("not connected to NATS at {0}")]
    Disconnected(String),
    /// NATS did not acknowledge in time.
    #[error("NATS did not acknowledge within {0:?}")]
    Timeout(Duration),
    /// The connection to NATS was lost while the record was sent: it may or may not be on the
    /// stream.
    #[error("the connection to NATS at {0} was lost before it acknowledged")]
    Lost(String),
}

/// What publishing needs, shared with the tasks that publish gathered batches.
#[derive(Clone, Debug)]
pub(super) struct Publisher {
    js: jetstream::Context,
    client: async_nats::Client,
    url: Arc<str>,
    /// How long a publish may wait for its acknowledgement, and an ingest for its verdict.
    timeout: Duration,
    ids: Arc<Ids>,
    /// The highest stream sequence NATS acknowledged to this node: the stream holds at least
    /// that much, whether or not this node's reading of it has delivered it yet.
    acked: Arc<AtomicU64>,
    /// Changes when the client connects or loses its connection (its events), so that waits
    /// on NATS give up when it is lost without looking again and again.
    connection: watch::Receiver<bool>,
}

/// This process's part of the message ids it makes, and how many it made.
#[derive(Debug)]
struct Ids {
    nonce: u64,
    published: AtomicU64,
}

impl Publisher {
    /// Publishes through `client` (connected to `url`, its connection's events on
    /// `connection`), waiting at most `timeout` for each acknowledgement.
    pub(super) fn new(
        (client, connection): (async_nats::Client, watch::Receiver<bool>),
        url: &str,
        timeout: Duration,
    ) -> Self {
        Self {
            connection,
            js: jetstream::new(client.clone()),
            client,
            url: url.into(),
            timeout,
            ids: Arc::new(Ids {
                nonce: process_nonce(),
                published: AtomicU64::new(0),
            }),
            acked: Arc::default(),
        }
    }

    /// The highest stream sequence NATS acknowledged to this node.
    pub(super) fn acked(&self) -> LogPosition {
        LogPosition::new(self.acked.load(Ordering::Relaxed))
    }

    /// Whether the connection to NATS is up.
    pub(super) fn connected(&self) -> bool {
        self.client.connection_state() == async_nats::connection::State::Connected
    }

    /// Resolves once the connection to NATS is down: what waits on NATS gives up then rather
    /// than at its timeout. A link that stops forwarding is found down by the client's pings
    /// (`cluster::PING_INTERVAL`); the client's state is looked at again every [`LOST_POLL`]
    /// besides its events.
    pub(super) async fn lost(&self) {
        let mut connection = self.connection.clone();
        while self.connected() {
            let _ = tokio::time::timeout(LOST_POLL, connection.changed()).await;
        }
    }

    /// How long a publish may wait for its acknowledgement, and an ingest for its verdict.
    pub(super) fn timeout(&self) -> Duration {
        self.timeout
    }

    /// This process's name among the nodes: the part of its message ids that is its own.
    pub(super) fn node(&self) -> String {
        format!("{:016x}", self.ids.nonce)
    }

    /// A message id unique to this process.
    pub(super) fn own_id(&self) -> String {
        format!(
            "{:016x}-{}",
            self.ids.nonce,
            self.ids.published.fetch_add(1, Ordering::Relaxed)
        )
    }

    /// The largest message the NATS server takes.
    pub(super) fn max_payload(&self) -> usize {
        self.client.server_info().max_payload
    }

    /// Publishes `payload`, a record of format `version`, on `subject` under the message id
    /// `id`, sending it again while its acknowledgement is lost, for at most the publish timeout.
    pub(super) async fn send(
        &self,
        subject: String,
        version: &'static str,
        payload: Vec<u8>,
        id: String,
    ) -> Result<Published, PublishError> {
        if !self.connected() {
            return Err(PublishError::Disconnected(self.url.to_string()));
        }
        let message = jetstream::message::PublishMessage::build()
            .payload(Bytes::from(payload))
            .header(RECORD_HEADER, version)
            .message_id(id);
        let published = async {
            loop {
                let sent = async {
                    self.js
                        .send_publish(subject.clone(), message.clone())
                        .await
                        .map_err(|error| error.to_string())?
                        .await
                        .map_err(|error| error.to_string())
                };
                match sent.await {
                    Ok(ack) => break ack,
                    Err(error) => {
                        tracing::debug!(%error, "cluster: publish not acknowledged; sending it again");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                }
            }
        };
        let ack = tokio::select! {
            ack = tokio::time::timeout(self.timeout, published) => {
                ack.map_err(|_| PublishError::Timeout(self.timeout))?
            }
            () = self.lost() => return Err(PublishError::Lost(self.url.to_string())),
        };
        self.acked.fetch_max(ack.sequence, Ordering::Relaxed);
        Ok(Published {
            sequence: LogPosition::new(ack.sequence),
            duplicate: ack.duplicate,
        })
    }
}

/// A runtime's name as one token of a NATS subject.
pub fn subject_token(runtime: &str) -> String {
    runtime
        .chars()
        .map(|c| match c {
            '.' | '*' | '>' | ' ' | '\t' => '_',
            c => c,
        })
        .collect()
}

/// 64 random bits for this process (std's `RandomState` keys from the OS's randomness).
fn process_nonce() -> u64 {
    use std::hash::{BuildHasher as _, Hasher as _};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u32(std::process::id());
    hasher.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runtime_names_become_one_subject_token() {
        assert_eq!(subject_token("orders.eu"), "orders_eu");
        assert_eq!(subject_token("a*b>c d"), "a_b_c_d");
        assert_eq!(subject_token("demo"), "demo");
    }
}
