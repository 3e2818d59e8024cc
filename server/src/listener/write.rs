//! Writes that fail when the client accepts no bytes for the write timeout, on both transports.

use std::future::Future;
use std::io::IoSlice;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::time::Sleep;

use super::Limits;

/// Writes one JSON answer with `status` (and the header lines `extra`, each ending in CRLF)
/// on a connection whose request is not read, then closes it.
pub(super) async fn answer_and_close<S: AsyncWrite + Unpin>(
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

/// Writes all of `parts`, vectored; fails when the client accepts no bytes for `timeout`. A
/// client that keeps up costs no timer: one runs only while a write is blocked.
pub(super) async fn write_all<S: AsyncWrite + Unpin>(
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
pub(super) struct Stall {
    timeout: Duration,
    /// Running while writes are blocked.
    stalled: Option<Pin<Box<Sleep>>>,
}

impl Stall {
    pub(super) fn new(timeout: Duration) -> Self {
        Self {
            timeout,
            stalled: None,
        }
    }

    /// Passes a write's outcome through, failing it once writes have been blocked too long.
    pub(super) fn timed<T>(
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
