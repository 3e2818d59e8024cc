//! The one error type of every route: a status, a stable code and a short message, sent as
//! `{"error": code, "message": message}`. Internal detail is logged, never sent.

use axum::extract::path::ErrorKind;
use axum::extract::rejection::PathRejection;
use axum::http::{header, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;

/// An error answer. Logged once, when it becomes a response: server errors at `warn`, refusals
/// of bad requests at `debug`.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct ApiError {
    status: StatusCode,
    code: &'static str,
    message: String,
    /// Headers that say more (e.g. the `Producer-Expected-Seq` of a 409).
    headers: Vec<(HeaderName, HeaderValue)>,
    /// Fields of the body beside `error` and `message` that say where (a schema violation's
    /// `view`, `key` and `pointer`).
    fields: serde_json::Map<String, serde_json::Value>,
    /// Its detail was logged when it was made.
    logged: bool,
}

impl ApiError {
    fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            code,
            message: message.into(),
            headers: Vec::new(),
            fields: serde_json::Map::new(),
            logged: false,
        }
    }

    /// The same error, with `name: value` on the response.
    pub fn with_header(mut self, name: HeaderName, value: HeaderValue) -> Self {
        self.headers.push((name, value));
        self
    }

    /// The same error, with `name: value` in the body beside `error` and `message`.
    pub fn with_field(mut self, name: &str, value: impl Into<serde_json::Value>) -> Self {
        self.fields.insert(name.to_owned(), value.into());
        self
    }

    /// `404 not_found`: no such route, view or runtime.
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "not_found", message)
    }

    /// `404` with another code than `not_found`: the thing exists, without what was asked of it.
    pub fn not_found_as(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, code, message)
    }

    /// `400 bad_request`.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "bad_request", message)
    }

    /// `401 unauthorized`, with `WWW-Authenticate: Bearer`.
    pub fn unauthorized(message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, "unauthorized", message)
    }

    /// `403` with `code`: understood, and not allowed.
    pub fn forbidden(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::FORBIDDEN, code, message)
    }

    /// `409` with `code`: conflicts with what the server already has.
    pub fn conflict(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::CONFLICT, code, message)
    }

    /// `413 body_too_large`.
    pub fn too_large(limit: usize) -> Self {
        Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "body_too_large",
            format!("request body is larger than {limit} bytes"),
        )
    }

    /// `422` with `code`: the request is well formed but cannot be carried out.
    pub fn unprocessable(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNPROCESSABLE_ENTITY, code, message)
    }

    /// `503 unavailable`.
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", message)
    }

    /// `503 unavailable` with `Retry-After: 1`: this node will have what was asked for shortly.
    pub fn unavailable_for_now(message: impl Into<String>) -> Self {
        Self::unavailable(message).with_header(header::RETRY_AFTER, HeaderValue::from_static("1"))
    }

    /// This answer with `Connection: close`: it is given before the request's body was read
    /// (or while it was), so the connection cannot carry another request, and says so.
    pub fn closing(self) -> Self {
        self.with_header(header::CONNECTION, HeaderValue::from_static("close"))
    }

    /// `503 runtime_halted`: the runtime stopped on this node (it could not reproduce its
    /// logged history); `message` says since where, why, and what brings it back.
    pub fn halted(message: impl Into<String>) -> Self {
        Self::new(StatusCode::SERVICE_UNAVAILABLE, "runtime_halted", message)
    }

    /// `503 outcome_unknown`: the request may yet take effect; `message` says how to learn
    /// whether it did.
    pub fn outcome_unknown(message: impl Into<String>) -> Self {
        Self::new(StatusCode::SERVICE_UNAVAILABLE, "outcome_unknown", message)
    }

    /// `500 internal`: `detail` goes to the log; the client learns only that it failed.
    pub fn internal(detail: impl std::fmt::Display) -> Self {
        Self::hiding(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            "internal error; see the server log",
            detail,
        )
    }

    /// `503 unavailable` with the public `message`; `detail` (paths, OS errors, error chains)
    /// goes to the log, once, never to the client.
    pub fn unavailable_hiding(message: &'static str, detail: impl std::fmt::Display) -> Self {
        Self::hiding(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            message,
            detail,
        )
    }

    /// The one place an internal error becomes an answer: the detail is logged here, the
    /// client gets `message`.
    fn hiding(
        status: StatusCode,
        code: &'static str,
        message: &'static str,
        detail: impl std::fmt::Display,
    ) -> Self {
        tracing::error!(status = status.as_u16(), error = %detail, "request failed");
        Self {
            logged: true,
            ..Self::new(status, code, message)
        }
    }

    /// The status (what the tests of the routes check).
    #[cfg(test)]
    pub fn status(&self) -> StatusCode {
        self.status
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        if self.status.is_server_error() {
            if !self.logged {
                tracing::warn!(status = self.status.as_u16(), error = %self.message, "request failed");
            }
        } else {
            tracing::debug!(status = self.status.as_u16(), error = %self.message, "request refused");
        }
        let mut body = self.fields;
        body.insert("error".into(), self.code.into());
        body.insert("message".into(), self.message.into());
        let mut response = (self.status, Json(body)).into_response();
        response.headers_mut().extend(self.headers);
        if self.status == StatusCode::UNAUTHORIZED {
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        response
    }
}

/// Gives an error answer that has no body of its own — axum's `405`, the timeout's `408`, a
/// layer's refusal — the JSON error, keeping its headers (`Allow`, …): whichever layer refuses a
/// request, the client reads the same shape.
pub async fn json_errors(response: Response) -> Response {
    let status = response.status();
    let is_error = status.is_client_error() || status.is_server_error();
    if !is_error || response.headers().contains_key(header::CONTENT_TYPE) {
        return response;
    }
    let (code, message) = match status {
        StatusCode::METHOD_NOT_ALLOWED => (
            "method_not_allowed",
            "this route does not take that method (see Allow)",
        ),
        StatusCode::REQUEST_TIMEOUT => (
            "request_timeout",
            "the request took too long; send it again",
        ),
        StatusCode::PAYLOAD_TOO_LARGE => ("body_too_large", "the request body is too large"),
        _ if status.is_server_error() => ("unavailable", "the server cannot answer now"),
        _ => ("bad_request", "the request cannot be served"),
    };
    let (parts, _) = response.into_parts();
    let mut json = ApiError::new(status, code, message).into_response();
    for (name, value) in &parts.headers {
        if name != header::CONTENT_LENGTH {
            json.headers_mut()
                .entry(name)
                .or_insert_with(|| value.clone());
        }
    }
    json
}

/// A path whose parameters cannot be read, in our words: axum's own text names its internals.
impl From<PathRejection> for ApiError {
    fn from(rejection: PathRejection) -> Self {
        match &rejection {
            PathRejection::FailedToDeserializePathParams(failed) => match failed.kind() {
                ErrorKind::InvalidUtf8InPathParam { key } => Self::bad_request(format!(
                    "the {key} in the path is not UTF-8 after percent-decoding"
                )),
                _ => Self::bad_request("the path cannot be read"),
            },
            // Every route names the parameters its handler reads: a missing one is ours.
            _ => Self::internal(rejection),
        }
    }
}
