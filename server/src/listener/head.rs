//! Request heads: parsed, and served by the lean transport, declined to hyper, or refused with
//! the JSON error.

use std::time::Duration;

use axum::body::Body;
use axum::http::{self, HeaderName, HeaderValue, Method, Request, Version};
use tokio::io::AsyncReadExt;

use super::write::answer_and_close;
use super::{Io, Limits, MAX_HEAD, MAX_HEADERS};

/// A request head refused before the router sees it (as hyper would refuse it, but with the
/// JSON error every other refusal has).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum BadHead {
    /// Not HTTP/1.x: `400`.
    Malformed,
    /// Past [`MAX_HEAD`] bytes or [`MAX_HEADERS`] fields: `431`.
    TooLarge,
}

impl BadHead {
    /// Answers it on `stream` and closes the connection, reading on for a moment first (at
    /// most 1 s and 1 MiB): closing with the rest of a long head unread would reset the
    /// connection, and the client could lose the answer.
    pub(super) async fn answer<S: Io>(self, mut stream: S, limits: Limits) {
        let (status, body) = match self {
            BadHead::Malformed => (
                "400 Bad Request",
                "{\"error\":\"bad_request\",\"message\":\"the request head is not valid HTTP/1.1\"}".to_owned(),
            ),
            BadHead::TooLarge => (
                "431 Request Header Fields Too Large",
                format!("{{\"error\":\"headers_too_large\",\"message\":\"the request head is over {MAX_HEAD} bytes or {MAX_HEADERS} header fields\"}}"),
            ),
        };
        tracing::debug!(?self, "request head refused");
        answer_and_close(&mut stream, status, "", &body, limits).await;
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
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) => return Parsed::Partial,
        Err(httparse::Error::TooManyHeaders) => return Parsed::Bad(BadHead::TooLarge),
        Err(_) => return Parsed::Bad(BadHead::Malformed),
    };
    if !framing_is_valid(parsed.headers) {
        return Parsed::Bad(BadHead::Malformed);
    }
    match lean_request(&parsed) {
        Some(request) => Parsed::Request(Box::new(request), len),
        None => Parsed::Decline,
    }
}

/// Whether the head's body framing is one hyper would take: every `Content-Length` decimal
/// digits and the same, and a `Transfer-Encoding` (HTTP/1.1) that ends with `chunked`.
fn framing_is_valid(headers: &[httparse::Header<'_>]) -> bool {
    let mut length = None;
    for header in headers {
        if header.name.eq_ignore_ascii_case("content-length") {
            let value = header.value;
            if value.is_empty()
                || !value.iter().all(u8::is_ascii_digit)
                || length.is_some_and(|seen| seen != value)
            {
                return false;
            }
            length = Some(value);
        } else if header.name.eq_ignore_ascii_case("transfer-encoding") {
            let last = header
                .value
                .rsplit(|&b| b == b',')
                .next()
                .unwrap_or_default();
            if !last.trim_ascii().eq_ignore_ascii_case(b"chunked") {
                return false;
            }
        }
    }
    true
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
mod tests {
    use super::*;

    fn parse(head: &str) -> Parsed {
        parse_head(head.as_bytes())
    }

    #[test]
    fn plain_gets_are_lean_and_the_rest_goes_to_hyper() {
        let head = "GET /views/a/events?x=1 HTTP/1.1\r\nHost: h\r\nConnection: keep-alive\r\n\r\n";
        let Parsed::Request(request, len) = parse(&format!("{head}GET")) else {
            panic!("a plain GET is served lean");
        };
        assert_eq!(len, head.len(), "a pipelined request stays unread");
        assert_eq!(request.uri().path(), "/views/a/events");
        assert_eq!(request.uri().query(), Some("x=1"));
        assert_eq!(request.headers()["host"], "h");
        for declined in [
            "HEAD / HTTP/1.1\r\n\r\n",
            "POST / HTTP/1.1\r\n\r\n",
            "GET / HTTP/1.0\r\n\r\n",
            "GET http://h/ HTTP/1.1\r\n\r\n",
            "GET / HTTP/1.1\r\nContent-Length: 0\r\n\r\n",
            "GET / HTTP/1.1\r\nExpect: 100-continue\r\n\r\n",
            "GET / HTTP/1.1\r\nConnection: close\r\n\r\n",
            "GET / HTTP/1.1\r\nConnection: upgrade\r\nUpgrade: websocket\r\n\r\n",
        ] {
            assert!(matches!(parse(declined), Parsed::Decline), "{declined:?}");
        }
        assert!(matches!(parse("GET / HTTP/1.1\r\nHost"), Parsed::Partial));
        let many = format!(
            "GET / HTTP/1.1\r\n{}\r\n",
            "a: b\r\n".repeat(MAX_HEADERS + 1)
        );
        assert!(matches!(parse(&many), Parsed::Bad(BadHead::TooLarge)));
        for malformed in [
            "GET / HTTP/1.1\r\nBad Header\r\n\r\n",
            "POST / HTTP/9.9\r\n\r\n",
            "\x16\x03\x01 not http\r\n\r\n",
            "GET / HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n",
            "POST / HTTP/1.1\r\nContent-Length: x\r\n\r\n",
            "POST / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
        ] {
            assert!(
                matches!(parse(malformed), Parsed::Bad(BadHead::Malformed)),
                "{malformed:?}"
            );
        }
    }
}
