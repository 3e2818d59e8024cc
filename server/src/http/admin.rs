//! Operator routes: write a snapshot now, list snapshots, restore one into the running server,
//! deploy a new module to a runtime, read what each runtime runs.
//!
//! | route | what |
//! |---|---|
//! | `GET /admin/` | the operator page: views, runtimes, the log, the cluster, snapshots, live plots of deliveries and ingest (from `/metrics` and the routes here, with the token the operator gives it) |
//! | `POST /admin/snapshot` | a snapshot now, through the same consistency cut as the timer, its file named `…-manual.vtsnap`: `{"name","size","records","exact":false}`; an empty body (or `{}`) |
//! | `GET /admin/snapshots` | every file in `<data-dir>/snapshots`, newest first: `{"snapshots":[{"name","kind","exact","age_seconds","size","valid","error"}]}` |
//! | `POST /admin/restore` | body `{"name": "snap-….vtsnap"}`: replace the running server's state with that snapshot's |
//! | `GET /admin/runtimes` | every runtime, in name order: `{"runtimes":[{"name","module","state_bytes","batches","last_error"}]}`, `last_error` being `null` or `{"kind","message","at_ms"}` ([`GuestFailure`]) |
//! | `PUT /admin/runtimes/{runtime}/module` | body: a `.wasm` module or a JavaScript module's source (`Content-Type` not checked: `application/wasm`, `text/javascript`; at most 64 MiB): swap it into the runtime between two batches, the guest's state carried over; `{"runtime","module","previous","position"}`; 422 when it does not load or refuses the state (the old module keeps running) |
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
//! names: anything else is a `400` naming it, checked after the token. An operator's typo is
//! never silently ignored.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use axum::extract::rejection::PathRejection;
use axum::extract::Path;
use axum::extract::{FromRequestParts, State};
use axum::http::header;
use axum::http::request::Parts;
use axum::routing::{get, post, put};
use axum::{Json, Router};
use bytes::Bytes;
use serde::Deserialize;
use sha2::{Digest, Sha256};

use super::query::Params;
use super::ApiError;
use crate::cluster::Cluster;
use crate::deploy::{DeployActionError, Deployer, MAX_MODULE_BYTES};
use crate::runtime::registry::Runtimes;
use crate::runtime::{DeployError, GuestFailure};
use crate::snapshot::{SnapshotActionError, Snapshots};

/// The environment variable holding the admin token.
pub const TOKEN_ENV: &str = "VIEWTAPE_ADMIN_TOKEN";

/// Largest JSON body of an admin route (`POST /admin/restore`: an object naming one file).
const MAX_JSON_BODY: usize = 4 * 1024;

/// What the admin routes share: the token's digest, the runtimes and the snapshot actions.
#[derive(Debug)]
pub struct Admin {
    /// SHA-256 of the token.
    token: [u8; 32],
    runtimes: Arc<Runtimes>,
    snapshots: Arc<Snapshots>,
    deployer: Arc<Deployer>,
    /// A node's cluster: restores go through its stream.
    cluster: Option<Arc<Cluster>>,
}

impl Admin {
    /// Admin over `runtimes`, `snapshots` and `deployer` with `token`; `None` for an empty
    /// token, which enables nothing.
    pub fn new(
        token: &str,
        runtimes: Arc<Runtimes>,
        snapshots: Arc<Snapshots>,
        deployer: Arc<Deployer>,
    ) -> Option<Self> {
        (!token.is_empty()).then(|| Self {
            token: Sha256::digest(token.as_bytes()).into(),
            runtimes,
            snapshots,
            deployer,
            cluster: None,
        })
    }

    /// The admin of a cluster's node: a restore is a record of the stream, restored by every
    /// node (a deploy is too, through the [`Deployer`]).
    #[must_use]
    pub fn in_cluster(self, cluster: Arc<Cluster>) -> Self {
        Self {
            cluster: Some(cluster),
            ..self
        }
    }

    /// Admin with the token from [`TOKEN_ENV`], if set; logs whether the routes are enabled.
    pub fn from_env(
        runtimes: Arc<Runtimes>,
        snapshots: Arc<Snapshots>,
        deployer: Arc<Deployer>,
    ) -> Option<Self> {
        let token = std::env::var(TOKEN_ENV).unwrap_or_default();
        let admin = Self::new(&token, runtimes, snapshots, deployer);
        if admin.is_some() {
            tracing::info!("admin routes enabled ({TOKEN_ENV} is set)");
        } else {
            tracing::info!("admin routes disabled: {TOKEN_ENV} is not set");
        }
        admin
    }

    /// Checks an `Authorization` header value. The scheme is case-insensitive.
    pub(super) fn check(&self, authorization: Option<&[u8]>) -> Result<(), ApiError> {
        let presented = authorization
            .and_then(|value| {
                let (scheme, token) = value.split_at_checked(7)?;
                scheme.eq_ignore_ascii_case(b"bearer ").then_some(token)
            })
            .ok_or_else(|| ApiError::unauthorized("a bearer token is required"))?;
        let digest: [u8; 32] = Sha256::digest(presented).into();
        if digests_equal(&digest, &self.token) {
            Ok(())
        } else {
            Err(ApiError::unauthorized("wrong token"))
        }
    }
}

/// Equal-length comparison that always looks at every byte.
fn digests_equal(a: &[u8; 32], b: &[u8; 32]) -> bool {
    let mut diff = 0u8;
    for (x, y) in a.iter().zip(b) {
        diff |= std::hint::black_box(x ^ y);
    }
    std::hint::black_box(diff) == 0
}

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
        include_str!("../../static/admin.html"),
    ))
}

/// Proof that the request carried the admin token, and no query parameter (no admin route
/// takes one). Extracted before any body, so an unauthenticated request learns nothing from
/// body parsing.
struct Authorized;

impl FromRequestParts<Arc<Admin>> for Authorized {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, admin: &Arc<Admin>) -> Result<Self, ApiError> {
        let authorization = parts.headers.get(header::AUTHORIZATION);
        admin.check(authorization.map(|value| value.as_bytes()))?;
        Params::parse(parts.uri.query(), &[], &[])?;
        Ok(Self)
    }
}

/// The JSON object of an admin route's `body` (at most [`MAX_JSON_BODY`] bytes; an empty body
/// is `{}`), holding only the `fields` its route takes, as a `T`. `shape` is what the route
/// takes, as a refusal says it.
///
/// # Errors
/// `400 bad_request`, in our words: the body is too large, not a JSON object, holds a field the
/// route does not take (named), or a field is missing or of the wrong type.
async fn json_body<T: serde::de::DeserializeOwned>(
    body: axum::body::Body,
    fields: &[&str],
    shape: &str,
) -> Result<T, ApiError> {
    let bytes: Bytes = axum::body::to_bytes(body, MAX_JSON_BODY)
        .await
        .map_err(|_| ApiError::bad_request(format!("body larger than {MAX_JSON_BODY} bytes")))?;
    let expected = || ApiError::bad_request(format!("expected a JSON body {shape}"));
    // No body at all is no fields; anything else must be a JSON object (blank lines are not).
    let object = if bytes.is_empty() {
        serde_json::Map::new()
    } else {
        match serde_json::from_slice(&bytes) {
            Ok(serde_json::Value::Object(object)) => object,
            _ => return Err(expected()),
        }
    };
    if let Some(unknown) = object.keys().find(|key| !fields.contains(&key.as_str())) {
        let unknown: String = unknown.chars().take(64).collect();
        return Err(ApiError::bad_request(format!(
            "unknown field {unknown:?} in the body; expected {shape}"
        )));
    }
    serde_json::from_value(serde_json::Value::Object(object)).map_err(|_| expected())
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
    let wasm = axum::body::to_bytes(body, MAX_MODULE_BYTES)
        .await
        .map_err(|_| ApiError::too_large(MAX_MODULE_BYTES))?;
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

/// Admin with `token` over an empty hub, snapshots in the temp dir, for tests without a socket.
#[cfg(test)]
pub(crate) fn test_admin(token: &str) -> Option<Admin> {
    use viewtape_journal::{EventJournal, JournalConfig};
    use viewtape_snapshots::SnapshotDir;

    use crate::hub::Hub;

    let hub = Arc::new(Hub::new(Arc::new(EventJournal::new(
        JournalConfig::default(),
    ))));
    let dir = Arc::new(SnapshotDir::open(std::env::temp_dir()).expect("temp dir"));
    let engine = crate::host::GuestEngine::new(crate::host::EngineConfig {
        pooled_instances: 1,
        ..crate::host::EngineConfig::default()
    })
    .expect("engine");
    let store = crate::runtime::registry::ModuleStore::open(std::env::temp_dir()).expect("store");
    Admin::new(
        token,
        Arc::default(),
        Arc::new(Snapshots::new(hub, dir, Arc::default(), Arc::default())),
        Arc::new(Deployer::new(engine, Arc::new(store), Arc::default(), None)),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn admin(token: &str) -> Option<Admin> {
        test_admin(token)
    }

    fn status(result: Result<(), ApiError>) -> u16 {
        result.map_or_else(|error| error.status().as_u16(), |()| 200)
    }

    #[test]
    fn no_token_disables_and_tokens_are_checked() {
        assert!(admin("").is_none());
        let a = admin("s3cret").unwrap();
        assert_eq!(status(a.check(Some(b"Bearer s3cret"))), 200);
        assert_eq!(status(a.check(Some(b"bearer s3cret"))), 200);
        assert_eq!(status(a.check(Some(b"BEARER s3cret"))), 200);
        assert_eq!(status(a.check(Some(b"Bearer s3cre"))), 401);
        assert_eq!(status(a.check(Some(b"Basic s3cret"))), 401);
        assert_eq!(status(a.check(Some(b"Bearer"))), 401);
        assert_eq!(status(a.check(None)), 401);
    }
}
