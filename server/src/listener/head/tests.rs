//! The head parser's tests: cases, a differential test against hyper's parser, and properties.

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
        (Verdict::Bad(BadHead::Framing(_)), ByHyper::Served(_, 0, 1..)) if has_length(bytes) => {
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
