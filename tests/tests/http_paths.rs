//! Two transports carry requests to one router: the lean transport takes plain `GET`s, hyper
//! every connection from the first request the lean transport declines. A client must not be
//! able to tell them apart. The differential tests send a corpus of requests both ways — on a
//! fresh connection (lean, unless the request itself is declined), and after a `HEAD` that hands
//! the connection to hyper — and require the same status, headers (but `date`) and body: once
//! against a server without auth, and once with tokens, public views and CORS on, where every
//! access and CORS rule must hold whichever way the connection got there (and does what the
//! rule says, checked case by case, so the two cannot be wrong alike).
//!
//! One file past 500 lines: the differential corpus and the cases it came from belong together.

use std::time::Duration;

use anyhow::{bail, ensure, Context as _};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use viewtape_tests::http::{self, parse_head, ChunkedDecoder};
use viewtape_tests::server::config_file;
use viewtape_tests::token::{hs256, hs256_claims, now};
use viewtape_tests::Server;

/// How long a stream may stay silent before its response counts as complete.
const SETTLE: Duration = Duration::from_millis(500);

/// A response as the client saw it: status line, headers but `date` (sorted), decoded body.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Seen {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Seen {
    /// Every value of header `name` (lowercase), in order.
    fn values<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a str> + 'a {
        self.headers
            .iter()
            .filter(move |(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// The one value of header `name`; `None` when it is missing.
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// Whether header `name` (a comma-separated list, possibly over several lines) lists
    /// `item`, compared without case.
    fn lists(&self, name: &str, item: &str) -> bool {
        self.values(name)
            .flat_map(|value| value.split(','))
            .any(|listed| listed.trim().eq_ignore_ascii_case(item))
    }

    /// The body as JSON.
    fn json(&self) -> anyhow::Result<serde_json::Value> {
        serde_json::from_str(&self.body).with_context(|| format!("not JSON: {:.300}", self.body))
    }

    /// What is left to compare of an answer whose body changes from one request to the next.
    fn without_body(&self) -> Self {
        Self {
            status: self.status,
            headers: self
                .headers
                .iter()
                .filter(|(name, _)| name != "content-length")
                .cloned()
                .collect(),
            body: String::new(),
        }
    }
}
/// Reads one response from `stream`; `buf` keeps what belongs to the next. A streamed body ends
/// at its last chunk or when nothing arrives for [`SETTLE`].
async fn read_response(
    stream: &mut TcpStream,
    buf: &mut Vec<u8>,
    head_only: bool,
) -> anyhow::Result<Seen> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let head = loop {
        if let Some((head, len)) = parse_head(buf)? {
            buf.drain(..len);
            break head;
        }
        let mut more = [0u8; 4096];
        let n = tokio::time::timeout_at(deadline, stream.read(&mut more)).await??;
        ensure!(n > 0, "closed before a response head");
        buf.extend_from_slice(&more[..n]);
    };
    let mut body = Vec::new();
    if !head_only {
        let chunked = head.header("transfer-encoding") == Some("chunked");
        let length: usize = head.header("content-length").map_or(Ok(0), str::parse)?;
        let mut decoder = ChunkedDecoder::default();
        loop {
            if chunked {
                if decoder.decode(buf, &mut body)? {
                    break;
                }
            } else if buf.len() >= length {
                body.extend(buf.drain(..length));
                break;
            }
            let mut more = [0u8; 4096];
            match tokio::time::timeout(SETTLE, stream.read(&mut more)).await {
                Ok(n) => {
                    let n = n?;
                    ensure!(n > 0, "closed inside a body");
                    buf.extend_from_slice(&more[..n]);
                }
                // A stream that goes on: compare what it sent once it has sent something.
                Err(_) if chunked && !body.is_empty() => break,
                Err(_) if chunked && tokio::time::Instant::now() < deadline => {}
                Err(_) => bail!("the body did not arrive in time"),
            }
        }
    }
    let mut headers: Vec<(String, String)> = head
        .headers
        .into_iter()
        .filter(|(name, _)| name != "date")
        .collect();
    headers.sort();
    Ok(Seen {
        status: head.status,
        headers,
        body: String::from_utf8_lossy(&body).into_owned(),
    })
}

/// What a case's answer must be, beyond both transports agreeing on it.
type Check = Box<dyn Fn(&Seen) -> anyhow::Result<()>>;

/// One corpus entry: the bytes a client sends (in pieces, with a pause between them), how many
/// responses come back, whether the lean transport serves it on a fresh connection, and what
/// the answers must be.
struct Case {
    name: &'static str,
    pieces: Vec<Vec<u8>>,
    responses: usize,
    lean: bool,
    head_only: bool,
    /// The body changes from one request to the next (counters): compared without it.
    volatile: bool,
    /// A head no route serves: the lean transport answers it with the JSON error on a fresh
    /// connection, hyper with its own empty body on a connection it serves already; the two
    /// are compared by status only.
    refused: bool,
    /// Checks of the answers: of the response at an index, or of every response (`None`).
    checks: Vec<(Option<usize>, Check)>,
}

impl Case {
    fn new(name: &'static str, request: impl Into<Vec<u8>>) -> Self {
        Self {
            name,
            pieces: vec![request.into()],
            responses: 1,
            lean: true,
            head_only: false,
            volatile: false,
            refused: false,
            checks: Vec::new(),
        }
    }

    fn declined(mut self) -> Self {
        self.lean = false;
        self
    }

    fn responses(mut self, n: usize) -> Self {
        self.responses = n;
        self
    }

    fn head_only(mut self) -> Self {
        self.head_only = true;
        self
    }

    fn volatile(mut self) -> Self {
        self.volatile = true;
        self
    }

    /// Refused before any route with `status` and the JSON error `code` (see [`Case::refused`]).
    fn refused(mut self, status: u16, code: &'static str) -> Self {
        self.refused = true;
        self.expect(move |seen| {
            let json: serde_json::Value = serde_json::from_str(&seen.body)?;
            ensure!(
                seen.status == status && json["error"] == code,
                "{status} {code}"
            );
            Ok(())
        })
    }

    /// Refused before any route with `status` and the JSON error `code`, alike on both
    /// transports: compared whole, unlike [`Case::refused`].
    fn refused_alike(self, status: u16, code: &'static str) -> Self {
        let mut case = self.refused(status, code);
        case.refused = false;
        case.expect(|seen| {
            ensure!(
                seen.header("connection") == Some("close"),
                "the connection stays open"
            );
            Ok(())
        })
    }

    /// Every response must pass `check`.
    fn expect(mut self, check: impl Fn(&Seen) -> anyhow::Result<()> + 'static) -> Self {
        self.checks.push((None, Box::new(check)));
        self
    }

    /// Response `index` must pass `check`.
    fn expect_nth(
        mut self,
        index: usize,
        check: impl Fn(&Seen) -> anyhow::Result<()> + 'static,
    ) -> Self {
        self.checks.push((Some(index), Box::new(check)));
        self
    }

    /// Sends the request in `n` pieces, 100 ms apart.
    fn slowly(mut self, n: usize) -> Self {
        let whole: Vec<u8> = self.pieces.concat();
        let size = whole.len().div_ceil(n);
        self.pieces = whole.chunks(size).map(<[u8]>::to_vec).collect();
        self
    }

    /// Runs the checks over `seen`, the answers both transports agreed on.
    fn check(&self, seen: &[Seen]) -> anyhow::Result<()> {
        ensure!(
            seen.len() == self.responses,
            "{} responses, {} expected",
            seen.len(),
            self.responses
        );
        for (index, check) in &self.checks {
            match index {
                Some(i) => {
                    let one = seen.get(*i).with_context(|| format!("no response {i}"))?;
                    check(one).with_context(|| format!("response {i}: {one:#?}"))?;
                }
                None => {
                    for (i, one) in seen.iter().enumerate() {
                        check(one).with_context(|| format!("response {i}: {one:#?}"))?;
                    }
                }
            }
        }
        Ok(())
    }
}

fn get(path: &str, headers: &str) -> String {
    format!("GET {path} HTTP/1.1\r\nHost: x\r\n{headers}\r\n")
}

/// Requests of every shape, for a server without auth.
fn corpus() -> Vec<Case> {
    let many_headers: String = (0..70).map(|i| format!("X-H{i}: v\r\n")).collect();
    vec![
        Case::new("stream", get("/views/prices/events", "")),
        Case::new("percent-encoded view", get("/views/pri%63es/events", "")),
        Case::new("invalid UTF-8 view", get("/views/%FF/events", ""))
            .expect(naming("not UTF-8"))
            .expect(not_naming("Invalid URL")),
        Case::new("unknown view", get("/views/nope/events", "")),
        Case::new("view name with a slash", get("/views/a/b/events", "")),
        Case::new("repeated query", get("/views/prices/events?cursor=a&cursor=b", "")),
        Case::new("bad query", get("/views/prices/events?cursor=%ZZ", "")),
        Case::new("malformed cursor", get("/views/prices/events?cursor=zzz", "")),
        Case::new("malformed Last-Event-ID", get("/views/prices/events", "Last-Event-ID: 12\r\n")),
        Case::new("tape", get("/views/prices/events?from=tape", "")),
        Case::new("state", get("/views/prices", "")),
        Case::new("list", get("/views", "")),
        Case::new("health", get("/healthz", "")),
        Case::new("metrics-free 404", get("/no/such/route", "")),
        Case::new("admin without a token", get("/admin/snapshot", "")),
        Case::new("allowed origin", get("/views/prices/events", "Origin: http://app.test\r\n")),
        Case::new("other origin", get("/views", "Origin: http://evil.test\r\n")),
        Case::new("gzip", get("/views", "Accept-Encoding: gzip\r\n")),
        Case::new("keep-alive", get("/views", "Connection: keep-alive\r\n")),
        Case::new("slow head", get("/views/prices/events", "User-Agent: slow\r\n")).slowly(4),
        Case::new(
            "keep-alive reuse",
            [get("/healthz", ""), get("/views/prices", "")].concat(),
        )
        .responses(2),
        Case::new(
            "pipelined",
            [get("/healthz", ""), get("/views", ""), get("/views/prices/events", "")].concat(),
        )
        .responses(3),
        Case::new("HEAD", "HEAD /views/prices HTTP/1.1\r\nHost: x\r\n\r\n")
            .declined()
            .head_only(),
        Case::new("HTTP/1.0", "GET /healthz HTTP/1.0\r\n\r\n").declined(),
        Case::new(
            "preflight",
            "OPTIONS /views/prices/events HTTP/1.1\r\nHost: x\r\nOrigin: http://app.test\r\n\
             Access-Control-Request-Method: GET\r\nAccess-Control-Request-Headers: last-event-id\r\n\r\n",
        )
        .declined(),
        Case::new("oversized head", get("/views/prices/events", &format!("X-Big: {}\r\n", "a".repeat(20_000))))
            .refused(431, "headers_too_large"),
        Case::new("too many headers", get("/views/prices/events", &many_headers))
            .refused(431, "headers_too_large"),
        Case::new("bad header line", get("/views/prices/events", "Bad Header\r\n"))
            .refused(400, "bad_request"),
        Case::new("invalid content-length", get("/views/prices/events", "Content-Length: x\r\n"))
            .refused(400, "bad_request"),
        Case::new(
            "doubled content-length",
            get("/views/prices/events", "Content-Length: 0\r\nContent-Length: 1\r\n"),
        )
        .refused(400, "bad_request"),
        Case::new("transfer-encoding gzip", get("/views/prices/events", "Transfer-Encoding: gzip\r\n"))
            .refused(400, "bad_request"),
        // Framing and `Host` that hyper takes but no transport may serve: the lean transport's
        // JSON error on a fresh connection, the same answer from hyper's before any route.
        Case::new("no host", "GET /views HTTP/1.1\r\n\r\n").refused_alike(400, "bad_request"),
        Case::new("two hosts", get("/views", "Host: y\r\n")).refused_alike(400, "bad_request"),
        Case::new("host with user info", "GET /views HTTP/1.1\r\nHost: u@x\r\n\r\n")
            .refused_alike(400, "bad_request"),
        Case::new(
            "gzip, chunked",
            "POST /runtimes/demo/ingest HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n",
        )
        .refused_alike(400, "bad_request"),
        // Refused by hyper itself on a connection it serves already (its empty answer); the
        // lean transport's JSON error was missing on a fresh one.
        Case::new(
            "content-length past 2^64",
            "POST /runtimes/demo/ingest HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999999999999\r\n\r\n",
        )
        .refused(400, "bad_request"),
        Case::new(
            "HTTP/1.0 chunked",
            "POST /runtimes/demo/ingest HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        )
        .refused(400, "bad_request"),
        Case::new("connection close", get("/views", "Connection: close\r\n")).declined(),
    ]
}

/// Sends `case` on `stream` and reads its responses.
async fn exchange(stream: &mut TcpStream, case: &Case) -> anyhow::Result<Vec<Seen>> {
    for (i, piece) in case.pieces.iter().enumerate() {
        if i > 0 {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        stream.write_all(piece).await?;
    }
    let mut buf = Vec::new();
    let mut seen = Vec::with_capacity(case.responses);
    for _ in 0..case.responses {
        seen.push(read_response(stream, &mut buf, case.head_only).await?);
    }
    Ok(seen)
}

/// The `viewtape_http_connections_total` counter of `transport`.
async fn connections(server: &Server, transport: &str) -> anyhow::Result<u64> {
    let series = format!("viewtape_http_connections_total{{transport=\"{transport}\"}}");
    Ok(server.metric(&series).await? as u64)
}

/// Sends every case both ways — on a fresh connection, and after a `HEAD` that hands the
/// connection to hyper — and requires the same answers, which must then pass the case's checks.
/// Last, requires that the connections went to the transports the cases say.
async fn differential(server: &Server, cases: &[Case]) -> anyhow::Result<()> {
    let (lean_before, hyper_before) = (
        connections(server, "lean").await?,
        connections(server, "hyper").await?,
    );
    let show = std::env::var_os("VIEWTAPE_SHOW_CORPUS").is_some();
    for case in cases {
        let mut fresh = TcpStream::connect(server.addr()).await?;
        let lean = exchange(&mut fresh, case)
            .await
            .with_context(|| format!("{}: fresh connection", case.name))?;

        let mut handed_over = handed_over_to_hyper(server).await?;
        let hyper = exchange(&mut handed_over, case)
            .await
            .with_context(|| format!("{}: through hyper", case.name))?;
        ensure!(
            lean.iter().all(|seen| seen.status != 0) && !lean.is_empty(),
            "{}: no response",
            case.name
        );
        if show {
            eprintln!("{}: {lean:?}", case.name);
        }
        let comparable = |seen: &[Seen]| -> Vec<Seen> {
            if case.refused {
                seen.iter()
                    .map(|one| Seen {
                        status: one.status,
                        headers: Vec::new(),
                        body: String::new(),
                    })
                    .collect()
            } else if case.volatile {
                seen.iter().map(Seen::without_body).collect()
            } else {
                seen.to_vec()
            }
        };
        ensure!(
            comparable(&lean) == comparable(&hyper),
            "{}: the transports differ\nfresh: {lean:#?}\nhyper: {hyper:#?}",
            case.name
        );
        // The checks hold for the fresh connection's answers (the JSON error, for a refusal).
        case.check(&lean).with_context(|| case.name)?;
    }
    // Each case's second connection went to hyper (its HEAD), and its first one wherever the
    // case says: the comparisons above were between the two transports they claim to be. The
    // harness reads /metrics with `Connection: close`, which hyper serves: one more.
    let declined = cases.iter().filter(|case| !case.lean).count() as u64;
    let hyper = connections(server, "hyper").await? - hyper_before;
    let lean = connections(server, "lean").await? - lean_before;
    ensure!(
        hyper == cases.len() as u64 + declined + 1,
        "hyper connections: {hyper}"
    );
    ensure!(
        lean == cases.len() as u64 - declined,
        "lean connections: {lean}"
    );
    Ok(())
}

/// A connection the lean transport has handed over to hyper: its first request, a `HEAD` the
/// lean transport declines, answered `200` with nothing after the head.
async fn handed_over_to_hyper(server: &Server) -> anyhow::Result<TcpStream> {
    let mut conn = TcpStream::connect(server.addr()).await?;
    conn.write_all(b"HEAD /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .await?;
    let mut buf = Vec::new();
    let head = read_response(&mut conn, &mut buf, true).await?;
    ensure!(head.status == 200 && buf.is_empty(), "{head:?}");
    Ok(conn)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_transports_answer_every_request_alike() -> anyhow::Result<()> {
    let config = config_file(
        "[server]\ncors_origins = [\"http://app.test\"]\n[[runtime]]\nname = \"demo\"\nwasm = \"builtin:ticker\"\nviews = [\"prices\"]\n",
    )?;
    let path = config.path().to_string_lossy().into_owned();
    let server = Server::start(&["--config", &path, "--demo-rate", "0"]).await?;
    server
        .post(
            "/runtimes/demo/ingest",
            b"{\"symbol\":\"ACME\",\"price\":1.5,\"seq\":1}\n",
        )
        .await?;
    differential(&server, &corpus()).await?;
    bad_framing_is_refused_and_closes_the_connection(&server).await
}

/// Reads one response, then requires the connection to close with nothing after it.
async fn answered_then_closed(stream: &mut TcpStream) -> anyhow::Result<Seen> {
    let mut buf = Vec::new();
    let seen = read_response(stream, &mut buf, false).await?;
    let mut rest = [0u8; 1024];
    loop {
        match tokio::time::timeout(Duration::from_secs(5), stream.read(&mut rest)).await {
            Ok(Ok(0) | Err(_)) => break,
            Ok(Ok(n)) => buf.extend_from_slice(&rest[..n]),
            Err(_) => bail!("the connection stays open after {seen:?}"),
        }
    }
    ensure!(
        buf.is_empty(),
        "more after the answer: {:?}",
        String::from_utf8_lossy(&buf)
    );
    Ok(seen)
}

/// A request with both `Content-Length` and `Transfer-Encoding` was served: a proxy in front
/// may read its body by one and this server by the other, and take bytes it forwarded as body
/// for a request of their own. It gets the JSON `400` now, and the connection closes with the
/// request after it unanswered. On a connection hyper serves already, hyper reads it by the
/// `Transfer-Encoding` alone and closes the connection after it: the request after it goes
/// unanswered there too. Every other framing refusal closes the connection as well, on both
/// transports.
async fn bad_framing_is_refused_and_closes_the_connection(server: &Server) -> anyhow::Result<()> {
    let body = "0\r\n\r\nGET /healthz HTTP/1.1\r\nHost: x\r\n\r\n";
    let ingest = |fields: &str, body: &str| {
        format!("POST /runtimes/demo/ingest HTTP/1.1\r\nHost: x\r\n{fields}\r\n{body}")
    };
    let length = format!("Content-Length: {}\r\n", body.len());
    let chunked = "Transfer-Encoding: chunked\r\n";
    let smuggling = [
        ingest(&format!("{length}{chunked}"), body),
        ingest(&format!("{chunked}{length}"), body),
    ];
    let others = [
        "GET /views HTTP/1.1\r\n\r\n".to_owned(),
        "GET /views HTTP/1.1\r\nHost: x\r\nHost: y\r\n\r\n".to_owned(),
        ingest("Transfer-Encoding: gzip, chunked\r\n", "0\r\n\r\n"),
        ingest("Content-Length: 99999999999999999999\r\n", ""),
        "POST /runtimes/demo/ingest HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
            .to_owned(),
        "GET /views HTTP/1.1\r\nHost: x\r\nX-A: b\r\n folded\r\n\r\n".to_owned(),
        "GET /views HTTP/1.1\r\nHost : x\r\n\r\n".to_owned(),
    ];
    for request in smuggling.iter().chain(&others) {
        let mut fresh = TcpStream::connect(server.addr()).await?;
        fresh.write_all(request.as_bytes()).await?;
        let seen = answered_then_closed(&mut fresh)
            .await
            .with_context(|| format!("fresh: {request:?}"))?;
        let json = seen.json().with_context(|| format!("fresh: {request:?}"))?;
        ensure!(
            seen.status == 400 && json["error"] == "bad_request",
            "fresh: {request:?}: {seen:?}"
        );

        let mut handed_over = handed_over_to_hyper(server).await?;
        handed_over.write_all(request.as_bytes()).await?;
        let seen = answered_then_closed(&mut handed_over)
            .await
            .with_context(|| format!("through hyper: {request:?}"))?;
        ensure!(
            smuggling.contains(request) || seen.status == 400,
            "through hyper: {request:?}: {seen:?}"
        );
    }
    Ok(())
}

/// The HS256 secret of the server with auth on.
const SECRET: &str = "http-paths-secret";

/// The one origin that server shares its answers with.
const APP: &str = "https://app.example";

/// The audience its tokens must name.
const AUDIENCE: &str = "viewtape";

/// The status is `want`.
fn status(want: u16) -> impl Fn(&Seen) -> anyhow::Result<()> {
    move |seen| {
        ensure!(seen.status == want, "status {}, not {want}", seen.status);
        Ok(())
    }
}

/// A refusal: `want`, a JSON error, and `WWW-Authenticate: Bearer` on a 401 (only there).
fn refused(want: u16) -> impl Fn(&Seen) -> anyhow::Result<()> {
    move |seen| {
        status(want)(seen)?;
        ensure!(
            seen.header("content-type") == Some("application/json"),
            "not a JSON error"
        );
        let error = seen.json()?;
        ensure!(
            error["error"].is_string() && error["message"].is_string(),
            "a JSON error: {error}"
        );
        let challenge = seen.header("www-authenticate");
        if want == 401 {
            ensure!(
                challenge == Some("Bearer"),
                "WWW-Authenticate: {challenge:?}"
            );
        } else {
            ensure!(challenge.is_none(), "WWW-Authenticate on a {want}");
        }
        Ok(())
    }
}

/// The body mentions `text` (an error that names the setting to change).
fn naming(text: &'static str) -> impl Fn(&Seen) -> anyhow::Result<()> {
    move |seen| {
        ensure!(seen.body.contains(text), "{text:?} not in {:?}", seen.body);
        Ok(())
    }
}

/// The body does not mention `text`.
fn not_naming(text: &'static str) -> impl Fn(&Seen) -> anyhow::Result<()> {
    move |seen| {
        ensure!(!seen.body.contains(text), "{text:?} in {:?}", seen.body);
        Ok(())
    }
}

/// Shared with the app: its origin echoed with credentials, the headers a client reads
/// (the challenge of a 401, the producer headers, `Retry-After`) exposed, and caches told
/// that the answer depends on the origin.
fn shared_with_app(seen: &Seen) -> anyhow::Result<()> {
    let origin = seen.header("access-control-allow-origin");
    ensure!(
        origin == Some(APP),
        "Access-Control-Allow-Origin: {origin:?}"
    );
    let credentials = seen.header("access-control-allow-credentials");
    ensure!(
        credentials == Some("true"),
        "Access-Control-Allow-Credentials: {credentials:?}"
    );
    ensure!(seen.lists("vary", "origin"), "no Vary: Origin");
    for name in [
        "content-type",
        "www-authenticate",
        "retry-after",
        "producer-duplicate",
        "producer-expected-seq",
    ] {
        ensure!(
            seen.lists("access-control-expose-headers", name),
            "{name} is not exposed"
        );
    }
    Ok(())
}

/// Not shared cross-origin (no origin sent, or one not allowed): no
/// `Access-Control-Allow-Origin`, so a browser withholds the answer from the page; and caches
/// told that the answer depends on the origin.
fn not_shared(seen: &Seen) -> anyhow::Result<()> {
    let origin = seen.header("access-control-allow-origin");
    ensure!(origin.is_none(), "Access-Control-Allow-Origin: {origin:?}");
    ensure!(seen.lists("vary", "origin"), "no Vary: Origin");
    Ok(())
}

/// A preflight answered without a token (a browser sends none): 200 and empty, every method
/// the API has and every request header it reads allowed, kept 10 minutes, and caches told
/// the answer depends on the origin and on what was asked.
fn preflight(seen: &Seen) -> anyhow::Result<()> {
    status(200)(seen)?;
    ensure!(seen.body.is_empty(), "a preflight has no body");
    for method in ["GET", "POST"] {
        ensure!(
            seen.lists("access-control-allow-methods", method),
            "{method} not allowed"
        );
    }
    for name in [
        "authorization",
        "content-type",
        "last-event-id",
        "producer-id",
        "producer-epoch",
        "producer-seq",
    ] {
        ensure!(
            seen.lists("access-control-allow-headers", name),
            "{name} not allowed"
        );
    }
    ensure!(
        seen.header("access-control-max-age") == Some("600"),
        "max-age"
    );
    for name in [
        "origin",
        "access-control-request-method",
        "access-control-request-headers",
    ] {
        ensure!(seen.lists("vary", name), "no Vary: {name}");
    }
    Ok(())
}

/// A preflight the app passes.
fn preflight_passes(seen: &Seen) -> anyhow::Result<()> {
    preflight(seen)?;
    let origin = seen.header("access-control-allow-origin");
    ensure!(
        origin == Some(APP),
        "Access-Control-Allow-Origin: {origin:?}"
    );
    let credentials = seen.header("access-control-allow-credentials");
    ensure!(
        credentials == Some("true"),
        "Access-Control-Allow-Credentials: {credentials:?}"
    );
    Ok(())
}

/// A preflight another origin fails: no `Access-Control-Allow-Origin`.
fn preflight_fails(seen: &Seen) -> anyhow::Result<()> {
    preflight(seen)?;
    not_shared(seen)
}

/// An SSE stream that started: its headers, the retry hint first, and `then` in what followed.
fn stream(then: &'static str) -> impl Fn(&Seen) -> anyhow::Result<()> {
    move |seen| {
        status(200)(seen)?;
        ensure!(seen.header("content-type") == Some("text/event-stream"));
        ensure!(seen.header("cache-control") == Some("no-store"));
        ensure!(seen.header("x-accel-buffering") == Some("no"));
        ensure!(seen.body.starts_with("retry: "), "no retry hint first");
        ensure!(seen.body.contains(then), "{then:?} not in the stream");
        Ok(())
    }
}

/// A view's state, holding `key`.
fn state(key: &'static str) -> impl Fn(&Seen) -> anyhow::Result<()> {
    move |seen| {
        status(200)(seen)?;
        ensure!(seen.header("content-type") == Some("application/json"));
        let state = seen.json()?;
        ensure!(state["cursor"].is_string(), "no cursor: {state}");
        let entries = state["entries"].as_object().context("no entries")?;
        ensure!(
            key.is_empty() || entries.contains_key(key),
            "{key:?} not in {state}"
        );
        Ok(())
    }
}

/// `GET /views` listing exactly `names`.
fn listing(names: &'static [&'static str]) -> impl Fn(&Seen) -> anyhow::Result<()> {
    move |seen| {
        status(200)(seen)?;
        let body = seen.json()?;
        let mut listed: Vec<&str> = body["views"]
            .as_array()
            .context("no views")?
            .iter()
            .filter_map(|view| view["name"].as_str())
            .collect();
        listed.sort_unstable();
        ensure!(listed == names, "listed {listed:?}, not {names:?}");
        Ok(())
    }
}

/// A `POST` of one tick to runtime `demo`'s ingest, with `headers`.
fn ingest(headers: &str) -> String {
    let body = "{\"symbol\":\"ACME\",\"price\":2.5,\"seq\":2}\n";
    format!(
        "POST /runtimes/demo/ingest HTTP/1.1\r\nHost: x\r\n{headers}Content-Type: application/x-ndjson\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
}

/// The access and CORS rules (DESIGN §9), each as requests and what their answers must be, for
/// a server whose `[auth] allow_query_token` is `query_tokens`. The views: `prices` (one tick,
/// needs a token), `public` (empty, readable by anyone), `orders.eu` (empty, needs a token).
fn access_corpus(query_tokens: bool) -> Vec<Case> {
    let bearer = |token: &str| format!("Authorization: Bearer {token}\r\n");
    let app = format!("Origin: {APP}\r\n");
    // Reads `prices` (by prefix) and pushes into `demo`.
    let good = hs256(SECRET, 600, AUDIENCE, &["pri*"], &["demo"]);
    let reader = bearer(&good);
    // Valid, and grants neither `prices` nor any ingest.
    let narrow = bearer(&hs256(SECRET, 600, AUDIENCE, &["orders.*"], &[]));
    // Reads every view.
    let every = bearer(&hs256(SECRET, 600, AUDIENCE, &["*"], &[]));
    let expired = bearer(&hs256(SECRET, -600, AUDIENCE, &["prices"], &["demo"]));
    let forged = bearer(&hs256("another-secret", 600, AUDIENCE, &["prices"], &[]));
    let elsewhere = bearer(&hs256(SECRET, 600, "elsewhere", &["prices"], &[]));
    let not_yet = bearer(&hs256_claims(
        SECRET,
        &serde_json::json!({"exp": now() + 7200, "nbf": now() + 3600, "aud": AUDIENCE, "views": ["prices"]}),
    ));
    let fractional = bearer(&hs256_claims(
        SECRET,
        &serde_json::json!({"exp": now() as f64 + 600.5, "iat": now() as f64 - 0.5, "aud": AUDIENCE, "views": ["prices"]}),
    ));
    let cookie = format!("Cookie: theme=dark; viewtape_token={good}\r\n");
    let preflight_for = |path: &str, origin: &str, method: &str, headers: &str| {
        format!(
            "OPTIONS {path} HTTP/1.1\r\nHost: x\r\nOrigin: {origin}\r\n\
             Access-Control-Request-Method: {method}\r\nAccess-Control-Request-Headers: {headers}\r\n\r\n"
        )
    };
    let mut cases =
        vec![
            // Preflights: answered before any access check, for the allowed origin only.
            Case::new(
                "preflight for a stream",
                preflight_for(
                    "/views/prices/events",
                    APP,
                    "GET",
                    "authorization,last-event-id",
                ),
            )
            .declined()
            .expect(preflight_passes),
            Case::new(
                "preflight from another origin",
                preflight_for(
                    "/views/prices/events",
                    "https://evil.example",
                    "GET",
                    "authorization,last-event-id",
                ),
            )
            .declined()
            .expect(preflight_fails),
            Case::new(
                "preflight for ingest",
                preflight_for(
                    "/runtimes/demo/ingest",
                    APP,
                    "POST",
                    "authorization,content-type,producer-id,producer-epoch,producer-seq",
                ),
            )
            .declined()
            .expect(preflight_passes),
            Case::new(
                "preflight for the list",
                preflight_for("/views", APP, "GET", "authorization"),
            )
            .declined()
            .expect(preflight_passes),
            // A valid token, from the app: served and shared.
            Case::new(
                "stream with a token, from the app",
                get("/views/prices/events", &format!("{app}{reader}")),
            )
            .expect(stream("ACME"))
            .expect(shared_with_app),
            Case::new(
                "state with a token, from the app",
                get("/views/prices", &format!("{app}{reader}")),
            )
            .expect(state("ACME"))
            .expect(shared_with_app),
            Case::new(
                "list with a token, from the app",
                get("/views", &format!("{app}{reader}")),
            )
            .expect(listing(&["prices", "public"]))
            .expect(shared_with_app),
            Case::new(
                "the Bearer scheme in lower case",
                get(
                    "/views/prices",
                    &format!("Authorization: bearer {good}\r\n"),
                ),
            )
            .expect(state("ACME"))
            .expect(not_shared),
            // Other origins: served (a browser withholds it), never shared.
            Case::new(
                "stream with a token, from another origin",
                get(
                    "/views/prices/events",
                    &format!("Origin: https://evil.example\r\n{reader}"),
                ),
            )
            .expect(stream("ACME"))
            .expect(not_shared),
            Case::new(
                "state from an origin that only starts like the app's",
                get(
                    "/views/prices",
                    &format!("Origin: https://app.example.evil\r\n{reader}"),
                ),
            )
            .expect(state("ACME"))
            .expect(not_shared),
            Case::new(
                "list from a null origin",
                get("/views", &format!("Origin: null\r\n{reader}")),
            )
            .expect(listing(&["prices", "public"]))
            .expect(not_shared),
            // No token where one is needed: 401, shared with the app so that it can read why.
            Case::new("stream without a token", get("/views/prices/events", ""))
                .expect(refused(401))
                .expect(not_shared),
            Case::new(
                "stream without a token, from the app",
                get("/views/prices/events", &app),
            )
            .expect(refused(401))
            .expect(shared_with_app),
            Case::new(
                "state without a token, from the app",
                get("/views/prices", &app),
            )
            .expect(refused(401))
            .expect(shared_with_app),
            Case::new(
                "unknown view without a token",
                get("/views/nope/events", ""),
            )
            .expect(refused(401)),
            // Tokens that fail: 401, on a public view too (no fallback to anonymous).
            Case::new(
                "garbage token on a stream",
                get(
                    "/views/prices/events",
                    &format!("{app}{}", bearer("garbage")),
                ),
            )
            .expect(refused(401))
            .expect(shared_with_app),
            Case::new(
                "garbage token on the list",
                get("/views", &bearer("garbage")),
            )
            .expect(refused(401)),
            Case::new(
                "garbage token on a public view",
                get("/views/public", &bearer("garbage")),
            )
            .expect(refused(401)),
            Case::new(
                "expired token on a stream",
                get("/views/prices/events", &expired),
            )
            .expect(refused(401)),
            Case::new("expired token on state", get("/views/prices", &expired))
                .expect(refused(401)),
            // A token whose `nbf` is an hour ahead was accepted.
            Case::new(
                "token not valid for an hour",
                get("/views/prices", &not_yet),
            )
            .expect(refused(401))
            .expect(naming("`nbf`")),
            // A fractional `exp` (a NumericDate may have one) was refused.
            Case::new(
                "token with a fractional exp",
                get("/views/prices", &fractional),
            )
            .expect(status(200)),
            Case::new(
                "token signed with another secret",
                get("/views/prices", &forged),
            )
            .expect(refused(401)),
            Case::new(
                "token for another audience",
                get("/views/prices/events", &elsewhere),
            )
            .expect(refused(401)),
            Case::new(
                "another scheme",
                get(
                    "/views/prices",
                    "Authorization: Basic YWxhZGRpbjpvcGVuc2VzYW1l\r\n",
                ),
            )
            .expect(refused(401)),
            Case::new(
                "an empty bearer token",
                get("/views/prices", "Authorization: Bearer \r\n"),
            )
            .expect(refused(401)),
            // Valid without the grant: 403; whether a view exists is for those who may read it.
            Case::new(
                "token without the grant, on a stream",
                get("/views/prices/events", &format!("{app}{narrow}")),
            )
            .expect(refused(403))
            .expect(shared_with_app),
            Case::new(
                "token without the grant, on state",
                get("/views/prices", &narrow),
            )
            .expect(refused(403)),
            Case::new(
                "unknown view with a token that does not grant it",
                get("/views/nope", &reader),
            )
            .expect(refused(403)),
            Case::new(
                "unknown view with a token for every view",
                get("/views/nope/events", &every),
            )
            .expect(refused(404)),
            // The cookie a browser's EventSource sends.
            Case::new(
                "cookie on a stream, from the app",
                get("/views/prices/events", &format!("{app}{cookie}")),
            )
            .expect(stream("ACME"))
            .expect(shared_with_app),
            Case::new("cookie on state", get("/views/prices", &cookie)).expect(state("ACME")),
            Case::new(
                "the cookie in a second Cookie header",
                get(
                    "/views/prices",
                    &format!("Cookie: theme=dark\r\nCookie: viewtape_token={good}\r\n"),
                ),
            )
            .expect(state("ACME")),
            Case::new(
                "cookie with a garbage token",
                get("/views/prices/events", "Cookie: viewtape_token=garbage\r\n"),
            )
            .expect(refused(401)),
            // Query tokens: the header and the cookie come first either way.
            Case::new(
                "a garbage query token beside a bearer token",
                get("/views/prices?access_token=garbage", &reader),
            )
            .expect(state("ACME")),
            Case::new(
                "a garbage query token beside the cookie",
                get("/views/prices?access_token=garbage", &cookie),
            )
            .expect(state("ACME")),
            Case::new(
                "a garbage query token",
                get("/views/prices/events?access_token=garbage", ""),
            )
            .expect(refused(401)),
            // Public views: no token needed.
            Case::new("public view without a token", get("/views/public", &app))
                .expect(state(""))
                .expect(shared_with_app),
            Case::new(
                "public stream without a token",
                get("/views/public/events", ""),
            )
            .expect(stream("retry: "))
            .expect(not_shared),
            Case::new(
                "public stream with a token that does not grant it",
                get("/views/public/events", &narrow),
            )
            .expect(stream("retry: ")),
            // GET /views lists what the caller may read.
            Case::new("list without a token", get("/views", &app))
                .expect(listing(&["public"]))
                .expect(shared_with_app),
            Case::new("list with a narrow token", get("/views", &narrow))
                .expect(listing(&["orders.eu", "public"])),
            Case::new("list with the cookie", get("/views", &cookie))
                .expect(listing(&["prices", "public"])),
            Case::new("list with a token for every view", get("/views", &every))
                .expect(listing(&["orders.eu", "prices", "public"])),
            // Routes without a token: health, and metrics from loopback.
            Case::new("health", get("/healthz", &app))
                .expect(status(200))
                .expect(shared_with_app),
            Case::new("metrics from loopback", get("/metrics", &app))
                .volatile()
                .expect(status(200))
                .expect(naming("viewtape_http_connections_total"))
                .expect(shared_with_app),
            // Ingest (declined: it has a body) is refused the same way; nothing is ingested.
            Case::new("ingest without a token, from the app", ingest(&app))
                .declined()
                .expect(refused(401))
                .expect(shared_with_app),
            Case::new("ingest with an expired token", ingest(&expired))
                .declined()
                .expect(refused(401)),
            Case::new(
                "ingest with a token that grants none, from the app",
                ingest(&format!("{app}{narrow}")),
            )
            .declined()
            .expect(refused(403))
            .expect(shared_with_app),
            // Requests the lean transport declines apply the same rules.
            Case::new(
                "HEAD with a token",
                format!("HEAD /views/prices HTTP/1.1\r\nHost: x\r\n{app}{reader}\r\n"),
            )
            .declined()
            .head_only()
            .expect(status(200))
            .expect(shared_with_app),
            Case::new(
                "HEAD without a token",
                format!("HEAD /views/prices HTTP/1.1\r\nHost: x\r\n{app}\r\n"),
            )
            .declined()
            .head_only()
            .expect(status(401))
            .expect(shared_with_app),
            Case::new(
                "HTTP/1.0 with a token",
                format!("GET /views HTTP/1.0\r\n{reader}\r\n"),
            )
            .declined()
            .expect(listing(&["prices", "public"])),
            Case::new(
                "a GET with a body and a token",
                format!(
                "GET /views/prices HTTP/1.1\r\nHost: x\r\n{reader}Content-Length: 2\r\n\r\n{{}}"
            ),
            )
            .declined()
            .expect(state("ACME")),
            // A connection does not carry a token from one request to the next.
            Case::new(
                "a token does not outlive its request",
                [
                    get("/views/prices", &format!("{app}{reader}")),
                    get("/views/prices", &app),
                    get("/views", &app),
                ]
                .concat(),
            )
            .responses(3)
            .expect_nth(0, state("ACME"))
            .expect_nth(1, refused(401))
            .expect_nth(2, listing(&["public"]))
            .expect(shared_with_app),
        ];
    // ?access_token= only where allowed; refused naming the setting elsewhere.
    let by_query = [
        Case::new(
            "query token on a stream, from the app",
            get(&format!("/views/prices/events?access_token={good}"), &app),
        ),
        Case::new(
            "query token on state",
            get(&format!("/views/prices?access_token={good}"), ""),
        ),
        Case::new(
            "query token on the list",
            get(&format!("/views?access_token={good}"), ""),
        ),
    ];
    let [stream_case, state_case, list_case] = by_query;
    // A parameter a route does not take is refused in our words, listing what it takes: the
    // token parameter only where it may carry a token.
    let unknown = Case::new(
        "unknown query parameter",
        get("/views/prices/events?verbose=1", ""),
    )
    .expect(refused(400))
    .expect(naming("unknown query parameter"))
    .expect(naming("verbose"))
    .expect(not_naming("Failed to deserialize"));
    cases.push(match query_tokens {
        true => unknown.expect(naming("access_token")),
        false => unknown.expect(not_naming("access_token")),
    });
    if query_tokens {
        cases.extend([
            stream_case.expect(stream("ACME")).expect(shared_with_app),
            state_case.expect(state("ACME")),
            list_case.expect(listing(&["prices", "public"])),
        ]);
    } else {
        cases.extend([
            stream_case
                .expect(refused(401))
                .expect(naming("allow_query_token"))
                .expect(shared_with_app),
            state_case
                .expect(refused(401))
                .expect(naming("allow_query_token")),
            list_case
                .expect(refused(401))
                .expect(naming("allow_query_token")),
        ]);
    }
    cases
}

/// Starts a server with auth on (HS256, audience, a public view), CORS for [`APP`], and
/// `[auth] allow_query_token = query_tokens`; ingests one tick into `prices`; runs the access
/// corpus both ways.
async fn access_rules_hold_alike(query_tokens: bool) -> anyhow::Result<()> {
    // No heartbeat within a test: a stream's answer is what it sent first, whenever it is read.
    let config = config_file(&format!(
        "[server]\ncors_origins = [\"{APP}\"]\nheartbeat = \"1h\"\n\n\
         [auth]\naudience = \"{AUDIENCE}\"\npublic_views = [\"public\"]\n\
         allow_query_token = {query_tokens}\n\n\
         [[runtime]]\nname = \"demo\"\nwasm = \"builtin:ticker\"\n\
         views = [\"prices\", \"public\", \"orders.eu\"]\n"
    ))?;
    let path = config.path().to_string_lossy().into_owned();
    let server = Server::start_with_env(
        &["--config", &path, "--demo-rate", "0"],
        &[("VIEWTAPE_JWT_SECRET", SECRET)],
    )
    .await?;
    let writer = format!("Bearer {}", hs256(SECRET, 600, AUDIENCE, &[], &["demo"]));
    let resp = http::request(
        server.addr(),
        "POST",
        "/runtimes/demo/ingest",
        &[("Authorization", &writer)],
        b"{\"symbol\":\"ACME\",\"price\":1.5,\"seq\":1}\n",
    )
    .await?;
    ensure!(
        resp.status() == 200,
        "ingest: {} {}",
        resp.status(),
        resp.text()
    );
    differential(&server, &access_corpus(query_tokens)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_transports_apply_the_access_and_cors_rules_alike() -> anyhow::Result<()> {
    access_rules_hold_alike(false).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_transports_apply_the_access_rules_alike_with_query_tokens_allowed(
) -> anyhow::Result<()> {
    access_rules_hold_alike(true).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_ends_when_the_client_goes_away_on_either_transport() -> anyhow::Result<()> {
    let server = Server::start(&["--demo-rate", "0"]).await?;
    for handed_over in [false, true] {
        let mut stream = TcpStream::connect(server.addr()).await?;
        if handed_over {
            stream
                .write_all(b"HEAD /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
                .await?;
            read_response(&mut stream, &mut Vec::new(), true).await?;
        }
        stream
            .write_all(get("/views/prices/events", "").as_bytes())
            .await?;
        read_response(&mut stream, &mut Vec::new(), false).await?;
        ensure!(server.metric("viewtape_sse_connections").await? == 1.0);
        drop(stream);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while server.metric("viewtape_sse_connections").await? != 0.0 {
            ensure!(
                tokio::time::Instant::now() < deadline,
                "the subscriber outlived its client (handed over: {handed_over})"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_connection_does_not_hold_up_others() -> anyhow::Result<()> {
    let server = Server::start(&[]).await?;
    // Like a browser's speculative preconnect: connected, nothing sent.
    let mut silent = Vec::new();
    for _ in 0..3 {
        silent.push(TcpStream::connect(server.addr()).await?);
    }
    let started = std::time::Instant::now();
    let health = server.get("/healthz").await?;
    ensure!(health.status() == 200);
    let mut stream = server.sse("/views/prices/events", &[]).await?;
    stream.until_synced(10).await?;
    ensure!(
        started.elapsed() < Duration::from_millis(500),
        "served in {:?}",
        started.elapsed()
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_sent_heads_and_open_streams_do_not_hold_up_a_stop() -> anyhow::Result<()> {
    let mut server = Server::start(&["--demo-rate", "0"]).await?;
    let mut half_sent = TcpStream::connect(server.addr()).await?;
    half_sent.write_all(b"GET /views/prices/ev").await?;
    let mut kept_alive = TcpStream::connect(server.addr()).await?;
    kept_alive.write_all(get("/healthz", "").as_bytes()).await?;
    read_response(&mut kept_alive, &mut Vec::new(), false).await?;
    let mut stream = server.sse("/views/prices/events", &[]).await?;
    stream.until_synced(10).await?;
    let started = std::time::Instant::now();
    let status = server.stop_graceful().await?;
    ensure!(status.success(), "{status:?}");
    ensure!(
        started.elapsed() < Duration::from_secs(5),
        "the stop took {:?}",
        started.elapsed()
    );
    Ok(())
}
