//! The HTTP API: one [`Router`] with every route and layer, whichever transport carries the
//! request.
//!
//! | route | module |
//! |---|---|
//! | `GET /views`, `GET /views/{view}`, `GET /views/{view}/events` | `views` |
//! | `POST /runtimes/{runtime}/ingest` | `ingest` |
//! | `GET /admin/`, `POST /admin/snapshot`, `GET /admin/snapshots`, `POST /admin/restore`, `GET /admin/runtimes`, `PUT /admin/runtimes/{runtime}/module` | [`admin`] |
//! | `GET /`, `GET /healthz`, `GET /readyz`, `GET /metrics` | here |
//! | `GET /openapi.json` | [`openapi`]: the description of every route |
//!
//! ## Layers
//!
//! Every route: a tracing span per request (`TraceLayer`) and CORS for the origins in
//! `[server] cors_origins`. Every route but the SSE stream: a time limit
//! ([`REQUEST_TIMEOUT`]) and gzip for clients that accept it. Errors are [`ApiError`].
//!
//! ## Logs
//!
//! An error answer is logged once, where it is made ([`ApiError`]): a server's failure at
//! `warn` or `error`, with its detail. The `TraceLayer` logs every response at `debug`, a `5xx`
//! too: a `503` is not a failure in itself (`/readyz` answers one while the server stops, as it
//! should), and one that is was logged by its `ApiError` already.

mod access;
pub mod admin;
mod body;
mod error;
mod ingest;
pub mod openapi;
#[cfg(test)]
mod props;
mod query;
mod schema;
mod views;

use std::sync::Arc;
use std::time::Duration;

use axum::http::{header, HeaderName, HeaderValue, Method, StatusCode};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::get;
use axum::Json;
use axum::Router;
use tokio::sync::watch;
use tower_http::compression::CompressionLayer;
use tower_http::cors::{AllowOrigin, CorsLayer};
use tower_http::timeout::TimeoutLayer;
use tower_http::trace::{DefaultOnFailure, TraceLayer};

pub use error::ApiError;

use crate::auth::Auth;
use crate::cluster::{Cluster, Halt};
use crate::config::ServerConfig;
use crate::hub::Hub;
use crate::log::LogMetrics;
use crate::metrics::Metrics;
use crate::runtime::registry::Runtimes;
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
    /// Token verification; `None`: auth is off.
    pub auth: Option<Arc<Auth>>,
    /// The node's cluster; `None`: a single node, ready until it stops.
    pub cluster: Option<Arc<Cluster>>,
    /// Turns `true` when the server stops: `/readyz` answers `503` from then on.
    pub stopping: watch::Receiver<bool>,
}

impl AppState {
    /// The state of a server over `hub`, `runtimes` and the log with `config`; SSE streams end when
    /// `shutdown` turns `true`.
    pub fn new(
        hub: Arc<Hub>,
        runtimes: Arc<Runtimes>,
        log: &LogMetrics,
        auth: Option<Arc<Auth>>,
        config: ServerConfig,
        shutdown: watch::Receiver<bool>,
    ) -> Self {
        let metrics = Arc::new(Metrics::new(Arc::clone(&hub), Arc::clone(&runtimes), log));
        let streams = Streams::new(
            Arc::clone(&hub),
            Arc::clone(&metrics),
            &config,
            shutdown.clone(),
        );
        Self {
            hub,
            runtimes,
            metrics,
            config: Arc::new(config),
            streams: Arc::new(streams),
            auth,
            cluster: None,
            stopping: shutdown,
        }
    }

    /// The state of a node of `cluster`: `/readyz` follows its apply loop.
    #[must_use]
    pub fn in_cluster(self, cluster: Arc<Cluster>) -> Self {
        Self {
            cluster: Some(cluster),
            ..self
        }
    }

    /// `404` saying `what` is not here (`no view named …`); but on a node of a cluster still
    /// catching up with the stream, `503` with `Retry-After`: the record that makes it may be
    /// among those the node has yet to apply.
    pub(crate) fn unknown(&self, what: String) -> ApiError {
        let catching_up = self.cluster.as_ref().map(|cluster| cluster.readiness());
        match catching_up {
            Some(r) if !r.ready && r.broken.is_none() && r.refused.is_none() => {
                ApiError::unavailable_for_now(format!(
                    "{what} yet: this node is catching up with its cluster (applied {} of {}); try again",
                    r.applied.get(),
                    r.stream_last.get()
                ))
            }
            _ => ApiError::not_found(what),
        }
    }
}

/// The router: every route, with its layers; the admin routes only with `admin`. Tests and
/// benchmarks drive it without a socket.
pub fn app(state: AppState, admin: Option<Arc<admin::Admin>>) -> Router {
    let cors = cors(&state.config);
    let operator = admin.clone();
    let bounded = Router::new()
        .route("/", get(index))
        .route("/viewtape-client.js", get(client_module))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route(
            "/metrics",
            get(move |state, extensions, headers| metrics(state, extensions, headers, operator)),
        )
        .merge(views::routes())
        .merge(schema::routes())
        .merge(ingest::routes())
        .merge(openapi::routes())
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
        .layer(axum::middleware::map_response(error::json_errors))
        .layer(tower::util::option_layer(cors))
        .layer(
            TraceLayer::new_for_http()
                .on_failure(DefaultOnFailure::new().level(tracing::Level::DEBUG)),
        )
}

/// CORS for `[server] cors_origins`, with credentials (cookies), on every route; none when the
/// list is empty (same-origin pages need none).
fn cors(config: &ServerConfig) -> Option<CorsLayer> {
    if config.cors_origins.is_empty() {
        return None;
    }
    let origins: Vec<HeaderValue> = config
        .cors_origins
        .iter()
        // Validated with the config: every entry is a header-safe origin.
        .filter_map(|origin| HeaderValue::from_str(origin).ok())
        .collect();
    let layer = CorsLayer::new()
        .allow_origin(AllowOrigin::list(origins))
        .allow_credentials(true)
        .allow_methods([Method::GET, Method::POST])
        .allow_headers([
            header::AUTHORIZATION,
            header::CONTENT_TYPE,
            HeaderName::from_static("last-event-id"),
            HeaderName::from_static("producer-id"),
            HeaderName::from_static("producer-epoch"),
            HeaderName::from_static("producer-seq"),
        ])
        .expose_headers([
            header::CONTENT_TYPE,
            header::RETRY_AFTER,
            header::WWW_AUTHENTICATE,
            HeaderName::from_static("producer-duplicate"),
            HeaderName::from_static("producer-expected-seq"),
        ])
        .max_age(Duration::from_secs(600));
    Some(layer)
}

/// `200` when the node serves what its cluster has (a single node always does), else `503`;
/// the body says how far it has applied the stream and, after a break, why it stopped. From the
/// moment the server is asked to stop: `503` with `"stopping": true`, so that a load balancer
/// sends no one new before the listener closes.
async fn readyz(axum::extract::State(state): axum::extract::State<AppState>) -> Response {
    let (ready, body) = readiness(&state);
    let status = match ready {
        true => StatusCode::OK,
        false => StatusCode::SERVICE_UNAVAILABLE,
    };
    (status, Json(body)).into_response()
}

/// Whether the node is ready, and what `/readyz` says about it. A runtime halted on this node
/// ([`RuntimeHalt`](crate::runtime::RuntimeHalt)) is named under `halted`, with where and why;
/// the node stays ready, since every other runtime is served.
fn readiness(state: &AppState) -> (bool, serde_json::Value) {
    if *state.stopping.borrow() {
        return (
            false,
            serde_json::json!({ "ready": false, "stopping": true }),
        );
    }
    let (ready, mut body) = match &state.cluster {
        None => (true, serde_json::json!({ "ready": true })),
        Some(cluster) => {
            let readiness = cluster.readiness();
            let ready = readiness.ready;
            let body = serde_json::to_value(readiness).unwrap_or(serde_json::Value::Null);
            (ready, body)
        }
    };
    let halted = state.runtimes.halted();
    if let (false, Some(body)) = (halted.is_empty(), body.as_object_mut()) {
        body.insert("halted".to_owned(), serde_json::json!(halted));
    }
    (ready, body)
}

async fn index() -> Html<&'static str> {
    Html(include_str!("../../static/index.html"))
}

/// `GET /viewtape-client.js`: `@viewtape/client` as one ES module (built from `clients/js` by
/// `npm run bundle`), what the demo page imports; pages served elsewhere may import it too.
async fn client_module() -> Response {
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "text/javascript; charset=utf-8",
        )],
        include_str!("../../static/viewtape-client.js"),
    )
        .into_response()
}

/// `GET /metrics`. With auth on, only from loopback or with the admin token: metrics name every
/// view and runtime.
async fn metrics(
    axum::extract::State(state): axum::extract::State<AppState>,
    extensions: axum::http::Extensions,
    headers: axum::http::HeaderMap,
    admin: Option<Arc<admin::Admin>>,
) -> Result<Response, ApiError> {
    if state.auth.is_some() {
        let local = extensions
            .get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()
            .is_some_and(|peer| peer.0.ip().is_loopback());
        let authorization = headers.get(header::AUTHORIZATION).map(|v| v.as_bytes());
        let operator = admin.is_some_and(|admin| admin.check(authorization).is_ok());
        if !local && !operator {
            return Err(ApiError::unauthorized(
                "/metrics: from loopback, or with the admin token (auth is on)",
            ));
        }
    }
    state.metrics.ready.set(i64::from(readiness(&state).0));
    let halt = state
        .cluster
        .as_ref()
        .and_then(|cluster| cluster.readiness().broken.map(|halt| halt.kind()));
    state.metrics.set_halt(&Halt::KINDS, halt);
    let body = state.metrics.render().map_err(ApiError::internal)?;
    Ok(([(header::CONTENT_TYPE, Metrics::CONTENT_TYPE)], body).into_response())
}

/// The state of a server over an empty hub with no runtimes, and `auth`, for tests without a
/// socket.
#[cfg(test)]
pub(crate) fn test_state(auth: Option<Arc<Auth>>) -> AppState {
    use viewtape_journal::{EventJournal, JournalConfig};

    let hub = Arc::new(Hub::new(Arc::new(EventJournal::new(
        JournalConfig::default(),
    ))));
    // The sender is dropped: streams end as if the server stopped, which no test here awaits.
    let (_, shutdown) = watch::channel(false);
    AppState::new(
        hub,
        Arc::default(),
        &LogMetrics::default(),
        auth,
        ServerConfig::default(),
        shutdown,
    )
}

/// A router over [`test_state`] without auth, and the admin routes enabled with the token
/// `admin`.
#[cfg(test)]
pub(crate) fn test_app_with_admin() -> (Router, Arc<Hub>) {
    let state = test_state(None);
    let hub = Arc::clone(&state.hub);
    let admin = admin::test_admin("admin").map(Arc::new);
    (app(state, admin), hub)
}

/// A router over [`test_state`] without auth and admin disabled.
#[cfg(test)]
pub(crate) fn test_app() -> (Router, Arc<Hub>) {
    let state = test_state(None);
    let hub = Arc::clone(&state.hub);
    (app(state, None), hub)
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;

    use axum::extract::ConnectInfo;
    use tower::ServiceExt;
    use viewtape_journal::{EventJournal, JournalConfig};

    use super::*;
    use crate::config::AuthSection;

    #[tokio::test]
    async fn a_browser_producer_may_send_and_read_the_producer_headers_cross_origin() {
        let (_, shutdown) = watch::channel(false);
        let hub = Arc::new(Hub::new(Arc::new(EventJournal::new(
            JournalConfig::default(),
        ))));
        let config = ServerConfig {
            cors_origins: vec!["https://app.example".into()],
            ..ServerConfig::default()
        };
        let state = AppState::new(
            hub,
            Arc::default(),
            &LogMetrics::default(),
            None,
            config,
            shutdown,
        );
        let request = axum::http::Request::builder()
            .method(Method::OPTIONS)
            .uri("/runtimes/demo/ingest")
            .header(header::ORIGIN, "https://app.example")
            .header(header::ACCESS_CONTROL_REQUEST_METHOD, "POST")
            .header(
                header::ACCESS_CONTROL_REQUEST_HEADERS,
                "producer-id,producer-seq,authorization",
            )
            .body(axum::body::Body::empty())
            .unwrap();
        let response = app(state, None).oneshot(request).await.unwrap();
        let allowed = response.headers()[header::ACCESS_CONTROL_ALLOW_HEADERS]
            .to_str()
            .unwrap()
            .to_owned();
        for name in [
            "producer-id",
            "producer-epoch",
            "producer-seq",
            "authorization",
        ] {
            assert!(allowed.contains(name), "{name} in {allowed}");
        }
        assert_eq!(
            response.headers()[header::ACCESS_CONTROL_ALLOW_CREDENTIALS],
            "true"
        );
    }

    /// The levels of the events logged while it runs.
    #[derive(Clone, Default)]
    struct Levels(Arc<std::sync::Mutex<Vec<tracing::Level>>>);

    impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Levels {
        fn on_event(
            &self,
            event: &tracing::Event<'_>,
            _: tracing_subscriber::layer::Context<'_, S>,
        ) {
            self.0
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .push(*event.metadata().level());
        }
    }

    /// While the server stopped, every load balancer's probe of `/readyz` was logged at ERROR
    /// (`response failed`): the `503` it is meant to get is logged at DEBUG.
    #[tokio::test]
    async fn a_503_from_readyz_while_stopping_is_not_logged_as_a_failure() {
        use tracing_subscriber::layer::SubscriberExt as _;

        let (stop, stopping) = watch::channel(false);
        let hub = Arc::new(Hub::new(Arc::new(EventJournal::new(
            JournalConfig::default(),
        ))));
        let state = AppState::new(
            hub,
            Arc::default(),
            &LogMetrics::default(),
            None,
            ServerConfig::default(),
            stopping,
        );
        stop.send_replace(true);
        let levels = Levels::default();
        let _logging =
            tracing::subscriber::set_default(tracing_subscriber::registry().with(levels.clone()));
        let request = axum::http::Request::get("/readyz")
            .body(axum::body::Body::empty())
            .unwrap();
        let response = app(state, None).oneshot(request).await.unwrap();
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        let levels = levels.0.lock().unwrap().clone();
        assert!(!levels.is_empty(), "the response is logged");
        assert!(
            levels.iter().all(|level| *level >= tracing::Level::DEBUG),
            "{levels:?}"
        );
    }

    #[tokio::test]
    async fn with_auth_on_metrics_are_for_loopback_only() {
        let auth = Auth::load(&AuthSection::default(), Some("secret"))
            .unwrap()
            .map(Arc::new);
        let router = app(test_state(auth), None);
        for (peer, status) in [
            ("127.0.0.1:4000", StatusCode::OK),
            ("[::1]:4000", StatusCode::OK),
            ("10.1.2.3:4000", StatusCode::UNAUTHORIZED),
        ] {
            let peer: SocketAddr = peer.parse().unwrap();
            let mut request = axum::http::Request::get("/metrics")
                .body(axum::body::Body::empty())
                .unwrap();
            request.extensions_mut().insert(ConnectInfo(peer));
            let response = router.clone().oneshot(request).await.unwrap();
            assert_eq!(response.status(), status, "{peer}");
        }
    }
}
