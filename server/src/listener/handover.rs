//! hyper: the rest of an HTTP/1.1 connection from the first request the lean transport declines,
//! and HTTP/2; the socket and the service hyper gets, with the same router, limits and stop.

use std::future::Future;
use std::io::IoSlice;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::Body;
use axum::http::Response;
use bytes::{Buf, Bytes, BytesMut};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tower::ServiceExt;

use super::head::refused_by_hyper;
use super::lean::read_some;
use super::stop::{stopped, BodyGuard, Guarded};
use super::{Connection, Io, Shared, H2_MAX_STREAMS, H2_PREFACE, MAX_HEAD, MAX_HEADERS};
use crate::sse::socket::Stall;

impl Connection {
    /// Serves the rest of the connection with hyper, starting with the bytes
    /// the lean transport already read.
    pub(super) async fn hand_to_hyper<S: Io>(self, stream: S, read: Bytes) {
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
    /// connection preface must arrive within
    /// [`Limits::header_timeout`](super::Limits::header_timeout), as a request head must (hyper
    /// would wait for it forever); it is handed to hyper with the rest.
    pub(super) async fn serve_h2<S: Io>(self, mut stream: S) {
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
                // Refused here, before any route, as the lean transport refuses it.
                let refused = refused_by_hyper(&request);
                request
                    .extensions_mut()
                    .insert(axum::extract::ConnectInfo(peer));
                let guard = refused
                    .is_none()
                    .then(|| BodyGuard::of(request.method(), &shared))
                    .flatten();
                let router = shared.router.clone();
                async move {
                    if let Some(refused) = refused {
                        return Ok(refused.response());
                    }
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
