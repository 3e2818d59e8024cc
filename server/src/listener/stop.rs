//! Stopping: the drain before the listener closes, the requests with bodies it waits for, and
//! the signal every connection watches.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use axum::body::Body;
use axum::http::Method;
use bytes::Bytes;
use tokio::sync::watch;

use super::{Shared, STREAM_FLUSH};

/// Resolves when the listener may close: after `shutdown`, once the requests with bodies in
/// flight have finished (at most [`Limits::drain_timeout`](super::Limits::drain_timeout)) and
/// the other responses have had [`STREAM_FLUSH`], or at once when `abandon` resolves.
pub(super) async fn drain(
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

/// Resolves once the server stops.
pub(super) async fn stopped(stopping: &mut watch::Receiver<bool>) {
    // An error means the accept loop is gone: stopped too.
    let _ = stopping.wait_for(|stop| *stop).await;
}

/// Counts a request with a body in [`Shared::bodies`] from its start until its response has been
/// sent (or dropped).
pub(super) struct BodyGuard(Arc<Shared>);

impl BodyGuard {
    /// A guard for `method`'s request, when it is one the drain waits for.
    pub(super) fn of(method: &Method, shared: &Arc<Shared>) -> Option<Self> {
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
pub(super) struct Guarded {
    pub(super) body: Body,
    pub(super) _guard: BodyGuard,
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
