//! A minimal HTTP/1.1 client over tokio TCP, for loopback only.
//!
//! Small on purpose: the bench opens thousands of these, and the tests need a timeout on every
//! read so a broken server fails a test instead of hanging it. It speaks what the server speaks:
//! one request per connection for [`request`] (`Connection: close`), keep-alive for
//! [`HttpConn`], and response bodies framed by `Content-Length`, `chunked`, or the end of the
//! connection.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{anyhow, bail, Context as _};
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};
use tokio::net::TcpStream;

/// How long any single read or connect may take before the call fails: generous, as it only
/// bounds a failure — a debug build on a loaded 2-core machine took 9.5 s to answer a 1 MiB
/// batch of 22,000 ticks (under the server's own 30 s request timeout).
pub const READ_TIMEOUT: Duration = Duration::from_secs(25);

/// Response heads larger than this are refused (the server's are a few hundred bytes).
const MAX_HEAD: usize = 64 * 1024;

/// Bodies larger than this are refused by [`request`] (a state dump in a test is far smaller).
const MAX_BODY: usize = 64 * 1024 * 1024;

/// A status line and headers.
#[derive(Debug, Clone)]
pub struct Head {
    /// The status code.
    pub status: u16,
    /// Headers in order, names lowercased.
    pub headers: Vec<(String, String)>,
}

impl Head {
    /// The first value of a header (case-insensitive name).
    pub fn header(&self, name: &str) -> Option<&str> {
        let name = name.to_ascii_lowercase();
        self.headers
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v.as_str())
    }

    pub(crate) fn framing(&self) -> anyhow::Result<Framing> {
        if let Some(te) = self.header("transfer-encoding") {
            if te
                .to_ascii_lowercase()
                .split(',')
                .any(|t| t.trim() == "chunked")
            {
                return Ok(Framing::Chunked(ChunkedDecoder::default()));
            }
        }
        match self.header("content-length") {
            Some(len) => Ok(Framing::Length(
                len.trim().parse().context("bad Content-Length")?,
            )),
            None => Ok(Framing::UntilClose),
        }
    }
}

/// A complete response.
#[derive(Debug, Clone)]
pub struct Response {
    /// Status and headers.
    pub head: Head,
    /// The decoded body.
    pub body: Vec<u8>,
}

impl Response {
    /// The status code.
    pub fn status(&self) -> u16 {
        self.head.status
    }

    /// See [`Head::header`].
    pub fn header(&self, name: &str) -> Option<&str> {
        self.head.header(name)
    }

    /// The body as text (lossy).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The body as JSON.
    ///
    /// # Errors
    /// When it is not JSON.
    pub fn json(&self) -> anyhow::Result<serde_json::Value> {
        serde_json::from_slice(&self.body).with_context(|| {
            format!(
                "status {} body is not JSON: {:.300}",
                self.status(),
                self.text()
            )
        })
    }
}

/// How a response body ends.
#[derive(Debug)]
pub(crate) enum Framing {
    Length(u64),
    Chunked(ChunkedDecoder),
    UntilClose,
}

/// An incremental `Transfer-Encoding: chunked` decoder.
#[derive(Debug, Default)]
pub struct ChunkedDecoder {
    state: ChunkState,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum ChunkState {
    /// Expecting a chunk-size line.
    #[default]
    Size,
    /// Inside chunk data, this many bytes left.
    Data(u64),
    /// Expecting the CRLF after chunk data.
    DataEnd,
    /// After the last (zero) chunk: trailer lines until an empty one.
    Trailer,
    /// The body is complete.
    Done,
}

impl ChunkedDecoder {
    /// Decodes from the front of `raw`, appending body bytes to `out` and removing what it
    /// consumed from `raw`; an incomplete size line or CRLF stays in `raw` for the next call.
    /// Returns whether the body is complete.
    ///
    /// # Errors
    /// On malformed framing.
    pub fn decode(&mut self, raw: &mut Vec<u8>, out: &mut Vec<u8>) -> anyhow::Result<bool> {
        let mut pos = 0;
        loop {
            match self.state {
                ChunkState::Done => break,
                ChunkState::Size | ChunkState::Trailer => {
                    let Some(nl) = raw[pos..].iter().position(|&b| b == b'\n') else {
                        if raw.len() - pos > 1024 {
                            bail!("chunk size line too long");
                        }
                        break;
                    };
                    let line = &raw[pos..pos + nl];
                    let line = line.strip_suffix(b"\r").unwrap_or(line);
                    pos += nl + 1;
                    if self.state == ChunkState::Trailer {
                        if line.is_empty() {
                            self.state = ChunkState::Done;
                        }
                        continue;
                    }
                    let text = std::str::from_utf8(line).context("chunk size is not text")?;
                    let hex = text.split(';').next().unwrap_or("").trim();
                    let size = u64::from_str_radix(hex, 16)
                        .with_context(|| format!("bad chunk size {text:?}"))?;
                    self.state = if size == 0 {
                        ChunkState::Trailer
                    } else {
                        ChunkState::Data(size)
                    };
                }
                ChunkState::Data(left) => {
                    let avail = (raw.len() - pos) as u64;
                    if avail == 0 {
                        break;
                    }
                    let take = left.min(avail) as usize;
                    out.extend_from_slice(&raw[pos..pos + take]);
                    pos += take;
                    let left = left - take as u64;
                    self.state = if left == 0 {
                        ChunkState::DataEnd
                    } else {
                        ChunkState::Data(left)
                    };
                }
                ChunkState::DataEnd => {
                    let rest = &raw[pos..];
                    if rest.starts_with(b"\r\n") {
                        pos += 2;
                    } else if rest.starts_with(b"\n") {
                        pos += 1;
                    } else if rest.is_empty() || rest == b"\r" {
                        break;
                    } else {
                        bail!("missing CRLF after chunk data");
                    }
                    self.state = ChunkState::Size;
                }
            }
        }
        raw.drain(..pos);
        Ok(self.state == ChunkState::Done)
    }
}

/// Parses a response head from the front of `buf`. `Ok(None)` when it is not complete yet;
/// otherwise the head and its length in bytes.
///
/// # Errors
/// On a malformed status line or header, or a head over 64 KiB.
pub fn parse_head(buf: &[u8]) -> anyhow::Result<Option<(Head, usize)>> {
    let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
        if buf.len() > MAX_HEAD {
            bail!("response head over {MAX_HEAD} bytes");
        }
        return Ok(None);
    };
    let text = std::str::from_utf8(&buf[..end]).context("response head is not UTF-8")?;
    let mut lines = text.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let mut parts = status_line.splitn(3, ' ');
    let version = parts.next().unwrap_or_default();
    if !version.starts_with("HTTP/1.") {
        bail!("not an HTTP/1.x response: {status_line:?}");
    }
    let status = parts
        .next()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| anyhow!("bad status line {status_line:?}"))?;
    let mut headers = Vec::new();
    for line in lines {
        let (name, value) = line
            .split_once(':')
            .ok_or_else(|| anyhow!("bad header line {line:?}"))?;
        headers.push((name.trim().to_ascii_lowercase(), value.trim().to_owned()));
    }
    Ok(Some((Head { status, headers }, end + 4)))
}

/// Encodes a request. `path` includes the query; `Host` and `Content-Length` are added.
pub fn encode_request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
    keep_alive: bool,
) -> Vec<u8> {
    let mut req = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\n");
    for (name, value) in headers {
        req.push_str(name);
        req.push_str(": ");
        req.push_str(value);
        req.push_str("\r\n");
    }
    if !body.is_empty() || method == "POST" || method == "PUT" {
        req.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
    if !keep_alive {
        req.push_str("Connection: close\r\n");
    }
    req.push_str("\r\n");
    let mut bytes = req.into_bytes();
    bytes.extend_from_slice(body);
    bytes
}

/// Refuses any address outside loopback: the harness and the bench only ever talk to a server
/// on this machine.
///
/// # Errors
/// When `addr` is not a loopback address.
pub fn ensure_loopback(addr: SocketAddr) -> anyhow::Result<()> {
    if !addr.ip().is_loopback() {
        bail!("{addr} is not a loopback address; this tool only targets 127.0.0.0/8 or ::1");
    }
    Ok(())
}

/// Connects with a timeout (loopback only).
///
/// # Errors
/// On a non-loopback address, refusal or timeout.
pub async fn connect(addr: SocketAddr) -> anyhow::Result<TcpStream> {
    ensure_loopback(addr)?;
    let stream = tokio::time::timeout(READ_TIMEOUT, TcpStream::connect(addr))
        .await
        .with_context(|| format!("connect to {addr} timed out"))?
        .with_context(|| format!("connect to {addr}"))?;
    stream.set_nodelay(true)?;
    Ok(stream)
}

/// Connects with a small kernel receive buffer (`SO_RCVBUF`), so a client that stops reading
/// pushes back on the server quickly (the slow-consumer test).
///
/// # Errors
/// See [`connect`].
pub async fn connect_with_recv_buffer(addr: SocketAddr, bytes: u32) -> anyhow::Result<TcpStream> {
    ensure_loopback(addr)?;
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    socket.set_recv_buffer_size(bytes)?;
    let stream = tokio::time::timeout(READ_TIMEOUT, socket.connect(addr))
        .await
        .with_context(|| format!("connect to {addr} timed out"))?
        .with_context(|| format!("connect to {addr}"))?;
    stream.set_nodelay(true)?;
    Ok(stream)
}

/// Reads once into `buf` with `timeout`; returns the byte count (0 at EOF).
pub(crate) async fn read_some<S: AsyncRead + Unpin>(
    stream: &mut S,
    buf: &mut Vec<u8>,
    timeout: Duration,
) -> anyhow::Result<usize> {
    let len = buf.len();
    buf.reserve(16 * 1024);
    let n = tokio::time::timeout(timeout, stream.read_buf(buf))
        .await
        .map_err(|_| anyhow!("no data from the server within {timeout:?}"))?
        .context("read")?;
    debug_assert_eq!(buf.len(), len + n);
    Ok(n)
}

/// Reads a response head; leftover body bytes stay in `buf`.
pub(crate) async fn read_head<S: AsyncRead + Unpin>(
    stream: &mut S,
    buf: &mut Vec<u8>,
) -> anyhow::Result<Head> {
    loop {
        if let Some((head, len)) = parse_head(buf)? {
            buf.drain(..len);
            return Ok(head);
        }
        if read_some(stream, buf, READ_TIMEOUT).await? == 0 {
            bail!("connection closed before the response head");
        }
    }
}

/// Reads a whole body framed per `head`; leftover bytes (a pipelined response) stay in `buf`.
async fn read_body<S: AsyncRead + Unpin>(
    stream: &mut S,
    head: &Head,
    buf: &mut Vec<u8>,
) -> anyhow::Result<Vec<u8>> {
    let mut body = Vec::new();
    match head.framing()? {
        Framing::Length(len) => {
            let len = usize::try_from(len).context("body too long")?;
            if len > MAX_BODY {
                bail!("body of {len} bytes is over {MAX_BODY}");
            }
            while buf.len() < len {
                if read_some(stream, buf, READ_TIMEOUT).await? == 0 {
                    bail!("connection closed inside the body");
                }
            }
            body.extend(buf.drain(..len));
        }
        Framing::Chunked(mut decoder) => loop {
            if decoder.decode(buf, &mut body)? {
                break;
            }
            if body.len() > MAX_BODY {
                bail!("body over {MAX_BODY} bytes");
            }
            if read_some(stream, buf, READ_TIMEOUT).await? == 0 {
                bail!("connection closed inside a chunked body");
            }
        },
        Framing::UntilClose => loop {
            body.append(buf);
            if body.len() > MAX_BODY {
                bail!("body over {MAX_BODY} bytes");
            }
            if read_some(stream, buf, READ_TIMEOUT).await? == 0 {
                break;
            }
        },
    }
    Ok(body)
}

/// Where the error bodies the server answered are collected, a file per test process
/// ([`record_error_body`]); `tests/error_bodies.rs` checks them all. Under this build's target
/// directory (`target/tmp/`, beside `target/debug/deps/<test>`), so that the checkouts of one
/// machine do not mix.
pub fn error_bodies_dir() -> std::path::PathBuf {
    let target = std::env::current_exe()
        .ok()
        .and_then(|exe| Some(exe.parent()?.parent()?.parent()?.to_owned()));
    target
        .map_or_else(std::env::temp_dir, |target| target.join("tmp"))
        .join("viewtape-error-bodies")
}

/// Appends a `4xx`/`5xx` answer's body to this process's file in [`error_bodies_dir`]
/// (best effort: collecting must never fail a test by itself).
pub fn record_error_body(status: u16, body: &[u8]) {
    use std::io::Write as _;
    if status < 400 {
        return;
    }
    let dir = error_bodies_dir();
    let line = serde_json::json!({ "status": status, "body": String::from_utf8_lossy(body) });
    let _ = std::fs::create_dir_all(&dir).and_then(|()| {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join(format!("{}.ndjson", std::process::id())))
            // One write per record: with `append`, records of concurrent tests never interleave.
            .and_then(|mut file| file.write_all(format!("{line}\n").as_bytes()))
    });
}

/// What is wrong with an error body, if anything: it is not the JSON error, or its message
/// carries internal detail — a file path, an OS error, a nested error chain, `Debug` text — or
/// words that are not the server's own (a library's refusal, the engine's trap text, a panic's
/// source location).
pub fn error_body_problem(body: &str) -> Option<&'static str> {
    if body.is_empty() {
        return Some("an empty body");
    }
    let Ok(json) = serde_json::from_str::<serde_json::Value>(body) else {
        return Some("not JSON");
    };
    // `/readyz` answers `503` with its readiness document, by contract.
    if json["ready"].is_boolean() {
        return None;
    }
    let (Some(_), Some(message)) = (json["error"].as_str(), json["message"].as_str()) else {
        return Some("not {\"error\", \"message\"}");
    };
    // Directories, not file names: a snapshot's file name is what an operator asks for.
    const PATHS: [&str; 8] = [
        "/tmp/", "/var/", "/home/", "/root/", "/work/", "/proc/", "/usr/", "/etc/",
    ];
    const OS_ERRORS: [&str; 5] = [
        "os error",
        "No space left",
        "Permission denied",
        "No such file",
        "File too large",
    ];
    const DEBUG: [&str; 4] = ["Error {", "Some(", " kind: ", "Custom {"];
    if PATHS.iter().any(|p| message.contains(p)) {
        return Some("a file path");
    }
    if OS_ERRORS.iter().any(|e| message.contains(e)) {
        return Some("an OS error");
    }
    if DEBUG.iter().any(|d| message.contains(d)) {
        return Some("Debug text");
    }
    // axum's and serde's refusals, wasmtime's trap text, a Rust panic's location.
    const FOREIGN: [&str; 7] = [
        "Failed to deserialize",
        "Invalid URL",
        "wasm backtrace",
        "wasm trap",
        "error while executing",
        "panicked at",
        ".rs:",
    ];
    if FOREIGN.iter().any(|f| message.contains(f)) {
        return Some("words that are not ours");
    }
    let mut depth = 0i32;
    for c in message.chars() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            _ => {}
        }
        if depth >= 2 {
            return Some("a nested error chain");
        }
    }
    message.contains("caused by").then_some("an error chain")
}

/// One request on a fresh connection (`Connection: close`), every read bounded by
/// [`READ_TIMEOUT`].
///
/// # Errors
/// On connection, timeout or framing errors (not on HTTP error statuses).
pub async fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> anyhow::Result<Response> {
    let mut stream = connect(addr).await?;
    let req = encode_request(addr, method, path, headers, body, false);
    tokio::time::timeout(READ_TIMEOUT, stream.write_all(&req))
        .await
        .context("write timed out")?
        .context("write request")?;
    let mut buf = Vec::new();
    let head = read_head(&mut stream, &mut buf).await?;
    let body = if method == "HEAD" || head.status == 204 || head.status == 304 {
        Vec::new()
    } else {
        read_body(&mut stream, &head, &mut buf).await?
    };
    // A `HEAD` answer has no body, by the protocol.
    if method != "HEAD" {
        record_error_body(head.status, &body);
    }
    Ok(Response { head, body })
}

/// A keep-alive connection for many sequential requests (the bench's publisher): over TCP, or
/// over any byte stream to `addr` the caller opened (TLS, for the bench).
#[derive(Debug)]
pub struct HttpConn<S = TcpStream> {
    addr: SocketAddr,
    stream: S,
    buf: Vec<u8>,
}

impl HttpConn {
    /// Connects (loopback only).
    ///
    /// # Errors
    /// See [`connect`].
    pub async fn connect(addr: SocketAddr) -> anyhow::Result<Self> {
        Ok(Self::on(addr, connect(addr).await?))
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> HttpConn<S> {
    /// Requests go over `stream`, already connected to `addr` (its `Host`).
    pub fn on(addr: SocketAddr, stream: S) -> Self {
        Self {
            addr,
            stream,
            buf: Vec::new(),
        }
    }

    /// Sends one request and reads its response.
    ///
    /// # Errors
    /// On I/O, timeout or framing errors, or when the server closed the connection.
    pub async fn send(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> anyhow::Result<Response> {
        let req = encode_request(self.addr, method, path, headers, body, true);
        tokio::time::timeout(READ_TIMEOUT, self.stream.write_all(&req))
            .await
            .context("write timed out")?
            .context("write request")?;
        let head = read_head(&mut self.stream, &mut self.buf).await?;
        let body = read_body(&mut self.stream, &head, &mut self.buf).await?;
        record_error_body(head.status, &body);
        Ok(Response { head, body })
    }
}

/// Reads from `stream` until the server closes it (EOF or reset; whatever it sends before, a
/// TLS alert say, is read and dropped), at most `within`; how long that took.
///
/// # Errors
/// When it is still open after `within`.
pub async fn closed_within<S: AsyncRead + Unpin>(
    stream: &mut S,
    within: Duration,
) -> anyhow::Result<Duration> {
    let started = std::time::Instant::now();
    let mut buf = [0u8; 4096];
    loop {
        match tokio::time::timeout_at((started + within).into(), stream.read(&mut buf)).await {
            Err(_) => bail!("the server did not close the connection within {within:?}"),
            Ok(Ok(0) | Err(_)) => return Ok(started.elapsed()),
            Ok(Ok(_)) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_head_and_leaves_body() {
        let raw = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nX-A:  b \r\n\r\nbody";
        let (head, len) = parse_head(raw).unwrap().unwrap();
        assert_eq!(head.status, 200);
        assert_eq!(head.header("content-type"), Some("text/event-stream"));
        assert_eq!(head.header("X-A"), Some("b"));
        assert_eq!(&raw[len..], b"body");
        assert!(parse_head(b"HTTP/1.1 200 OK\r\n").unwrap().is_none());
        assert!(parse_head(b"SSH-2.0\r\n\r\n").is_err());
    }

    #[test]
    fn chunked_decoding_at_every_split() {
        let wire = b"5;ext=1\r\nhello\r\n7\r\n, world\r\n0\r\nTrailer: x\r\n\r\nNEXT";
        for cut in 0..=wire.len() {
            let mut d = ChunkedDecoder::default();
            let mut raw = wire[..cut].to_vec();
            let mut out = Vec::new();
            let mut done = d.decode(&mut raw, &mut out).unwrap();
            raw.extend_from_slice(&wire[cut..]);
            done |= d.decode(&mut raw, &mut out).unwrap();
            assert!(done, "cut {cut}");
            assert_eq!(out, b"hello, world", "cut {cut}");
            assert_eq!(raw, b"NEXT", "cut {cut}");
        }
    }

    #[test]
    fn chunked_rejects_garbage() {
        let mut d = ChunkedDecoder::default();
        assert!(d.decode(&mut b"zz\r\n".to_vec(), &mut Vec::new()).is_err());
        let mut d = ChunkedDecoder::default();
        assert!(d
            .decode(&mut b"1\r\nab\r\n".to_vec(), &mut Vec::new())
            .is_err());
    }

    #[test]
    fn request_encoding() {
        let addr: SocketAddr = "127.0.0.1:9".parse().unwrap();
        let req = encode_request(addr, "POST", "/x?y=1", &[("A", "b")], b"hi", false);
        assert_eq!(
            req,
            b"POST /x?y=1 HTTP/1.1\r\nHost: 127.0.0.1:9\r\nA: b\r\nContent-Length: 2\r\nConnection: close\r\n\r\nhi"
        );
    }

    #[test]
    fn only_loopback() {
        assert!(ensure_loopback("127.0.0.1:1".parse().unwrap()).is_ok());
        assert!(ensure_loopback("[::1]:1".parse().unwrap()).is_ok());
        assert!(ensure_loopback("10.0.0.1:1".parse().unwrap()).is_err());
    }
}

#[cfg(test)]
mod error_body_tests {
    use super::error_body_problem;

    #[test]
    fn internal_detail_is_caught_and_our_words_pass() {
        let leaked = r#"{"error":"unavailable","message":"runtime `demo`: the log failed, nothing was committed: the log is poisoned (the log is poisoned (log I/O failed: write /tmp/x/log/log-1.vtlog: No space left on device (os error 28)))"}"#;
        assert_eq!(error_body_problem(leaked), Some("a file path"));
        let os = r#"{"error":"unavailable","message":"write failed: No space left on device"}"#;
        assert_eq!(error_body_problem(os), Some("an OS error"));
        let chain = r#"{"error":"x","message":"a (b (c))"}"#;
        assert_eq!(error_body_problem(chain), Some("a nested error chain"));
        assert_eq!(error_body_problem("oops"), Some("not JSON"));
        let ours = r#"{"error":"unauthorized","message":"invalid token: it has expired (`exp`): get a new one"}"#;
        assert_eq!(error_body_problem(ours), None);
        assert_eq!(error_body_problem(""), Some("an empty body"));
        let axum = r#"{"error":"bad_request","message":"bad query: Failed to deserialize query string: unknown field `x`, expected `access_token`"}"#;
        assert_eq!(error_body_problem(axum), Some("words that are not ours"));
        let trap = r#"{"error":"batch_rejected","message":"runtime `m`: guest panicked: boom (at src/lib.rs:77:28; wasm trap: wasm `unreachable` instruction executed)"}"#;
        assert_eq!(error_body_problem(trap), Some("words that are not ours"));
    }
}
