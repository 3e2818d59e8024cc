//! The guest slot: the runtime's instance, made again from the last good state after a
//! failure, and one batch run through it.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::task::Task;
use super::{BatchSink, IngestError};
use crate::host::{GuestBatch, GuestError, GuestInstance};
use crate::log::BatchEntry;

impl<S: BatchSink> Task<S> {
    /// A new instance of the running module, from `state` (`None` or empty: the guest's
    /// `init`).
    pub(super) async fn instantiate(
        &self,
        module: &crate::host::GuestModule,
        state: Option<&[u8]>,
    ) -> Result<GuestInstance, GuestError> {
        let state = state.filter(|state| !state.is_empty());
        GuestInstance::new(
            module,
            &self.name,
            &self.config.limits,
            &self.config.guest_config,
            state,
        )
        .await
    }

    /// The instance, made again from the last good state if the last one was dropped.
    async fn instance(&mut self) -> Result<&mut GuestInstance, GuestError> {
        if self.instance.is_none() {
            let instance = self
                .instantiate(&self.module, Some(&self.last.state[..]))
                .await?;
            self.stats.restarts.fetch_add(1, Ordering::Relaxed);
            self.instance = Some(instance);
        }
        // Just filled if it was empty.
        self.instance
            .as_mut()
            .ok_or_else(|| GuestError::Protocol("instance vanished".into()))
    }

    /// Drops the instance (its heap may be mid-update) and makes it again from the last good
    /// state; a failure is retried on the next batch.
    pub(super) async fn reinstantiate(&mut self) {
        self.instance = None;
        if let Err(err) = self.instance().await {
            tracing::error!(error = %err, "re-instantiation failed; will retry on the next batch");
        }
    }
    /// Runs `entry`'s input through the guest (an empty input from a source runs nothing). On
    /// success the guest's new state is the last good one; on failure the instance is made
    /// again from the last good state.
    pub(super) async fn run_guest(
        &mut self,
        entry: &BatchEntry,
    ) -> Result<GuestBatch, IngestError> {
        if entry.input.is_empty() && entry.checkpoint.is_some() {
            return Ok(GuestBatch::default());
        }
        let views = Arc::clone(&self.views);
        let instance = match self.instance().await {
            Ok(instance) => instance,
            Err(source) => {
                tracing::error!(error = %source, "runtime unavailable: re-instantiation failed");
                return Err(IngestError::Unavailable {
                    runtime: self.name.to_string(),
                    source,
                });
            }
        };
        let outcome = match instance.on_batch(&entry.input).await {
            Ok(batch) => match declared(&views, batch) {
                Ok(batch) => instance.save().await.map(|state| (batch, state)),
                Err(error) => Err(error),
            },
            Err(err) => Err(err),
        };
        let source = match outcome {
            Ok((batch, state)) => {
                self.last.state = state;
                return Ok(batch);
            }
            Err(source) => source,
        };
        self.stats.failures.fetch_add(1, Ordering::Relaxed);
        if source.is_input_error() {
            tracing::info!(error = %source, "batch rejected");
        } else {
            tracing::warn!(error = %source, "guest failed; re-instantiating from the last good state");
        }
        // Drop the store whatever the failure: its heap may be mid-update.
        self.reinstantiate().await;
        let runtime = self.name.to_string();
        // The wall-clock backstop is a fault of the moment, not a verdict on the batch.
        Err(if matches!(source, GuestError::Timeout { .. }) {
            IngestError::Unavailable { runtime, source }
        } else {
            IngestError::Guest { runtime, source }
        })
    }

    /// Marks a gap on this runtime's views: the loss of its input touches nothing else.
    pub(super) fn mark_gap(&self) {
        self.stats.gaps.fetch_add(1, Ordering::Relaxed);
        self.journal
            .mark_gap_in(self.views.iter().map(String::as_str));
    }
}

/// `batch`, if it publishes only to `views` (what its runtime declares).
fn declared(views: &[String], batch: GuestBatch) -> Result<GuestBatch, GuestError> {
    match batch
        .events
        .iter()
        .find(|event| !views.iter().any(|v| **v == *event.view))
    {
        Some(event) => Err(GuestError::UndeclaredView {
            view: event.view.to_string(),
            declared: views.to_vec(),
        }),
        None => Ok(batch),
    }
}
