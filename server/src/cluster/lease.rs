//! What runs once per cluster: the node holding a lease (a JetStream key-value entry) runs
//! it, renewing the lease every third of [`LEASE`]; when that node is gone, another takes the
//! lease within [`LEASE`] and starts it there.

use std::sync::Arc;

use bytes::Bytes;
use tokio::task::JoinHandle;
use tracing::Instrument as _;

use super::{Cluster, LEASE};
use crate::log::{Log, LogPosition};

impl Cluster {
    /// Runs what `start` starts (`name`: the demo feed, a file source) on one node of the
    /// cluster at a time: the node that holds its lease, taken once the node is ready and has
    /// applied everything the stream held then (so it starts from the last record the previous
    /// holder published), and renewed every
    /// third of [`LEASE`]. A node that cannot renew stops it; when its holder is gone, another
    /// node takes the lease within [`LEASE`] and starts it there. that holds its lease, taken once the node is ready and renewed every
    /// third of [`LEASE`]. A node that cannot renew stops it; when its holder is gone, another
    /// node takes the lease within [`LEASE`] and starts it there.
    pub fn spawn_once<F>(self: &Arc<Self>, name: String, log: Arc<Log>, start: F) -> JoinHandle<()>
    where
        F: Fn() -> JoinHandle<()> + Send + 'static,
    {
        let cluster = Arc::clone(self);
        let span = tracing::info_span!("cluster_once", task = %name);
        tokio::spawn(async move { cluster.hold_lease(&name, &log, start).await }.instrument(span))
    }

    async fn hold_lease(&self, name: &str, log: &Log, start: impl Fn() -> JoinHandle<()>) {
        let held = log
            .metrics()
            .leases_held
            .get_or_create(&[("task", name.to_owned())])
            .clone();
        let holder = Bytes::from(format!(
            "pid {} since {}",
            std::process::id(),
            crate::log::unix_ms_now()
        ));
        let mut tick = tokio::time::interval(LEASE / 3);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // The task, aborted when the lease is lost (or this loop is).
        let mut running: Option<(AbortOnDrop, u64)> = None;
        loop {
            tick.tick().await;
            running = match running.take() {
                None if !self.readiness().ready => None,
                None => match self.leases.create(name, holder.clone()).await {
                    Ok(revision) => {
                        self.caught_up(log).await;
                        tracing::info!(name, "cluster: this node holds the lease; starting");
                        held.set(1);
                        Some((AbortOnDrop(start()), revision))
                    }
                    Err(_) => None,
                },
                Some((task, revision)) => {
                    match self.leases.update(name, holder.clone(), revision).await {
                        Ok(revision) => Some((task, revision)),
                        Err(error) => {
                            tracing::warn!(%error, name, "cluster: the lease could not be renewed; stopped here");
                            held.set(0);
                            None
                        }
                    }
                }
            };
        }
    }
}

impl Cluster {
    /// Waits (at most a lease's time) until this node has applied everything the stream holds
    /// now.
    async fn caught_up(&self, log: &Log) {
        let last = match self.js.get_stream(&self.stream).await {
            Ok(mut stream) => match stream.info().await {
                Ok(info) => LogPosition::new(info.state.last_sequence),
                Err(_) => return,
            },
            Err(_) => return,
        };
        let mut committed = log.watch_committed();
        let _ = tokio::time::timeout(LEASE, committed.wait_for(|c| *c >= last)).await;
    }
}

/// A task aborted when this is dropped.
struct AbortOnDrop(JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
