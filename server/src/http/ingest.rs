//! `POST /runtimes/{runtime}/ingest`: one all-or-nothing batch for a runtime's guest.

use axum::body::Body;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::routing::post;
use axum::{Json, Router};

use super::{ApiError, AppState};
use crate::runtime::IngestError;

pub(super) fn routes() -> Router<AppState> {
    Router::new().route("/runtimes/{runtime}/ingest", post(ingest))
}

/// 200 with the events per view; 404 for an unknown runtime; 413 past `max_body`; 422 when
/// the guest refused or failed on the batch (nothing was committed); 503 when the runtime
/// cannot run it.
async fn ingest(
    State(state): State<AppState>,
    runtime: Result<Path<String>, PathRejection>,
    body: Body,
) -> Result<Json<serde_json::Value>, ApiError> {
    let Path(runtime) = runtime?;
    let registered = state
        .runtimes
        .get(&runtime)
        .ok_or_else(|| ApiError::not_found(format!("no runtime named {runtime:?}")))?;
    let limit = state.config.max_body;
    // A declared length over the limit is refused before the body is read, so a client that
    // sent `Expect: 100-continue` gets the 413 instead of an invitation to upload.
    if http_body::Body::size_hint(&body).lower() > limit as u64 {
        state.metrics.ingest_rejected.inc();
        return Err(ApiError::too_large(limit));
    }
    let input = axum::body::to_bytes(body, limit).await.map_err(|_| {
        state.metrics.ingest_rejected.inc();
        ApiError::too_large(limit)
    })?;
    let summary = registered.handle.ingest(input).await.map_err(|error| {
        state.metrics.ingest_rejected.inc();
        match error {
            IngestError::Guest { .. } => {
                ApiError::unprocessable("batch_rejected", error.to_string())
            }
            _ => ApiError::unavailable(error.to_string()),
        }
    })?;
    state.metrics.ingest_accepted.inc();
    Ok(Json(
        serde_json::json!({ "events": summary.per_view, "gaps": summary.gaps }),
    ))
}
