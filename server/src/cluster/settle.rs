//! Settling a node's runtimes with the stream, once, when it has caught up: its config's
//! runtimes the stream never saw are declared by define records (so every node runs them), a
//! runtime whose module the stream has not decided gets this node's by a deploy record, and a
//! node whose config contradicts the cluster is not ready and takes no ingest.

use std::sync::atomic::Ordering;

use async_nats::jetstream::stream::LastRawMessageErrorKind;

use super::apply::Appliers;
use super::bucket::BoxError;
use super::{Cluster, RETRY};
use crate::catalog::CatalogError;
use crate::log::{Definition, Log, LogPosition};
use crate::runtime::registry::Registered;
use crate::runtime::{DeployError, IngestError, RuntimeSnapshot};

impl Cluster {
    /// Settles this node's runtimes against the stream, once, when it has caught up:
    /// - a runtime of its config that the stream has no record of is declared by a define
    ///   record (published here, applied by every node: all of them run it from then on);
    /// - one the stream defined runs as the stream says (a config that says otherwise is
    ///   logged);
    /// - one whose module the stream has not decided yet has this node's declared (a deploy
    ///   record); then this node's config must name a module the runtime has run on the
    ///   stream, with the guest config the stream decided: a node that runs another build than
    ///   the cluster is not ready and takes no ingest.
    pub(super) async fn settle_modules(&self, appliers: &Appliers, log: &Log) {
        let mut refused = Vec::new();
        for (name, registered) in appliers.runtimes.iter() {
            if let Some(running) = &registered.definition() {
                let Some(own) = appliers.configured.get(&name) else {
                    continue;
                };
                match registered.handle.save().await {
                    Ok(saved) => refused.extend(disagreements(&name, own, running, &saved)),
                    Err(error) => refused.push(format!(
                        "runtime {name:?}: its state could not be read: {error}"
                    )),
                }
                continue;
            }
            // NATS away, or the declaration not applied in time: tried again until it goes
            // through (the node stays not ready and takes no ingest meanwhile). Another node's
            // record may replace or delete the runtime meanwhile: each try settles the one that
            // runs then.
            let mut attempt = 0u32;
            self.readiness
                .send_modify(|readiness| readiness.settling = Some(name.clone()));
            let declared = loop {
                // Read before the runtime is: the runtime read reflects at least this much.
                let committed = log.committed();
                let Some(registered) = appliers.runtimes.get(&name) else {
                    break None;
                };
                if registered.definition().is_some() {
                    break None;
                }
                match self.declare(appliers, committed, &name, &registered).await {
                    Ok(declared) => break Some((declared, registered)),
                    Err(error) => {
                        if attempt.is_multiple_of(5) {
                            tracing::warn!(%error, runtime = name, "cluster: the runtime could not be declared on the stream yet; retrying");
                        }
                        attempt += 1;
                        tokio::time::sleep(RETRY).await;
                    }
                }
            };
            let Some((declared, registered)) = declared else {
                // Defined or deleted by another node's record: it runs as the stream says.
                continue;
            };
            let saved = match declared {
                Declared::Module(saved) => *saved,
                Declared::Defined => continue,
                Declared::Refused(reason) => {
                    refused.push(format!("runtime {name:?}: {reason}"));
                    continue;
                }
                Declared::HistoryMissing => {
                    refused.push(format!(
                        "runtime {name:?}: the stream holds its records from before this node's state, which holds nothing of it (the state was made by a node that does not run it): this node cannot know its history. To serve it, start this node with an empty data directory, so it joins from the stream's beginning or from a shared snapshot that holds the runtime"
                    ));
                    continue;
                }
            };
            if !saved.modules.contains(&registered.configured) {
                refused.push(format!(
                    "runtime {name:?}: this node's config names module {}, which the cluster never ran; the cluster runs {}. Start this node on the cluster's module, or deploy yours through any node (PUT /admin/runtimes/{name}/module, or viewtape deploy)",
                    registered.configured,
                    registered.handle.module()
                ));
            }
            let own = registered.handle.guest_config_crc();
            if let Some(decided) = saved.config.filter(|&decided| decided != own) {
                refused.push(format!(
                    "runtime {name:?}: this node's guest config (`config =`, crc {own:08x}) is not the one the cluster runs (crc {decided:08x}). Start this node with the same `config =` as the others"
                ));
            }
        }
        for name in appliers.configured.keys() {
            if appliers.runtimes.get(name).is_none() {
                tracing::warn!(runtime = name, "cluster: this node's config declares a runtime the cluster deleted; it stays deleted (PUT /admin/runtimes/{{runtime}} creates it again on every node)");
            }
        }
        self.readiness
            .send_modify(|readiness| readiness.settling = None);
        if !refused.is_empty() {
            let reason = refused.join("; ");
            tracing::error!(%reason, "cluster: this node runs another build than the cluster: not ready, no ingest; it applies the stream with the cluster's modules meanwhile");
            self.stream_log.refuse(reason.clone());
            self.readiness
                .send_modify(|readiness| readiness.refused = Some(reason));
        }
        self.stream_log.open();
        self.settled.store(true, Ordering::Relaxed);
        let stream_last = LogPosition::new(self.stream_last.load(Ordering::Relaxed));
        self.update_readiness(log.committed(), stream_last);
    }

    /// Declares the config runtime `registered` on the stream if the stream has not decided its
    /// module yet: by a define record when the stream holds no record of it, else by a deploy
    /// record of its module. See [`Declared`]. `registered` was read after this node had applied
    /// the stream through `committed`.
    async fn declare(
        &self,
        appliers: &Appliers,
        committed: LogPosition,
        name: &str,
        registered: &Registered,
    ) -> Result<Declared, DeclareError> {
        let saved = registered.handle.save().await?;
        if !saved.modules.is_empty() {
            return Ok(Declared::Module(Box::new(saved)));
        }
        // Its records on its own subject, and any this node passed over before (also those in
        // messages of several runtimes, and those the stream no longer holds).
        let stream = &self.stream_log;
        let first = self
            .first_record_on(stream.subject(name))
            .await?
            .into_iter()
            .chain(stream.first_passed_over(name))
            .min();
        if first.is_some_and(|first| first <= committed) {
            return Ok(Declared::HistoryMissing);
        }
        let running = registered.handle.module();
        let wasm = appliers.modules.get(&running)?;
        self.put_module(&wasm).await.map_err(DeclareError::Bucket)?;
        match (first, appliers.configured.get(name)) {
            (None, Some(definition)) => {
                match appliers
                    .catalog
                    .put_settling(name, definition.clone())
                    .await
                {
                    Ok((changed, _)) => {
                        tracing::info!(runtime = name, ?changed, "cluster: this node's config declares a runtime the stream had no record of: defined on every node");
                        Ok(Declared::Defined)
                    }
                    Err(error @ (CatalogError::Shared { .. } | CatalogError::Log { .. })) => {
                        Err(DeclareError::Define(error))
                    }
                    Err(error) => Ok(Declared::Refused(error.to_string())),
                }
            }
            _ => {
                registered.handle.declare_module().await?;
                Ok(Declared::Module(Box::new(registered.handle.save().await?)))
            }
        }
    }

    /// The sequence of the first record on `subject` the stream holds, if it holds any.
    async fn first_record_on(&self, subject: String) -> Result<Option<LogPosition>, DeclareError> {
        let stream = self
            .js
            .get_stream_no_info(&self.stream)
            .await
            .map_err(|error| DeclareError::Stream(error.into()))?;
        match stream.get_first_raw_message_by_subject(subject, 1).await {
            Ok(message) => Ok(Some(LogPosition::new(message.sequence))),
            Err(error) if error.kind() == LastRawMessageErrorKind::NoMessageFound => Ok(None),
            Err(error) => Err(DeclareError::Stream(error.into())),
        }
    }
}

/// How this node's config (`own`) disagrees with the cluster's definition of runtime `name`
/// (`running`, whose state is `saved`), as reasons to refuse: it names a module the runtime has
/// not run on the stream, or another guest config or schemas. Other differences (views,
/// limits) are logged: the node runs the cluster's definition.
fn disagreements(
    name: &str,
    own: &Definition,
    running: &Definition,
    saved: &RuntimeSnapshot,
) -> Vec<String> {
    let mut reasons = Vec::new();
    if !saved.modules.contains(&own.module) {
        reasons.push(format!(
            "runtime {name:?}: this node's config names module {}, which the cluster never ran; the cluster defined it on {}. Start this node on the cluster's module, or deploy yours through any node (PUT /admin/runtimes/{name}/module, or viewtape deploy)",
            own.module, running.module
        ));
    }
    if own.guest_config() != running.guest_config() || own.schemas != running.schemas {
        reasons.push(format!(
            "runtime {name:?}: this node's guest config (`config =`, `schemas`) is not the one the cluster defined. Start this node with the cluster's (GET /admin/runtimes/{name} shows it), or change it through any node (PUT /admin/runtimes/{name})"
        ));
    }
    if reasons.is_empty() && (own.views != running.views || own.limits != running.limits) {
        tracing::warn!(runtime = name, "cluster: this node's config gives this runtime other views or limits than the cluster defined; it runs the cluster's definition (GET /admin/runtimes/{{runtime}} shows it)");
    }
    reasons
}

/// Why a runtime's module could not be declared on the stream yet (tried again until it is).
#[derive(Debug, thiserror::Error)]
enum DeclareError {
    /// The runtime's state could not be read.
    #[error(transparent)]
    Save(#[from] IngestError),
    /// The module is not in this node's store.
    #[error(transparent)]
    Store(#[from] std::io::Error),
    /// The module could not be put in the bucket.
    #[error(transparent)]
    Bucket(BoxError),
    /// The stream could not be read.
    #[error(transparent)]
    Stream(BoxError),
    /// The declaration was not applied.
    #[error(transparent)]
    Declare(#[from] DeployError),
    /// The define record was not published, or not applied in time.
    #[error(transparent)]
    Define(CatalogError),
}

/// What declaring a config runtime on the stream came to.
enum Declared {
    /// Its module is decided (now or before): the runtime's state then (the modules it has run
    /// on the stream, the guest config the stream decided).
    Module(Box<RuntimeSnapshot>),
    /// It is defined by a record: this node's, as its config says (the stream had no record of
    /// it), or another node's, applied here meanwhile.
    Defined,
    /// The cluster refused its definition (its views overlap another runtime's, say).
    Refused(String),
    /// The stream holds records of it from before this node's state, or this node passed over
    /// some before, and the state has never applied its declaration: its history is missing
    /// here.
    HistoryMissing,
}
