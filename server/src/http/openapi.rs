//! `GET /openapi.json`: the OpenAPI 3.2 description of every route, kept in the repository as
//! `docs/openapi.json` and served with each typed view's schema in its routes
//! ([`super::schema::typed_document`]). Tests hold it to the router: every route is described,
//! and every operation described is routed.

use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::{Json, Router};

use super::AppState;

/// The document, as in `docs/openapi.json`.
pub const DOCUMENT: &str = include_str!("../../../docs/openapi.json");

pub(super) fn routes() -> Router<AppState> {
    Router::new().route("/openapi.json", get(document))
}

async fn document(State(state): State<AppState>) -> impl IntoResponse {
    let schemas: Vec<_> = state
        .runtimes
        .iter()
        .map(|(_, runtime)| runtime.handle.schemas())
        .collect();
    let typed = schemas
        .iter()
        .flat_map(|schemas| schemas.iter())
        .map(|(view, schema)| (view, &**schema));
    // The document is ours and parses (a test holds it); were it not, the route says so.
    let base = serde_json::from_str(DOCUMENT).unwrap_or_else(|error| {
        tracing::error!(%error, "docs/openapi.json does not parse");
        serde_json::Value::Null
    });
    (
        [(header::CACHE_CONTROL, "no-cache")],
        Json(super::schema::typed_document(base, typed)),
    )
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use axum::http::{Method, Request, StatusCode};
    use tower::ServiceExt;

    use super::*;

    /// Every `(method, path)` the document describes.
    fn described() -> BTreeSet<(String, String)> {
        let document: serde_json::Value = serde_json::from_str(DOCUMENT).unwrap();
        assert_eq!(document["openapi"], "3.2.0");
        let mut out = BTreeSet::new();
        for (path, item) in document["paths"].as_object().unwrap() {
            for method in item.as_object().unwrap().keys() {
                out.insert((method.to_uppercase(), path.clone()));
            }
        }
        out
    }

    /// Every `.route("PATH", method(…))` in the HTTP module's sources, with its methods.
    fn routed() -> BTreeSet<(String, String)> {
        let mut files = Vec::new();
        let mut dirs = vec![std::path::PathBuf::from(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/src/http"
        ))];
        while let Some(dir) = dirs.pop() {
            for entry in std::fs::read_dir(dir).unwrap() {
                let path = entry.unwrap().path();
                match path.is_dir() {
                    true => dirs.push(path),
                    false => files.push(path),
                }
            }
        }
        let mut out = BTreeSet::new();
        for file in files {
            let text = std::fs::read_to_string(file).unwrap();
            for piece in text.split(".route(").skip(1) {
                let piece = piece.trim_start();
                let Some(rest) = piece.strip_prefix('"') else {
                    continue;
                };
                let (path, rest) = rest.split_once('"').unwrap();
                // The method router runs to the end of the call: up to the next `.route(` or
                // the end of the function at the latest, so take the text before them and find
                // the method functions in it.
                let call = rest.split(".route(").next().unwrap_or(rest);
                let end = [call.find("\n        ."), call.find("\n}")]
                    .into_iter()
                    .flatten()
                    .min();
                let call = &call[..end.unwrap_or(call.len())];
                for method in ["get", "post", "put", "delete", "patch"] {
                    if call.contains(&format!(" {method}("))
                        || call.contains(&format!(".{method}("))
                    {
                        out.insert((method.to_uppercase(), path.to_owned()));
                    }
                }
            }
        }
        out
    }

    #[test]
    fn every_route_is_described_and_every_described_operation_is_routed() {
        let (described, routed) = (described(), routed());
        assert!(
            routed.len() >= 13,
            "the scan found too few routes: {routed:?}"
        );
        let undocumented: Vec<_> = routed.difference(&described).collect();
        assert!(
            undocumented.is_empty(),
            "routes missing from docs/openapi.json: {undocumented:?}"
        );
        let unrouted: Vec<_> = described.difference(&routed).collect();
        assert!(
            unrouted.is_empty(),
            "operations in docs/openapi.json with no route: {unrouted:?}"
        );
    }

    #[tokio::test]
    async fn every_described_operation_reaches_a_route_of_the_router() {
        let router = crate::http::test_app_with_admin().0;
        for (method, path) in described() {
            let uri = path
                .replace("{view}", "prices")
                .replace("{runtime}", "demo");
            let request = Request::builder()
                .method(Method::from_bytes(method.as_bytes()).unwrap())
                .uri(&uri)
                .body(axum::body::Body::empty())
                .unwrap();
            let response = router.clone().oneshot(request).await.unwrap();
            assert_ne!(
                response.status(),
                StatusCode::METHOD_NOT_ALLOWED,
                "{method} {uri}"
            );
            if response.status() == StatusCode::NOT_FOUND {
                let body = axum::body::to_bytes(response.into_body(), 1 << 16)
                    .await
                    .unwrap();
                let body = String::from_utf8_lossy(&body);
                assert!(!body.contains("no such route"), "{method} {uri}: {body}");
            }
        }
    }
}
