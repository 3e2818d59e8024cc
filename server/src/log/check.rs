//! On a cluster, nodes compare what they applied: a runtime's batch at a check point is written
//! by every node to a key of the cluster's check bucket (`<stream>-checks`), and the first value
//! written is the reference. A node whose own value differs has not reproduced the stream's
//! history for that runtime, and halts it
//! ([`RuntimeHalt`](crate::runtime::RuntimeHalt)) — so that every node either serves the
//! reference's events under a cursor, or none.
//!
//! What is compared ([`Applied`]) is a function of the stream alone: the batch's events (their
//! number and the CRC-32C of every field, in order, as a local log's digest) and the guest's saved
//! state after it. Which batches are check points is each node's own choice (see
//! [`Applied::is_check_point`], from the position of the runtime's previous batch, which snapshots
//! keep): a position only one node checks is simply not compared. The
//! bucket keeps keys for [`KEPT`], long enough for a node joining from a recent snapshot.

use std::time::Duration;

use async_nats::jetstream::kv;
use bytes::Bytes;

use super::LogPosition;

/// How long the check bucket keeps a key.
pub const KEPT: Duration = Duration::from_secs(600);

/// Positions of a runtime's batches fall into bands of this many stream sequences; the first
/// batch of a runtime in a band is a check point.
const BAND: u64 = 8;

/// What a node applied of one batch, as it is compared.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Applied {
    /// The events the batch published.
    pub events: u64,
    /// The CRC-32C of its events and gaps, in order.
    pub crc: u32,
    /// The CRC-32C of the guest's saved state after it.
    pub state: u32,
}

impl Applied {
    /// Whether this node checks a batch at `position`, its runtime's previous one on this node
    /// being at `previous`: the first in each band of [`BAND`] sequences.
    pub fn is_check_point(position: LogPosition, previous: Option<LogPosition>) -> bool {
        previous.is_none_or(|previous| previous.get() / BAND != position.get() / BAND)
    }

    /// The value written to the bucket: what is compared, then the node that wrote it.
    fn value(self, node: &str) -> String {
        format!("{} {:08x} {:08x} {node}", self.events, self.crc, self.state)
    }
}

/// How a check ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Checked {
    /// This node wrote the first value: the reference for every other node.
    First,
    /// Another node wrote the same.
    Agreed,
    /// Another node wrote something else first: the value it wrote.
    Differed(String),
    /// The bucket could not be asked (NATS unreachable, say): nothing is known.
    Unchecked(String),
}

impl Checked {
    /// Every label of `viewtape_cluster_checks_total`.
    pub const OUTCOMES: [&'static str; 4] = ["first", "agreed", "differed", "unchecked"];

    /// This outcome's label.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::First => "first",
            Self::Agreed => "agreed",
            Self::Differed(_) => "differed",
            Self::Unchecked(_) => "unchecked",
        }
    }
}

/// The cluster's check bucket, as this node writes to it.
#[derive(Clone, Debug)]
pub struct Checks {
    store: kv::Store,
    node: String,
}

impl Checks {
    /// Checks through `store` as `node` (a name for the values this node writes first).
    pub fn new(store: kv::Store, node: String) -> Self {
        Self { store, node }
    }

    /// Compares `applied`, what this node applied of `runtime`'s batch at `position`, with
    /// what the first node to check it wrote.
    pub async fn check(&self, runtime: &str, position: LogPosition, applied: Applied) -> Checked {
        let key = format!("{}.{}", hex(runtime), position.get());
        let value = applied.value(&self.node);
        match self.store.create(&key, Bytes::from(value.clone())).await {
            Ok(_) => return Checked::First,
            Err(error) if error.kind() == kv::CreateErrorKind::AlreadyExists => {}
            Err(error) => return Checked::Unchecked(error.to_string()),
        }
        let theirs = match self.store.get(&key).await {
            Ok(Some(theirs)) => String::from_utf8_lossy(&theirs).into_owned(),
            Ok(None) => return Checked::Unchecked("the key expired".to_owned()),
            Err(error) => return Checked::Unchecked(error.to_string()),
        };
        let compared = |value: &str| {
            value
                .rsplit_once(' ')
                .map(|(compared, _)| compared.to_owned())
        };
        match compared(&theirs) == compared(&value) {
            true => Checked::Agreed,
            false => Checked::Differed(theirs),
        }
    }
}

/// `name` in hex: any runtime name as a valid key token.
fn hex(name: &str) -> String {
    name.bytes().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_batch_in_each_band_is_a_check_point() {
        let at = LogPosition::new;
        assert!(Applied::is_check_point(at(5), None));
        assert!(!Applied::is_check_point(at(7), Some(at(5))));
        assert!(Applied::is_check_point(at(8), Some(at(7))));
        assert!(Applied::is_check_point(at(1000), Some(at(8))));
    }

    #[test]
    fn the_value_compared_leaves_the_writer_out() {
        let applied = Applied {
            events: 3,
            crc: 0xdead_beef,
            state: 7,
        };
        assert_eq!(applied.value("node-a"), "3 deadbeef 00000007 node-a");
        assert_eq!(hex("rt-1"), "72742d31");
    }
}
