//! Runtimes as data, through the admin routes (access and strict inputs as in [`super`]):
//!
//! | route | what |
//! |---|---|
//! | `POST /admin/modules` | body: a guest module, WebAssembly or JavaScript (at most 64 MiB); checked and kept by SHA-256: `{"module":"sha256:…","kind":"wasm"|"js","bytes":N}`, the same for the same bytes |
//! | `PUT /admin/runtimes/{runtime}` | body: `{"module","views"[,"config","schemas","limits"]}`; `201` created, `200` replaced (the state carried over as by a deploy) or unchanged; `400` a body that is not such JSON (a key given twice named in `field`), `413` one over 256 KiB, `422` a wrong field (named in `field`, in our words), `409 view_conflict` a view another runtime has |
//! | `GET /admin/runtimes/{runtime}` | its definition and status |
//! | `DELETE /admin/runtimes/{runtime}` | `200`; its ingest answers `404` from then on and its views are retired |
//!
//! Each change is a record of the log ([`crate::catalog`]).

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use bytes::Bytes;
use viewtape_journal::ViewName;

use super::gate::{json_object, Admin, Authorized};
use crate::catalog::{CatalogError, Changed};
use crate::config::{LimitsSection, BUILTIN_GUESTS};
use crate::deploy::{DeployActionError, MAX_MODULE_BYTES};
use crate::host::ModuleFingerprint;
use crate::http::body::read_body;
use crate::http::ApiError;
use crate::log::Definition;
use crate::runtime::registry::Registered;

/// Largest body of `PUT /admin/runtimes/{runtime}` (schemas included).
const MAX_DEFINITION_BODY: usize = 256 * 1024;

/// The fields `PUT /admin/runtimes/{runtime}` takes.
const FIELDS: [&str; 5] = ["module", "views", "config", "schemas", "limits"];

/// What `PUT /admin/runtimes/{runtime}` takes, as a refusal says it.
const SHAPE: &str = "{\"module\": \"builtin:json\" | \"sha256:<hex>\", \"views\": [\"…\"], \"config\"?: \"…\", \"schemas\"?: {\"view\": {…}}, \"limits\"?: {…}}";

impl From<CatalogError> for ApiError {
    fn from(error: CatalogError) -> Self {
        match &error {
            CatalogError::NoSuchRuntime(_) => ApiError::not_found(error.to_string()),
            CatalogError::Conflict { view, runtime, .. } => {
                let (view, runtime) = (view.clone(), runtime.clone());
                ApiError::conflict("view_conflict", error.to_string())
                    .with_field("view", view)
                    .with_field("runtime", runtime)
            }
            CatalogError::Invalid { field, .. } => {
                let field = field.clone();
                ApiError::unprocessable("invalid_definition", error.to_string())
                    .with_field("field", field)
            }
            CatalogError::NoSuchModule(_) => {
                ApiError::unprocessable("invalid_definition", error.to_string())
                    .with_field("field", "module")
            }
            CatalogError::Refused { .. } => {
                ApiError::unprocessable("module_refused", error.to_string())
            }
            CatalogError::Capacity { .. } => ApiError::unavailable(error.to_string()),
            CatalogError::Log { .. } | CatalogError::Shared { .. } => {
                ApiError::unavailable_hiding(
                    "the change could not be made durable now; nothing changed (the server log says why)",
                    &error,
                )
            }
        }
    }
}

/// `POST /admin/modules`: the module checked and kept.
pub(super) async fn put_module(
    _: Authorized,
    State(admin): State<Arc<Admin>>,
    body: axum::body::Body,
) -> Result<Json<serde_json::Value>, ApiError> {
    let bytes = read_body(body, MAX_MODULE_BYTES).await?;
    let size = bytes.len();
    let module = admin.deployer().keep("(upload)", bytes).await?;
    tracing::info!(action = "module", module = %module.fingerprint(), bytes = size, "admin: module kept");
    Ok(Json(serde_json::json!({
        "module": module.fingerprint().to_string(),
        "kind": module.kind_name(),
        "bytes": size,
    })))
}

/// `PUT /admin/runtimes/{runtime}`: create or replace.
pub(super) async fn put_runtime(
    _: Authorized,
    State(admin): State<Arc<Admin>>,
    runtime: Result<Path<String>, PathRejection>,
    body: axum::body::Body,
) -> Result<(StatusCode, Json<serde_json::Value>), ApiError> {
    let Path(runtime) = runtime?;
    ViewName::new(&runtime).map_err(|_| {
        ApiError::bad_request(format!(
            "runtime name {runtime:?}: use 1-128 of A-Z a-z 0-9 . _ -"
        ))
    })?;
    let object = json_object(body, MAX_DEFINITION_BODY, &FIELDS, SHAPE).await?;
    let running = admin.catalog().runtimes().get(&runtime);
    let definition = definition(&admin, running.as_ref(), object).await?;
    let (changed, position) = admin.catalog().put(&runtime, definition).await?;
    tracing::info!(action = "define", %runtime, ?changed, "admin: runtime defined");
    let status = match changed {
        Changed::Created => StatusCode::CREATED,
        Changed::Replaced | Changed::Unchanged | Changed::Deleted => StatusCode::OK,
    };
    let registered = admin
        .catalog()
        .runtimes()
        .get(&runtime)
        .ok_or_else(|| ApiError::not_found(format!("no runtime named {runtime:?}")))?;
    let mut answer = describe(&runtime, &registered);
    answer["position"] = position.map(|p| p.get()).into();
    Ok((status, Json(answer)))
}

/// `GET /admin/runtimes/{runtime}`: its definition and status.
pub(super) async fn get_runtime(
    _: Authorized,
    State(admin): State<Arc<Admin>>,
    runtime: Result<Path<String>, PathRejection>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let Path(runtime) = runtime?;
    let registered = admin
        .catalog()
        .runtimes()
        .get(&runtime)
        .ok_or_else(|| ApiError::not_found(format!("no runtime named {runtime:?}")))?;
    Ok(Json(describe(&runtime, &registered)))
}

/// `DELETE /admin/runtimes/{runtime}`.
pub(super) async fn delete_runtime(
    _: Authorized,
    State(admin): State<Arc<Admin>>,
    runtime: Result<Path<String>, PathRejection>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let Path(runtime) = runtime?;
    let position = admin.catalog().delete(&runtime).await?;
    tracing::info!(action = "delete", %runtime, "admin: runtime deleted; its views are retired");
    Ok(Json(serde_json::json!({
        "runtime": runtime,
        "deleted": true,
        "position": position.map(|p| p.get()),
    })))
}

/// A runtime as `GET` shows it: what it is made of (as a `PUT` takes it) and how it runs.
fn describe(name: &str, registered: &Registered) -> serde_json::Value {
    let handle = &registered.handle;
    let stats = handle.stats();
    let status = serde_json::json!({
        "running_module": handle.module().to_string(),
        "state_bytes": stats.state_bytes.load(Ordering::Relaxed),
        "batches": stats.batches.load(Ordering::Relaxed),
        "failures": stats.failures.load(Ordering::Relaxed),
        "halted": stats.halted(),
    });
    let Some(definition) = registered.definition() else {
        return serde_json::json!({
            "runtime": name,
            "declared_by": "config",
            "module": handle.module().to_string(),
            "views": handle.views(),
            "status": status,
        });
    };
    let schemas: serde_json::Map<String, serde_json::Value> = definition
        .schemas
        .iter()
        .map(|(view, text)| {
            let schema = serde_json::from_str(text).unwrap_or(serde_json::Value::Null);
            (view.clone(), schema)
        })
        .collect();
    let limits = LimitsSection::from_limits(&definition.limits.to_limits());
    serde_json::json!({
        "runtime": name,
        "declared_by": "record",
        "module": definition.module_name,
        "views": definition.views,
        "config": definition.config,
        "schemas": schemas,
        "limits": limits,
        "status": status,
    })
}

/// Reads the definition a `PUT` body gives: each field on its own, so that a refusal names it.
/// Without a `module`, the `running` runtime's build stays.
async fn definition(
    admin: &Admin,
    running: Option<&Registered>,
    mut object: serde_json::Map<String, serde_json::Value>,
) -> Result<Definition, ApiError> {
    fn field<T: serde::de::DeserializeOwned>(
        object: &mut serde_json::Map<String, serde_json::Value>,
        name: &str,
        what: &str,
    ) -> Result<Option<T>, ApiError> {
        object
            .remove(name)
            .map(|value| {
                serde_json::from_value(value).map_err(|_| {
                    ApiError::unprocessable(
                        "invalid_definition",
                        format!("{name}: expected {what}"),
                    )
                    .with_field("field", name)
                })
            })
            .transpose()
    }
    let missing =
        |name: &str| ApiError::bad_request(format!("the body has no {name:?}; expected {SHAPE}"));
    let module: Option<String> = field(&mut object, "module", "a string")?;
    let views: Vec<String> =
        field(&mut object, "views", "an array of strings")?.ok_or_else(|| missing("views"))?;
    let config: String = field(&mut object, "config", "a string")?.unwrap_or_default();
    let schemas: BTreeMap<String, serde_json::Value> =
        field(&mut object, "schemas", "an object of JSON Schemas by view")?.unwrap_or_default();
    let invalid = |field: &str, message: String| {
        ApiError::unprocessable("invalid_definition", format!("{field}: {message}"))
            .with_field("field", field)
    };
    let limits = object
        .remove("limits")
        .map_or_else(|| Ok(LimitsSection::default()), LimitsSection::from_json)
        .map_err(|problem| invalid(&problem.key, problem.message))?;
    let (fingerprint, module) = match (module, running) {
        (Some(module), _) => (
            module_of(admin, &module)
                .await
                .map_err(|error| invalid("module", error.to_string()))?,
            module,
        ),
        (None, Some(running)) => {
            let module = running.handle.module();
            let name = admin
                .catalog()
                .definition_of(running)
                .map_or_else(|| module.to_string(), |definition| definition.module_name);
            (module, name)
        }
        (None, None) => return Err(missing("module")),
    };
    Ok(Definition {
        module: fingerprint,
        module_name: module,
        views,
        config,
        schemas: schemas
            .into_iter()
            .map(|(view, schema)| (view, schema.to_string()))
            .collect(),
        limits: (&limits.to_limits()).into(),
        declared: None,
    })
}

/// Why a definition's `module` names no module this server can run: answered as `422
/// invalid_definition` with field `module`, in these words.
#[derive(Debug, thiserror::Error)]
enum ModuleRefError {
    /// `builtin:<guest>` with no such guest.
    #[error("no built-in guest {guest:?} (built-in: {})", BUILTIN_GUESTS.map(|(guest, _)| guest).join(", "))]
    NoSuchBuiltin {
        /// The name after `builtin:`.
        guest: String,
    },
    /// A built-in guest that could not be kept.
    #[error(transparent)]
    Keep(#[from] DeployActionError),
    /// Neither `builtin:<guest>` nor a fingerprint.
    #[error("{0:?} is neither builtin:<guest> nor sha256:<64 hex> of an uploaded module")]
    Unrecognized(String),
    /// A fingerprint of no module kept here or in the cluster's bucket.
    #[error("module {0} is not kept here: upload it first (POST /admin/modules)")]
    NotKept(ModuleFingerprint),
    /// The module from the cluster's bucket could not be kept here.
    #[error(transparent)]
    Store(std::io::Error),
}

/// The module `name` names: a built-in (kept now, like an upload), or one kept already, here or
/// in the cluster's bucket.
async fn module_of(admin: &Admin, name: &str) -> Result<ModuleFingerprint, ModuleRefError> {
    if let Some(builtin) = name.strip_prefix("builtin:") {
        let (_, wasm) = BUILTIN_GUESTS
            .iter()
            .find(|(guest, _)| *guest == builtin)
            .ok_or_else(|| ModuleRefError::NoSuchBuiltin {
                guest: builtin.to_owned(),
            })?;
        let module = admin
            .deployer()
            .keep(name, Bytes::from_static(wasm))
            .await?;
        return Ok(module.fingerprint().clone());
    }
    let fingerprint = ModuleFingerprint::parse(name)
        .ok_or_else(|| ModuleRefError::Unrecognized(name.to_owned()))?;
    let store = admin.catalog().modules();
    if store.get(&fingerprint).is_err() {
        let wasm = match admin.cluster() {
            Some(cluster) => cluster.get_module(&fingerprint).await.ok(),
            None => None,
        }
        .ok_or_else(|| ModuleRefError::NotKept(fingerprint.clone()))?;
        store.put(&wasm).map_err(ModuleRefError::Store)?;
    }
    Ok(fingerprint)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_module_that_names_nothing_is_told_in_the_words_a_client_sees() {
        let fingerprint = ModuleFingerprint::of(b"wasm");
        for (error, words) in [
            (
                ModuleRefError::NoSuchBuiltin {
                    guest: "nope".to_owned(),
                },
                "no built-in guest \"nope\" (built-in: ticker, logstats, json)".to_owned(),
            ),
            (
                ModuleRefError::Unrecognized("x".to_owned()),
                "\"x\" is neither builtin:<guest> nor sha256:<64 hex> of an uploaded module"
                    .to_owned(),
            ),
            (
                ModuleRefError::NotKept(fingerprint.clone()),
                format!(
                    "module {fingerprint} is not kept here: upload it first (POST /admin/modules)"
                ),
            ),
            (
                ModuleRefError::Store(std::io::Error::other("disk full")),
                "disk full".to_owned(),
            ),
        ] {
            assert_eq!(error.to_string(), words);
        }
    }
}
