//! The HTTP API: one [`Router`] with every route and layer, whichever transport
//! ([`crate::listener`]) carries the request.
//!
//! | route | module |
//! |---|---|
//! | `GET /views`, `GET /views/{view}`, `GET /views/{view}/events` | `views` |
//! | `POST /runtimes/{runtime}/ingest` | `ingest` |
//! | `POST /admin/snapshot`, `GET /admin/snapshots`, `POST /admin/restore` | [`admin`] |
//! | `GET /`, `GET /healthz`, `GET /metrics` | here |
//!
//! ## Layers
//!
//! Every route: a tracing span per request (`TraceLayer`) and CORS for the origins in
//! `[server] cors_origins`. Every route but the SSE stream: a time limit
//! ([`REQUEST_TIMEOUT`]) and gzip for clients that accept it. Errors are [`ApiError`].

pub mod admin;
mod error;
mod ingest;
mod views;

use std::sync::Arc;
use std::time::Duration;

use axum::http::{header, HeaderName, HeaderValue, Method, StatusCode};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use tower_http::compression::CompressionLayer;
use tower_http::cors::{AllowOrigin, CorsLayer};
use tower_http::timeout::TimeoutLayer;
use tower_http::trace::TraceLayer;

pub use error::ApiError;

use crate::config::ServerConfig;
use crate::hub::Hub;
use crate::metrics::Metrics;
use crate::registry::Runtimes;
use crate::sse::Streams;

/// Time limit for every request but an SSE stream; past it, 408.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// What the public routes share.
#[derive(Clone)]
pub struct AppState {
    /// Views, journal, commit path.
    pub hub: Arc<Hub>,
    /// The runtimes, by name.
    pub runtimes: Arc<Runtimes>,
    /// Counters.
    pub metrics: Arc<Metrics>,
    /// HTTP settings.
    pub config: Arc<ServerConfig>,
    /// Opens SSE subscribers.
    pub streams: Arc<Streams>,
}

/// The router: every route, with its layers. Tests drive it without a socket.
pub fn app(state: AppState, admin: Arc<admin::Admin>) -> Router {
    let cors = cors(&state.config);
    let bounded = Router::new()
        .route("/", get(index))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/metrics", get(metrics))
        .merge(views::routes())
        .merge(ingest::routes())
        .with_state(state.clone())
        .merge(admin::routes(admin))
        .layer(CompressionLayer::new())
        .layer(TimeoutLayer::with_status_code(
            StatusCode::REQUEST_TIMEOUT,
            REQUEST_TIMEOUT,
        ));
    Router::new()
        .merge(views::stream_routes().with_state(state))
        .merge(bounded)
        .fallback(|| async { ApiError::not_found("no such route") })
        .layer(cors)
        .layer(TraceLayer::new_for_http())
}

/// CORS for `[server] cors_origins`, with credentials (cookies), on every route; no origin
/// is allowed when the list is empty.
fn cors(config: &ServerConfig) -> CorsLayer {
    let origins: Vec<HeaderValue> = config
        .cors_origins
        .iter()
        .filter_map(|origin| HeaderValue::from_str(origin).ok())
        .collect();
    CorsLayer::new()
        .allow_origin(AllowOrigin::list(origins))
        .allow_credentials(true)
        .allow_methods([Method::GET, Method::POST])
        .allow_headers([
            header::AUTHORIZATION,
            header::CONTENT_TYPE,
            HeaderName::from_static("last-event-id"),
        ])
        .expose_headers([header::CONTENT_TYPE])
        .max_age(Duration::from_secs(600))
}

async fn index() -> Html<&'static str> {
    Html(include_str!("../../static/index.html"))
}

async fn metrics(axum::extract::State(state): axum::extract::State<AppState>) -> Response {
    let handles: Vec<_> = state.runtimes.iter().map(|(_, r)| r.handle.clone()).collect();
    let body = state.metrics.render(&state.hub, &handles);
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        body,
    )
        .into_response()
}

/// A router over an empty hub with no runtimes and admin disabled, for tests without a socket.
#[cfg(test)]
pub(crate) fn test_app() -> (Router, Arc<Hub>) {
    use viewtape_journal::{EventJournal, JournalConfig};
    use viewtape_snapshots::SnapshotDir;

    let hub = Arc::new(Hub::new(Arc::new(EventJournal::new(JournalConfig::default()))));
    let metrics = Arc::new(Metrics::default());
    let config = ServerConfig::default();
    // The sender is dropped: streams end as if the server stopped, which no test here awaits.
    let (_, shutdown) = tokio::sync::watch::channel(false);
    let state = AppState {
        hub: Arc::clone(&hub),
        runtimes: Arc::default(),
        metrics: Arc::clone(&metrics),
        streams: Arc::new(Streams::new(Arc::clone(&hub), metrics, &config, shutdown)),
        config: Arc::new(config),
    };
    let dir = Arc::new(SnapshotDir::open(std::env::temp_dir()).expect("temp dir"));
    let snapshots = Arc::new(crate::snapshot::Snapshots::new(Arc::clone(&hub), dir, Arc::default()));
    (app(state, Arc::new(admin::Admin::new(None, snapshots))), hub)
}
