//! HTTPS against the real binary: `[server] tls_cert` / `tls_key` with certificates made here
//! (rcgen, no openssl binary). HTTP/2 by ALPN carries SSE to a real client (curl) and several
//! streams share one connection; HTTP/1.1 over TLS goes through the lean transport (GETs,
//! streams) and hyper (ingest); SIGHUP swaps the certificate, and a bad pair leaves the old one
//! serving; a plain-HTTP client on the TLS port and a silent one are dropped without holding
//! anyone up; a JWKS key file is reloaded on SIGHUP as well.
//!
//! One file past 500 lines: one subject (TLS and HTTP/2), each test whole.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, ensure, Context as _};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;
use tokio::process::Command;
use tokio_rustls::client::TlsStream;
use tokio_rustls::rustls::crypto::ring::default_provider;
use tokio_rustls::rustls::pki_types::{CertificateDer, ServerName};
use tokio_rustls::rustls::{ClientConfig, RootCertStore};
use tokio_rustls::TlsConnector;
use viewtape_tests::http::{self, HttpConn, READ_TIMEOUT};
use viewtape_tests::server::config_file;
use viewtape_tests::{cursor_offset, expect, EventStream, Feed, Response, Server, SseParser};

/// How long a SIGHUP may take to show in the server's log.
const RELOAD_TIMEOUT: Duration = Duration::from_secs(10);

/// A self-signed certificate for `localhost` and `127.0.0.1`, and its P-256 key.
struct Cert {
    pem: String,
    key_pem: String,
    der: CertificateDer<'static>,
}

impl Cert {
    fn new(name: &str) -> anyhow::Result<Self> {
        let key = rcgen::KeyPair::generate()?;
        let mut params =
            rcgen::CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()])?;
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, format!("viewtape test {name}"));
        let cert = params.self_signed(&key)?;
        Ok(Self {
            pem: cert.pem(),
            key_pem: key.serialize_pem(),
            der: cert.der().clone(),
        })
    }
}

/// The certificate and key files the server is configured with.
struct Files {
    dir: tempfile::TempDir,
    cert: PathBuf,
    key: PathBuf,
}

impl Files {
    fn new(cert: &Cert) -> anyhow::Result<Self> {
        let dir = tempfile::Builder::new().prefix("viewtape-tls-").tempdir()?;
        let files = Self {
            cert: dir.path().join("cert.pem"),
            key: dir.path().join("key.pem"),
            dir,
        };
        files.install(&cert.pem, &cert.key_pem)?;
        Ok(files)
    }

    /// Writes a certificate and a key (not necessarily a pair), each replaced whole.
    fn install(&self, cert_pem: &str, key_pem: &str) -> anyhow::Result<()> {
        for (path, text) in [(&self.cert, cert_pem), (&self.key, key_pem)] {
            let fresh = path.with_extension("new");
            std::fs::write(&fresh, text)?;
            std::fs::rename(&fresh, path)?;
        }
        Ok(())
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
}

/// The `[server]` lines of HTTPS with `files`.
fn tls_section(files: &Files) -> String {
    format!(
        "tls_cert = {:?}\ntls_key = {:?}\n",
        files.cert.display().to_string(),
        files.key.display().to_string()
    )
}

/// The demo ticker (`demo` → `prices`) served over HTTPS with `files`, plus `server` lines and
/// further sections.
async fn start(
    files: &Files,
    server: &str,
    more: &str,
) -> anyhow::Result<(Server, tempfile::NamedTempFile)> {
    let config = config_file(&format!(
        "[server]\n{}{server}\n[[runtime]]\nname = \"demo\"\nwasm = \"builtin:ticker\"\n\
         views = [\"prices\"]\n{more}",
        tls_section(files)
    ))?;
    let path = config.path().display().to_string();
    let server = Server::start(&["--config", &path]).await?;
    ensure!(
        server.scheme() == "https",
        "the listening line says https with TLS on"
    );
    Ok((server, config))
}

/// A TLS client that trusts only `trusted` and offers `alpn`.
fn client(trusted: &Cert, alpn: &[&[u8]]) -> anyhow::Result<TlsConnector> {
    let mut roots = RootCertStore::empty();
    roots.add(trusted.der.clone())?;
    let mut config = ClientConfig::builder_with_provider(Arc::new(default_provider()))
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Ok(TlsConnector::from(Arc::new(config)))
}

/// Connects to `addr` and completes a handshake for `localhost` (bounded by [`READ_TIMEOUT`]).
async fn connect(addr: SocketAddr, client: &TlsConnector) -> anyhow::Result<TlsStream<TcpStream>> {
    let tcp = http::connect(addr).await?;
    let name = ServerName::try_from("localhost")?;
    tokio::time::timeout(READ_TIMEOUT, client.connect(name, tcp))
        .await
        .context("TLS handshake timed out")?
        .context("TLS handshake")
}

/// The ALPN protocol the server chose, after a handshake offering `offer`.
async fn negotiated(
    addr: SocketAddr,
    trusted: &Cert,
    offer: &[&[u8]],
) -> anyhow::Result<Option<Vec<u8>>> {
    let stream = connect(addr, &client(trusted, offer)?).await?;
    Ok(stream.get_ref().1.alpn_protocol().map(<[u8]>::to_vec))
}

/// One HTTP/1.1 request over a fresh TLS connection (ALPN `http/1.1`).
async fn request(
    addr: SocketAddr,
    trusted: &Cert,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> anyhow::Result<Response> {
    let stream = connect(addr, &client(trusted, &[b"http/1.1"])?).await?;
    HttpConn::on(addr, stream)
        .send(method, path, headers, body)
        .await
}

/// Series of `/metrics`, read at once over HTTPS (a lean GET: it counts itself).
async fn metrics<const N: usize>(
    addr: SocketAddr,
    trusted: &Cert,
    series: [&str; N],
) -> anyhow::Result<[f64; N]> {
    let text = request(addr, trusted, "GET", "/metrics", &[], b"")
        .await?
        .text();
    let mut values = [0.0; N];
    for (value, series) in values.iter_mut().zip(series) {
        *value = text
            .lines()
            .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
            .with_context(|| format!("no {series} in /metrics"))?
            .trim()
            .parse()
            .context("metric value")?;
    }
    Ok(values)
}

/// One series of `/metrics`, read over HTTPS.
async fn metric(addr: SocketAddr, trusted: &Cert, series: &str) -> anyhow::Result<f64> {
    Ok(metrics(addr, trusted, [series]).await?[0])
}

const LEAN: &str = "viewtape_http_connections_total{transport=\"lean\"}";
const HYPER: &str = "viewtape_http_connections_total{transport=\"hyper\"}";
const H2: &str = "viewtape_http_connections_total{transport=\"h2\"}";
const TLS_FAILURES: &str = "viewtape_tls_handshake_failures_total";

/// Ingests `ndjson` into `demo` over HTTPS and requires a 200.
async fn ingest(addr: SocketAddr, trusted: &Cert, ndjson: &str) -> anyhow::Result<Response> {
    let resp = request(
        addr,
        trusted,
        "POST",
        "/runtimes/demo/ingest",
        &[],
        ndjson.as_bytes(),
    )
    .await?;
    ensure!(
        resp.status() == 200,
        "ingest: {} {}",
        resp.status(),
        resp.text()
    );
    Ok(resp)
}

/// Waits (≤ [`RELOAD_TIMEOUT`]) until the server's log holds `count` lines containing `text`.
async fn log_lines(server: &Server, text: &str, count: usize) -> anyhow::Result<()> {
    let deadline = Instant::now() + RELOAD_TIMEOUT;
    loop {
        let seen = server.logs().lines().filter(|l| l.contains(text)).count();
        if seen >= count {
            ensure!(
                seen == count,
                "{seen} lines with {text:?}, expected {count}"
            );
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("{count} log lines with {text:?} did not show within {RELOAD_TIMEOUT:?}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// curl, which must be there and speak HTTP/2.
async fn curl() -> anyhow::Result<&'static str> {
    let out = Command::new("curl")
        .arg("--version")
        .output()
        .await
        .map_err(|error| {
            anyhow!(
                "this test drives a real HTTP/2 client, curl, and cannot run it ({error}): install \
                 curl (Debian's is built with nghttp2), as scripts/test does"
            )
        })?;
    let version = String::from_utf8_lossy(&out.stdout);
    ensure!(
        version
            .lines()
            .any(|l| l.starts_with("Features:") && l.contains("HTTP2")),
        "this curl has no HTTP/2 support:\n{version}"
    );
    Ok("curl")
}

/// `curl --http2 -N -v` trusting only `ca` and following `urls`: one to stdout, or several in
/// parallel (multiplexed on one connection, curl's default) each to the file after its URL.
/// Stdout and stderr (the verbose trace) are piped.
async fn curl_h2(
    ca: &Path,
    urls: &[(String, Option<PathBuf>)],
) -> anyhow::Result<tokio::process::Child> {
    let mut command = Command::new(curl().await?);
    command
        .args([
            "--http2",
            "--silent",
            "--show-error",
            "--no-buffer",
            "--verbose",
        ])
        .args(["--max-time", "60", "--cacert"])
        .arg(ca);
    if urls.len() > 1 {
        command.args(["--parallel", "--parallel-max", "10"]);
    }
    for (url, out) in urls {
        command.arg(url);
        if let Some(out) = out {
            command.arg("--output").arg(out);
        }
    }
    command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .context("spawn curl")
}

/// Reads `curl`'s stdout through an SSE parser until `want` events arrived (each read bounded).
async fn curl_events(
    stdout: &mut tokio::process::ChildStdout,
    parser: &mut SseParser,
    want: usize,
) -> anyhow::Result<Vec<viewtape_tests::SseEvent>> {
    let mut events = Vec::new();
    let mut buf = vec![0u8; 16 * 1024];
    while events.len() < want {
        let n = tokio::time::timeout(READ_TIMEOUT, stdout.read(&mut buf))
            .await
            .with_context(|| format!("curl printed no more events; got {events:?}"))??;
        ensure!(n > 0, "curl's output ended after {events:?}");
        parser.feed(&buf[..n]);
        while let Some(event) = parser.pop() {
            events.push(event);
        }
    }
    Ok(events)
}

/// Stops curl and returns its verbose trace.
async fn curl_trace(mut child: tokio::process::Child) -> anyhow::Result<String> {
    let mut stderr = child.stderr.take().context("curl stderr")?;
    child.start_kill()?;
    let mut trace = Vec::new();
    tokio::time::timeout(READ_TIMEOUT, stderr.read_to_end(&mut trace))
        .await
        .context("curl's trace did not end")??;
    let _ = tokio::time::timeout(READ_TIMEOUT, child.wait()).await;
    Ok(String::from_utf8_lossy(&trace).into_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_carries_sse_streams_to_curl() -> anyhow::Result<()> {
    let a = Cert::new("A")?;
    let files = Files::new(&a)?;
    let (server, _config) = start(&files, "", "").await?;
    let addr = server.addr();
    let mut feed = Feed::new(&["ACME", "BOLT"]);
    ingest(addr, &a, &feed.batch(2)).await?;
    let h2_before = metric(addr, &a, H2).await?;

    let url = format!("https://localhost:{}/views/prices/events", addr.port());
    let mut curl = curl_h2(&files.cert, &[(url.clone(), None)]).await?;
    let mut stdout = curl.stdout.take().context("curl stdout")?;
    let mut parser = SseParser::new();
    // The state (two keys, no ids), then `synced` with the cursor.
    let events = curl_events(&mut stdout, &mut parser, 3).await?;
    let kinds: Vec<_> = events.iter().map(|e| e.event.as_str()).collect();
    ensure!(kinds == ["state", "state", "synced"], "{events:?}");
    ensure!(events[..2].iter().all(|e| e.id.is_none()), "{events:?}");
    let synced = events[2].id.as_deref().unwrap_or_default();
    ensure!(cursor_offset(synced)? == 2, "{events:?}");
    ensure!(
        parser.retry().is_some(),
        "the retry hint arrives over HTTP/2 too"
    );
    // Live: an update with its cursor, as soon as it is published.
    ingest(addr, &a, &feed.batch(1)).await?;
    let live = curl_events(&mut stdout, &mut parser, 1).await?;
    expect::update(&live[0], 3, "ACME", 3)?;
    ensure!(
        metric(addr, &a, H2).await? == h2_before + 1.0,
        "curl's connection is counted as h2"
    );
    let trace = curl_trace(curl).await?;
    for line in [
        "ALPN: server accepted h2",
        "< HTTP/2 200",
        "< content-type: text/event-stream",
    ] {
        ensure!(
            trace.contains(line),
            "no {line:?} in curl's trace:\n{trace}"
        );
    }

    // Three streams on one HTTP/2 connection: what a browser's six HTTP/1.1 connections per
    // origin cannot do for many tabs.
    let h2_before = metric(addr, &a, H2).await?;
    let urls: Vec<_> = ["", "?from=tape", "?from=tape"]
        .iter()
        .enumerate()
        .map(|(i, query)| {
            (
                format!("{url}{query}"),
                Some(files.path(&format!("stream{i}"))),
            )
        })
        .collect();
    let curl = curl_h2(&files.cert, &urls).await?;
    // The state stream: two states and `synced`; each tape: the three updates.
    let want = [("state", 2), ("synced", 1)];
    let tape = [("update", 3)];
    for ((_, out), want) in urls.iter().zip([&want[..], &tape, &tape]) {
        let out = out.as_deref().context("an output file")?;
        let deadline = Instant::now() + READ_TIMEOUT;
        loop {
            let mut parser = SseParser::new();
            parser.feed(&std::fs::read(out).unwrap_or_default());
            let events: Vec<_> = std::iter::from_fn(|| parser.pop()).collect();
            let got: Vec<_> = want
                .iter()
                .map(|(kind, _)| (*kind, events.iter().filter(|e| e.event == *kind).count()))
                .collect();
            if got == want {
                break;
            }
            ensure!(
                Instant::now() < deadline,
                "{}: {events:?}, expected {want:?}",
                out.display()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    ensure!(metric(addr, &a, "viewtape_sse_connections").await? == 3.0);
    ensure!(
        metric(addr, &a, H2).await? == h2_before + 1.0,
        "three streams, one connection"
    );
    let trace = curl_trace(curl).await?;
    ensure!(
        trace.matches("< HTTP/2 200").count() == 3,
        "three streams answered over HTTP/2:\n{trace}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http1_over_tls_takes_the_lean_transport_and_hyper() -> anyhow::Result<()> {
    let a = Cert::new("A")?;
    let files = Files::new(&a)?;
    let (server, _config) = start(&files, "", "").await?;
    let addr = server.addr();

    // ALPN: h2 first, then http/1.1; a client offering nothing gets HTTP/1.1 anyway.
    ensure!(
        negotiated(addr, &a, &[b"h2", b"http/1.1"])
            .await?
            .as_deref()
            == Some(&b"h2"[..])
    );
    ensure!(
        negotiated(addr, &a, &[b"http/1.1", b"h2"])
            .await?
            .as_deref()
            == Some(&b"h2"[..])
    );
    ensure!(negotiated(addr, &a, &[b"http/1.1"]).await?.as_deref() == Some(&b"http/1.1"[..]));
    let plain = connect(addr, &client(&a, &[])?).await?;
    ensure!(plain.get_ref().1.alpn_protocol().is_none());
    let resp = HttpConn::on(addr, plain)
        .send("GET", "/healthz", &[], b"")
        .await?;
    ensure!(
        resp.status() == 200,
        "HTTP/1.1 without ALPN: {}",
        resp.status()
    );

    let [lean, hyper] = metrics(addr, &a, [LEAN, HYPER]).await?;
    // A GET: the lean transport. A POST: hyper.
    let state = request(addr, &a, "GET", "/views/prices", &[], b"").await?;
    ensure!(state.status() == 200, "{} {}", state.status(), state.text());
    ensure!(state.json()?["entries"] == serde_json::json!({}));
    let mut feed = Feed::new(&["ACME"]);
    let receipt = ingest(addr, &a, &feed.batch(2)).await?.json()?;
    ensure!(receipt["events"]["prices"] == 2, "{receipt}");
    // This read is a lean GET too.
    let after = metrics(addr, &a, [LEAN, HYPER]).await?;
    ensure!(
        after == [lean + 2.0, hyper + 1.0],
        "{after:?} after {lean} {hyper}"
    );

    // Kept-alive requests and a stream over one TLS connection on the lean transport.
    let stream = connect(addr, &client(&a, &[b"http/1.1"])?).await?;
    let mut conn = HttpConn::on(addr, stream);
    for _ in 0..3 {
        let resp = conn.send("GET", "/views/prices", &[], b"").await?;
        ensure!(resp.status() == 200 && resp.json()?["entries"]["ACME"].is_object());
    }
    let stream = connect(addr, &client(&a, &[b"http/1.1"])?).await?;
    let mut events = EventStream::open(stream, addr, "/views/prices/events", &[]).await?;
    let (states, synced) = events.until_synced(10).await?;
    ensure!(states.len() == 1, "{states:?}");
    ensure!(cursor_offset(synced.id.as_deref().unwrap_or_default())? == 2);
    ingest(addr, &a, &feed.batch(1)).await?;
    expect::update(&events.next_event().await?, 3, "ACME", 3)?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_swaps_the_certificate_and_a_bad_pair_keeps_the_old_one() -> anyhow::Result<()> {
    let (a, b, c) = (Cert::new("A")?, Cert::new("B")?, Cert::new("C")?);
    let files = Files::new(&a)?;
    let (server, _config) = start(&files, "", "").await?;
    let addr = server.addr();
    let healthy = |resp: Response| {
        ensure!(resp.status() == 200, "{} {}", resp.status(), resp.text());
        Ok(())
    };
    healthy(request(addr, &a, "GET", "/healthz", &[], b"").await?)?;
    let refused = connect(addr, &client(&b, &[])?).await;
    ensure!(refused.is_err(), "a client trusting only B is refused A");

    // A stream opened with A outlives the swap.
    let stream = connect(addr, &client(&a, &[b"http/1.1"])?).await?;
    let mut open = EventStream::open(stream, addr, "/views/prices/events", &[]).await?;
    open.until_synced(10).await?;

    files.install(&b.pem, &b.key_pem)?;
    server.hangup()?;
    log_lines(&server, "TLS certificate and key reloaded", 1).await?;
    healthy(request(addr, &b, "GET", "/healthz", &[], b"").await?)?;
    let error = connect(addr, &client(&a, &[])?).await.err();
    ensure!(
        error.is_some_and(|e| format!("{e:#}").contains("certificate")),
        "a client trusting only A is refused B"
    );
    let mut feed = Feed::new(&["ACME"]);
    ingest(addr, &b, &feed.batch(1)).await?;
    expect::update(&open.next_event().await?, 1, "ACME", 1)?;

    // B's certificate with C's key: refused, logged, and B keeps serving.
    files.install(&b.pem, &c.key_pem)?;
    server.hangup()?;
    log_lines(&server, "TLS certificate not reloaded", 1).await?;
    let logs = server.logs();
    let line = logs
        .lines()
        .find(|l| l.contains("TLS certificate not reloaded"))
        .unwrap_or_default();
    ensure!(line.contains("ERROR"), "logged as an error: {line}");
    ensure!(
        line.contains("does not go with"),
        "names the mismatch: {line}"
    );
    healthy(request(addr, &b, "GET", "/healthz", &[], b"").await?)?;
    ensure!(connect(addr, &client(&c, &[])?).await.is_err());
    ensure!(connect(addr, &client(&a, &[])?).await.is_err());
    // A missing file: the same.
    std::fs::remove_file(&files.key)?;
    server.hangup()?;
    log_lines(&server, "TLS certificate not reloaded", 2).await?;
    healthy(request(addr, &b, "GET", "/healthz", &[], b"").await?)?;

    // A good pair again is taken.
    files.install(&c.pem, &c.key_pem)?;
    server.hangup()?;
    log_lines(&server, "TLS certificate and key reloaded", 2).await?;
    healthy(request(addr, &c, "GET", "/healthz", &[], b"").await?)?;
    ensure!(connect(addr, &client(&b, &[])?).await.is_err());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_http_and_silent_clients_are_dropped_without_holding_anyone_up() -> anyhow::Result<()>
{
    let a = Cert::new("A")?;
    let files = Files::new(&a)?;
    let header_timeout = Duration::from_secs(2);
    let (server, _config) = start(&files, "header_timeout = \"2s\"\n", "").await?;
    let addr = server.addr();
    let failures = metric(addr, &a, TLS_FAILURES).await?;

    // Plain HTTP on the TLS port: a plain 400 saying to use HTTPS, then the connection closes.
    let answer = http::request(addr, "GET", "/healthz", &[], b"").await?;
    let error = viewtape_tests::expect::json_error(&answer, 400)?;
    ensure!(
        error["message"]
            .as_str()
            .is_some_and(|m| m.contains("HTTPS")),
        "{error}"
    );
    let mut tcp = http::connect(addr).await?;
    tcp.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .await?;
    http::closed_within(&mut tcp, READ_TIMEOUT).await?;
    ensure!(metric(addr, &a, TLS_FAILURES).await? == failures + 2.0);

    // Silent clients: one that sends nothing, one that stops inside the handshake, one that
    // completes the handshake and sends no request. Meanwhile others are served at once.
    let opened = Instant::now();
    let mut silent = http::connect(addr).await?;
    let mut half = http::connect(addr).await?;
    // The first bytes of a TLS record header: a handshake that never goes on.
    half.write_all(&[0x16, 0x03, 0x01]).await?;
    let (mut quiet, _) = connect(addr, &client(&a, &[b"http/1.1"])?)
        .await?
        .into_inner();
    for _ in 0..3 {
        let resp = request(addr, &a, "GET", "/healthz", &[], b"").await?;
        ensure!(resp.status() == 200);
    }
    ensure!(
        opened.elapsed() < header_timeout,
        "others are served while silent clients wait: {:?}",
        opened.elapsed()
    );
    // The handshake's time and then the request head's: each at most header_timeout.
    let limit = header_timeout * 4;
    for (name, stream) in [
        ("silent", &mut silent),
        ("half a handshake", &mut half),
        ("a handshake and no request", &mut quiet),
    ] {
        http::closed_within(stream, limit)
            .await
            .with_context(|| format!("{name} client"))?;
        let after = opened.elapsed();
        ensure!(
            after >= header_timeout - Duration::from_millis(100),
            "{name}: closed after {after:?}, before header_timeout"
        );
    }
    ensure!(metric(addr, &a, TLS_FAILURES).await? == failures + 4.0);
    let resp = request(addr, &a, "GET", "/healthz", &[], b"").await?;
    ensure!(resp.status() == 200, "still serving");
    Ok(())
}

/// Unpadded base64url, as JWKs write their numbers.
fn base64url(bytes: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

/// A P-256 key under `kid`: its signing key and its public JWK.
fn es256(kid: &str) -> anyhow::Result<(jsonwebtoken::EncodingKey, serde_json::Value)> {
    let pair = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)?;
    let signing = jsonwebtoken::EncodingKey::from_ec_pem(pair.serialize_pem().as_bytes())?;
    let point = pair.public_key_raw();
    ensure!(point.len() == 65 && point[0] == 4, "an uncompressed point");
    let jwk = serde_json::json!({
        "kty": "EC", "crv": "P-256", "use": "sig", "alg": "ES256", "kid": kid,
        "x": base64url(&point[1..33]), "y": base64url(&point[33..]),
    });
    Ok((signing, jwk))
}

/// An ES256 token under `kid` that may read `prices`, for a minute.
fn token(signing: &jsonwebtoken::EncodingKey, kid: &str) -> anyhow::Result<String> {
    let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::ES256);
    header.kid = Some(kid.to_owned());
    let claims = serde_json::json!({"exp": viewtape_tests::token::now() + 60, "aud": "viewtape", "views": ["prices"]});
    Ok(jsonwebtoken::encode(&header, &claims, signing)?)
}

/// The status of `GET /views/prices` over HTTPS with `token`.
async fn read_prices(addr: SocketAddr, trusted: &Cert, token: String) -> anyhow::Result<u16> {
    let bearer = format!("Bearer {token}");
    let headers = [("Authorization", bearer.as_str())];
    let resp = request(addr, trusted, "GET", "/views/prices", &headers, b"").await?;
    Ok(resp.status())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_jwks_key_file_is_reloaded_on_sighup() -> anyhow::Result<()> {
    let a = Cert::new("A")?;
    let files = Files::new(&a)?;
    let jwks = files.path("jwks.json");
    let (old_key, old_jwk) = es256("2026-old")?;
    std::fs::write(&jwks, serde_json::json!({ "keys": [old_jwk] }).to_string())?;
    let auth = format!(
        "\n[auth]\npublic_keys = {:?}\naudience = \"viewtape\"\n",
        jwks.display().to_string()
    );
    let (server, _config) = start(&files, "", &auth).await?;
    let addr = server.addr();
    let get = |token: String| read_prices(addr, &a, token);
    let old = token(&old_key, "2026-old")?;
    ensure!(get(old.clone()).await? == 200);
    ensure!(
        get(token(&old_key, "another")?).await? == 401,
        "another kid"
    );
    let unauthenticated = request(addr, &a, "GET", "/views/prices", &[], b"").await?;
    expect::json_error(&unauthenticated, 401)?;

    // Another key in the file, then SIGHUP: the old token (already verified, so remembered)
    // is refused, the new key's accepted.
    let (new_key, new_jwk) = es256("2026-new")?;
    std::fs::write(&jwks, serde_json::json!({ "keys": [new_jwk] }).to_string())?;
    server.hangup()?;
    log_lines(&server, "auth keys reloaded", 1).await?;
    ensure!(get(old.clone()).await? == 401, "the old key is gone");
    ensure!(get(token(&new_key, "2026-new")?).await? == 200);

    // A file that is no JWKS: logged, and the keys in use stay.
    std::fs::write(&jwks, "{\"keys\": 7}")?;
    server.hangup()?;
    log_lines(&server, "auth keys not reloaded", 1).await?;
    ensure!(get(token(&new_key, "2026-new")?).await? == 200);
    ensure!(get(old).await? == 401);
    Ok(())
}

/// HTTP/2 clients that hold a connection and say nothing are dropped like HTTP/1.1 ones: no
/// preface within `header_timeout`, or no answer to the server's pings within `write_timeout`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_http2_clients_are_dropped() -> anyhow::Result<()> {
    let a = Cert::new("A")?;
    let files = Files::new(&a)?;
    let (server, _config) = start(
        &files,
        "header_timeout = \"1s\"\nwrite_timeout = \"2s\"\n",
        "",
    )
    .await?;
    let addr = server.addr();

    // h2 chosen by ALPN, then nothing: closed after header_timeout.
    let opened = Instant::now();
    let (mut quiet, _) = connect(addr, &client(&a, &[b"h2"])?).await?.into_inner();
    let closed = http::closed_within(&mut quiet, Duration::from_secs(5)).await?;
    ensure!(
        closed >= Duration::from_millis(900),
        "closed after {closed:?}, before header_timeout"
    );
    ensure!(opened.elapsed() < Duration::from_secs(5));

    // The preface and empty SETTINGS, then silence (the server's SETTINGS and PINGs go
    // unanswered): closed once a ping goes unanswered for write_timeout.
    let mut tls = connect(addr, &client(&a, &[b"h2"])?).await?;
    tls.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00")
        .await?;
    tls.flush().await?;
    let opened = Instant::now();
    let mut buf = [0u8; 1024];
    loop {
        match tokio::time::timeout(Duration::from_secs(12), tls.read(&mut buf)).await {
            Err(_) => bail!("a silent HTTP/2 connection stayed open for 12 s"),
            Ok(Ok(0) | Err(_)) => break,
            Ok(Ok(_)) => {}
        }
    }
    ensure!(
        opened.elapsed() >= Duration::from_millis(1900),
        "closed after {:?}",
        opened.elapsed()
    );

    // Meanwhile, and after: served.
    let resp = request(addr, &a, "GET", "/healthz", &[], b"").await?;
    ensure!(resp.status() == 200);
    Ok(())
}
