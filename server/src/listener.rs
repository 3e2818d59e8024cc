//! The accept loop: SSE subscriptions straight on the socket, everything
//! else through axum.
//!
//! ## Why
//!
//! An idle SSE connection is the unit of scale. Through hyper each one keeps
//! an 8 KiB read buffer and an 8 KiB header buffer for its whole life — most
//! of its memory. A `GET /views/{view}/events` request is recognised by
//! *peeking* at the socket (nothing is consumed, so anything else goes to
//! hyper untouched), its head is read into a small buffer that is freed
//! before streaming, and the stream is written as chunked transfer encoding
//! by the subscriber's own task: a connection then costs its subscriber and
//! its task, a few KiB.
//!
//! The fast path handles exactly what it recognises; a request line that
//! arrived in pieces, or anything else, is served by the same axum handler.

use std::future::Future;
use std::io::IoSlice;
use std::time::Duration;

use axum::Router;
use bytes::Bytes;
use hyper_util::rt::TokioIo;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tracing::Instrument;

use crate::http::{subscribe, ApiError, AppState, EventsQuery, SSE_HEADERS};

/// Largest request head the fast path reads; longer heads get 431.
const MAX_HEAD: usize = 16 * 1024;
/// Time a client has to send its request head.
const HEAD_TIMEOUT: Duration = Duration::from_secs(10);
/// Time in-flight non-SSE requests get to finish at shutdown.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);

/// Serves `router` on `listener` until `shutdown` resolves, then stops
/// accepting and lets in-flight requests finish. SSE streams end by
/// themselves on the same signal (they watch `state.shutdown`).
///
/// # Errors
/// None today; accept errors are logged and retried.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    state: AppState,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    let graceful = GracefulShutdown::new();
    let service = TowerToHyperService::new(router);
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
        // Everything per connection happens in its own task: a client that
        // connects and sends nothing must not hold up the accept loop.
        let (state, service, watcher) = (state.clone(), service.clone(), graceful.watcher());
        tokio::spawn(async move {
            if let Some(target) = sse_target(&stream).await {
                // A task of its own, sized for the stream alone (this one
                // also carries the peek and hyper's branch); SSE streams end
                // on the shutdown signal themselves, unwatched.
                let span = tracing::debug_span!("sse", %peer);
                tokio::spawn(serve_sse(stream, target, state).instrument(span));
                return;
            }
            let connection = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service);
            if let Err(error) = watcher.watch(connection).await {
                tracing::debug!(%peer, %error, "connection ended with an error");
            }
        });
    }
    drop(listener);
    if tokio::time::timeout(DRAIN_TIMEOUT, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!("in-flight requests did not finish within {DRAIN_TIMEOUT:?}");
    }
    Ok(())
}

/// The request target when the socket starts with `GET /views/{view}/events`.
async fn sse_target(stream: &TcpStream) -> Option<String> {
    let mut peeked = [0u8; 512];
    let n = tokio::time::timeout(Duration::from_secs(1), stream.peek(&mut peeked))
        .await
        .ok()?
        .ok()?;
    let line = peeked[..n].split(|&b| b == b'\n').next()?;
    if line.len() == n {
        return None; // the request line has not fully arrived
    }
    let target = std::str::from_utf8(line.strip_prefix(b"GET ")?).ok()?;
    let target = target.trim_end().strip_suffix(" HTTP/1.1")?;
    let path = target.split('?').next()?;
    let view = path.strip_prefix("/views/")?.strip_suffix("/events")?;
    (!view.is_empty() && !view.contains('/')).then(|| target.to_owned())
}

/// Reads the request head, then streams the subscription.
async fn serve_sse(mut stream: TcpStream, target: String, state: AppState) {
    let last_event_id = match tokio::time::timeout(HEAD_TIMEOUT, read_head(&mut stream)).await {
        Ok(Ok(last_event_id)) => last_event_id,
        Ok(Err(status)) => {
            let _ = write_plain(&mut stream, status).await;
            return;
        }
        Err(_) => return, // the client never finished its request
    };
    let (path, query) = target.split_once('?').unwrap_or((&target, ""));
    let view = path
        .trim_start_matches("/views/")
        .trim_end_matches("/events");
    let query: EventsQuery = match serde_urlencoded::from_str(query) {
        Ok(query) => query,
        Err(error) => {
            let error = ApiError::BadRequest(format!("bad query: {error}"));
            let _ = write_error(&mut stream, &error).await;
            return;
        }
    };
    let mut subscriber = match subscribe(&state, view, last_event_id, query) {
        Ok(subscriber) => subscriber,
        Err(error) => {
            let _ = write_error(&mut stream, &error).await;
            return;
        }
    };
    let mut head = String::from("HTTP/1.1 200 OK\r\n");
    for (name, value) in SSE_HEADERS {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("transfer-encoding: chunked\r\n\r\n");
    if stream.write_all(head.as_bytes()).await.is_err() {
        return;
    }
    let (mut reader, mut writer) = stream.split();
    // Reading is how a closed connection shows up while the view is quiet;
    // a client has nothing else to send on this connection.
    let mut probe = [0u8; 64];
    loop {
        tokio::select! {
            chunk = subscriber.next_chunk() => match chunk {
                Some(chunk) if chunk.is_empty() => {}
                Some(chunk) => {
                    if write_chunk(&mut writer, chunk).await.is_err() {
                        return; // the client went away
                    }
                }
                None => break,
            },
            read = reader.read(&mut probe) => match read {
                Ok(0) | Err(_) => return, // the client went away
                Ok(_) => {}
            },
        }
    }
    // The stream ended (shutdown): finish the chunked body and close.
    let _ = writer.write_all(b"0\r\n\r\n").await;
    let _ = writer.shutdown().await;
}

/// Reads the head up to the blank line; returns `Last-Event-ID`.
async fn read_head(stream: &mut TcpStream) -> Result<Option<String>, u16> {
    let mut buf = Vec::with_capacity(1024);
    loop {
        let mut headers = [httparse::EMPTY_HEADER; 64];
        let mut request = httparse::Request::new(&mut headers);
        match request.parse(&buf) {
            Ok(httparse::Status::Complete(_)) => {
                let last_event_id = request
                    .headers
                    .iter()
                    .find(|h| h.name.eq_ignore_ascii_case("last-event-id"))
                    .map(|h| String::from_utf8_lossy(h.value).into_owned());
                return Ok(last_event_id);
            }
            Ok(httparse::Status::Partial) => {}
            Err(httparse::Error::TooManyHeaders) => return Err(431),
            Err(_) => return Err(400),
        }
        if buf.len() >= MAX_HEAD {
            return Err(431);
        }
        let mut more = [0u8; 1024];
        let n = stream.read(&mut more).await.map_err(|_| 400u16)?;
        if n == 0 {
            return Err(400);
        }
        buf.extend_from_slice(&more[..n]);
    }
}

/// One chunk of the chunked body, in one vectored write when the socket
/// takes it all.
async fn write_chunk(
    stream: &mut (impl AsyncWriteExt + Unpin),
    chunk: Bytes,
) -> std::io::Result<()> {
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

async fn write_error(stream: &mut TcpStream, error: &ApiError) -> std::io::Result<()> {
    let (status, body) = error.status_and_body();
    let body = body.to_string();
    let head = format!(
        "HTTP/1.1 {} {}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        status.as_u16(),
        status.canonical_reason().unwrap_or(""),
        body.len()
    );
    stream.write_all(format!("{head}{body}").as_bytes()).await?;
    stream.shutdown().await
}

async fn write_plain(stream: &mut TcpStream, status: u16) -> std::io::Result<()> {
    let reason = match status {
        431 => "Request Header Fields Too Large",
        _ => "Bad Request",
    };
    let head =
        format!("HTTP/1.1 {status} {reason}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n");
    stream.write_all(head.as_bytes()).await?;
    stream.shutdown().await
}
