//! Property test: no request panics the router, whatever its token claims and headers, and
//! every refusal is the JSON error in our own words.

use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use base64::Engine as _;
use http_body_util::BodyExt as _;
use proptest::prelude::*;
use tower::ServiceExt as _;

use super::{app, test_state};
use crate::auth::Auth;
use crate::config::AuthSection;

const SECRET: &str = "props-secret";

/// A claim value: the right type, the wrong one, or an extreme.
fn value() -> impl Strategy<Value = serde_json::Value> {
    prop_oneof![
        any::<u64>().prop_map(serde_json::Value::from),
        Just(serde_json::Value::from(u64::MAX)),
        Just(serde_json::Value::from(-1)),
        Just(serde_json::Value::from(1e300)),
        Just(serde_json::Value::Null),
        "[a-z*]{0,6}".prop_map(serde_json::Value::from),
        proptest::collection::vec("[a-z*]{0,6}", 0..3).prop_map(serde_json::Value::from),
    ]
}

/// A token: HS256-signed claims (well-formed or not), under a header that may be unusual.
fn token() -> impl Strategy<Value = String> {
    // Well-formed grants with an extreme `exp`, beside arbitrary claims.
    let valid = (
        prop_oneof![
            Just(u64::MAX),
            Just(u64::MAX / 1000),
            Just(4_000_000_000u64),
            any::<u64>()
        ],
        prop_oneof![Just("*"), Just("prices"), Just("pri*")],
    )
        .prop_map(|(exp, grant)| {
            std::collections::BTreeMap::from([
                ("exp".to_owned(), serde_json::Value::from(exp)),
                ("views".to_owned(), serde_json::json!([grant])),
                ("ingest".to_owned(), serde_json::json!([grant])),
            ])
        });
    let arbitrary = proptest::collection::btree_map(
        prop_oneof![
            Just("exp".to_owned()),
            Just("views".to_owned()),
            Just("ingest".to_owned()),
            Just("aud".to_owned()),
            Just("nbf".to_owned()),
            "[a-z]{1,4}"
        ],
        value(),
        0..6,
    );

    let alg = prop_oneof![
        Just("HS256"),
        Just("none"),
        Just("RS256"),
        Just("ES256"),
        Just("xx")
    ];
    let arbitrary = (arbitrary, alg, any::<bool>());
    let valid = (valid, Just("HS256"), Just(true));
    prop_oneof![valid, arbitrary].prop_map(|(claims, alg, sign)| {
        let b64 = |bytes: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes);
        let header = b64(format!("{{\"alg\":\"{alg}\",\"typ\":\"JWT\"}}").as_bytes());
        let body = b64(&serde_json::to_vec(&claims).unwrap_or_default());
        let signature = match sign {
            true => {
                let key = jsonwebtoken::EncodingKey::from_secret(SECRET.as_bytes());
                let message = format!("{header}.{body}");
                jsonwebtoken::crypto::sign(message.as_bytes(), &key, jsonwebtoken::Algorithm::HS256)
                    .unwrap_or_default()
            }
            false => "c2lnbmF0dXJl".to_owned(),
        };
        format!("{header}.{body}.{signature}")
    })
}

/// A header value as a client might send it, printable or not.
fn header_value() -> impl Strategy<Value = String> {
    prop_oneof![
        "[0-9]{0,22}",
        "[+ -]?[0-9]{1,4}",
        "[ -~]{0,24}",
        Just("18446744073709551616".to_owned()),
    ]
}

fn request(
    path: &str,
    method: &str,
    token: Option<&str>,
    headers: &[(&str, String)],
) -> Request<Body> {
    let mut request = Request::builder().method(method).uri(path);
    if let Some(token) = token {
        request = request.header("authorization", format!("Bearer {token}"));
    }
    for (name, value) in headers {
        request = request.header(*name, value.as_str());
    }
    request
        .body(Body::from("{\"symbol\":\"ACME\",\"price\":1,\"seq\":1}\n"))
        .unwrap_or_default()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    #[test]
    fn no_request_panics_and_every_refusal_is_our_json(
        token in proptest::option::of(token()),
        seq in header_value(),
        epoch in header_value(),
        last_event_id in header_value(),
        route in 0usize..4,
    ) {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        runtime.block_on(async {
            let auth = Auth::load(&AuthSection::default(), Some(SECRET)).unwrap().map(Arc::new);
            let state = test_state(auth);
            state.hub.declare("prices");
            let (path, method) = [
                ("/views/prices/events", "GET"),
                ("/views/prices", "GET"),
                ("/views", "GET"),
                ("/runtimes/demo/ingest", "POST"),
            ][route];
            let headers = [
                ("producer-id", "p".to_owned()),
                ("producer-seq", seq),
                ("producer-epoch", epoch),
                ("last-event-id", last_event_id),
            ];
            let headers: Vec<_> = headers
                .into_iter()
                .filter(|(_, v)| axum::http::HeaderValue::from_str(v).is_ok())
                .collect();
            let response = app(state, None)
                .oneshot(request(path, method, token.as_deref(), &headers))
                .await
                .unwrap();
            let status = response.status();
            if status == StatusCode::OK {
                return Ok(()); // a stream or a document: not read here
            }
            let body = response.into_body().collect().await.unwrap().to_bytes();
            let json: serde_json::Value = serde_json::from_slice(&body)
                .map_err(|_| TestCaseError::fail(format!("{status}: not JSON: {body:?}")))?;
            let message = json["message"].as_str().unwrap_or_default();
            prop_assert!(json["error"].is_string() && !message.is_empty(), "{status}: {json}");
            for library_text in ["line ", "column", "variant", "expected one of", "Error("] {
                prop_assert!(!message.contains(library_text), "{status}: {message}");
            }
            Ok(())
        })?;
    }
}

/// A layer's bare refusal (the timeout's `408`, axum's `405`) becomes the JSON error, its
/// headers kept.
#[tokio::test]
async fn bare_refusals_get_the_json_error() {
    for (status, code) in [
        (StatusCode::REQUEST_TIMEOUT, "request_timeout"),
        (StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed"),
        (StatusCode::PAYLOAD_TOO_LARGE, "body_too_large"),
    ] {
        let mut bare = axum::response::Response::new(Body::empty());
        *bare.status_mut() = status;
        bare.headers_mut()
            .insert("allow", axum::http::HeaderValue::from_static("GET"));
        let answered = super::error::json_errors(bare).await;
        assert_eq!(answered.status(), status);
        assert_eq!(answered.headers()["allow"], "GET");
        let body = answered.into_body().collect().await.unwrap().to_bytes();
        let json: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(json["error"], code, "{json}");
    }
}
