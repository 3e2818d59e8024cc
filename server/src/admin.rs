//! Operator routes: write a snapshot now, list snapshots, restore one into the running server.
//!
//! | route | what |
//! |---|---|
//! | `POST /admin/snapshot` | a periodic snapshot now, through the same consistency cut as the timer: `{"name","size","records","exact":false}` |
//! | `GET /admin/snapshots` | every file in `<data-dir>/snapshots`, newest first: `{"snapshots":[{"name","kind","exact","age_seconds","size","valid","error"}]}` |
//! | `POST /admin/restore` | body `{"name": "snap-….vtsnap"}`: replace the running server's state with that snapshot's |
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
//! ## Live restore
//!
//! A restore validates before it touches anything: the file must load completely (checksums,
//! body) and each runtime's state must belong to the module that runs now (the same fingerprint
//! check as at start-up) — otherwise 422 with the reason, and nothing changed. Then, inside one
//! consistency cut (every runtime paused between batches, in name order like every cut):
//! each runtime instantiates a guest from the snapshot's state next to the running one (a guest
//! refusing its state aborts the restore, still with nothing changed); the views' state and the
//! journal are replaced, **always with a fresh epoch** — the snapshot's offsets were issued in
//! another life, so no cursor may resume into them; the new guests are swapped in; the cut is
//! released. Every subscriber is woken, finds its cursor's epoch stale and gets a `reset`
//! followed by the restored state. Views the snapshot does not name are emptied. A runtime the
//! snapshot does not name keeps its guest. A pull source's position is not moved by a restore
//! (the source task owns it); only the runtime's recorded checkpoint is.
//!
//! Admin actions are serialized by one lock, and each is logged at `info` with its outcome.

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::extract::{FromRequestParts, State};
use axum::http::request::Parts;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use bytes::Bytes;
use serde::Deserialize;
use sha2::{Digest, Sha256};
use viewtape_snapshots::{SnapshotDir, SnapshotError};

use crate::http::AppState;
use crate::hub::ViewStateDump;
use crate::runtime::{RuntimeHandle, RuntimeSnapshot};
use crate::server::{write_snapshot, SnapshotBody};

/// The environment variable holding the admin token.
pub const TOKEN_ENV: &str = "VIEWTAPE_ADMIN_TOKEN";

/// Largest `POST /admin/restore` body: a JSON object naming one file.
const MAX_RESTORE_BODY: usize = 4 * 1024;

/// What the admin routes need: the token's digest, the snapshot directory and the runtimes.
#[derive(Debug)]
pub struct Admin {
    /// SHA-256 of the token; `None` disables every admin route.
    token: Option<[u8; 32]>,
    snapshots: Arc<SnapshotDir>,
    /// `(name, handle, module fingerprint)` in name order, the order every cut pauses them in.
    runtimes: Vec<(String, RuntimeHandle, String)>,
    /// One admin action at a time.
    busy: tokio::sync::Mutex<()>,
}

impl Admin {
    /// Admin over `snapshots` and `runtimes` (in name order), with `token` (`None` or empty:
    /// disabled).
    pub fn new(
        token: Option<&str>,
        snapshots: Arc<SnapshotDir>,
        mut runtimes: Vec<(String, RuntimeHandle, String)>,
    ) -> Self {
        runtimes.sort_by(|a, b| a.0.cmp(&b.0));
        Self {
            token: token
                .filter(|t| !t.is_empty())
                .map(|t| Sha256::digest(t.as_bytes()).into()),
            snapshots,
            runtimes,
            busy: tokio::sync::Mutex::new(()),
        }
    }

    /// Admin with the token from [`TOKEN_ENV`]; logs whether the routes are enabled.
    pub fn from_env(
        snapshots: Arc<SnapshotDir>,
        runtimes: Vec<(String, RuntimeHandle, String)>,
    ) -> Self {
        let token = std::env::var(TOKEN_ENV).ok();
        let admin = Self::new(token.as_deref(), snapshots, runtimes);
        if admin.is_enabled() {
            tracing::info!("admin routes enabled ({TOKEN_ENV} is set)");
        } else {
            tracing::info!("admin routes disabled: {TOKEN_ENV} is not set");
        }
        admin
    }

    /// Whether a token is configured.
    pub fn is_enabled(&self) -> bool {
        self.token.is_some()
    }

    /// Checks an `Authorization` header value.
    fn check(&self, authorization: Option<&[u8]>) -> Result<(), AdminError> {
        let Some(expected) = &self.token else {
            return Err(AdminError::Disabled);
        };
        let presented = authorization
            .and_then(|value| value.strip_prefix(b"Bearer "))
            .ok_or(AdminError::Unauthorized("a bearer token is required"))?;
        let digest: [u8; 32] = Sha256::digest(presented).into();
        if digests_equal(&digest, expected) {
            Ok(())
        } else {
            Err(AdminError::Unauthorized("wrong token"))
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

/// The admin routes, merged into [`crate::http::app`].
pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/admin/snapshot", post(snapshot_now))
        .route("/admin/snapshots", get(list))
        .route("/admin/restore", post(restore))
}

/// Proof that the request carried the admin token. Extracted before any body, so an
/// unauthenticated request learns nothing from body parsing.
struct Authorized(Arc<Admin>);

impl FromRequestParts<AppState> for Authorized {
    type Rejection = AdminError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, AdminError> {
        let authorization = parts
            .headers
            .get(header::AUTHORIZATION)
            .map(HeaderValue::as_bytes);
        state.admin.check(authorization)?;
        Ok(Self(Arc::clone(&state.admin)))
    }
}

/// Why an admin request failed: a status and the usual `{"error","message"}` body. Logged
/// once, when turned into a response.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AdminError {
    /// No token configured: 404, exactly like an unknown route.
    #[error("no such route")]
    Disabled,
    /// 401.
    #[error("{0}")]
    Unauthorized(&'static str),
    /// 400.
    #[error("{0}")]
    BadRequest(String),
    /// 404: no such snapshot.
    #[error("{0}")]
    NoSuchSnapshot(String),
    /// 422: the snapshot cannot be restored (invalid file, different module, guest refused).
    #[error("{0}")]
    Unrestorable(String),
    /// 500: the detail is logged, not sent.
    #[error("{0}")]
    Internal(String),
}

impl IntoResponse for AdminError {
    fn into_response(self) -> Response {
        let (status, code) = match &self {
            Self::Disabled => (StatusCode::NOT_FOUND, "not_found"),
            Self::Unauthorized(_) => (StatusCode::UNAUTHORIZED, "unauthorized"),
            Self::BadRequest(_) => (StatusCode::BAD_REQUEST, "bad_request"),
            Self::NoSuchSnapshot(_) => (StatusCode::NOT_FOUND, "no_such_snapshot"),
            Self::Unrestorable(_) => (StatusCode::UNPROCESSABLE_ENTITY, "snapshot_unrestorable"),
            Self::Internal(_) => (StatusCode::INTERNAL_SERVER_ERROR, "internal"),
        };
        let message = match &self {
            Self::Internal(detail) => {
                tracing::error!(error = %detail, "admin action failed");
                "internal error; see the server log".to_owned()
            }
            Self::Disabled => {
                tracing::debug!("admin route requested while admin is disabled");
                self.to_string()
            }
            Self::Unauthorized(why) => {
                tracing::warn!(reason = why, "admin request refused");
                self.to_string()
            }
            _ => {
                tracing::warn!(error = %self, "admin action refused");
                self.to_string()
            }
        };
        let body = serde_json::json!({ "error": code, "message": message });
        let mut response = (status, Json(body)).into_response();
        if status == StatusCode::UNAUTHORIZED {
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        response
    }
}

/// `POST /admin/snapshot`.
async fn snapshot_now(
    Authorized(admin): Authorized,
    State(state): State<AppState>,
) -> Result<Json<serde_json::Value>, AdminError> {
    let _busy = admin.busy.lock().await;
    let written = write_snapshot(&state.hub, &admin.snapshots, &admin.runtimes, false)
        .await
        .map_err(|error| AdminError::Internal(format!("snapshot failed: {error:#}")))?;
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

/// `GET /admin/snapshots`.
async fn list(Authorized(admin): Authorized) -> Result<Json<serde_json::Value>, AdminError> {
    let snapshots = Arc::clone(&admin.snapshots);
    let entries = tokio::task::spawn_blocking(move || snapshots.list())
        .await
        .map_err(|error| AdminError::Internal(format!("listing task: {error}")))?
        .map_err(|error| AdminError::Internal(format!("listing snapshots: {error}")))?;
    let now_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
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

#[derive(Debug, Deserialize)]
struct RestoreRequest {
    name: String,
}

/// `POST /admin/restore`.
async fn restore(
    Authorized(admin): Authorized,
    State(state): State<AppState>,
    body: axum::body::Body,
) -> Result<Json<serde_json::Value>, AdminError> {
    let body: Bytes = axum::body::to_bytes(body, MAX_RESTORE_BODY)
        .await
        .map_err(|_| {
            AdminError::BadRequest(format!("body larger than {MAX_RESTORE_BODY} bytes"))
        })?;
    let request: RestoreRequest = serde_json::from_slice(&body).map_err(|error| {
        AdminError::BadRequest(format!(
            "expected {{\"name\": \"<snapshot file>\"}}: {error}"
        ))
    })?;
    let name = request.name;
    let _busy = admin.busy.lock().await;

    // 1. Load and validate everything before touching the server.
    let snapshots = Arc::clone(&admin.snapshots);
    let file = name.clone();
    let loaded = tokio::task::spawn_blocking(move || snapshots.load_named::<SnapshotBody>(&file))
        .await
        .map_err(|error| AdminError::Internal(format!("loading task: {error}")))?
        .map_err(|error| match error {
            SnapshotError::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound => {
                AdminError::NoSuchSnapshot(format!("no snapshot named {name:?}"))
            }
            SnapshotError::Invalid { .. } => AdminError::Unrestorable(error.to_string()),
            other => AdminError::Internal(format!("loading {name:?}: {other}")),
        })?;
    let body = loaded.body;
    let mut guests = Vec::new();
    for dump in body.runtimes {
        match admin.runtimes.iter().find(|(n, _, _)| *n == dump.name) {
            Some((_, _, module)) if *module == dump.module => guests.push((
                dump.name,
                RuntimeSnapshot {
                    state: dump.state,
                    checkpoint: dump.checkpoint,
                },
            )),
            Some((_, _, module)) => {
                return Err(AdminError::Unrestorable(format!(
                    "{name}: runtime {:?} state belongs to module {}, but module {module} runs now",
                    dump.name, dump.module
                )))
            }
            None => tracing::warn!(
                runtime = %dump.name,
                file = %name,
                "snapshot holds state for a runtime that does not run here; ignored"
            ),
        }
    }
    let mut views = body.views;
    for view in state.hub.views() {
        if !views.iter().any(|v| v.view == view.name()) {
            views.push(ViewStateDump {
                view: view.name().to_owned(),
                entries: Vec::new(),
            });
        }
    }

    // 2. The cut: every runtime paused between batches, in name order.
    let mut paused = Vec::with_capacity(admin.runtimes.len());
    for (runtime, handle, _) in &admin.runtimes {
        let (_, guard) = handle
            .pause()
            .await
            .map_err(|error| AdminError::Internal(format!("pausing {runtime:?}: {error}")))?;
        paused.push((runtime.as_str(), guard));
    }
    // 3. New guests next to the running ones; any refusal leaves everything as it was.
    for (runtime, snapshot) in guests {
        let Some((_, guard)) = paused.iter().find(|(n, _)| *n == runtime) else {
            continue;
        };
        guard.stage_restore(snapshot).await.map_err(|error| {
            AdminError::Unrestorable(format!("{name}: the guest refused its state: {error}"))
        })?;
    }
    // 4. Replace: state and journal (fresh epoch, always), then the guests.
    let records = body.journal.record_count();
    // A dump without an epoch (taken with the journal disabled) is discarded by hydrate, which
    // would keep the current epoch under replaced state: mark a gap so old cursors fail closed.
    // Marked first: the restore's wake-up then reaches every subscriber after the gap.
    if body.journal.epoch.is_none() {
        state.hub.journal().mark_gap().await;
    }
    state.hub.restore(body.journal, false, views).await;
    let epoch = state.hub.journal().epoch().await;
    for (runtime, guard) in &paused {
        if let Err(error) = guard.commit_restore().await {
            // The journal is already replaced; a runtime that went away cannot be helped here.
            tracing::error!(runtime = %runtime, %error, "restored guest state not applied");
        }
    }
    drop(paused);
    tracing::info!(
        action = "restore",
        file = %name,
        %epoch,
        records,
        "admin: snapshot restored; every subscriber is reset"
    );
    Ok(Json(serde_json::json!({
        "name": name,
        "epoch": epoch.to_string(),
        "records": records,
    })))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn admin(token: Option<&str>) -> Admin {
        let dir = std::env::temp_dir();
        Admin::new(
            token,
            Arc::new(SnapshotDir::open(dir).expect("temp dir")),
            Vec::new(),
        )
    }

    #[test]
    fn no_token_disables_and_tokens_are_checked() {
        assert!(matches!(
            admin(None).check(Some(b"Bearer x")),
            Err(AdminError::Disabled)
        ));
        assert!(matches!(
            admin(Some("")).check(Some(b"Bearer ")),
            Err(AdminError::Disabled)
        ));
        let a = admin(Some("s3cret"));
        assert!(a.check(Some(b"Bearer s3cret")).is_ok());
        assert!(matches!(
            a.check(Some(b"Bearer s3cre")),
            Err(AdminError::Unauthorized(_))
        ));
        assert!(matches!(
            a.check(Some(b"Basic s3cret")),
            Err(AdminError::Unauthorized(_))
        ));
        assert!(matches!(a.check(None), Err(AdminError::Unauthorized(_))));
    }
}
