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
mod tests {
    use std::convert::Infallible;
    use std::sync::{Arc, Mutex};

    use hyper::body::Incoming;
    use hyper_util::rt::TokioIo;
    use proptest::prelude::*;
    use tokio::io::AsyncWriteExt;

    use super::*;

    fn parse(head: &str) -> Parsed {
        parse_head(head.as_bytes())
    }

    /// What [`parse_head`] said, comparably.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum Verdict {
        Lean(usize),
        Decline,
        Partial,
        Bad(BadHead),
    }

    fn verdict(bytes: &[u8]) -> Verdict {
        match parse_head(bytes) {
            Parsed::Request(_, len) => Verdict::Lean(len),
            Parsed::Decline => Verdict::Decline,
            Parsed::Partial => Verdict::Partial,
            Parsed::Bad(bad) => Verdict::Bad(bad),
        }
    }

    /// What hyper, set up as the listener sets it up, makes of `bytes` on a fresh connection.
    #[derive(Debug, PartialEq, Eq)]
    enum ByHyper {
        /// Hands the request to the service, where [`refused_by_hyper`] says this; with its
        /// `content-length` and `transfer-encoding` lines.
        Served(Option<BadHead>, usize, usize),
        /// Answers with this status itself.
        Refused(u16),
        /// Closes without an answer.
        Nothing,
    }

    fn by_hyper(bytes: &[u8]) -> ByHyper {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let (mut client, server) = tokio::io::duplex(1 << 17);
            client.write_all(bytes).await.unwrap();
            client.shutdown().await.unwrap();
            let seen = Arc::new(Mutex::new(None));
            let service = {
                let seen = Arc::clone(&seen);
                hyper::service::service_fn(move |request: Request<Incoming>| {
                    let count = |name| request.headers().get_all(name).iter().count();
                    *seen.lock().unwrap() = Some(ByHyper::Served(
                        refused_by_hyper(&request),
                        count(http::header::CONTENT_LENGTH),
                        count(http::header::TRANSFER_ENCODING),
                    ));
                    async { Ok::<_, Infallible>(Response::new(Body::empty())) }
                })
            };
            let mut builder = hyper::server::conn::http1::Builder::new();
            builder
                .max_buf_size(MAX_HEAD)
                .max_headers(MAX_HEADERS)
                .half_close(true);
            let connection = builder.serve_connection(TokioIo::new(server), service);
            let mut answer = Vec::new();
            let read = async {
                let _ = client.read_to_end(&mut answer).await;
            };
            let both = async {
                let (_served, ()) = tokio::join!(connection, read);
            };
            tokio::time::timeout(Duration::from_secs(10), both)
                .await
                .expect("hyper answers or closes");
            if let Some(served) = seen.lock().unwrap().take() {
                return served;
            }
            match answer.get(9..12).map(std::str::from_utf8) {
                Some(Ok(status)) => ByHyper::Refused(status.parse().unwrap()),
                _ => ByHyper::Nothing,
            }
        })
    }

    /// The two transports agree on `bytes`: what the lean transport serves, hyper serves and
    /// lets through; what it declines, hyper decides; what it refuses, hyper refuses too — by
    /// itself, or by [`refused_by_hyper`] for the same reason — but for a head with both
    /// `Content-Length` and `Transfer-Encoding`, which hyper reads by the latter alone (and
    /// closes the connection after).
    fn agree(bytes: &[u8]) -> Result<(), String> {
        let lean = verdict(bytes);
        let hyper = by_hyper(bytes);
        let agreed = match (lean, &hyper) {
            (Verdict::Partial, _) => true,
            (Verdict::Lean(_), ByHyper::Served(None, ..)) => true,
            (Verdict::Lean(_), _) => false,
            (Verdict::Decline, ByHyper::Served(refused, ..)) => refused.is_none(),
            (Verdict::Decline, _) => true,
            // The `Content-Length` hyper dropped for the `Transfer-Encoding`.
            (Verdict::Bad(BadHead::Framing(_)), ByHyper::Served(_, 0, 1..))
                if has_length(bytes) =>
            {
                true
            }
            (Verdict::Bad(BadHead::Framing(framing)), ByHyper::Served(refused, ..)) => {
                *refused == Some(BadHead::Framing(framing))
            }
            (Verdict::Bad(_), ByHyper::Served(..)) => false,
            (Verdict::Bad(_), _) => true,
        };
        match agreed {
            true => Ok(()),
            false => Err(format!(
                "lean {lean:?}, hyper {hyper:?}: {:?}",
                String::from_utf8_lossy(bytes)
            )),
        }
    }

    /// Whether the head in `bytes` has a `Content-Length` line.
    fn has_length(bytes: &[u8]) -> bool {
        let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
        let mut parsed = httparse::Request::new(&mut headers);
        parsed.parse(bytes).is_ok()
            && parsed
                .headers
                .iter()
                .any(|header| header.name.eq_ignore_ascii_case("content-length"))
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
            "HEAD / HTTP/1.1\r\nHost: h\r\n\r\n",
            "POST / HTTP/1.1\r\nHost: h\r\n\r\n",
            "GET / HTTP/1.0\r\n\r\n",
            "GET http://h/ HTTP/1.1\r\nHost: h\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: h\r\nContent-Length: 0\r\n\r\n",
            "POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: h\r\nExpect: 100-continue\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: h\r\nConnection: upgrade\r\nUpgrade: websocket\r\n\r\n",
        ] {
            assert!(matches!(parse(declined), Parsed::Decline), "{declined:?}");
        }
        assert!(matches!(parse("GET / HTTP/1.1\r\nHost"), Parsed::Partial));
        let many = format!(
            "GET / HTTP/1.1\r\n{}\r\n",
            "a: b\r\n".repeat(MAX_HEADERS + 1)
        );
        assert!(matches!(parse(&many), Parsed::Bad(BadHead::TooLarge)));
        // A whole head past the limit in one buffer (one large read brought it) was served.
        let head = |size: usize| {
            let padding = "a".repeat(size - get_head("Host: h\r\nX-Pad: \r\n").len());
            get_head(&format!("Host: h\r\nX-Pad: {padding}\r\n"))
        };
        assert!(matches!(
            parse(&head(MAX_HEAD)),
            Parsed::Request(_, MAX_HEAD)
        ));
        assert!(matches!(
            parse(&head(MAX_HEAD + 1)),
            Parsed::Bad(BadHead::TooLarge)
        ));
        for malformed in [
            "GET / HTTP/1.1\r\nBad Header\r\n\r\n",
            "GET / HTTP/1.1\r\nHost : h\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: h\r\nX-A: b\r\n c\r\n\r\n",
            "POST / HTTP/9.9\r\n\r\n",
            "\x16\x03\x01 not http\r\n\r\n",
        ] {
            assert!(
                matches!(parse(malformed), Parsed::Bad(BadHead::Malformed)),
                "{malformed:?}"
            );
        }
    }

    /// Both `Content-Length` and `Transfer-Encoding`, a transfer coding besides `chunked`, no
    /// `Host` or two, and a `Content-Length` past what hyper takes were served (or left to
    /// hyper's empty answer): each is refused with the JSON error, on both transports.
    #[test]
    fn bad_framing_and_hosts_are_refused_on_both_transports() {
        use Framing::*;
        let post = |fields: &str| format!("POST /runtimes/demo/ingest HTTP/1.1\r\n{fields}\r\n");
        for (head, want) in [
            (
                post("Host: h\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n"),
                LengthAndCoding,
            ),
            (
                post("Host: h\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n"),
                LengthAndCoding,
            ),
            (
                post("Host: h\r\nTransfer-Encoding: gzip, chunked\r\n"),
                Coding,
            ),
            (
                post("Host: h\r\nTransfer-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n"),
                Coding,
            ),
            (
                post("Host: h\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n"),
                Coding,
            ),
            (
                post("Host: h\r\nTransfer-Encoding: chunked, chunked\r\n"),
                Coding,
            ),
            (post("Host: h\r\nTransfer-Encoding: gzip\r\n"), Coding),
            (
                "POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n".to_owned(),
                CodingInHttp10,
            ),
            (
                post("Host: h\r\nContent-Length: 99999999999999999999\r\n"),
                Length,
            ),
            (
                post("Host: h\r\nContent-Length: 18446744073709551614\r\n"),
                Length,
            ),
            (post("Host: h\r\nContent-Length: x\r\n"), Length),
            (post("Host: h\r\nContent-Length: +1\r\n"), Length),
            (post("Host: h\r\nContent-Length: 1, 1\r\n"), Length),
            (
                post("Host: h\r\nContent-Length: 1\r\nContent-Length: 2\r\n"),
                Length,
            ),
            (post(""), NoHost),
            (get_head(""), NoHost),
            (get_head("Host: a\r\nHost: b\r\n"), ManyHosts),
            (get_head("Host: a\r\nHost: a\r\n"), ManyHosts),
            (
                "GET / HTTP/1.0\r\nHost: a\r\nHost: b\r\n\r\n".to_owned(),
                ManyHosts,
            ),
            (get_head("Host: a b\r\n"), BadHost),
            (get_head("Host: user@h\r\n"), BadHost),
            (get_head("Host: h/path\r\n"), BadHost),
        ] {
            assert_eq!(
                verdict(head.as_bytes()),
                Verdict::Bad(BadHead::Framing(want)),
                "{head:?}"
            );
            agree(head.as_bytes()).unwrap();
            let (status, body) = BadHead::Framing(want).answer_parts();
            let body: serde_json::Value = serde_json::from_str(&body).unwrap();
            assert_eq!(status, StatusCode::BAD_REQUEST);
            assert_eq!(body["error"], "bad_request");
            assert_eq!(body["message"], want.message());
        }
        // What stays accepted: the largest length hyper takes, repeated lengths that agree,
        // `chunked` in any case, HTTP/1.0 without `Host`, an empty `Host`, a port, IPv6.
        for head in [
            post("Host: h\r\nContent-Length: 18446744073709551613\r\n"),
            post("Host: h\r\nContent-Length: 3\r\nContent-Length: 3\r\n"),
            post("Host: h\r\nTransfer-Encoding: Chunked\r\n"),
            "GET / HTTP/1.0\r\n\r\n".to_owned(),
            get_head("Host:\r\n"),
            get_head("Host: 127.0.0.1:8080\r\n"),
            get_head("Host: [::1]:80\r\n"),
            get_head("Host: xn--bcher-kva.example\r\n"),
        ] {
            assert!(
                matches!(
                    verdict(head.as_bytes()),
                    Verdict::Lean(_) | Verdict::Decline
                ),
                "{head:?}"
            );
            agree(head.as_bytes()).unwrap();
        }
    }

    fn get_head(fields: &str) -> String {
        format!("GET /views HTTP/1.1\r\n{fields}\r\n")
    }

    /// A request head built of pieces that each exercise a rule: methods, targets, versions,
    /// and header lines with framing, `Host`, folding, spaces and bytes out of place.
    fn heads() -> impl Strategy<Value = Vec<u8>> {
        let method = prop::sample::select(vec!["GET", "POST", "HEAD", "PUT", "G T", "", "get"]);
        let target = prop::sample::select(vec![
            "/",
            "/views?x=1",
            "http://h/",
            "*",
            "/%ZZ",
            "/a b",
            "/\x7f",
            "//x",
            "h:80",
        ]);
        let version = prop::sample::select(vec![
            "HTTP/1.1",
            "HTTP/1.0",
            "HTTP/2.0",
            "HTTP/1.1 ",
            "HTTP/1",
            "http/1.1",
        ]);
        let field = prop::sample::select(vec![
            "Host: x",
            "Host: x:80",
            "Host:",
            "Host: a b",
            "Host: u@x",
            "host: X",
            "Content-Length: 0",
            "Content-Length: 5",
            "Content-Length: 99999999999999999999",
            "Content-Length: 18446744073709551613",
            "Content-Length: 18446744073709551614",
            "Content-Length: +1",
            "Content-Length: 1, 1",
            "Content-Length:",
            "Transfer-Encoding: chunked",
            "Transfer-Encoding: gzip, chunked",
            "transfer-encoding: CHUNKED ",
            "Transfer-Encoding: chunked, chunked",
            "Transfer-Encoding: identity",
            "Transfer-Encoding:",
            " folded",
            "\tfolded",
            "Bad Header",
            "X : y",
            "X: \x01",
            "X: \x7f",
            "X:\u{e9}",
            "Connection: close",
            "Connection: keep-alive",
            "Expect: 100-continue",
            "Upgrade: h2c",
            "TE: trailers",
        ]);
        let end = prop::sample::select(vec!["\r\n", "\n"]);
        (
            method,
            target,
            version,
            prop::collection::vec((field, end.clone()), 0..6),
            end,
        )
            .prop_map(|(method, target, version, fields, end)| {
                let mut head = format!("{method} {target} {version}\r\n");
                for (field, end) in fields {
                    head.push_str(field);
                    head.push_str(end);
                }
                head.push_str(end);
                head.into_bytes()
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(4_000))]

        /// Any bytes: no panic, and a verdict on a whole head does not change with what follows
        /// it (a pipelined request, a body).
        #[test]
        fn any_bytes_get_a_verdict_that_what_follows_does_not_change(
            bytes in prop::collection::vec(any::<u8>(), 0..600),
            more in prop::collection::vec(any::<u8>(), 1..40),
        ) {
            let first = verdict(&bytes);
            if let Verdict::Lean(len) = first {
                prop_assert!(len <= bytes.len());
                prop_assert_eq!(verdict(&bytes[..len]), first);
            }
            let longer = [&bytes[..], &more].concat();
            if first != Verdict::Partial {
                prop_assert_eq!(verdict(&longer), first);
            }
        }

        /// Heads of every shape, and the same edited byte by byte: the lean transport and hyper
        /// agree on each (see [`agree`]).
        #[test]
        fn both_transports_agree_on_every_head(
            head in heads(),
            edits in prop::collection::vec((0usize..200, any::<u8>(), 0u8..3), 0..3),
        ) {
            let mut head = head;
            for (at, byte, how) in edits {
                let at = at.min(head.len());
                match how {
                    0 if at < head.len() => head[at] = byte,
                    1 => head.insert(at, byte),
                    2 if at < head.len() => drop(head.remove(at)),
                    _ => {}
                }
            }
            prop_assert_eq!(agree(&head), Ok(()));
        }
    }
}
