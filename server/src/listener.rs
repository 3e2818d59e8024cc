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
//! ## Limits
//!
//! Both transports apply the same ones: request heads of at most [`MAX_HEAD`]
//! bytes and [`MAX_HEADERS`] fields, sent within [`Limits::header_timeout`];
//! a client that accepts no bytes of a response for [`Limits::write_timeout`]
//! is dropped (an SSE client resumes with its cursor when it comes back). The
//! lean transport closes a kept-alive connection after [`Limits::idle_timeout`]
//! without a request. At most [`Limits::max_connections`] connections are open
//! at once; past that a connection gets `503` and is closed, and when accepting
//! fails (out of file descriptors) the loop backs off, logging once per episode.
//!
//! ## Stopping
//!
//! When `shutdown` resolves (the router's streams end on the same signal, and
//! `/readyz` turns `503`), the loop keeps accepting while it drains: requests
//! with bodies in flight (every method but `GET` and `HEAD`) get up to
//! [`Limits::drain_timeout`] to finish, and every other response [`STREAM_FLUSH`]
//! to write its last bytes — or until `abandon` resolves (a second signal).
//! Then the listener closes, connections between requests or still sending a
//! head close, and the loop returns without waiting for the rest: a client
//! that stopped reading, or never finishes its head, cannot hold the stop.

use std::future::Future;
use std::io::IoSlice;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{self, HeaderName, HeaderValue, Method, Request, Response, Version};
use axum::Router;
use bytes::{Buf, Bytes, BytesMut};
use http_body_util::BodyExt;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};
use tokio::time::Sleep;
use tower::ServiceExt;
use tracing::Instrument;

use crate::config::ServerConfig;
use crate::metrics::Metrics;
use crate::tls::Tls;

/// Largest request head, on both transports; past it, 431.
pub const MAX_HEAD: usize = 16 * 1024;
/// Most header fields in one request, on both transports; past it, 431.
pub const MAX_HEADERS: usize = 64;
/// Most concurrent streams (requests) on one HTTP/2 connection.
const H2_MAX_STREAMS: u32 = 256;
/// What an HTTP/2 client sends first (RFC 9113, 3.4).
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// Bytes the lean transport reads at a time while streaming a response: just
/// enough to notice a closed connection or keep a pipelined request.
const PROBE: usize = 64;
/// How often, at most, memory freed by closed hyper connections is handed back to the OS.
const TRIM_EVERY: Duration = Duration::from_secs(5);
/// At a stop, time every response but a request with a body gets to write its last bytes: an
/// SSE stream's final `retry:` hint, a `GET` being answered.
pub const STREAM_FLUSH: Duration = Duration::from_millis(300);
/// How often a lasting episode of failed accepts is reported.
const ACCEPT_REPORT_EVERY: Duration = Duration::from_secs(10);
/// Time without a failed accept that ends an episode.
const ACCEPT_CALM: Duration = Duration::from_secs(1);
/// First and longest pause after a failed accept.
const ACCEPT_BACKOFF: (Duration, Duration) = (Duration::from_millis(10), Duration::from_secs(1));

/// The limits both transports apply, from `[server]`.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Time to send a whole request head (from the connection's start for its first).
    pub header_timeout: Duration,
    /// Time a kept-alive connection may wait for its next request.
    pub idle_timeout: Duration,
    /// Time a client may accept no bytes before it is dropped.
    pub write_timeout: Duration,
    /// At a stop, time in-flight requests with bodies get to finish.
    pub drain_timeout: Duration,
    /// Most connections open at once.
    pub max_connections: usize,
}

impl From<&ServerConfig> for Limits {
    fn from(config: &ServerConfig) -> Self {
        Self {
            header_timeout: config.header_timeout,
            idle_timeout: config.idle_timeout,
            write_timeout: config.write_timeout,
            drain_timeout: config.drain_timeout,
            max_connections: config.http_connection_limit(),
        }
    }
}

/// Serves `router` on `listener` with `limits` until `shutdown` resolves, then drains (see the
/// module docs) and closes the listener.
///
/// # Errors
/// None today; accept errors are counted, logged once per episode, and retried.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    metrics: Arc<Metrics>,
    limits: Limits,
    tls: Option<Arc<Tls>>,
    shutdown: impl Future<Output = ()>,
    abandon: impl Future<Output = ()>,
) -> std::io::Result<()> {
    let shared = Arc::new(Shared {
        router,
        metrics,
        limits,
        tls,
        closed: AtomicU64::new(0),
        bodies: watch::Sender::new(0),
    });
    let trimmer = tokio::spawn(trim_after_closes(Arc::clone(&shared)));
    let permits = Arc::new(Semaphore::new(limits.max_connections));
    let (stop, stopping) = watch::channel(false);
    let mut shutdown = std::pin::pin!(drain(shutdown, abandon, &shared));
    let mut backoff = ACCEPT_BACKOFF.0;
    let mut trouble: Option<AcceptTrouble> = None;
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = &mut shutdown => break,
        };
        let (stream, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(error) => {
                shared.metrics.accept_errors.inc();
                match &mut trouble {
                    None => {
                        tracing::warn!(%error, "accepting connections failed; backing off (failures are counted in viewtape_accept_errors_total and reported every {ACCEPT_REPORT_EVERY:?} while they last)");
                        trouble = Some(AcceptTrouble::new());
                    }
                    Some(trouble) => trouble.failed(&error),
                }
                tokio::select! {
                    () = tokio::time::sleep(backoff) => {}
                    () = &mut shutdown => break,
                }
                backoff = (backoff * 2).min(ACCEPT_BACKOFF.1);
                continue;
            }
        };
        backoff = ACCEPT_BACKOFF.0;
        if trouble.as_ref().is_some_and(AcceptTrouble::is_over) {
            tracing::info!("accepting connections again");
            trouble = None;
        }
        let Ok(permit) = Arc::clone(&permits).try_acquire_owned() else {
            shared.metrics.http_refused.inc();
            tokio::spawn(refuse(stream, limits));
            continue;
        };
        let _ = stream.set_nodelay(true);
        let connection = Connection {
            peer,
            shared: Arc::clone(&shared),
            stopping: stopping.clone(),
            _permit: permit,
        };
        let span = tracing::debug_span!("connection", %peer);
        tokio::spawn(connection.start(stream).instrument(span));
    }
    drop(listener);
    trimmer.abort();
    let _ = stop.send(true);
    Ok(())
}

/// Resolves when the listener may close: after `shutdown`, once the requests with bodies in
/// flight have finished (at most [`Limits::drain_timeout`]) and the other responses have had
/// [`STREAM_FLUSH`], or at once when `abandon` resolves.
async fn drain(
    shutdown: impl Future<Output = ()>,
    abandon: impl Future<Output = ()>,
    shared: &Shared,
) {
    shutdown.await;
    let started = Instant::now();
    let mut bodies = shared.bodies.subscribe();
    let finished = async {
        let _ = bodies.wait_for(|n| *n == 0).await;
    };
    let drained = futures_util::future::join(finished, tokio::time::sleep(STREAM_FLUSH));
    let limit = shared.limits.drain_timeout.max(STREAM_FLUSH);
    tokio::select! {
        _ = drained => {}
        () = tokio::time::sleep(limit) => {
            tracing::warn!(drain_timeout = ?shared.limits.drain_timeout, in_flight = *shared.bodies.borrow(), "requests with bodies did not finish in time; stopping without them");
        }
        () = abandon => tracing::warn!("asked again to stop: not waiting for in-flight requests"),
    }
    tracing::info!(took = ?started.elapsed(), "drained; closing the listener");
}

/// An episode of failing accepts: one line when it starts, one every [`ACCEPT_REPORT_EVERY`]
/// while it lasts, one when it is over.
struct AcceptTrouble {
    since_report: u64,
    last_report: Instant,
    last_failure: Instant,
}

impl AcceptTrouble {
    fn new() -> Self {
        let now = Instant::now();
        Self {
            since_report: 0,
            last_report: now,
            last_failure: now,
        }
    }

    fn failed(&mut self, error: &std::io::Error) {
        let now = Instant::now();
        self.since_report += 1;
        self.last_failure = now;
        if now - self.last_report >= ACCEPT_REPORT_EVERY {
            tracing::warn!(%error, failures = self.since_report, "accepting connections still fails");
            (self.since_report, self.last_report) = (0, now);
        }
    }

    /// Over once accepting has not failed for [`ACCEPT_CALM`]: the first accepts after descriptors
    /// run out often fail again at once, and that is the same episode.
    fn is_over(&self) -> bool {
        self.last_failure.elapsed() >= ACCEPT_CALM
    }
}

/// Answers a connection past the limit with `503` and closes it, without reading a request.
async fn refuse(stream: TcpStream, limits: Limits) {
    let body = format!(
        "{{\"error\":\"unavailable\",\"message\":\"too many connections (limit {})\"}}",
        limits.max_connections
    );
    answer_and_close(
        stream,
        "503 Service Unavailable",
        "retry-after: 1\r\n",
        &body,
        limits,
    )
    .await;
}

/// Answers a plain HTTP request on the TLS port: `400` with a JSON error saying to use HTTPS,
/// in plain text since the client speaks no TLS, then closes.
async fn plain_http_to_tls(stream: TcpStream, limits: Limits) {
    let body = "{\"error\":\"bad_request\",\"message\":\"this port speaks HTTPS only: use https:// in the URL\"}";
    tracing::debug!("plain HTTP on the TLS port; told to use HTTPS");
    answer_and_close(stream, "400 Bad Request", "", body, limits).await;
}

/// Writes one JSON answer with `status` (and the header lines `extra`, each ending in CRLF)
/// on a connection whose request is not read, then closes it.
async fn answer_and_close<S: AsyncWrite + Unpin>(
    mut stream: S,
    status: &str,
    extra: &str,
    body: &str,
    limits: Limits,
) {
    let response = format!(
        "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\
         {extra}connection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = write_all(
        &mut stream,
        &mut [IoSlice::new(response.as_bytes())],
        limits.write_timeout,
    )
    .await;
    let _ = stream.shutdown().await;
}

/// What every connection shares.
struct Shared {
    router: Router,
    metrics: Arc<Metrics>,
    limits: Limits,
    /// HTTPS, when configured: every connection starts with a handshake.
    tls: Option<Arc<Tls>>,
    /// Connections that have ended, on either transport.
    closed: AtomicU64,
    /// Requests with bodies being served (see [`BodyGuard`]).
    bodies: watch::Sender<usize>,
}

/// Counts a request with a body in [`Shared::bodies`] from its start until its response has been
/// sent (or dropped).
struct BodyGuard(Arc<Shared>);

impl BodyGuard {
    /// A guard for `method`'s request, when it is one the drain waits for.
    fn of(method: &Method, shared: &Arc<Shared>) -> Option<Self> {
        if method == Method::GET || method == Method::HEAD {
            return None;
        }
        shared.bodies.send_modify(|n| *n += 1);
        Some(Self(Arc::clone(shared)))
    }
}

impl Drop for BodyGuard {
    fn drop(&mut self) {
        self.0.bodies.send_modify(|n| *n -= 1);
    }
}

/// A response body that holds a [`BodyGuard`] until it is sent.
struct Guarded {
    body: Body,
    _guard: BodyGuard,
}

impl http_body::Body for Guarded {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

/// Hands freed memory back to the OS after connections close, at most every [`TRIM_EVERY`]. An
/// allocator keeps freed memory for reuse, and after a peak of thousands of concurrent
/// connections (8–16 KiB of buffers each for hyper's) it would keep much of it for good: with
/// glibc, RSS crept from 59 to 95 MB over ten rounds of 4,000 hyper connections; with this it
/// stays flat.
async fn trim_after_closes(shared: Arc<Shared>) {
    let mut seen = 0;
    loop {
        tokio::time::sleep(TRIM_EVERY).await;
        let closed = shared.closed.load(Ordering::Relaxed);
        if closed != seen {
            seen = closed;
            let _ = tokio::task::spawn_blocking(release_free_memory).await;
        }
    }
}

/// Returns what the server's allocator (mimalloc, set in `main.rs`) holds free to the OS.
fn release_free_memory() {
    // SAFETY: mi_collect takes no pointers; it frees mimalloc's own free pages and may be called
    // from any thread at any time (with the system allocator in use it finds nothing to free).
    unsafe {
        libmimalloc_sys::mi_collect(true);
    }
}

/// One accepted connection.
struct Connection {
    /// The client's address, handed to the router with every request (`ConnectInfo`).
    peer: SocketAddr,
    shared: Arc<Shared>,
    /// Flips to `true` when the server stops.
    stopping: watch::Receiver<bool>,
    /// Its place under [`Limits::max_connections`].
    _permit: OwnedSemaphorePermit,
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.shared.closed.fetch_add(1, Ordering::Relaxed);
    }
}

/// What waiting for a request head gave.
enum Next {
    /// A request for the lean transport; its head is consumed from the buffer.
    Request(Box<Request<Body>>),
    /// A request for hyper; the buffer holds everything read so far.
    Decline,
    /// Nothing more to serve: the client closed, timed out, or the server stops.
    Close,
    /// A head no transport can serve: answered with the JSON error, then the connection closes.
    Refuse(BadHead),
}

/// A request head refused before the router sees it (as hyper would refuse it, but with the
/// JSON error every other refusal has).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BadHead {
    /// Not HTTP/1.x: `400`.
    Malformed,
    /// Past [`MAX_HEAD`] bytes or [`MAX_HEADERS`] fields: `431`.
    TooLarge,
}

impl BadHead {
    /// Answers it on `stream` and closes the connection, reading on for a moment first (at
    /// most 1 s and 1 MiB): closing with the rest of a long head unread would reset the
    /// connection, and the client could lose the answer.
    async fn answer<S: Io>(self, mut stream: S, limits: Limits) {
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
        let mut sink = [0u8; 8192];
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

/// A connection's byte stream: TCP, or TLS over it.
trait Io: AsyncRead + AsyncWrite + Unpin + Send + 'static {}
impl<S: AsyncRead + AsyncWrite + Unpin + Send + 'static> Io for S {}

impl Connection {
    /// Serves a fresh connection: over TLS when configured (HTTP/2 when the client chose it by
    /// ALPN), else plain HTTP/1.1.
    async fn start(self, stream: TcpStream) {
        match self.shared.tls.clone() {
            None => self.run(stream).await,
            // Boxed: the TLS path's futures are large, and a task is as large as its future,
            // so a plain connection's task would carry their size with it.
            Some(tls) => Box::pin(self.start_tls(tls, stream)).await,
        }
    }

    /// The TLS handshake, then HTTP/2 or HTTP/1.1 as the client chose. A client that speaks
    /// plain HTTP to the port instead gets a plain `400` saying to use HTTPS.
    async fn start_tls(self, tls: Arc<Tls>, stream: TcpStream) {
        let mut first = [0u8; 1];
        let peeked =
            tokio::time::timeout(self.shared.limits.header_timeout, stream.peek(&mut first)).await;
        if matches!(peeked, Ok(Ok(1))) && first[0].is_ascii_uppercase() {
            self.shared.metrics.tls_failures.inc();
            return plain_http_to_tls(stream, self.shared.limits).await;
        }
        let handshake = tokio::time::timeout(
            self.shared.limits.header_timeout,
            tls.acceptor().accept(stream),
        );
        let stream = match handshake.await {
            Ok(Ok(stream)) => stream,
            Ok(Err(error)) => {
                self.shared.metrics.tls_failures.inc();
                return tracing::debug!(%error, "TLS handshake failed");
            }
            Err(_) => {
                self.shared.metrics.tls_failures.inc();
                return tracing::debug!("TLS handshake timed out");
            }
        };
        if stream.get_ref().1.alpn_protocol() == Some(crate::tls::H2) {
            return self.serve_h2(stream).await;
        }
        self.run(stream).await;
    }

    /// Serves HTTP/1.1: the lean transport, until a request it declines hands the rest of the
    /// connection to hyper.
    async fn run<S: Io>(self, mut stream: S) {
        // Bytes read and not yet consumed: a partial head, or pipelined requests.
        let mut buf = BytesMut::new();
        let mut first = true;
        loop {
            let request = match self.next_request(&mut stream, &mut buf, first).await {
                Next::Request(request) => request,
                Next::Decline => return self.hand_to_hyper(stream, buf.freeze()).await,
                Next::Close => return,
                Next::Refuse(bad) => {
                    if first {
                        self.shared.metrics.lean_connections.inc();
                    }
                    return bad.answer(stream, self.shared.limits).await;
                }
            };
            if first {
                self.shared.metrics.lean_connections.inc();
            }
            first = false;
            if buf.is_empty() {
                // The head is consumed: free its buffer before a response (an SSE stream) that
                // may last for hours.
                buf = BytesMut::new();
            }
            let mut request = *request;
            request
                .extensions_mut()
                .insert(axum::extract::ConnectInfo(self.peer));
            let response = match self.shared.router.clone().oneshot(request).await {
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
    async fn next_request<S: Io>(&self, stream: &mut S, buf: &mut BytesMut, first: bool) -> Next {
        let mut stopping = self.stopping.clone();
        tokio::select! {
            next = read_request(stream, buf, first, self.shared.limits) => next,
            () = stopped(&mut stopping) => Next::Close,
        }
    }

    /// Serves the rest of the connection with hyper, starting with the bytes
    /// the lean transport already read.
    async fn hand_to_hyper<S: Io>(self, stream: S, read: Bytes) {
        let Shared {
            metrics, limits, ..
        } = &*self.shared;
        metrics.hyper_connections.inc();
        let mut builder = hyper::server::conn::http1::Builder::new();
        builder
            .timer(TokioTimer::new())
            .header_read_timeout(limits.header_timeout)
            .max_buf_size(MAX_HEAD)
            .max_headers(MAX_HEADERS);
        let connection = builder.serve_connection(self.hyper_io(stream, read), self.service());
        self.drive(connection, |connection| connection.graceful_shutdown())
            .await;
    }

    /// Serves an HTTP/2 connection with hyper: the same router, limits and stop. The client's
    /// connection preface must arrive within [`Limits::header_timeout`], as a request head
    /// must (hyper would wait for it forever); it is handed to hyper with the rest.
    async fn serve_h2<S: Io>(self, mut stream: S) {
        let Shared {
            metrics, limits, ..
        } = &*self.shared;
        let mut preface = BytesMut::new();
        let read = async {
            while preface.len() < H2_PREFACE.len() {
                if read_some(&mut stream, &mut preface).await? == 0 {
                    return Err(std::io::ErrorKind::UnexpectedEof.into());
                }
            }
            Ok::<_, std::io::Error>(())
        };
        match tokio::time::timeout(limits.header_timeout, read).await {
            Ok(Ok(())) if preface.starts_with(H2_PREFACE) => {}
            Ok(Ok(())) => return tracing::debug!("not an HTTP/2 connection preface; closed"),
            Ok(Err(error)) => return tracing::debug!(%error, "HTTP/2 preface not read"),
            Err(_) => return tracing::debug!("no HTTP/2 preface within header_timeout; closed"),
        }
        metrics.h2_connections.inc();
        let mut builder = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
        builder
            .timer(TokioTimer::new())
            .max_header_list_size(MAX_HEAD as u32)
            .max_concurrent_streams(H2_MAX_STREAMS)
            .keep_alive_interval(Some(limits.write_timeout))
            .keep_alive_timeout(limits.write_timeout);
        let connection =
            builder.serve_connection(self.hyper_io(stream, preface.freeze()), self.service());
        self.drive(connection, |connection| connection.graceful_shutdown())
            .await;
    }

    /// The socket as hyper sees it.
    fn hyper_io<S: Io>(&self, stream: S, read: Bytes) -> TokioIo<HyperIo<S>> {
        TokioIo::new(HyperIo {
            read,
            inner: stream,
            stall: Stall::new(self.shared.limits.write_timeout),
        })
    }

    /// The router as a hyper service, handing it the client's address with every request.
    fn service(
        &self,
    ) -> TowerToHyperService<
        impl tower::Service<
                hyper::Request<hyper::body::Incoming>,
                Response = Response<Body>,
                Error = std::convert::Infallible,
                Future = impl Send,
            > + Clone,
    > {
        let (peer, shared) = (self.peer, Arc::clone(&self.shared));
        TowerToHyperService::new(tower::service_fn(
            move |mut request: hyper::Request<hyper::body::Incoming>| {
                request
                    .extensions_mut()
                    .insert(axum::extract::ConnectInfo(peer));
                let guard = BodyGuard::of(request.method(), &shared);
                let router = shared.router.clone();
                async move {
                    let response = router.oneshot(request).await?;
                    Ok(match guard {
                        Some(guard) => response.map(|body| {
                            Body::new(Guarded {
                                body,
                                _guard: guard,
                            })
                        }),
                        None => response,
                    })
                }
            },
        ))
    }

    /// Runs a hyper connection to its end; when the server stops, asks it to finish gracefully.
    async fn drive<C>(&self, connection: C, graceful: impl FnOnce(Pin<&mut C>))
    where
        C: Future<Output = Result<(), hyper::Error>>,
    {
        let mut connection = std::pin::pin!(connection);
        let mut stopping = self.stopping.clone();
        let result = tokio::select! {
            result = connection.as_mut() => result,
            () = stopped(&mut stopping) => {
                graceful(connection.as_mut());
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
    async fn respond<S: Io>(
        &self,
        stream: &mut S,
        buf: &mut BytesMut,
        response: Response<Body>,
    ) -> std::io::Result<()> {
        let timeout = self.shared.limits.write_timeout;
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
            return write_all(stream, &mut [IoSlice::new(&head)], timeout).await;
        }
        head.extend_from_slice(b"transfer-encoding: chunked\r\n\r\n");
        write_all(stream, &mut [IoSlice::new(&head)], timeout).await?;
        drop(head);
        let mut probe = [0u8; PROBE];
        loop {
            tokio::select! {
                frame = body.frame() => match frame {
                    Some(Ok(frame)) => {
                        if let Ok(data) = frame.into_data() {
                            if !data.is_empty() {
                                let size = format!("{:x}\r\n", data.len());
                                let mut parts = [
                                    IoSlice::new(size.as_bytes()),
                                    IoSlice::new(&data),
                                    IoSlice::new(b"\r\n"),
                                ];
                                write_all(stream, &mut parts, timeout).await?;
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
        write_all(stream, &mut [IoSlice::new(b"0\r\n\r\n")], timeout).await
    }
}

/// Reads until `buf` holds a whole request head: the next request of a kept-alive connection
/// has [`Limits::idle_timeout`] to start, and every head [`Limits::header_timeout`] to arrive
/// once started (from the connection's start for its first).
async fn read_request<S: Io>(
    stream: &mut S,
    buf: &mut BytesMut,
    first: bool,
    limits: Limits,
) -> Next {
    if !first && buf.is_empty() {
        match tokio::time::timeout(limits.idle_timeout, read_some(stream, buf)).await {
            Ok(Ok(n)) if n > 0 => {}
            _ => return Next::Close,
        }
    }
    let deadline = tokio::time::Instant::now() + limits.header_timeout;
    loop {
        match parse_head(buf) {
            Parsed::Request(request, len) => {
                buf.advance(len);
                return Next::Request(request);
            }
            Parsed::Decline => return Next::Decline,
            Parsed::Bad(bad) => return Next::Refuse(bad),
            Parsed::Partial if buf.len() >= MAX_HEAD => return Next::Refuse(BadHead::TooLarge),
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
async fn read_some<S: Io>(stream: &mut S, buf: &mut BytesMut) -> std::io::Result<usize> {
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
    /// A head nobody serves.
    Bad(BadHead),
}

/// Parses a request head and keeps it only when it is a plain `GET`.
fn parse_head(buf: &[u8]) -> Parsed {
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

/// Writes all of `parts`, vectored; fails when the client accepts no bytes for `timeout`. A
/// client that keeps up costs no timer: one runs only while a write is blocked.
async fn write_all<S: AsyncWrite + Unpin>(
    stream: &mut S,
    mut parts: &mut [IoSlice<'_>],
    timeout: Duration,
) -> std::io::Result<()> {
    let mut stall = Stall::new(timeout);
    while !parts.is_empty() {
        let written = std::future::poll_fn(|cx| {
            let poll = Pin::new(&mut *stream).poll_write_vectored(cx, parts);
            stall.timed(cx, poll)
        })
        .await?;
        if written == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        IoSlice::advance_slices(&mut parts, written);
    }
    // TLS holds written bytes until flushed; for TCP this is nothing.
    std::future::poll_fn(|cx| {
        let poll = Pin::new(&mut *stream).poll_flush(cx);
        stall.timed(cx, poll)
    })
    .await
}

/// How long writes have been blocked: they fail once no bytes were accepted for the timeout.
struct Stall {
    timeout: Duration,
    /// Running while writes are blocked.
    stalled: Option<Pin<Box<Sleep>>>,
}

impl Stall {
    fn new(timeout: Duration) -> Self {
        Self {
            timeout,
            stalled: None,
        }
    }

    /// Passes a write's outcome through, failing it once writes have been blocked too long.
    fn timed<T>(
        &mut self,
        cx: &mut Context<'_>,
        poll: Poll<std::io::Result<T>>,
    ) -> Poll<std::io::Result<T>> {
        if poll.is_ready() {
            self.stalled = None;
            return poll;
        }
        let timeout = self.timeout;
        let stalled = self
            .stalled
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
        match stalled.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(std::io::ErrorKind::TimedOut.into())),
            Poll::Pending => Poll::Pending,
        }
    }
}

/// The socket as hyper sees it: first the bytes the lean transport already took from it, and
/// writes that fail when the client accepts nothing for the write timeout.
struct HyperIo<S> {
    read: Bytes,
    inner: S,
    stall: Stall,
}

impl<S: Io> AsyncRead for HyperIo<S> {
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

impl<S: Io> AsyncWrite for HyperIo<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let poll = Pin::new(&mut self.inner).poll_write(cx, data);
        self.stall.timed(cx, poll)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let poll = Pin::new(&mut self.inner).poll_write_vectored(cx, data);
        self.stall.timed(cx, poll)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let poll = Pin::new(&mut self.inner).poll_flush(cx);
        self.stall.timed(cx, poll)
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
