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
//!   `upgrade`, `connection` other than `keep-alive`. The bytes already read
//!   are replayed to hyper, so the hand-over is invisible to the client.
//!
//! A head that is malformed, over the limits, or framed in a way a proxy in
//! front could read differently (both `content-length` and
//! `transfer-encoding`, a transfer coding besides `chunked`, no `host` or
//! several) is refused with the JSON error, and the connection closed: by the
//! lean transport when it reads the head, and before any route by hyper's
//! service when hyper does (hyper itself refuses what it cannot parse).
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
//!
//! | file | job |
//! |---|---|
//! | this one | [`serve`]: the accept loop, the limits, what every connection shares |
//! | `accept` | failed accepts reported once per episode; connections past the limit refused |
//! | `handshake` | a connection's start: TLS, then HTTP/2 or HTTP/1.1; plain HTTP on the TLS port |
//! | `lean` | the lean HTTP/1.1 transport: request heads read, responses written |
//! | `head` | request heads parsed: the lean transport's, hyper's, or refused |
//! | `handover` | hyper: the rest of a declined connection, HTTP/2; its socket and service |
//! | `write` | the one answer written on a connection whose request is not read |
//! | `stop` | the drain when the server stops, and the requests with bodies it waits for |
//! | `trim` | memory freed by closed connections handed back to the OS |
//! | [`tls`] | the certificate and key, reloadable; the TLS acceptor with HTTP/2 by ALPN |

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};
use tracing::Instrument;

use crate::config::ServerConfig;
use crate::listener::tls::Tls;
use crate::metrics::Metrics;
use crate::sse::socket::SharedTcp;

mod accept;
mod handover;
mod handshake;
mod head;
mod lean;
mod stop;
pub mod tls;
mod trim;
mod write;

use accept::{refuse, AcceptTrouble};
use stop::drain;
use trim::trim_after_closes;

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

/// What every connection shares.
struct Shared {
    router: Router,
    metrics: Arc<Metrics>,
    limits: Limits,
    /// HTTPS, when configured: every connection starts with a handshake.
    tls: Option<Arc<Tls>>,
    /// Connections that have ended, on either transport.
    closed: AtomicU64,
    /// Requests with bodies being served (see [`BodyGuard`](stop::BodyGuard)).
    bodies: watch::Sender<usize>,
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

/// A connection's byte stream: TCP, or TLS over it.
trait Io: AsyncRead + AsyncWrite + Unpin + Send + 'static {
    /// The plain TCP socket under it, which other tasks may write to in turn; `None` for TLS.
    fn direct(&self) -> Option<SharedTcp>;
}

impl Io for SharedTcp {
    fn direct(&self) -> Option<SharedTcp> {
        Some(self.clone())
    }
}

impl Io for tokio_rustls::server::TlsStream<TcpStream> {
    fn direct(&self) -> Option<SharedTcp> {
        None
    }
}
