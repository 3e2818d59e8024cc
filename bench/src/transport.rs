//! How the tool reaches the server: plain TCP, or TLS (`--tls h1|h2`, see [`crate::tls`]).
//!
//! Requests (ingest, the tape) and HTTP/1.1 subscribers go over a [`Conn`]: TCP, or TLS that
//! offers only `http/1.1` (the server's lean transport); one connection per subscriber. With
//! `--tls h2`, subscribers are HTTP/2 streams instead, [`H2_STREAMS_PER_CONNECTION`] to a
//! connection (hyper's client over TLS offering only `h2`); every other request still goes over
//! HTTP/1.1. A [`Subscription`] reads either kind with the same SSE parser.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, bail, ensure, Context as _};
use bytes::Bytes;
use clap::ValueEnum;
use http_body_util::{BodyExt as _, Empty};
use hyper::body::Incoming;
use hyper::client::conn::http2::SendRequest;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_rustls::rustls::pki_types::ServerName;
use tokio_rustls::rustls::ClientConfig;
use tokio_rustls::TlsConnector;
use tokio_util::either::Either;
use viewtape_tests::http::{self, READ_TIMEOUT};
use viewtape_tests::{EventBody, EventStream, SseEventRef, SseParser};

use crate::tls::{ServerTls, ALPN_H2};

/// Concurrent connection (or stream) openings while subscribers connect.
const CONNECT_CONCURRENCY: usize = 256;

/// Streams per HTTP/2 connection: the server's `max_concurrent_streams`.
pub const H2_STREAMS_PER_CONNECTION: usize = 256;

/// A connection for HTTP/1.1: TCP, or TLS over it (boxed: a rustls connection is over 1 KB).
pub type Conn = Either<TcpStream, Box<TlsStream<TcpStream>>>;

/// What subscribers speak; `--tls h1|h2` names the TLS ones (without it: plain).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Transport {
    /// HTTP/1.1 over TCP.
    #[value(skip)]
    Plain,
    /// HTTP/1.1 over TLS, one connection per stream.
    #[value(name = "h1")]
    TlsH1,
    /// HTTP/2 over TLS, up to 256 streams per connection.
    #[value(name = "h2")]
    TlsH2,
}

impl Transport {
    /// The name printed with every figure.
    pub fn name(self) -> &'static str {
        match self {
            Self::Plain => "plain-h1",
            Self::TlsH1 => "tls-h1",
            Self::TlsH2 => "tls-h2",
        }
    }
}

/// Opens connections to the server; cheap to clone into connecting tasks.
#[derive(Debug, Clone)]
pub struct Dialer {
    addr: SocketAddr,
    transport: Transport,
    /// Client configs offering `http/1.1` and `h2`, with TLS.
    tls: Option<(Arc<ClientConfig>, Arc<ClientConfig>)>,
}

impl Dialer {
    /// Plain connections to `addr`, or TLS ones trusting `tls`'s certificate.
    pub fn new(addr: SocketAddr, transport: Transport, tls: Option<&ServerTls>) -> Self {
        Self {
            addr,
            transport,
            tls: tls.map(|tls| (Arc::clone(&tls.h1), Arc::clone(&tls.h2))),
        }
    }

    /// What subscribers speak.
    pub fn transport(&self) -> Transport {
        self.transport
    }

    /// A connection for HTTP/1.1 requests (TLS offering `http/1.1` when the server has TLS).
    ///
    /// # Errors
    /// On connection or handshake errors and timeouts.
    pub async fn connect(&self) -> anyhow::Result<Conn> {
        let tcp = http::connect(self.addr).await?;
        match &self.tls {
            None => Ok(Either::Left(tcp)),
            Some((h1, _)) => Ok(Either::Right(Box::new(self.handshake(tcp, h1).await?))),
        }
    }

    /// An HTTP/1.1 SSE stream on a connection of its own (see [`EventStream::connect`]).
    ///
    /// # Errors
    /// See [`Dialer::connect`] and [`EventStream::connect`].
    pub async fn event_stream(
        &self,
        path: &str,
        headers: &[(&str, &str)],
    ) -> anyhow::Result<EventStream<Conn>> {
        EventStream::open(self.connect().await?, self.addr, path, headers).await
    }

    async fn handshake(
        &self,
        tcp: TcpStream,
        config: &Arc<ClientConfig>,
    ) -> anyhow::Result<TlsStream<TcpStream>> {
        let name = ServerName::IpAddress(self.addr.ip().into());
        tokio::time::timeout(
            READ_TIMEOUT,
            TlsConnector::from(Arc::clone(config)).connect(name, tcp),
        )
        .await
        .with_context(|| format!("TLS handshake with {} timed out", self.addr))?
        .with_context(|| format!("TLS handshake with {}", self.addr))
    }

    /// A new HTTP/2 connection (TLS, `h2` by ALPN); its driver runs in a task of its own
    /// and ends when the last handle to it and its streams are dropped.
    async fn h2_connection(&self) -> anyhow::Result<H2Connection> {
        let Some((_, h2)) = &self.tls else {
            bail!("HTTP/2 needs --tls");
        };
        let tcp = http::connect(self.addr).await?;
        let tls = self.handshake(tcp, h2).await?;
        ensure!(
            tls.get_ref().1.alpn_protocol() == Some(ALPN_H2),
            "the server did not choose h2 by ALPN"
        );
        let (send, connection) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tls))
                .await
                .context("HTTP/2 handshake")?;
        tokio::spawn(async move {
            if let Err(error) = connection.await {
                eprintln!("HTTP/2 connection: {error}");
            }
        });
        Ok(H2Connection {
            send,
            authority: self.addr.to_string(),
        })
    }
}

/// A handle to one HTTP/2 connection; clones open streams on the same connection.
#[derive(Debug, Clone)]
struct H2Connection {
    send: SendRequest<Empty<Bytes>>,
    authority: String,
}

impl H2Connection {
    /// `GET path` as an SSE stream on this connection.
    async fn event_stream(
        mut self,
        path: &str,
        headers: &[(&str, &str)],
    ) -> anyhow::Result<H2Events> {
        let mut request = hyper::Request::get(format!("https://{}{path}", self.authority))
            .header("accept", "text/event-stream");
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let request = request.body(Empty::new()).context("request")?;
        self.send.ready().await.context("HTTP/2 connection")?;
        let response = tokio::time::timeout(READ_TIMEOUT, self.send.send_request(request))
            .await
            .context("HTTP/2 response head timed out")?
            .context("HTTP/2 request")?;
        let status = response.status();
        let mut body = response.into_body();
        if status != hyper::StatusCode::OK {
            let start = tokio::time::timeout(Duration::from_millis(200), body.frame()).await;
            let text = match start {
                Ok(Some(Ok(frame))) => frame.into_data().unwrap_or_default(),
                _ => Bytes::new(),
            };
            bail!(
                "GET {path}: status {status} (expected 200): {:.300}",
                String::from_utf8_lossy(&text)
            );
        }
        Ok(H2Events {
            body,
            parser: SseParser::new(),
            eof: false,
        })
    }
}

/// An SSE stream that is one HTTP/2 stream.
#[derive(Debug)]
pub struct H2Events {
    body: Incoming,
    parser: SseParser,
    eof: bool,
}

/// One subscriber's stream, whatever the transport.
#[derive(Debug)]
pub enum Subscription {
    /// Its own HTTP/1.1 connection (TCP or TLS).
    H1(EventStream<Conn>),
    /// A stream on a shared HTTP/2 connection.
    H2(H2Events),
}

impl Subscription {
    /// One read (at most `timeout`), handing every event it completes to `on_event`; see
    /// [`EventStream::read_with`]. Returns `false` once the stream ended.
    ///
    /// # Errors
    /// On timeout (`no data from the server within …`), I/O or framing errors.
    pub async fn read_with(
        &mut self,
        timeout: Duration,
        on_event: impl FnMut(SseEventRef<'_>),
    ) -> anyhow::Result<bool> {
        let events = match self {
            Self::H1(stream) => return stream.read_with(timeout, on_event).await,
            Self::H2(events) => events,
        };
        if events.eof {
            return Ok(false);
        }
        let frame = tokio::time::timeout(timeout, events.body.frame())
            .await
            .map_err(|_| anyhow!("no data from the server within {timeout:?}"))?;
        match frame {
            None => {
                events.eof = true;
                Ok(false)
            }
            Some(frame) => {
                if let Ok(data) = frame.context("HTTP/2 stream")?.into_data() {
                    events.parser.feed_with(&data, on_event);
                }
                Ok(true)
            }
        }
    }

    /// Its socket (non-blocking) and body decoder, for a caller that reads the socket itself.
    ///
    /// # Errors
    /// When it is not HTTP/1.1 over plain TCP, or the socket cannot be taken from tokio.
    pub fn into_plain(self) -> anyhow::Result<(std::net::TcpStream, EventBody)> {
        let Self::H1(stream) = self else {
            bail!("an HTTP/2 stream has no socket of its own");
        };
        let (conn, body) = stream.into_parts();
        let Either::Left(tcp) = conn else {
            bail!("a TLS connection is read through rustls");
        };
        Ok((tcp.into_std().context("take the socket from tokio")?, body))
    }

    /// Whether the server ended the stream (as far as reads have seen).
    pub fn is_closed(&self) -> bool {
        match self {
            Self::H1(stream) => stream.is_closed(),
            Self::H2(events) => events.eof,
        }
    }
}

/// Opens `n` SSE streams on `path` resuming after `cursor` (`Last-Event-ID`), at most
/// [`CONNECT_CONCURRENCY`] at a time: a connection each, or with `--tls h2` streams on
/// `n / 256` (rounded up) HTTP/2 connections opened first.
///
/// # Errors
/// When any stream cannot be opened.
pub async fn connect_all(
    dialer: &Dialer,
    path: &str,
    n: usize,
    cursor: &str,
) -> anyhow::Result<Vec<Subscription>> {
    let mut h2 = Vec::new();
    if dialer.transport == Transport::TlsH2 {
        for _ in 0..n.div_ceil(H2_STREAMS_PER_CONNECTION) {
            h2.push(dialer.h2_connection().await?);
        }
    }
    let mut streams = Vec::with_capacity(n);
    let mut pending = tokio::task::JoinSet::new();
    let mut started = 0;
    while streams.len() < n {
        while started < n && pending.len() < CONNECT_CONCURRENCY {
            let connection = h2.get(started / H2_STREAMS_PER_CONNECTION).cloned();
            let (dialer, path, cursor) = (dialer.clone(), path.to_owned(), cursor.to_owned());
            pending.spawn(async move {
                let headers = [("Last-Event-ID", cursor.as_str())];
                anyhow::Ok(match connection {
                    Some(connection) => {
                        Subscription::H2(connection.event_stream(&path, &headers).await?)
                    }
                    None => Subscription::H1(dialer.event_stream(&path, &headers).await?),
                })
            });
            started += 1;
        }
        match pending.join_next().await {
            Some(done) => streams.push(
                done.context("connect task")?
                    .with_context(|| format!("subscriber {} of {n}", streams.len() + 1))?,
            ),
            None => break,
        }
    }
    Ok(streams)
}
