//! A new module swapped in between two batches, the guest's state carried over (see
//! [`RuntimeHandle::deploy`](super::RuntimeHandle::deploy)).

use std::sync::{Arc, PoisonError};

use bytes::Bytes;

use super::command::DeployWhen;
use super::task::Task;
use super::{BatchSink, DeployError, Deployed};
use crate::host::{GuestError, GuestModule};
use crate::log::{unix_ms_now, DeployEntry, Entry, LogPosition};
use crate::schema::ViewSchemas;

/// A module made ready to take over.
struct Prepared {
    /// The state, in the module's own format.
    state: Bytes,
    schemas: Arc<ViewSchemas>,
}

impl<S: BatchSink> Task<S> {
    /// Swaps `module` in, carrying the state over, and logs it; at start-up ([`DeployWhen`]), a
    /// module that refuses the state starts fresh instead of being refused.
    pub(super) async fn deploy(
        &mut self,
        module: GuestModule,
        when: DeployWhen,
    ) -> Result<Deployed, DeployError> {
        let previous = self.slot.module().fingerprint().clone();
        let next = module.fingerprint().clone();
        let halted = self.last.halted.clone();
        if let (Some(halt), DeployWhen::Live) = (&halted, when) {
            return Err(DeployError::Halted {
                runtime: self.name.to_string(),
                halt: halt.clone(),
            });
        }
        if next == previous && halted.is_none() {
            return Ok(Deployed {
                previous,
                module: next,
                position: None,
                fresh: false,
            });
        }
        // The config names a module for a halted runtime: it starts fresh on it, whatever the
        // state it had.
        let fresh = halted.is_some();
        let prepared = self
            .prepare(&module, fresh)
            .await
            .map(|prepared| (prepared, fresh));
        let (prepared, fresh) = match prepared {
            Ok(prepared) => prepared,
            Err(error) if when == DeployWhen::AtStart => {
                tracing::warn!(%error, module = %next, "the new module refuses the saved state: it starts fresh, with a gap on this runtime's views");
                let prepared = self
                    .prepare(&module, true)
                    .await
                    .map_err(|source| self.refused(source))?;
                (prepared, true)
            }
            Err(error) => return Err(self.refused(error)),
        };
        let entry = Entry::Deploy(DeployEntry {
            runtime: self.name.to_string(),
            module: next.clone(),
            previous: previous.clone(),
            at_ms: unix_ms_now(),
            pending: false,
            fresh,
            guest_config: Some(self.guest_config_crc),
        });
        let position = self
            .log
            .append(vec![entry.encode()])
            .await
            .map_err(|source| DeployError::Log {
                runtime: self.name.to_string(),
                source,
            })?;
        let log = Arc::clone(&self.log);
        let turn = log.turn(position, 1).await;
        let deployed = self.install(module, prepared, fresh, position);
        drop(turn);
        tracing::info!(module = %next, %previous, fresh, "module deployed");
        Ok(deployed)
    }

    /// Switches to `module` at `position` of the log (already logged), from the state (or
    /// fresh): a deploy applied from the log. A refusal consumes the position all the same.
    pub(super) async fn switch(
        &mut self,
        module: GuestModule,
        fresh: bool,
        position: Option<LogPosition>,
    ) -> Result<Deployed, DeployError> {
        let prepared = self.prepare(&module, fresh).await;
        let log = Arc::clone(&self.log);
        let turn = log.turn(position, 1).await;
        let deployed = match prepared {
            Ok(prepared) => Ok(self.install(module, prepared, fresh, position)),
            Err(source) => Err(self.refused(source)),
        };
        drop(turn);
        deployed
    }

    /// The saved state (or a fresh one) in `module`'s own format, as an instance of it saves
    /// it, and the schemas it holds the views to — each of which the views' values already
    /// fit, where it changes.
    async fn prepare(&self, module: &GuestModule, fresh: bool) -> Result<Prepared, GuestError> {
        let state = (!fresh).then_some(&self.last.state[..]);
        let mut instance = self.slot.instantiate(module, state).await?;
        let schemas = self.slot.schemas_of(&instance)?;
        for (view, schema) in self.slot.schemas().changed_in(&schemas) {
            if let Some(violation) = self.sink.misfit(view, schema) {
                return Err(violation.into());
            }
        }
        let state = instance.save().await?;
        Ok(Prepared { state, schemas })
    }

    /// Makes `module` the running one, at its turn.
    fn install(
        &mut self,
        module: GuestModule,
        prepared: Prepared,
        fresh: bool,
        position: Option<LogPosition>,
    ) -> Deployed {
        let Prepared { state, schemas } = prepared;
        // Only a fresh start lifts a halt (a halted runtime takes no other deploy).
        match (fresh, self.last.halted.take()) {
            (true, Some(halt)) => {
                tracing::warn!(position = halt.position.get(), "the halted runtime starts fresh on a new module: a gap on its views, past every offset the records it could not apply may have taken");
                self.mark_loss(halt.lost);
            }
            (true, None) if !self.last.state.is_empty() => {
                tracing::warn!("the guest starts fresh: its earlier state is gone");
                self.mark_gap();
            }
            (false, halted) => self.last.halted = halted,
            (true, None) => {}
        }
        let previous = self.slot.module().fingerprint().clone();
        let next = module.fingerprint().clone();
        *self
            .schemas_now
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Arc::clone(&schemas);
        *self
            .module_now
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = module.clone();
        self.slot.install(module, schemas);
        self.last.state = state;
        self.note_state();
        self.last.ran(&next);
        self.deployed();
        Deployed {
            previous,
            module: next,
            position,
            fresh,
        }
    }

    fn refused(&self, source: GuestError) -> DeployError {
        DeployError::Refused {
            runtime: self.name.to_string(),
            source,
        }
    }
}
