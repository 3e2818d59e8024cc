//! Request heads: parsed, and served by the lean transport, declined to hyper, or refused with
//! the JSON error.

use std::time::Duration;

use axum::body::Body;
use axum::http::{self, HeaderName, HeaderValue, Method, Request, Response, StatusCode, Version};
use tokio::io::AsyncReadExt;

use super::write::answer_and_close;
use super::{Io, Limits, MAX_HEAD, MAX_HEADERS};

/// A request head refused before the router sees it (as hyper would refuse it, but with the
/// JSON error every other refusal has).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum BadHead {
    /// Not HTTP/1.x: `400`.
    Malformed,
    /// HTTP/1.x whose body framing or `Host` no transport may serve: `400`.
    Framing(Framing),
    /// Past [`MAX_HEAD`] bytes or [`MAX_HEADERS`] fields: `431`.
    TooLarge,
}

/// What is wrong with a head's body framing or `Host`. Where a proxy in front and this server
/// could read such a head differently — where its body ends, which host it is for — the bytes
/// after it could be taken for a request the proxy never saw; so it is refused, and the
/// connection closed after the answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Framing {
    /// Both `Content-Length` and `Transfer-Encoding`.
    LengthAndCoding,
    /// A `Transfer-Encoding` other than `chunked` alone (`gzip, chunked`, `chunked, chunked`).
    Coding,
    /// `Transfer-Encoding` in an HTTP/1.0 request, which has none.
    CodingInHttp10,
    /// A `Content-Length` that is not one number hyper can take, or lines that differ.
    Length,
    /// An HTTP/1.1 request without `Host`.
    NoHost,
    /// More than one `Host` line.
    ManyHosts,
    /// A `Host` that is not a host with an optional port.
    BadHost,
}

impl Framing {
    fn message(self) -> &'static str {
        match self {
            Framing::LengthAndCoding => "the request has both Content-Length and Transfer-Encoding: send one of them",
            Framing::Coding => "Transfer-Encoding must be chunked alone: this server takes no other transfer coding",
            Framing::CodingInHttp10 => "an HTTP/1.0 request cannot have Transfer-Encoding: send Content-Length, or use HTTP/1.1",
            Framing::Length => "Content-Length must be one number of bytes in decimal digits, the same on every line",
            Framing::NoHost => "an HTTP/1.1 request must have a Host header",
            Framing::ManyHosts => "a request must have one Host header, not several",
            Framing::BadHost => "the Host header must be a host name or address, with an optional port",
        }
    }
}

/// The largest `Content-Length` hyper takes (it keeps the two values above for itself); the
/// lean transport takes the same, so that both refuse alike.
const MAX_CONTENT_LENGTH: u64 = u64::MAX - 2;

impl BadHead {
    /// Its status and JSON body.
    fn answer_parts(self) -> (StatusCode, String) {
        let (status, code, message) = match self {
            BadHead::Malformed => (
                StatusCode::BAD_REQUEST,
                "bad_request",
                "the request head is not valid HTTP/1.1".to_owned(),
            ),
            BadHead::Framing(framing) => (
                StatusCode::BAD_REQUEST,
                "bad_request",
                framing.message().to_owned(),
            ),
            BadHead::TooLarge => (
                StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
                "headers_too_large",
                format!("the request head is over {MAX_HEAD} bytes or {MAX_HEADERS} header fields"),
            ),
        };
        let body = serde_json::json!({"error": code, "message": message});
        (status, body.to_string())
    }

    /// Answers it on `stream` and closes the connection, reading on for a moment first (at
    /// most 1 s and 1 MiB): closing with the rest of a long head unread would reset the
    /// connection, and the client could lose the answer.
    pub(super) async fn answer<S: Io>(self, mut stream: S, limits: Limits) {
        let (status, body) = self.answer_parts();
        tracing::debug!(?self, "request head refused");
        let status = format!(
            "{} {}",
            status.as_str(),
            status.canonical_reason().unwrap_or("")
        );
        answer_and_close(&mut stream, &status, "", &body, limits).await;
        // On the heap: an array here would size every connection's task, which holds this
        // future's state whether or not it ever answers a bad head.
        let mut sink = vec![0u8; 8192];
        let drain = async {
            let mut read = 0;
            while read < 1 << 20 {
                match stream.read(&mut sink).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => read += n,
                }
            }
        };
        let _ = tokio::time::timeout(Duration::from_secs(1), drain).await;
    }

    /// The same answer as [`BadHead::answer`] writes, as a response for hyper to send: hyper
    /// closes the connection after it, as its `connection: close` says.
    pub(super) fn response(self) -> Response<Body> {
        let (status, body) = self.answer_parts();
        tracing::debug!(?self, "request head refused");
        let mut response = Response::new(Body::from(body));
        *response.status_mut() = status;
        let headers = response.headers_mut();
        headers.insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        headers.insert(http::header::CONNECTION, HeaderValue::from_static("close"));
        response
    }
}

/// The refusal of a request hyper parsed, if its framing or `Host` is one no transport may
/// serve (see [`check_framing`]); HTTP/2 has neither `Transfer-Encoding` nor a `Host` of its
/// own, and is not checked. Hyper has already refused the rest of what
/// [`check_framing`] refuses, with its own empty answer, and read a request that had both
/// `Content-Length` and `Transfer-Encoding` by the latter (then closed the connection): it
/// hands over the head without the `Content-Length`.
pub(super) fn refused_by_hyper<B>(request: &Request<B>) -> Option<BadHead> {
    let http10 = match request.version() {
        Version::HTTP_10 => true,
        Version::HTTP_11 => false,
        _ => return None,
    };
    let fields = request
        .headers()
        .iter()
        .map(|(name, value)| (name.as_str().as_bytes(), value.as_bytes()));
    check_framing(http10, fields).err().map(BadHead::Framing)
}

/// What the bytes read so far hold.
pub(super) enum Parsed {
    /// A complete head the lean transport serves, and its length.
    Request(Box<Request<Body>>, usize),
    /// A head for hyper (or bytes hyper should refuse).
    Decline,
    /// Not a complete head yet.
    Partial,
    /// A head nobody serves.
    Bad(BadHead),
}

/// Parses a request head and keeps it only when it is a plain `GET`.
pub(super) fn parse_head(buf: &[u8]) -> Parsed {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut parsed = httparse::Request::new(&mut headers);
    let len = match parsed.parse(buf) {
        // Whole, but longer than a head may be: the reads that brought it were large enough
        // to carry it past the limit before it was looked at.
        Ok(httparse::Status::Complete(len)) if len > MAX_HEAD => {
            return Parsed::Bad(BadHead::TooLarge)
        }
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) => return Parsed::Partial,
        Err(httparse::Error::TooManyHeaders) => return Parsed::Bad(BadHead::TooLarge),
        Err(_) => return Parsed::Bad(BadHead::Malformed),
    };
    let fields = parsed
        .headers
        .iter()
        .map(|header| (header.name.as_bytes(), header.value));
    if let Err(framing) = check_framing(parsed.version == Some(0), fields) {
        return Parsed::Bad(BadHead::Framing(framing));
    }
    match lean_request(&parsed) {
        Some(request) => Parsed::Request(Box::new(request), len),
        None => Parsed::Decline,
    }
}

/// Checks a request head's body framing and `Host` (fields by name and value, names in any
/// case): at most one of `Content-Length` and `Transfer-Encoding`; every `Content-Length` the
/// same number, at most [`MAX_CONTENT_LENGTH`], in decimal digits; `Transfer-Encoding`
/// `chunked` alone, and only in HTTP/1.1; exactly one `Host` in HTTP/1.1 and at most one in
/// HTTP/1.0, a host name or address with an optional port, or empty.
fn check_framing<'a>(
    http10: bool,
    fields: impl IntoIterator<Item = (&'a [u8], &'a [u8])>,
) -> Result<(), Framing> {
    // Everything is looked at before anything is refused, so that the reason does not depend
    // on the order of the lines (hyper hands them over grouped by name).
    let (mut length, mut bad_length) = (None, false);
    let (mut codings, mut bad_coding) = (0, false);
    let (mut hosts, mut bad_host) = (0, false);
    for (name, value) in fields {
        if name.eq_ignore_ascii_case(b"content-length") {
            match content_length(value) {
                Some(n) if length.is_none_or(|seen| seen == n) => length = Some(n),
                _ => bad_length = true,
            }
        } else if name.eq_ignore_ascii_case(b"transfer-encoding") {
            // A second line adds a second coding, even if it says `chunked` again.
            codings += 1;
            bad_coding |= !value.trim_ascii().eq_ignore_ascii_case(b"chunked");
        } else if name.eq_ignore_ascii_case(b"host") {
            hosts += 1;
            bad_host |= !is_host(value);
        }
    }
    let refusal = if codings > 0 && http10 {
        Framing::CodingInHttp10
    } else if bad_coding || codings > 1 {
        Framing::Coding
    } else if bad_length {
        Framing::Length
    } else if length.is_some() && codings > 0 {
        Framing::LengthAndCoding
    } else if hosts > 1 {
        Framing::ManyHosts
    } else if bad_host {
        Framing::BadHost
    } else if hosts == 0 && !http10 {
        Framing::NoHost
    } else {
        return Ok(());
    };
    Err(refusal)
}

/// A `Content-Length` value: decimal digits only, at most [`MAX_CONTENT_LENGTH`].
fn content_length(value: &[u8]) -> Option<u64> {
    if value.is_empty() {
        return None;
    }
    value
        .iter()
        .try_fold(0u64, |n, &digit| {
            let digit = digit.is_ascii_digit().then(|| u64::from(digit - b'0'))?;
            n.checked_mul(10)?.checked_add(digit)
        })
        .filter(|&n| n <= MAX_CONTENT_LENGTH)
}

/// Whether `value` reads as a `Host`: empty, or a host name, IPv4 or bracketed IPv6 address,
/// with an optional port — nothing of a URL's user info, path, query or fragment, and no
/// spaces.
fn is_host(value: &[u8]) -> bool {
    value
        .iter()
        .all(|&b| b.is_ascii_alphanumeric() || b"-._~%!$&'()*+,;=:[]".contains(&b))
}

/// The `http::Request` for a head the lean transport serves: `GET`, HTTP/1.1,
/// an origin-form target, no body and nothing that changes the framing.
fn lean_request(parsed: &httparse::Request<'_, '_>) -> Option<Request<Body>> {
    if parsed.method != Some("GET") || parsed.version != Some(1) {
        return None;
    }
    let target = parsed.path.filter(|path| path.starts_with('/'))?;
    let mut request = Request::builder()
        .method(Method::GET)
        .uri(target)
        .version(Version::HTTP_11);
    for header in parsed.headers.iter() {
        let name = HeaderName::from_bytes(header.name.as_bytes()).ok()?;
        let value = HeaderValue::from_bytes(header.value).ok()?;
        let declined = name == http::header::CONTENT_LENGTH
            || name == http::header::TRANSFER_ENCODING
            || name == http::header::EXPECT
            || name == http::header::UPGRADE
            || name == http::header::TE
            || (name == http::header::CONNECTION
                && !value.as_bytes().eq_ignore_ascii_case(b"keep-alive"));
        if declined {
            return None;
        }
        request = request.header(name, value);
    }
    request.body(Body::empty()).ok()
}

#[cfg(test)]
mod tests;
