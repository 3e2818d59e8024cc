//! The lean HTTP/1.1 transport: plain `GET` requests read into a small buffer and handed to
//! the router, responses written without a buffer of their own.

use std::io::IoSlice;
use std::time::Duration;

use axum::body::Body;
use axum::http::{self, Request, Response};
use bytes::{Buf, BytesMut};
use http_body_util::BodyExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tower::ServiceExt;

use super::head::{parse_head, BadHead, Parsed};
use super::stop::stopped;
use super::{Connection, Io, Limits, MAX_HEAD, PROBE};
use crate::sse::socket::{chunk_head, write_all};

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

impl Connection {
    /// Serves HTTP/1.1: the lean transport, until a request it declines hands the rest of the
    /// connection to hyper.
    pub(super) async fn run<S: Io>(self, mut stream: S) {
        // Bytes read and not yet consumed: a partial head, or pipelined requests.
        let mut buf = BytesMut::new();
        let mut first = true;
        loop {
            let request = match self.next_request(&mut stream, &mut buf, first).await {
                Next::Request(request) => request,
                // Boxed: hyper's connection future is large, and an inline one would size
                // every lean connection's task, idle SSE streams included.
                Next::Decline => return Box::pin(self.hand_to_hyper(stream, buf.freeze())).await,
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
            if let Some(socket) = stream.direct() {
                // A streamed response is written chunked, straight to this socket: others
                // may write chunks to it in turn (see `crate::sse`).
                request.extensions_mut().insert(socket);
            }
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
        let (parts, body) = response.into_parts();
        let length = http_body::Body::size_hint(&body).exact();
        let has_length = parts.headers.contains_key(http::header::CONTENT_LENGTH);
        let mut head = response_head(&parts);
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
        write_chunked(stream, buf, body, timeout).await
    }
}

/// A response head's status line, its header fields and `date`, without the blank line that
/// ends it: the framing fields come next.
fn response_head(parts: &http::response::Parts) -> Vec<u8> {
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
    head
}

/// Writes `body` chunked, then its last chunk, while a small probe reads from the client: it
/// notices a close at once and keeps pipelined bytes in `buf` for the next request.
async fn write_chunked<S: Io>(
    stream: &mut S,
    buf: &mut BytesMut,
    mut body: Body,
    timeout: Duration,
) -> std::io::Result<()> {
    let mut probe = [0u8; PROBE];
    loop {
        tokio::select! {
            frame = body.frame() => match frame {
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        if !data.is_empty() {
                            let head = chunk_head(data.len());
                            let mut parts = [
                                IoSlice::new(head.as_ref()),
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

/// Reads what the socket has into `buf`; `Ok(0)` when the client closed.
pub(super) async fn read_some<S: Io>(stream: &mut S, buf: &mut BytesMut) -> std::io::Result<usize> {
    buf.reserve(1024);
    stream.read_buf(buf).await
}
