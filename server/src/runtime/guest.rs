//! The guest slot ([`GuestSlot`]): a runtime's module, run one batch at a time. The runtime
//! task owns one; `viewtape run` runs one over recorded input, so a batch runs, fails and rolls
//! back there exactly as in the server.
//!
//! Every batch runs on an instance made for it from the last good state, and the instance is
//! dropped when the batch ends. A guest's output is so a function of its module, its config,
//! the state it saved and the batch — never of an instance's history: a warm instance's heap
//! (an allocator's free lists, a JavaScript engine's objects, module-level variables, when its
//! garbage collector runs) cannot make the live run differ from a replay after a restart, a
//! restore or on another node, and fuel costs the same on both. Nothing is held between
//! batches but the state's bytes, so an idle runtime costs no instance.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::Bytes;
use viewtape_journal::ViewClaim;

use super::{FailureKind, RuntimeStats};

use crate::host::{EventKind, GuestBatch, GuestError, GuestInstance, GuestModule, Limits};
use crate::schema::{too_deep, ConfiguredSchemas, ViewSchemas};

/// Why a batch did not run through a [`GuestSlot`].
#[derive(Debug)]
pub enum SlotError {
    /// The guest failed on the batch (trap, rejection, limits, a view it may not publish to);
    /// the state stays the last good one.
    Failed(GuestError),
    /// No instance could be made from the last good state: nothing ran.
    Unavailable(GuestError),
}

/// A runtime's module, its limits and config. The last good state lives with its owner, which
/// hands it to [`GuestSlot::run`]: the state a failure rolls back to is always the one that
/// owner keeps.
#[derive(Debug)]
pub struct GuestSlot {
    module: GuestModule,
    name: Arc<str>,
    limits: Limits,
    config: Bytes,
    stats: Arc<RuntimeStats>,
    /// Where its events may go and what they must look like.
    typing: Typing,
    /// The schemas of the module it runs: its declaration over the configured ones.
    schemas: Arc<ViewSchemas>,
}

/// What a slot's events must look like: the views they may go to (what the runtime declares;
/// `None`: anywhere, as `viewtape run` has no config to say) and the schemas the config gives
/// some of them.
#[derive(Clone, Debug, Default)]
pub struct Typing {
    /// The declared views.
    pub views: Option<Arc<[String]>>,
    /// Schemas from the config, which win over the guest's for the views they name.
    pub configured: ConfiguredSchemas,
}

impl GuestSlot {
    /// `module` as runtime `name` with `limits`, its events held to `typing`, checked by an
    /// instance from `state` (`None` or empty: the guest's `init` with `config`), which is
    /// dropped; failures are counted in `stats`.
    ///
    /// # Errors
    /// The guest's `init` or `restore` refused, no instance could be made, or the guest
    /// declared schemas that cannot be used.
    pub async fn new(
        module: GuestModule,
        name: Arc<str>,
        limits: Limits,
        config: Bytes,
        typing: Typing,
        state: Option<&[u8]>,
        stats: Arc<RuntimeStats>,
    ) -> Result<Self, GuestError> {
        let mut slot = Self {
            module,
            name,
            limits,
            config,
            stats,
            typing,
            schemas: ViewSchemas::none(),
        };
        slot.schemas = if slot.module.is_unavailable() {
            // A halted runtime's stand-in: held to what its config declares.
            Arc::new(ViewSchemas::declared(
                None,
                &slot.typing.configured,
                slot.typing.views.as_deref(),
            )?)
        } else {
            let instance = slot.instantiate(&slot.module, state).await?;
            slot.schemas_of(&instance)?
        };
        Ok(slot)
    }

    /// The module it runs.
    pub fn module(&self) -> &GuestModule {
        &self.module
    }

    /// The schemas its events are held to now.
    pub fn schemas(&self) -> &Arc<ViewSchemas> {
        &self.schemas
    }

    /// The schemas events are held to when `instance` (of this slot's module or another one)
    /// runs: its declaration over the configured schemas.
    ///
    /// # Errors
    /// [`GuestError::Schema`]: the declaration cannot be used.
    pub fn schemas_of(&self, instance: &GuestInstance) -> Result<Arc<ViewSchemas>, GuestError> {
        let schemas = ViewSchemas::declared(
            instance.declaration(),
            &self.typing.configured,
            self.typing.views.as_deref(),
        )?;
        Ok(Arc::new(schemas))
    }

    /// A new instance of `module` from `state` (`None` or empty: `init`), with this slot's
    /// name, limits and config; the running one is untouched.
    ///
    /// # Errors
    /// As [`GuestSlot::new`].
    pub async fn instantiate(
        &self,
        module: &GuestModule,
        state: Option<&[u8]>,
    ) -> Result<GuestInstance, GuestError> {
        let state = state.filter(|state| !state.is_empty());
        GuestInstance::new(module, &self.name, &self.limits, &self.config, state).await
    }

    /// What an instance from `state` (empty: `init`) saves.
    ///
    /// # Errors
    /// No instance could be made, or the guest's `save` failed.
    pub async fn saved(&self, state: &[u8]) -> Result<Bytes, GuestError> {
        self.instantiate(&self.module, Some(state))
            .await?
            .save()
            .await
    }

    /// Runs `module` from now on, its events held to `schemas`.
    pub fn install(&mut self, module: GuestModule, schemas: Arc<ViewSchemas>) {
        self.module = module;
        self.schemas = schemas;
    }

    /// Runs `input`, ingested at `at_ms`, through an instance made from `state`; the events must
    /// go to the declared views and fit their schemas (unless `fit` says they are known to). On
    /// success `state` becomes the guest's new state; on failure it stays the last good one.
    ///
    /// # Errors
    /// [`SlotError`].
    pub async fn run(
        &self,
        input: &[u8],
        at_ms: u64,
        state: &mut Bytes,
        fit: Fit,
    ) -> Result<GuestBatch, SlotError> {
        let views = self.typing.views.clone();
        let schemas = match fit {
            Fit::Check => Some(Arc::clone(&self.schemas)),
            Fit::Known => None,
        };
        let mut instance = match self.instantiate(&self.module, Some(state)).await {
            Ok(instance) => instance,
            Err(error) => {
                self.stats.failed(FailureKind::Unavailable, &error);
                return Err(SlotError::Unavailable(error));
            }
        };
        // A logged batch's verdict was given live: a replay follows it, whatever the limits
        // are now.
        instance.meter(fit == Fit::Check);
        let outcome = match instance.on_batch(input, at_ms).await {
            Ok(batch) => match typed(views.as_deref(), schemas.as_deref(), batch) {
                Ok(batch) => instance.save().await.map(|saved| (batch, saved)),
                Err(error) => Err(error),
            },
            Err(err) => Err(err),
        };
        drop(instance);
        let error = match outcome {
            Ok((batch, saved)) => {
                *state = saved;
                return Ok(batch);
            }
            Err(error) => error,
        };
        self.stats.failures.fetch_add(1, Ordering::Relaxed);
        if error.is_input_error() {
            self.stats.failed(FailureKind::Rejected, &error);
            tracing::info!(%error, "batch rejected");
        } else {
            self.stats.failed(FailureKind::Failed, &error);
            tracing::warn!(%error, "guest failed; the state stays the last good one");
        }
        Err(SlotError::Failed(error))
    }
}

/// Whether a run checks its events against the views' schemas.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fit {
    /// New input: every update must fit its view's schema.
    Check,
    /// A logged batch run again: its events are checked against what the log says it
    /// produced (a digest), which fitted when it committed, and it runs without the fuel limit,
    /// which judged it live (the fuel a batch costs depends on the instance's history).
    Known,
}

/// `batch`, if it publishes only to `views` (what its runtime declares; `None`: anywhere) and,
/// with `schemas` (new input; `None`: a logged batch run again, whose events fitted when it
/// committed), every update's JSON value is within [`crate::schema::MAX_DEPTH`] and fits its view's schema;
/// with every event's JSON verdict settled.
fn typed(
    views: Option<&[String]>,
    schemas: Option<&ViewSchemas>,
    mut batch: GuestBatch,
) -> Result<GuestBatch, GuestError> {
    if let Some(views) = views {
        if let Some(event) = batch
            .events
            .iter()
            .find(|event| !ViewClaim::any_takes(views, &event.view))
        {
            return Err(GuestError::UndeclaredView {
                view: event.view.to_string(),
                declared: views.to_vec(),
            });
        }
    }
    let checked = schemas.is_some();
    let schemas = schemas.filter(|schemas| !schemas.is_empty());
    for event in &mut batch.events {
        // Text that is not JSON is published as a JSON string of it: only a value is bounded.
        if checked && event.kind == EventKind::Update && too_deep(&event.payload) && event.is_json()
        {
            return Err(GuestError::TooDeep {
                view: event.view.to_string(),
                key: event.key.to_string(),
            });
        }
        // Valid JSON by its grammar, and still refused by every strict reader: not published.
        if checked && event.escapes_lone_surrogate() && event.is_json() {
            return Err(GuestError::LoneSurrogate {
                view: event.view.to_string(),
                key: event.key.to_string(),
            });
        }
        let schema = schemas
            .filter(|_| event.kind == EventKind::Update)
            .and_then(|schemas| schemas.get(&event.view));
        if let Some(schema) = schema {
            schema.check(&event.view, &event.key, &event.payload)?;
        }
        // A value that fitted its schema was parsed as JSON by the check: no second parse.
        event.settle_json(schema.is_some());
    }
    Ok(batch)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use crate::host::GuestEvent;

    use super::*;

    fn update(view: &str, payload: &'static [u8]) -> GuestEvent {
        GuestEvent::unsettled(
            Arc::from(view),
            "k",
            EventKind::Update,
            Bytes::from_static(payload),
        )
    }

    #[test]
    fn every_event_leaves_with_its_json_verdict() {
        let declaration =
            serde_json::to_vec(&serde_json::json!({"schemas": {"typed": {"type": "object"}}}))
                .unwrap();
        let schemas = ViewSchemas::declared(Some(&declaration), &BTreeMap::new(), None).unwrap();
        let batch = || {
            GuestBatch::of_events(vec![
                update("typed", br#"{"a":1}"#),
                update("plain", br#"{"a":1}"#),
                update("plain", b"not json"),
            ])
        };
        for schemas in [Some(&schemas), None] {
            let checked = typed(None, schemas, batch()).unwrap();
            let verdicts: Vec<bool> = checked.events.iter().map(GuestEvent::is_json).collect();
            assert_eq!(
                verdicts,
                [true, true, false],
                "schemas: {}",
                schemas.is_some()
            );
        }
        let refused = GuestBatch::of_events(vec![update("typed", b"not json")]);
        assert!(matches!(
            typed(None, Some(&schemas), refused),
            Err(GuestError::SchemaViolation(_))
        ));
    }

    /// A value nested 200,000 deep was taken by an untyped view (a `builtin:json` one), and
    /// called "not JSON" by a typed one: one bound now refuses it in every view, by name.
    #[test]
    fn every_view_refuses_a_value_nested_past_the_one_bound() {
        let nested = |depth: usize| {
            let text = format!("{}1{}", "[".repeat(depth), "]".repeat(depth));
            Bytes::from(text.into_bytes())
        };
        let event = |view: &str, payload: Bytes| {
            GuestEvent::unsettled(Arc::from(view), "k", EventKind::Update, payload)
        };
        let declaration =
            serde_json::to_vec(&serde_json::json!({"schemas": {"typed": {"type": "array"}}}))
                .unwrap();
        let schemas = ViewSchemas::declared(Some(&declaration), &BTreeMap::new(), None).unwrap();
        for view in ["typed", "plain"] {
            for depth in [crate::schema::MAX_DEPTH + 1, 200_000] {
                let batch = GuestBatch::of_events(vec![event(view, nested(depth))]);
                let error = typed(None, Some(&schemas), batch).unwrap_err();
                assert!(
                    matches!(&error, GuestError::TooDeep { view: v, .. } if v == view),
                    "{view}: {error}"
                );
                assert!(
                    error.to_string().contains("nested deeper than 128"),
                    "{error}"
                );
                assert!(error.is_input_error());
            }
            let within = GuestBatch::of_events(vec![event(view, nested(crate::schema::MAX_DEPTH))]);
            let batch = typed(None, Some(&schemas), within).unwrap();
            assert!(batch.events[0].is_json(), "{view}");
        }
        // Text that is not JSON is no value, whatever its brackets: published as a string.
        let text = Bytes::from("[".repeat(1_000).into_bytes());
        let batch = typed(
            None,
            Some(&schemas),
            GuestBatch::of_events(vec![event("plain", text)]),
        );
        assert!(!batch.unwrap().events[0].is_json());
        // A logged batch run again is not held to it: it committed as it was.
        let known = GuestBatch::of_events(vec![event("plain", nested(1_000))]);
        assert!(typed(None, None, known).is_ok());
    }

    /// A JavaScript guest's `ctx.publish('v', 'k', {a: '\uD800'})` published `{"a":"\ud800"}`,
    /// which no strict JSON reader takes: refused in every view, by name, as new input.
    #[test]
    fn every_view_refuses_a_value_with_a_lone_surrogate() {
        let declaration =
            serde_json::to_vec(&serde_json::json!({"schemas": {"typed": {"type": "object"}}}))
                .unwrap();
        let schemas = ViewSchemas::declared(Some(&declaration), &BTreeMap::new(), None).unwrap();
        for view in ["typed", "plain"] {
            let batch = GuestBatch::of_events(vec![update(view, br#"{"a":"\ud800"}"#)]);
            let error = typed(None, Some(&schemas), batch).unwrap_err();
            assert!(
                matches!(&error, GuestError::LoneSurrogate { view: v, .. } if v == view),
                "{view}: {error}"
            );
            assert!(error.is_input_error());
            let paired = GuestBatch::of_events(vec![update(view, br#"{"a":"\ud83d\ude00"}"#)]);
            assert!(typed(None, Some(&schemas), paired).is_ok());
        }
        // Text that is not JSON is published as a string of it, its backslashes as they are.
        let text = GuestBatch::of_events(vec![update("plain", br#"\ud800 {"#)]);
        assert!(!typed(None, Some(&schemas), text).unwrap().events[0].is_json());
        let known = GuestBatch::of_events(vec![update("plain", br#"{"a":"\ud800"}"#)]);
        assert!(typed(None, None, known).is_ok());
    }
}
