//! The log's metrics, and a cluster's: kept up to date by their owners, registered here.

use prometheus_client::registry::Registry;

use crate::log::LogMetrics;

/// Registers the log's metrics (kept up to date by the log itself).
pub(super) fn register_log(registry: &mut Registry, log: &LogMetrics) {
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
    register_cluster(registry, log);
}

/// Registers a cluster's metrics, part of the log's (kept up to date by the cluster's tasks).
fn register_cluster(registry: &mut Registry, log: &LogMetrics) {
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
        "viewtape_cluster_checks",
        "On a cluster: checks of what this node applied of a runtime's batch against the first node to check it, by outcome (first, agreed, differed: the runtime halts here, unchecked: NATS did not answer)",
        log.checks.clone(),
    );
    registry.register(
        "viewtape_cluster_lease_held",
        "On a cluster: 1 for each task whose lease this node holds (the demo feed, file sources)",
        log.leases_held.clone(),
    );
}
