//! Reading views: the list, one view's state, and its SSE stream.

use std::collections::BTreeMap;

use axum::body::Body;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, RawQuery, State};
use axum::http::{header, HeaderMap, HeaderValue};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Extension, Json, Router};
use bytes::{BufMut, Bytes, BytesMut};
use viewtape_journal::{EventJournal, ViewName};

use super::access::Caller;
use super::query::Params;
use super::{ApiError, AppState};
use crate::hub::narrow::Narrow;
use crate::hub::{ReadHold, View};
use crate::log::LogPosition;
use crate::sse::socket::SharedTcp;
use crate::sse::{OpenError, Start, MAX_FRAMES_PER_CHUNK};

/// The bounded routes: list and state.
pub(super) fn routes() -> Router<AppState> {
    Router::new()
        .route("/views", get(list_views))
        .route("/views/{view}", get(view_state))
}

/// The SSE stream, which lives as long as the client follows.
pub(super) fn stream_routes() -> Router<AppState> {
    Router::new().route("/views/{view}/events", get(events))
}

/// The query of a reading route: the parameters it `takes`, and `?access_token=`, listed in
/// refusals only where `[auth] allow_query_token` lets it carry a token (elsewhere it is taken
/// only so that [`Caller::of`] can say why it is refused).
pub(super) fn reading_query(
    state: &AppState,
    query: Option<&str>,
    takes: &[&'static str],
) -> Result<Params, ApiError> {
    const TOKEN: &str = "access_token";
    if state
        .auth
        .as_ref()
        .is_some_and(|auth| auth.allows_query_token())
    {
        let takes: Vec<&'static str> = takes.iter().copied().chain([TOKEN]).collect();
        Params::parse(query, &takes, &[])
    } else {
        Params::parse(query, takes, &[TOKEN])
    }
}

/// Read your writes: with `?after=POSITION` (a log position a change or a batch was answered
/// with, through any node), waits until this node has applied it, at most `[cluster]
/// ahead_wait`, else a `503` with `Retry-After`. A single node answers a change once applied.
async fn after(state: &AppState, query: &Params) -> Result<(), ApiError> {
    let Some(text) = query.get("after") else {
        return Ok(());
    };
    let position = text.parse::<u64>().map(LogPosition::new).map_err(|_| {
        ApiError::bad_request(format!(
            "after={text:?}: a log position, as a change or a batch was answered with"
        ))
    })?;
    let Some(cluster) = &state.cluster else {
        return Ok(());
    };
    if cluster.reach_position(position).await {
        return Ok(());
    }
    Err(ApiError::unavailable_for_now(format!(
        "this node has not applied log position {} yet (it has applied {}); try again",
        position.get(),
        cluster.applied().get()
    )))
}

/// `?keys=`/`?prefix=`, or a `400` saying what is wrong with them.
fn narrow(keys: Option<&str>, prefix: Option<&str>) -> Result<Narrow, ApiError> {
    Narrow::parse(keys, prefix).map_err(|error| ApiError::bad_request(error.to_string()))
}

/// `GET /views`: the views the caller may read (some keys of, under a narrowed grant: then
/// `keys` counts only those; the tape's counts and window stay the view's, as its cursors do).
async fn list_views(
    State(state): State<AppState>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
) -> Result<Json<serde_json::Value>, ApiError> {
    let query = reading_query(&state, query.as_deref(), &[])?;
    let caller = Caller::of(&state, &headers, query.get("access_token"))?;
    let journal = state.hub.journal();
    let counts: BTreeMap<String, u64> = journal.entry_counts_now().into_iter().collect();
    let bytes: BTreeMap<String, u64> = journal.retained_bytes_now().into_iter().collect();
    let views: Vec<serde_json::Value> = state
        .hub
        .views()
        .iter()
        .filter(|view| view.lasting())
        .filter_map(|view| {
            // Listed with some keys granted; `keys` counts only those.
            let grants = caller.grants(view.name());
            (!grants.is_empty()).then(|| (view, granted_keys(view, journal, &grants)))
        })
        .map(|(view, keys)| {
            let window = journal.window_now(view.name());
            serde_json::json!({
                "name": view.name(),
                "keys": keys,
                "retained": counts.get(view.name()).copied().unwrap_or(0),
                "bytes": bytes.get(view.name()).copied().unwrap_or(0),
                "epoch": window.epoch.to_string(),
                "first": window.first,
                "next": window.next,
                "sealed": window.sealed,
            })
        })
        .collect();
    Ok(Json(serde_json::json!({ "views": views })))
}

/// The view `name`, held for the read: one that exists, or one that a pattern of a running
/// runtime takes (`chat.*` takes `chat.room-7`), empty while nothing was published there. A read
/// makes no lasting view: only a publish does (see [`crate::hub`]).
fn find_view(state: &AppState, name: &str) -> Option<ReadHold> {
    state.hub.hold(name).or_else(|| {
        let taken = ViewName::new(name).is_ok() && state.runtimes.taking(name).is_some();
        taken.then(|| state.hub.hold_on_demand(name))
    })
}

/// `404`: no view `view`, and no pattern of a running runtime takes the name.
fn no_view(state: &AppState, view: &str) -> ApiError {
    state.unknown(format!("no view named {view:?}"))
}

/// How many keys of `view` the narrowings of the caller's `grants` (at least one) let it read.
fn granted_keys(view: &View, journal: &EventJournal, grants: &[&Narrow]) -> usize {
    match Narrow::union(grants.iter().copied()) {
        Some(Narrow::All) => view.keys(),
        // One narrowing: counted in one pass under the view's lock, no key copied.
        Some(joined) => view.cut(journal, &joined).entries.len(),
        // Grants no one narrowing joins: each key against each grant.
        None => view
            .entries()
            .iter()
            .filter(|(key, _)| grants.iter().any(|g| g.keeps(key)))
            .count(),
    }
}

/// `GET /views/{view}`: `{"cursor": C, "entries": {key: payload}}` (the keys `?keys=` or
/// `?prefix=` name, else every key the caller's grants give), read in one critical section with
/// the cursor, encoded lazily as the socket takes it: a large state never becomes one buffer.
async fn view_state(
    State(state): State<AppState>,
    view: Result<Path<String>, PathRejection>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let Path(view) = view?;
    let query = reading_query(&state, query.as_deref(), &["keys", "prefix", "after"])?;
    let asked = narrow(query.get("keys"), query.get("prefix"))?;
    let narrow = Caller::of(&state, &headers, query.get("access_token"))?.read(&view, asked)?;
    after(&state, &query).await?;
    let held = find_view(&state, &view).ok_or_else(|| no_view(&state, &view))?;
    let view = held.view();
    let cut = view.cut(state.hub.journal(), &narrow);
    let head = Bytes::from(format!("{{\"cursor\":\"{}\",\"entries\":{{", cut.cursor));
    let total = cut.entries.len();
    let entries = cut.entries;
    let chunks = (0..total).step_by(MAX_FRAMES_PER_CHUNK).map(move |start| {
        let mut out = BytesMut::new();
        let end = total.min(start + MAX_FRAMES_PER_CHUNK);
        for (i, entry) in entries[start..end].iter().enumerate() {
            if start + i > 0 {
                out.put_u8(b',');
            }
            entry.put_json_member(&mut out);
        }
        out.freeze()
    });
    let body = futures_util::stream::iter(
        std::iter::once(head)
            .chain(chunks)
            .chain(std::iter::once(Bytes::from_static(b"}}\n")))
            .map(Ok::<_, std::convert::Infallible>),
    );
    tracing::debug!(view = view.name(), keys = total, "state read");
    Ok((
        [
            (header::CONTENT_TYPE, "application/json"),
            (header::CACHE_CONTROL, "no-store"),
        ],
        Body::from_stream(body),
    )
        .into_response())
}

/// The response headers of every SSE stream.
const SSE_HEADERS: [(header::HeaderName, &str); 3] = [
    (header::CONTENT_TYPE, "text/event-stream"),
    (header::CACHE_CONTROL, "no-store"),
    (header::HeaderName::from_static("x-accel-buffering"), "no"),
];

/// `GET /views/{view}/events`: 404 for an unknown view, 503 past the connection limit. The
/// cursor comes from `Last-Event-ID`, else `?cursor=`; the header wins. `?until=head` ends the
/// stream once it has delivered everything up to the view's head at open. `?keys=`/`?prefix=`
/// narrow it to those keys (see [`crate::hub::narrow`]); a narrowed grant, to its keys.
async fn events(
    State(state): State<AppState>,
    view: Result<Path<String>, PathRejection>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
    socket: Option<Extension<SharedTcp>>,
) -> Result<Response, ApiError> {
    let Path(view) = view?;
    let query = reading_query(
        &state,
        query.as_deref(),
        &["cursor", "from", "until", "keys", "prefix", "after"],
    )?;
    let from_tape = match query.get("from") {
        None => false,
        Some("tape") => true,
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "from={other:?}: the one value is \"tape\""
            )))
        }
    };
    let until_head = match query.get("until") {
        None => false,
        Some("head") => true,
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "until={other:?}: the one value is \"head\""
            )))
        }
    };
    let asked = narrow(query.get("keys"), query.get("prefix"))?;
    let caller = Caller::of(&state, &headers, query.get("access_token"))?;
    // Under a narrowed grant, the grant's keys: for the state, the tape after a cursor, every
    // reset and `?until=head` alike — the stream holds this one narrowing to its end.
    let narrow = caller.read(&view, asked)?;
    after(&state, &query).await?;
    let last_event_id = headers
        .get("last-event-id")
        .map(|value| String::from_utf8_lossy(value.as_bytes()).into_owned());
    let start = match last_event_id
        .as_deref()
        .or(query.get("cursor"))
        .filter(|text| !text.is_empty())
    {
        Some(text) => text.parse().map_or(Start::Malformed, Start::Cursor),
        None if from_tape => Start::Tape,
        None => Start::State,
    };
    if let (Some(cluster), Start::Cursor(cursor)) = (&state.cluster, &start) {
        cluster
            .reach(&state.hub, &view, cursor)
            .await
            .map_err(|why| {
                ApiError::unavailable_for_now(format!(
                    "the cursor is ahead of this node and {why}; try again, or another node"
                ))
            })?;
    }
    let held = find_view(&state, &view).ok_or_else(|| no_view(&state, &view))?;
    let subscriber = state
        .streams
        .open(held, start, narrow, caller.expires_at())
        .map_err(|error| match error {
            OpenError::Full { .. } => ApiError::unavailable(error.to_string()),
        })?;
    let subscriber = match until_head {
        true => subscriber.until_head(),
        false => subscriber,
    };
    let subscriber = match socket {
        Some(Extension(socket)) => subscriber.direct(socket),
        None => subscriber,
    };
    let mut response = Body::from_stream(subscriber.into_stream()).into_response();
    for (name, value) in SSE_HEADERS {
        response
            .headers_mut()
            .insert(name, HeaderValue::from_static(value));
    }
    Ok(response)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use axum::http::StatusCode;
    use futures_util::StreamExt;
    use tower::ServiceExt;

    use crate::host::{EventKind, GuestBatch, GuestEvent};
    use crate::http::test_app;
    use crate::runtime::BatchSink;

    #[tokio::test]
    async fn view_state_is_one_valid_json_document_across_chunks() {
        let (router, hub) = test_app();
        let events = (0..1_200)
            .map(|i| {
                GuestEvent::new(
                    Arc::from("v"),
                    format!("k{i}"),
                    EventKind::Update,
                    bytes::Bytes::from(format!("{{\"n\":{i}}}")),
                )
            })
            .collect();
        hub.commit(
            "test",
            GuestBatch::of_events(events),
            crate::log::unix_ms_now(),
        )
        .await;
        let request = axum::http::Request::get("/views/v")
            .body(axum::body::Body::empty())
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
        let cut = hub
            .view("v")
            .unwrap()
            .cut(hub.journal(), &crate::hub::narrow::Narrow::All);
        assert_eq!(state["cursor"], cut.cursor.to_string());
        let entries = state["entries"].as_object().unwrap();
        assert_eq!(entries.len(), 1_200);
        assert_eq!(entries["k777"], serde_json::json!({ "n": 777 }));
    }

    /// A bad path or query was answered in axum's and serde's words ("Invalid URL: …",
    /// "Failed to deserialize query string: …", listing `access_token` with query tokens off).
    #[tokio::test]
    async fn bad_paths_and_queries_are_refused_in_our_words() {
        let (router, hub) = test_app();
        hub.declare("prices");
        for (uri, said) in [
            ("/views/%FF", "the view in the path is not UTF-8"),
            ("/views/%FF/events", "the view in the path is not UTF-8"),
            ("/views/%FF/schema", "the view in the path is not UTF-8"),
            (
                "/views?verbose=1",
                "unknown query parameter \"verbose\"; this route takes no query parameter",
            ),
            (
                "/views/prices?cursor=1",
                "unknown query parameter \"cursor\"; this route takes: keys, prefix",
            ),
            (
                "/views/prices/events?form=tape",
                "unknown query parameter \"form\"; this route takes: cursor, from, until, keys, prefix",
            ),
            ("/views/prices/events?from=bogus", "from=\"bogus\""),
            (
                "/views/prices/events?cursor=a&cursor=b",
                "query parameter \"cursor\" is given more than once",
            ),
        ] {
            let request = axum::http::Request::get(uri)
                .body(axum::body::Body::empty())
                .unwrap();
            let response = router.clone().oneshot(request).await.unwrap();
            assert_eq!(response.status(), StatusCode::BAD_REQUEST, "{uri}");
            let body = axum::body::to_bytes(response.into_body(), 1 << 16)
                .await
                .unwrap();
            let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
            let message = body["message"].as_str().unwrap();
            assert_eq!(body["error"], "bad_request", "{uri}");
            assert!(message.contains(said), "{uri}: {message}");
        }
    }

    #[tokio::test]
    async fn bad_paths_and_queries_are_json_errors() {
        let (router, hub) = test_app();
        hub.declare("prices");
        for (uri, status) in [
            ("/views/pri%63es", StatusCode::OK),
            ("/views/%FF", StatusCode::BAD_REQUEST),
            ("/views/%FF/events", StatusCode::BAD_REQUEST),
            (
                "/views/prices/events?cursor=a&cursor=b",
                StatusCode::BAD_REQUEST,
            ),
            ("/views/nope/events", StatusCode::NOT_FOUND),
        ] {
            let request = axum::http::Request::get(uri)
                .body(axum::body::Body::empty())
                .unwrap();
            let response = router.clone().oneshot(request).await.unwrap();
            assert_eq!(response.status(), status, "{uri}");
            if status != StatusCode::OK {
                assert_eq!(
                    response.headers()["content-type"],
                    "application/json",
                    "{uri}"
                );
            }
        }
    }
}
