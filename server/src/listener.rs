//! The accept loop and the HTTP/1.1 transports that carry requests to the
//! router.
//!
//! ## One router, two transports
//!
//! Every request is answered by the same axum [`Router`]: one route table,
//! one set of extractors, rejections, errors and layers. Only the way bytes
//! reach it differs:
//!
//! - The **lean transport** (this module) serves plain `GET` requests, which
//!   is what browsers, `EventSource` and SSE libraries send. It reads each
//!   request head into a small buffer, hands the router an `http::Request`,
//!   and writes the response itself: `content-length` for bodies of known
//!   size, chunked for streams. While a response streams, the connection
//!   holds no read or write buffer of its own, only a small probe that
//!   notices at once when the client goes away. An idle SSE connection then
//!   costs its subscriber and one small task, a few KiB, where hyper keeps
//!   8 KiB read and 8 KiB write buffers for the connection's whole life.
//! - **hyper** serves a connection from the first request the lean transport
//!   declines on: one with a body or framing headers (`content-length`,
//!   `transfer-encoding`), `HEAD` and other methods, HTTP/1.0, `expect`,
//!   `upgrade`, `connection` other than `keep-alive`, a head over the limits,
//!   or anything it cannot parse. The bytes already read are replayed to
//!   hyper, so the hand-over is invisible to the client and every malformed
//!   request gets hyper's answer.
//!
//! Both transports apply the same limits ([`MAX_HEAD`], [`MAX_HEADERS`],
//! [`HEAD_TIMEOUT`]) and the same graceful stop.
//!
//! ## Stopping
//!
//! When `shutdown` resolves the loop stops accepting, connections between
//! requests close, responses in flight finish (SSE streams end by themselves
//! on the same signal) and the loop waits up to [`DRAIN_TIMEOUT`] for them.

use std::future::Future;
use std::io::IoSlice;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::http::{self, HeaderName, HeaderValue, Method, Request, Response, Version};
use axum::Router;
use bytes::{Buf, Bytes, BytesMut};
use http_body_util::BodyExt;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tower::ServiceExt;
use tracing::Instrument;

use crate::metrics::Metrics;

/// Largest request head, on both transports; past it, 431.
pub const MAX_HEAD: usize = 16 * 1024;
/// Most header fields in one request, on both transports; past it, 431.
pub const MAX_HEADERS: usize = 64;
/// Time a client has to send a whole request head, counted from the
/// connection's start for its first request.
pub const HEAD_TIMEOUT: Duration = Duration::from_secs(10);
/// Time a kept-alive connection may wait for its next request.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// Time in-flight responses get to finish at shutdown.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);
/// Bytes the lean transport reads at a time while streaming a response: just
/// enough to notice a closed connection or keep a pipelined request.
const PROBE: usize = 64;

/// Serves `router` on `listener` until `shutdown` resolves, then stops
/// accepting and lets in-flight responses finish (at most [`DRAIN_TIMEOUT`]).
///
/// # Errors
/// None today; accept errors are logged and retried.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    metrics: Arc<Metrics>,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    // Every connection holds a clone of `drained`; when all are gone, the
    // receiver sees the channel close.
    let (drained, mut all_drained) = mpsc::channel::<()>(1);
    let (stop, stopping) = watch::channel(false);
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    // Out of file descriptors, mostly: back off instead of spinning.
                    tracing::warn!(%error, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let _ = stream.set_nodelay(true);
        let connection = Connection {
            router: router.clone(),
            metrics: Arc::clone(&metrics),
            stopping: stopping.clone(),
            _drained: drained.clone(),
        };
        let span = tracing::debug_span!("connection", %peer);
        tokio::spawn(connection.run(stream).instrument(span));
    }
    drop(listener);
    let _ = stop.send(true);
    drop(drained);
    if tokio::time::timeout(DRAIN_TIMEOUT, all_drained.recv())
        .await
        .is_err()
    {
        tracing::warn!("in-flight requests did not finish within {DRAIN_TIMEOUT:?}");
    }
    Ok(())
}

/// One accepted connection.
struct Connection {
    router: Router,
    metrics: Arc<Metrics>,
    /// Flips to `true` when the server stops.
    stopping: watch::Receiver<bool>,
    /// Dropped when the connection ends; the accept loop's drain waits for it.
    _drained: mpsc::Sender<()>,
}

/// What waiting for a request head gave.
enum Next {
    /// A request for the lean transport; its head is consumed from the buffer.
    Request(Box<Request<Body>>),
    /// A request for hyper; the buffer holds everything read so far.
    Decline,
    /// Nothing more to serve: the client closed, timed out, or the server stops.
    Close,
}

impl Connection {
    async fn run(self, mut stream: TcpStream) {
        // Bytes read and not yet consumed: a partial head, or pipelined requests.
        let mut buf = BytesMut::new();
        let mut first = true;
        loop {
            let request = match self.next_request(&mut stream, &mut buf, first).await {
                Next::Request(request) => request,
                Next::Decline => return self.hand_to_hyper(stream, buf.freeze()).await,
                Next::Close => return,
            };
            if first {
                self.metrics.lean_connections.inc();
            }
            first = false;
            if buf.is_empty() {
                // The head is consumed: free its buffer before a response (an SSE stream) that
                // may last for hours.
                buf = BytesMut::new();
            }
            let response = match self.router.clone().oneshot(*request).await {
                Ok(response) => response,
                Err(infallible) => match infallible {},
            };
            let responded = self.respond(&mut stream, &mut buf, response).await;
            if responded.is_err() || *self.stopping.borrow() {
                break;
            }
            // Keep no read buffer between requests beyond what a pipelined request needs.
            buf = BytesMut::from(&buf[..]);
        }
        let _ = stream.shutdown().await;
    }

    /// Waits for the next request head and decides which transport serves it. A stop ends
    /// the wait at once: a client that is slow to send a head cannot hold the server up.
    async fn next_request(&self, stream: &mut TcpStream, buf: &mut BytesMut, first: bool) -> Next {
        let mut stopping = self.stopping.clone();
        tokio::select! {
            next = read_request(stream, buf, first) => next,
            () = stopped(&mut stopping) => Next::Close,
        }
    }

    /// Serves the rest of the connection with hyper, starting with the bytes
    /// the lean transport already read.
    async fn hand_to_hyper(self, stream: TcpStream, read: Bytes) {
        self.metrics.hyper_connections.inc();
        let mut builder = hyper::server::conn::http1::Builder::new();
        builder
            .timer(TokioTimer::new())
            .header_read_timeout(HEAD_TIMEOUT)
            .max_buf_size(MAX_HEAD)
            .max_headers(MAX_HEADERS);
        let io = TokioIo::new(Rewind {
            read,
            inner: stream,
        });
        let connection = builder.serve_connection(io, TowerToHyperService::new(self.router));
        let mut connection = std::pin::pin!(connection);
        let mut stopping = self.stopping;
        let result = tokio::select! {
            result = connection.as_mut() => result,
            () = stopped(&mut stopping) => {
                connection.as_mut().graceful_shutdown();
                connection.await
            }
        };
        if let Err(error) = result {
            tracing::debug!(%error, "connection ended with an error");
        }
    }

    /// Writes `response`. Bodies of known size go out with `content-length`;
    /// streams chunked, while a small probe reads from the client: it notices
    /// a close at once and keeps pipelined bytes for the next request.
    async fn respond(
        &self,
        stream: &mut TcpStream,
        buf: &mut BytesMut,
        response: Response<Body>,
    ) -> std::io::Result<()> {
        let (parts, mut body) = response.into_parts();
        let length = http_body::Body::size_hint(&body).exact();
        let has_length = parts.headers.contains_key(http::header::CONTENT_LENGTH);
        let mut head = Vec::with_capacity(256);
        head.extend_from_slice(b"HTTP/1.1 ");
        head.extend_from_slice(parts.status.as_str().as_bytes());
        head.push(b' ');
        head.extend_from_slice(parts.status.canonical_reason().unwrap_or("").as_bytes());
        head.extend_from_slice(b"\r\n");
        for (name, value) in &parts.headers {
            head.extend_from_slice(name.as_str().as_bytes());
            head.extend_from_slice(b": ");
            head.extend_from_slice(value.as_bytes());
            head.extend_from_slice(b"\r\n");
        }
        head.extend_from_slice(b"date: ");
        head.extend_from_slice(httpdate::fmt_http_date(std::time::SystemTime::now()).as_bytes());
        head.extend_from_slice(b"\r\n");
        drop(parts);
        if has_length || length.is_some() {
            if let (false, Some(length)) = (has_length, length) {
                head.extend_from_slice(format!("content-length: {length}\r\n").as_bytes());
            }
            head.extend_from_slice(b"\r\n");
            let body = body
                .collect()
                .await
                .map_err(std::io::Error::other)?
                .to_bytes();
            head.extend_from_slice(&body);
            return stream.write_all(&head).await;
        }
        head.extend_from_slice(b"transfer-encoding: chunked\r\n\r\n");
        stream.write_all(&head).await?;
        drop(head);
        let mut probe = [0u8; PROBE];
        loop {
            tokio::select! {
                frame = body.frame() => match frame {
                    Some(Ok(frame)) => {
                        if let Ok(data) = frame.into_data() {
                            if !data.is_empty() {
                                write_chunk(stream, data).await?;
                            }
                        }
                    }
                    Some(Err(error)) => return Err(std::io::Error::other(error)),
                    None => break,
                },
                read = stream.read(&mut probe) => match read {
                    Ok(0) => return Err(std::io::ErrorKind::UnexpectedEof.into()),
                    Ok(n) if buf.len() + n <= MAX_HEAD => buf.extend_from_slice(&probe[..n]),
                    // More pipelined than any head may be: not a client we keep.
                    Ok(_) => return Err(std::io::ErrorKind::InvalidData.into()),
                    Err(error) => return Err(error),
                },
            }
        }
        stream.write_all(b"0\r\n\r\n").await
    }
}

/// Reads until `buf` holds a whole request head: the next request of a kept-alive connection
/// has [`IDLE_TIMEOUT`] to start, and every head [`HEAD_TIMEOUT`] to arrive once started (from
/// the connection's start for its first).
async fn read_request(stream: &mut TcpStream, buf: &mut BytesMut, first: bool) -> Next {
    if !first && buf.is_empty() {
        match tokio::time::timeout(IDLE_TIMEOUT, read_some(stream, buf)).await {
            Ok(Ok(n)) if n > 0 => {}
            _ => return Next::Close,
        }
    }
    let deadline = tokio::time::Instant::now() + HEAD_TIMEOUT;
    loop {
        match parse_head(buf) {
            Parsed::Request(request, len) => {
                buf.advance(len);
                return Next::Request(request);
            }
            Parsed::Decline => return Next::Decline,
            Parsed::Partial if buf.len() >= MAX_HEAD => return Next::Decline,
            Parsed::Partial => {}
        }
        match tokio::time::timeout_at(deadline, read_some(stream, buf)).await {
            Ok(Ok(n)) if n > 0 => {}
            // Closed, failed or too slow: like hyper, no answer.
            _ => return Next::Close,
        }
    }
}

/// Resolves once the server stops.
async fn stopped(stopping: &mut watch::Receiver<bool>) {
    // An error means the accept loop is gone: stopped too.
    let _ = stopping.wait_for(|stop| *stop).await;
}

/// Reads what the socket has into `buf`; `Ok(0)` when the client closed.
async fn read_some(stream: &mut TcpStream, buf: &mut BytesMut) -> std::io::Result<usize> {
    buf.reserve(1024);
    stream.read_buf(buf).await
}

/// What the bytes read so far hold.
enum Parsed {
    /// A complete head the lean transport serves, and its length.
    Request(Box<Request<Body>>, usize),
    /// A head for hyper (or bytes hyper should refuse).
    Decline,
    /// Not a complete head yet.
    Partial,
}

/// Parses a request head and keeps it only when it is a plain `GET`.
fn parse_head(buf: &[u8]) -> Parsed {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut parsed = httparse::Request::new(&mut headers);
    let len = match parsed.parse(buf) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) => return Parsed::Partial,
        Err(_) => return Parsed::Decline,
    };
    match lean_request(&parsed) {
        Some(request) => Parsed::Request(Box::new(request), len),
        None => Parsed::Decline,
    }
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

/// One chunk of a chunked body, in one vectored write when the socket takes
/// it all.
async fn write_chunk(stream: &mut TcpStream, chunk: Bytes) -> std::io::Result<()> {
    let size = format!("{:x}\r\n", chunk.len());
    let mut parts = [
        IoSlice::new(size.as_bytes()),
        IoSlice::new(&chunk),
        IoSlice::new(b"\r\n"),
    ];
    let mut remaining = &mut parts[..];
    while !remaining.is_empty() {
        let written = stream.write_vectored(remaining).await?;
        if written == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        IoSlice::advance_slices(&mut remaining, written);
    }
    Ok(())
}

/// A socket whose first reads return bytes already taken from it.
struct Rewind {
    read: Bytes,
    inner: TcpStream,
}

impl AsyncRead for Rewind {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        out: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if self.read.is_empty() {
            return Pin::new(&mut self.inner).poll_read(cx, out);
        }
        let n = self.read.len().min(out.remaining());
        out.put_slice(&self.read[..n]);
        self.read.advance(n);
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for Rewind {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, data)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, data)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
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
            "GET / HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n",
            "GET / HTTP/1.1\r\nExpect: 100-continue\r\n\r\n",
            "GET / HTTP/1.1\r\nConnection: close\r\n\r\n",
            "GET / HTTP/1.1\r\nConnection: upgrade\r\nUpgrade: websocket\r\n\r\n",
            "GET / HTTP/1.1\r\nBad Header\r\n\r\n",
        ] {
            assert!(matches!(parse(declined), Parsed::Decline), "{declined:?}");
        }
        assert!(matches!(parse("GET / HTTP/1.1\r\nHost"), Parsed::Partial));
        let many = format!(
            "GET / HTTP/1.1\r\n{}\r\n",
            "a: b\r\n".repeat(MAX_HEADERS + 1)
        );
        assert!(matches!(parse(&many), Parsed::Decline));
    }
}
