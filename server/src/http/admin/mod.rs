//! Operator routes: write a snapshot now, list snapshots, restore one into the running server,
//! deploy a new module to a runtime, read what each runtime runs, and create, replace and delete
//! runtimes ([`runtimes`]). The token and the strict reading of bodies are the [`gate`]'s.
//!
//! | route | what |
//! |---|---|
//! | `GET /admin/` | the operator page: views, runtimes, the log, the cluster, snapshots, live plots of deliveries and ingest (from `/metrics` and the routes here, with the token the operator gives it) |
//! | `POST /admin/snapshot` | a snapshot now, through the same consistency cut as the timer, its file named `…-manual.vtsnap`: `{"name","size","records","exact":false}`; an empty body (or `{}`) |
//! | `GET /admin/snapshots` | every file in `<data-dir>/snapshots`, newest first: `{"snapshots":[{"name","kind","exact","age_seconds","size","valid","error"}]}` |
//! | `POST /admin/restore` | body `{"name": "snap-….vtsnap"}`: replace the running server's state with that snapshot's |
//! | `GET /admin/runtimes` | every runtime, in name order: `{"runtimes":[{"name","module","state_bytes","batches","last_error","halted"}]}`, `last_error` being `null` or `{"kind","message","at_ms"}` ([`GuestFailure`]), `halted` `null` or `{"position","reason","lost","unreadable"}` ([`RuntimeHalt`](crate::runtime::RuntimeHalt)) |
//! | `PUT /admin/runtimes/{runtime}/module` | body: a `.wasm` module or a JavaScript module's source (`Content-Type` not checked: `application/wasm`, `text/javascript`; at most 64 MiB): swap it into the runtime between two batches, the guest's state carried over; `{"runtime","module","previous","position"}`; 422 when it does not load or refuses the state (the old module keeps running) |
//! | `POST /admin/modules`, `PUT`/`GET`/`DELETE /admin/runtimes/{runtime}` | runtimes as data: see [`runtimes`] |
//!
//! ## Access
//!
//! Every admin route needs `Authorization: Bearer <token>`, the token being
//! `VIEWTAPE_ADMIN_TOKEN` as read at start-up. Without a configured token (unset or empty) the
//! routes are **disabled**: they answer 404 like any unknown path, never open. A missing or wrong
//! token gets 401 with `WWW-Authenticate: Bearer`. Tokens are compared as SHA-256 digests in a
//! loop that always touches all 32 bytes, so the time taken says nothing about how much of a
//! guess was right, nor about the token's length.
//!
//! A live restore is [`Snapshots::restore_live`]: validated before anything changes, carried
//! out inside one consistency cut, always with a fresh epoch. Admin actions are logged at `info`
//! with their outcome.
//!
//! ## Strict inputs
//!
//! No admin route takes a query parameter, and a JSON body holds exactly the fields its route
//! names, each key once at any depth (JSON readers disagree on which of two wins): anything else
//! is a `400` naming it, checked after the token. An operator's typo is never silently ignored.
//! A body over its route's limit is a `413`, before any of it is read when its `Content-Length`
//! says so (a client that sent `Expect: 100-continue` is not invited to upload).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use axum::extract::rejection::PathRejection;
use axum::extract::Path;
use axum::extract::State;
use axum::http::header;
use axum::routing::{get, post, put};
use axum::{Json, Router};
use serde::Deserialize;

use super::body::read_body;
use super::query::Params;
use super::ApiError;
use crate::deploy::{DeployActionError, MAX_MODULE_BYTES};
use crate::runtime::{DeployError, GuestFailure};

mod gate;
mod runtimes;

use crate::snapshot::SnapshotActionError;
#[cfg(test)]
pub(crate) use gate::test_admin;
use gate::{json_body, Authorized};
pub use gate::{Admin, TOKEN_ENV};

/// The admin routes, with their own state; none at all without a token, so every admin path
/// is a 404 like any unknown one.
pub(super) fn routes(admin: Option<Arc<Admin>>) -> axum::Router {
    let Some(admin) = admin else {
        return Router::new();
    };
    Router::new()
        .route("/admin/", get(page))
        .route("/admin/snapshot", post(snapshot_now))
        .route("/admin/snapshots", get(list))
        .route("/admin/restore", post(restore))
        .route("/admin/runtimes", get(runtimes))
        .route("/admin/runtimes/{runtime}/module", put(deploy))
        .route("/admin/modules", post(runtimes::put_module))
        .route(
            "/admin/runtimes/{runtime}",
            put(runtimes::put_runtime)
                .get(runtimes::get_runtime)
                .delete(runtimes::delete_runtime),
        )
        .with_state(admin)
}

/// `GET /admin/`: the operator page. Static HTML and script holding no data, so it is served
/// without the token (a browser cannot send one with a page load); everything it shows it
/// fetches with the token the operator gives it (`#token=…`, or typed in).
async fn page(
    uri: axum::http::Uri,
) -> Result<([(header::HeaderName, &'static str); 2], &'static str), ApiError> {
    Params::parse(uri.query(), &[], &[])?;
    Ok((
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        include_str!("../../../static/admin.html"),
    ))
}

impl From<SnapshotActionError> for ApiError {
    fn from(error: SnapshotActionError) -> Self {
        match error {
            SnapshotActionError::NoSuchSnapshot(_) => ApiError::not_found(error.to_string()),
            SnapshotActionError::Unrestorable(_) => {
                ApiError::unprocessable("snapshot_unrestorable", error.to_string())
            }
            // The stream's and the bucket's own words (the NATS client's) stay in the log.
            SnapshotActionError::Shared(_) => ApiError::unavailable_hiding(
                "the restore did not go through the cluster's stream in time (the server log says why)",
                &error,
            ),
            other => ApiError::internal(other),
        }
    }
}

/// What `POST /admin/snapshot` takes: nothing (an empty body, or `{}`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SnapshotRequest {}

/// `POST /admin/snapshot`: a manual snapshot now,
/// `{"name","size","records","exact":false}`.
async fn snapshot_now(
    _: Authorized,
    State(admin): State<Arc<Admin>>,
    body: axum::body::Body,
) -> Result<Json<serde_json::Value>, ApiError> {
    let SnapshotRequest {} = json_body(body, &[], "{} or none").await?;
    let written = admin.snapshots.write_manual().await?;
    let name = written.info.file_name();
    tracing::info!(
        action = "snapshot",
        file = %name,
        size = written.info.size(),
        records = written.records,
        "admin: snapshot written"
    );
    Ok(Json(serde_json::json!({
        "name": name,
        "size": written.info.size(),
        "records": written.records,
        "exact": false,
    })))
}

/// `GET /admin/snapshots`: every file, newest first.
async fn list(
    _: Authorized,
    State(admin): State<Arc<Admin>>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let entries = admin.snapshots.list().await?;
    let now_ms = crate::log::unix_ms_now();
    let snapshots: Vec<serde_json::Value> = entries
        .iter()
        .map(|entry| {
            serde_json::json!({
                "name": entry.file_name,
                "kind": entry.kind.as_str(),
                "exact": entry.is_exact(),
                "age_seconds": now_ms.saturating_sub(entry.created_at_ms()) as f64 / 1000.0,
                "size": entry.size,
                "valid": entry.is_valid(),
                "error": entry.status.as_ref().err().map(ToString::to_string),
            })
        })
        .collect();
    tracing::debug!(count = snapshots.len(), "admin: snapshots listed");
    Ok(Json(serde_json::json!({ "snapshots": snapshots })))
}

/// `GET /admin/runtimes`: what each runtime runs now, in name order.
async fn runtimes(_: Authorized, State(admin): State<Arc<Admin>>) -> Json<serde_json::Value> {
    let runtimes: Vec<serde_json::Value> = admin
        .runtimes
        .iter()
        .map(|(name, registered)| {
            let stats = registered.handle.stats();
            serde_json::json!({
                "name": name,
                "module": registered.handle.module().to_string(),
                "state_bytes": stats.state_bytes.load(Ordering::Relaxed),
                "batches": stats.batches.load(Ordering::Relaxed),
                "last_error": stats.last_failure().as_ref().map(failure_json),
                "halted": stats.halted(),
            })
        })
        .collect();
    Json(serde_json::json!({ "runtimes": runtimes }))
}

fn failure_json(failure: &GuestFailure) -> serde_json::Value {
    serde_json::json!({
        "kind": failure.kind.as_str(),
        "message": failure.message,
        "at_ms": failure.at_ms,
    })
}

/// What `POST /admin/restore` takes.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RestoreRequest {
    name: String,
}

/// `POST /admin/restore` with `{"name": "<snapshot file>"}`.
async fn restore(
    _: Authorized,
    State(admin): State<Arc<Admin>>,
    body: axum::body::Body,
) -> Result<Json<serde_json::Value>, ApiError> {
    let request: RestoreRequest =
        json_body(body, &["name"], "{\"name\": \"<snapshot file>\"}").await?;
    let restored = match &admin.cluster {
        Some(cluster) => cluster.restore(&admin.snapshots, &request.name).await?,
        None => admin.snapshots.restore_live(&request.name).await?,
    };
    tracing::info!(
        action = "restore",
        file = %request.name,
        epoch = %restored.epoch,
        records = restored.records,
        "admin: snapshot restored; every subscriber is reset"
    );
    Ok(Json(serde_json::json!({
        "name": request.name,
        "epoch": restored.epoch.to_string(),
        "records": restored.records,
        "position": restored.position,
    })))
}

impl From<DeployActionError> for ApiError {
    fn from(error: DeployActionError) -> Self {
        match error {
            DeployActionError::NoSuchRuntime(_) => ApiError::not_found(error.to_string()),
            DeployActionError::Load { .. } => {
                ApiError::unprocessable("module_refused", error.to_string())
            }
            // What the new module did, in our words; the detail (a trap's text, a panic's
            // location) is logged here, once.
            DeployActionError::Runtime(DeployError::Refused {
                ref runtime,
                ref source,
            }) => {
                tracing::info!(%runtime, error = %source, "deploy refused by the new module");
                ApiError::unprocessable(
                    "module_refused",
                    format!(
                        "runtime `{runtime}`: the new module cannot take over: {}",
                        source.public_message()
                    ),
                )
            }
            DeployActionError::Runtime(DeployError::Stale { .. }) => {
                ApiError::conflict("deploy_stale", error.to_string())
            }
            DeployActionError::Runtime(DeployError::Stopped { .. }) => {
                ApiError::unavailable(error.to_string())
            }
            DeployActionError::Runtime(DeployError::Halted { .. }) => {
                ApiError::halted(error.to_string())
            }
            DeployActionError::Runtime(_) | DeployActionError::Bucket(_) => {
                ApiError::unavailable_hiding(
                    "the deploy could not be made durable now; the running module keeps serving",
                    &error,
                )
            }
            other => ApiError::internal(other),
        }
    }
}

/// `PUT /admin/runtimes/{runtime}/module` with a `.wasm` or JavaScript body (the bytes say which).
async fn deploy(
    _: Authorized,
    State(admin): State<Arc<Admin>>,
    runtime: Result<Path<String>, PathRejection>,
    body: axum::body::Body,
) -> Result<Json<serde_json::Value>, ApiError> {
    let Path(runtime) = runtime?;
    let wasm = read_body(body, MAX_MODULE_BYTES).await?;
    let deployed = admin.deployer.deploy(&runtime, wasm).await?;
    tracing::info!(
        action = "deploy",
        %runtime,
        module = %deployed.module,
        previous = %deployed.previous,
        "admin: module deployed"
    );
    Ok(Json(serde_json::json!({
        "runtime": runtime,
        "module": deployed.module.to_string(),
        "previous": deployed.previous.to_string(),
        "position": deployed.position,
    })))
}
