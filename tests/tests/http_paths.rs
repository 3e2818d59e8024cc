//! Two transports carry requests to one router: the lean transport takes plain `GET`s, hyper
//! every connection from the first request the lean transport declines. A client must not be
//! able to tell them apart. The differential test sends a corpus of requests both ways — on a
//! fresh connection (lean, unless the request itself is declined), and after a `HEAD` that hands
//! the connection to hyper — and requires the same status, headers (but `date`) and body.

use std::time::Duration;

use anyhow::{bail, ensure, Context as _};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use viewtape_tests::http::{parse_head, ChunkedDecoder};
use viewtape_tests::Server;

/// How long a stream may stay silent before its response counts as complete.
const SETTLE: Duration = Duration::from_millis(500);

/// A response as the client saw it: status line, headers but `date` (sorted), decoded body,
/// and whether the server closed the connection after it.
#[derive(Debug, PartialEq, Eq)]
struct Seen {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
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

/// One corpus entry: the bytes a client sends (in pieces, with a pause between them), how many
/// responses come back, and whether the lean transport serves it on a fresh connection.
struct Case {
    name: &'static str,
    pieces: Vec<Vec<u8>>,
    responses: usize,
    lean: bool,
    head_only: bool,
}

impl Case {
    fn new(name: &'static str, request: impl Into<Vec<u8>>) -> Self {
        Self {
            name,
            pieces: vec![request.into()],
            responses: 1,
            lean: true,
            head_only: false,
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

    /// Sends the request in `n` pieces, 100 ms apart.
    fn slowly(mut self, n: usize) -> Self {
        let whole: Vec<u8> = self.pieces.concat();
        let size = whole.len().div_ceil(n);
        self.pieces = whole.chunks(size).map(<[u8]>::to_vec).collect();
        self
    }
}

fn get(path: &str, headers: &str) -> String {
    format!("GET {path} HTTP/1.1\r\nHost: x\r\n{headers}\r\n")
}

fn corpus() -> Vec<Case> {
    let many_headers: String = (0..70).map(|i| format!("X-H{i}: v\r\n")).collect();
    vec![
        Case::new("stream", get("/views/prices/events", "")),
        Case::new("percent-encoded view", get("/views/pri%63es/events", "")),
        Case::new("invalid UTF-8 view", get("/views/%FF/events", "")),
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
            .declined(),
        Case::new("too many headers", get("/views/prices/events", &many_headers)).declined(),
        Case::new("bad header line", get("/views/prices/events", "Bad Header\r\n")).declined(),
        Case::new("invalid content-length", get("/views/prices/events", "Content-Length: x\r\n")).declined(),
        Case::new(
            "doubled content-length",
            get("/views/prices/events", "Content-Length: 0\r\nContent-Length: 1\r\n"),
        )
        .declined(),
        Case::new("transfer-encoding gzip", get("/views/prices/events", "Transfer-Encoding: gzip\r\n"))
            .declined(),
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_transports_answer_every_request_alike() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let config = dir.path().join("viewtape.toml");
    std::fs::write(
        &config,
        "[server]\ncors_origins = [\"http://app.test\"]\n[[runtime]]\nname = \"demo\"\nwasm = \"builtin:ticker\"\nviews = [\"prices\"]\n",
    )?;
    let config = config.to_string_lossy().into_owned();
    let server = Server::start(&["--config", &config, "--demo-rate", "0"]).await?;
    server
        .post(
            "/runtimes/demo/ingest",
            b"{\"symbol\":\"ACME\",\"price\":1.5,\"seq\":1}\n",
        )
        .await?;
    let (lean_before, hyper_before) = (
        connections(&server, "lean").await?,
        connections(&server, "hyper").await?,
    );
    let cases = corpus();
    for case in &cases {
        let mut fresh = TcpStream::connect(server.addr()).await?;
        let lean = exchange(&mut fresh, case)
            .await
            .with_context(|| format!("{}: fresh connection", case.name))?;

        let mut handed_over = TcpStream::connect(server.addr()).await?;
        handed_over
            .write_all(b"HEAD /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            .await?;
        let mut buf = Vec::new();
        let head = read_response(&mut handed_over, &mut buf, true).await?;
        ensure!(head.status == 200 && buf.is_empty(), "{head:?}");
        let hyper = exchange(&mut handed_over, case)
            .await
            .with_context(|| format!("{}: through hyper", case.name))?;
        ensure!(
            lean.iter().all(|seen| seen.status != 0) && !lean.is_empty(),
            "{}: no response",
            case.name
        );
        if std::env::var_os("VIEWTAPE_SHOW_CORPUS").is_some() {
            eprintln!("{}: {lean:?}", case.name);
        }
        ensure!(
            lean == hyper,
            "{}: the transports differ\nfresh: {lean:#?}\nhyper: {hyper:#?}",
            case.name
        );
    }
    // Each case's second connection went to hyper (its HEAD), and its first one wherever the
    // case says: the comparisons above were between the two transports they claim to be. The
    // harness reads /metrics with `Connection: close`, which hyper serves: one more.
    let declined = cases.iter().filter(|case| !case.lean).count() as u64;
    let hyper = connections(&server, "hyper").await? - hyper_before;
    let lean = connections(&server, "lean").await? - lean_before;
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
