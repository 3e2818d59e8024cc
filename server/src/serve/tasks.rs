//! What runs beside the listener: the pull sources, the demo feed, periodic snapshots and, on a
//! cluster, the sharing of snapshots. All of it stops before the exact snapshot at the stop.

use std::sync::Arc;

use tokio::task::JoinHandle;

use super::start::Started;
use super::ServeOptions;
use crate::cluster::Cluster;
use crate::config::Config;
use crate::log::Log;
use crate::runtime::registry::Runtimes;
use crate::source::{FileTail, FileTailConfig, SourceCheckpoint};

/// The tasks beside the listener.
pub(super) struct Tasks {
    /// The pull sources and the demo feed.
    sources: Vec<JoinHandle<()>>,
    /// Periodic snapshots, and their sharing with the cluster.
    snapshots: Vec<JoinHandle<()>>,
}

impl Tasks {
    /// Starts each runtime's pull source (see [`start_sources`]).
    pub(super) fn sources(config: &Config, started: &Started) -> Self {
        let sources = start_sources(
            config,
            &started.runtimes,
            started.cluster.as_ref(),
            &started.log,
        );
        Self {
            sources,
            snapshots: Vec::new(),
        }
    }

    /// Starts the demo feed into the runtime `demo` (none at rate 0; on a cluster, once per
    /// cluster: the node holding its lease feeds it), periodic snapshots (none at interval 0)
    /// and, on a cluster, the sharing of every snapshot written.
    pub(super) fn spawn_rest(&mut self, options: &ServeOptions, started: &Started) {
        let config = &options.config;
        let cluster = &started.cluster;
        if started.runtimes.get(super::demo::DEMO).is_some() && options.demo_rate > 0 {
            let (runtimes, hub, rate) = (
                Arc::clone(&started.runtimes),
                Arc::clone(&started.hub),
                options.demo_rate,
            );
            let feed =
                move || super::demo::spawn_feed(Arc::clone(&runtimes), Arc::clone(&hub), rate);
            self.sources.push(match cluster {
                // Once per cluster: the node holding its lease feeds it.
                Some(cluster) => {
                    cluster.spawn_once("demo-feed".into(), Arc::clone(&started.log), feed)
                }
                None => feed(),
            });
        }
        let periodic = (!config.server.snapshot_interval.is_zero()).then(|| {
            started
                .snapshots
                .spawn_periodic(config.server.snapshot_interval)
        });
        let sharing = cluster
            .as_ref()
            .map(|cluster| cluster.spawn_share(&started.snapshots));
        self.snapshots
            .extend([periodic, sharing].into_iter().flatten());
    }

    /// Stops them all: the sources and the feed first, then the snapshot tasks.
    pub(super) fn abort(self) {
        for source in self.sources {
            source.abort();
        }
        for task in self.snapshots {
            task.abort();
        }
    }
}

/// Starts each runtime's pull source where the applied history left it: on a cluster, once
/// per cluster, on the node holding its lease, from the checkpoint of the last record applied
/// when it takes the lease.
fn start_sources(
    config: &Config,
    runtimes: &Arc<Runtimes>,
    cluster: Option<&Arc<Cluster>>,
    log: &Arc<Log>,
) -> Vec<JoinHandle<()>> {
    let mut sources = Vec::new();
    for section in &config.runtimes {
        let Some(source) = &section.source else {
            continue;
        };
        if runtimes.get(&section.name).is_none() {
            continue;
        }
        let (runtimes, name, file) = (
            Arc::clone(runtimes),
            section.name.clone(),
            source.file.clone(),
        );
        let follow = move || {
            let (runtimes, name, file) = (Arc::clone(&runtimes), name.clone(), file.clone());
            tokio::spawn(async move {
                let Some(mut handle) = runtimes.get(&name).map(|registered| registered.handle)
                else {
                    return;
                };
                loop {
                    let position = match handle.save().await {
                        Ok(saved) => saved
                            .checkpoint
                            .map(|SourceCheckpoint::FileTail(position)| position),
                        Err(error) => {
                            tracing::debug!(%error, "runtime stopped; its file source does not start");
                            return;
                        }
                    };
                    let tail = FileTail::new(FileTailConfig::new(file.clone()), position);
                    // Ends when the runtime stops, or is aborted with this task; a runtime
                    // replaced by a define record is followed on from its checkpoint.
                    handle.follow(tail).await;
                    match runtimes.successor(&name, &handle) {
                        Some(next) => handle = next,
                        None => return,
                    }
                }
            })
        };
        sources.push(match cluster {
            Some(cluster) => {
                cluster.spawn_once(format!("source-{}", section.name), Arc::clone(log), follow)
            }
            None => follow(),
        });
    }
    sources
}
