//! The HTTP API: routes, the shared application state, and the one error
//! type every handler returns.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use bytes::{BufMut, Bytes, BytesMut};
use serde::Deserialize;
use tokio::sync::{watch, Semaphore};
use viewtape_journal::Cursor;

use crate::config::ServerConfig;
use crate::frame;
use crate::hub::Hub;
use crate::metrics::Metrics;
use crate::runtime::{IngestError, RuntimeHandle};
use crate::sse::{Start, Subscriber};

/// What every handler shares.
#[derive(Clone)]
pub struct AppState {
    /// Views, journal, commit path.
    pub hub: Arc<Hub>,
    /// The runtimes, by name.
    pub runtimes: Arc<BTreeMap<String, RuntimeHandle>>,
    /// Counters.
    pub metrics: Arc<Metrics>,
    /// HTTP settings.
    pub config: Arc<ServerConfig>,
    /// Permits for SSE connections.
    pub connections: Arc<Semaphore>,
    /// Flips to `true` when the server shuts down; streams then end.
    pub shutdown: watch::Receiver<bool>,
    /// Operator actions (`/admin/*`) and their token.
    pub admin: Arc<crate::admin::Admin>,
}

/// The router. Tests drive it without a socket.
pub fn app(state: AppState) -> Router {
    Router::new()
        .route("/", get(index))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/metrics", get(metrics))
        .route("/views", get(list_views))
        .route("/views/{view}", get(view_state))
        .route("/views/{view}/events", get(events))
        .route("/runtimes/{runtime}/ingest", post(ingest))
        .merge(crate::admin::routes())
        .fallback(|| async { ApiError::NotFound("no such route".to_owned()) })
        .with_state(state)
}

/// Every error a handler returns: a status and a short JSON body, never
/// internal detail. Logged once, here.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// 404.
    #[error("{0}")]
    NotFound(String),
    /// 413.
    #[error("request body is larger than {0} bytes")]
    TooLarge(usize),
    /// 422: the guest refused or failed on the batch.
    #[error("{0}")]
    Rejected(String),
    /// 503.
    #[error("{0}")]
    Unavailable(String),
    /// 400.
    #[error("{0}")]
    BadRequest(String),
}

impl ApiError {
    /// The status and JSON body of this error, logged once.
    pub(crate) fn status_and_body(&self) -> (StatusCode, serde_json::Value) {
        let (status, code) = match self {
            Self::NotFound(_) => (StatusCode::NOT_FOUND, "not_found"),
            Self::TooLarge(_) => (StatusCode::PAYLOAD_TOO_LARGE, "body_too_large"),
            Self::Rejected(_) => (StatusCode::UNPROCESSABLE_ENTITY, "batch_rejected"),
            Self::Unavailable(_) => (StatusCode::SERVICE_UNAVAILABLE, "unavailable"),
            Self::BadRequest(_) => (StatusCode::BAD_REQUEST, "bad_request"),
        };
        if status.is_server_error() {
            tracing::warn!(error = %self, "request failed");
        } else {
            tracing::debug!(error = %self, "request refused");
        }
        let body = serde_json::json!({ "error": code, "message": self.to_string() });
        (status, body)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (status, body) = self.status_and_body();
        (status, Json(body)).into_response()
    }
}

async fn index() -> Html<&'static str> {
    Html(include_str!("../static/index.html"))
}

async fn metrics(State(state): State<AppState>) -> Response {
    let runtimes: Vec<RuntimeHandle> = state.runtimes.values().cloned().collect();
    let body = state.metrics.render(&state.hub, &runtimes);
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        body,
    )
        .into_response()
}

async fn list_views(State(state): State<AppState>) -> Json<serde_json::Value> {
    let journal = state.hub.journal();
    let counts: BTreeMap<String, u64> = journal.entry_counts_now().into_iter().collect();
    let bytes: BTreeMap<String, u64> = journal.retained_bytes_now().into_iter().collect();
    let views: Vec<serde_json::Value> = state
        .hub
        .views()
        .iter()
        .map(|view| {
            let window = journal.window_now(view.name());
            serde_json::json!({
                "name": view.name(),
                "keys": view.keys(),
                "retained": counts.get(view.name()).copied().unwrap_or(0),
                "bytes": bytes.get(view.name()).copied().unwrap_or(0),
                "epoch": window.epoch.to_string(),
                "first": window.first,
                "next": window.next,
                "sealed": window.sealed,
            })
        })
        .collect();
    Json(serde_json::json!({ "views": views }))
}

/// `GET /views/{view}`: `{"cursor": C, "entries": {key: payload}}`, read in
/// one critical section with the cursor, written in chunks.
async fn view_state(
    State(state): State<AppState>,
    Path(view): Path<String>,
) -> Result<Response, ApiError> {
    let view = state
        .hub
        .view(&view)
        .ok_or_else(|| ApiError::NotFound(format!("no view named {view:?}")))?;
    let cut = view.cut(state.hub.journal());
    let head = Bytes::from(format!("{{\"cursor\":\"{}\",\"entries\":{{", cut.cursor));
    let total = cut.frames.len();
    let frames = cut.frames;
    // Encoded lazily, 512 entries per chunk, as the socket takes them: a
    // large state never becomes one buffer.
    let entries = (0..total).step_by(512).map(move |start| {
        let mut out = BytesMut::new();
        for (i, frame) in frames[start..total.min(start + 512)].iter().enumerate() {
            if start + i > 0 {
                out.put_u8(b',');
            }
            out.extend_from_slice(&frame::state_member(frame));
        }
        out.freeze()
    });
    let chunks = futures_util::stream::iter(
        std::iter::once(head)
            .chain(entries)
            .chain(std::iter::once(Bytes::from_static(b"}}\n")))
            .map(Ok::<_, std::convert::Infallible>),
    );
    tracing::debug!(view = view.name(), keys = total, "state read");
    Ok((
        [
            (header::CONTENT_TYPE, "application/json"),
            (header::CACHE_CONTROL, "no-store"),
        ],
        Body::from_stream(chunks),
    )
        .into_response())
}

/// The query of `GET /views/{view}/events`.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct EventsQuery {
    cursor: Option<String>,
    from: Option<String>,
}

/// `GET /views/{view}/events` through axum. Most SSE connections never get
/// here: [`crate::listener`] serves them straight on the socket, and this
/// handler serves the rest (e.g. a request line that arrived in pieces).
async fn events(
    State(state): State<AppState>,
    Path(view): Path<String>,
    Query(query): Query<EventsQuery>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let last_event_id = headers
        .get("last-event-id")
        .map(|value| value.to_str().unwrap_or("\u{fffd}").to_owned());
    let subscriber = subscribe(&state, &view, last_event_id, query)?;
    let mut response = Body::from_stream(subscriber.into_stream()).into_response();
    let headers = response.headers_mut();
    for (name, value) in SSE_HEADERS {
        headers.insert(name, HeaderValue::from_static(value));
    }
    Ok(response)
}

/// The response headers of every SSE stream.
pub(crate) const SSE_HEADERS: [(&str, &str); 3] = [
    ("content-type", "text/event-stream"),
    ("cache-control", "no-store"),
    ("x-accel-buffering", "no"),
];

/// Opens a subscriber on `view`: 404 for an unknown view, 503 past the
/// connection limit. The cursor comes from `Last-Event-ID`, else
/// `?cursor=`; the header wins.
pub(crate) fn subscribe(
    state: &AppState,
    view: &str,
    last_event_id: Option<String>,
    query: EventsQuery,
) -> Result<Subscriber, ApiError> {
    let view = state
        .hub
        .view(view)
        .ok_or_else(|| ApiError::NotFound(format!("no view named {view:?}")))?;
    let permit = Arc::clone(&state.connections)
        .try_acquire_owned()
        .map_err(|_| {
            state
                .metrics
                .connections_refused
                .fetch_add(1, Ordering::Relaxed);
            ApiError::Unavailable(format!(
                "too many SSE connections (limit {})",
                state.config.max_connections
            ))
        })?;
    let start = match last_event_id
        .or(query.cursor)
        .filter(|text| !text.is_empty())
    {
        Some(text) => match text.parse::<Cursor>() {
            Ok(cursor) => Start::Cursor(cursor),
            Err(_) => Start::Malformed,
        },
        None if query.from.as_deref() == Some("tape") => Start::Tape,
        None => Start::State,
    };
    tracing::debug!(view = view.name(), ?start, "subscribed");
    Ok(Subscriber::new(
        Arc::clone(&state.hub),
        view,
        Arc::clone(&state.metrics),
        start,
        state.shutdown.clone(),
        state.config.heartbeat,
        state.config.retry,
        permit,
    ))
}

/// `POST /runtimes/{runtime}/ingest`: one all-or-nothing batch.
async fn ingest(
    State(state): State<AppState>,
    Path(runtime): Path<String>,
    body: Body,
) -> Result<Json<serde_json::Value>, ApiError> {
    let handle = state
        .runtimes
        .get(&runtime)
        .ok_or_else(|| ApiError::NotFound(format!("no runtime named {runtime:?}")))?;
    let limit = state.config.max_body;
    let input = axum::body::to_bytes(body, limit).await.map_err(|_| {
        state
            .metrics
            .ingest_rejected
            .fetch_add(1, Ordering::Relaxed);
        ApiError::TooLarge(limit)
    })?;
    match handle.ingest(input).await {
        Ok(summary) => {
            state
                .metrics
                .ingest_accepted
                .fetch_add(1, Ordering::Relaxed);
            Ok(Json(serde_json::json!({ "events": summary.per_view })))
        }
        Err(error) => {
            state
                .metrics
                .ingest_rejected
                .fetch_add(1, Ordering::Relaxed);
            Err(match error {
                IngestError::Guest { .. } => ApiError::Rejected(error.to_string()),
                _ => ApiError::Unavailable(error.to_string()),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use futures_util::StreamExt;
    use tower::ServiceExt;
    use viewtape_journal::{EventJournal, JournalConfig};
    use viewtape_snapshots::SnapshotDir;

    use super::*;
    use crate::admin::Admin;
    use crate::host::{EventKind, GuestBatch, GuestEvent};
    use crate::runtime::BatchSink;

    #[tokio::test]
    async fn view_state_is_one_valid_json_document_across_chunks() {
        let hub = Arc::new(Hub::new(Arc::new(EventJournal::new(
            JournalConfig::default(),
        ))));
        let events = (0..1_200)
            .map(|i| GuestEvent {
                view: Arc::from("v"),
                key: format!("k{i}"),
                kind: EventKind::Update,
                payload: Bytes::from(format!("{{\"n\":{i}}}")),
            })
            .collect();
        hub.commit(
            "test",
            GuestBatch {
                events,
                gaps: vec![],
            },
        )
        .await;
        let dir = tempfile::tempdir().unwrap();
        let (_tx, shutdown) = watch::channel(false);
        let router = app(AppState {
            hub: Arc::clone(&hub),
            runtimes: Arc::new(BTreeMap::new()),
            metrics: Arc::new(Metrics::default()),
            config: Arc::new(ServerConfig::default()),
            connections: Arc::new(Semaphore::new(1)),
            shutdown,
            admin: Arc::new(Admin::new(
                None,
                Arc::new(SnapshotDir::open(dir.path()).unwrap()),
                vec![],
            )),
        });
        let request = axum::http::Request::get("/views/v")
            .body(Body::empty())
            .unwrap();
        let response = router.oneshot(request).await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        let mut body = response.into_body().into_data_stream();
        let (mut bytes, mut chunks) = (Vec::new(), 0);
        while let Some(chunk) = body.next().await {
            bytes.extend_from_slice(&chunk.unwrap());
            chunks += 1;
        }
        assert!(chunks >= 4, "streamed in chunks, got {chunks}");
        let state: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        let cut = hub.view("v").unwrap().cut(hub.journal());
        assert_eq!(state["cursor"], cut.cursor.to_string());
        let entries = state["entries"].as_object().unwrap();
        assert_eq!(entries.len(), 1_200);
        assert_eq!(entries["k777"], serde_json::json!({ "n": 777 }));
    }
}
