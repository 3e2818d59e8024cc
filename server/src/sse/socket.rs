//! A plain TCP connection that its transport and the fan-out pass both write to, writes that
//! fail when the client accepts nothing for the write timeout, and HTTP/1.1 chunk framing.
//!
//! An SSE stream served by the lean HTTP/1.1 transport is written by its own task (the
//! response head, chunks the subscriber builds, the last chunk) and, while the subscriber is
//! parked at the head of its view's tape, by one of the view's fan-out passes. Never both at
//! once: a pass writes only while the subscriber is parked, and the subscriber unparks before
//! anything else is written. So the socket is shared ([`SharedTcp`]) and every writer frames its
//! bytes the same way ([`chunk_head`]).

use std::future::Future;
use std::io::IoSlice;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::time::Sleep;

/// A TCP connection shared by the tasks that write to it in turn.
#[derive(Clone, Debug)]
pub struct SharedTcp(Arc<TcpStream>);

impl SharedTcp {
    /// Shares `stream`.
    pub fn new(stream: TcpStream) -> Self {
        Self(Arc::new(stream))
    }

    /// Writes what the socket takes now, without waiting; `WouldBlock` when it takes nothing.
    ///
    /// # Errors
    /// The socket's error, or `WouldBlock`.
    pub fn try_write(&self, data: &[u8]) -> std::io::Result<usize> {
        self.0.try_write(data)
    }

    /// Shuts the writing half down: the client reads what was written, then the end; every
    /// later write fails at once.
    pub fn shut_writes(&self) {
        // Fails only when the socket is already gone.
        let _ = socket2::SockRef::from(&*self.0).shutdown(std::net::Shutdown::Write);
    }

    /// Sends with `send` once the socket is writable; a `WouldBlock` clears the readiness and
    /// waits again.
    fn poll_send(
        &self,
        cx: &mut Context<'_>,
        send: impl Fn(&TcpStream) -> std::io::Result<usize>,
    ) -> Poll<std::io::Result<usize>> {
        loop {
            ready!(self.0.poll_write_ready(cx))?;
            match send(&self.0) {
                Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => {}
                written => return Poll::Ready(written),
            }
        }
    }
}

impl AsyncRead for SharedTcp {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        loop {
            ready!(self.0.poll_read_ready(cx))?;
            // A `WouldBlock` clears the readiness: the next poll waits for the socket.
            match self.0.try_read(buf.initialize_unfilled()) {
                Ok(n) => {
                    buf.advance(n);
                    return Poll::Ready(Ok(()));
                }
                Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(error) => return Poll::Ready(Err(error)),
            }
        }
    }
}

impl AsyncWrite for SharedTcp {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        self.poll_send(cx, |socket| socket.try_write(data))
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        self.poll_send(cx, |socket| socket.try_write_vectored(data))
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        self.shut_writes();
        Poll::Ready(Ok(()))
    }
}

/// The head of an HTTP/1.1 chunk of `len` bytes (its size in hex and CRLF), in a buffer of its
/// own; the chunk's data and a CRLF follow it.
pub fn chunk_head(len: usize) -> ChunkHead {
    let mut head = ChunkHead {
        bytes: [0; 18],
        len: 0,
    };
    let digits = (usize::BITS - len.leading_zeros()).div_ceil(4).max(1) as usize;
    for (i, byte) in head.bytes[..digits].iter_mut().enumerate() {
        let nibble = (len >> (4 * (digits - 1 - i))) & 0xf;
        *byte = b"0123456789abcdef"[nibble];
    }
    head.bytes[digits..digits + 2].copy_from_slice(b"\r\n");
    head.len = digits + 2;
    head
}

/// What [`chunk_head`] returns.
#[derive(Clone, Copy, Debug)]
pub struct ChunkHead {
    bytes: [u8; 18],
    len: usize,
}

impl AsRef<[u8]> for ChunkHead {
    fn as_ref(&self) -> &[u8] {
        &self.bytes[..self.len]
    }
}

/// Writes all of `parts`, vectored; fails when the client accepts no bytes for `timeout`. A
/// client that keeps up costs no timer: one runs only while a write is blocked.
///
/// # Errors
/// The socket's error; `TimedOut` when no bytes were accepted for `timeout`.
pub async fn write_all<S: AsyncWrite + Unpin>(
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
#[derive(Debug)]
pub struct Stall {
    timeout: Duration,
    /// Running while writes are blocked.
    stalled: Option<Pin<Box<Sleep>>>,
}

impl Stall {
    /// Writes that fail once blocked for `timeout`.
    pub fn new(timeout: Duration) -> Self {
        Self {
            timeout,
            stalled: None,
        }
    }

    /// Passes a write's outcome through, failing it once writes have been blocked too long.
    pub fn timed<T>(
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunk_heads_are_the_size_in_lowercase_hex() {
        for len in [0, 1, 9, 10, 15, 16, 255, 4096, 16_384, 0xabcdef, usize::MAX] {
            assert_eq!(
                chunk_head(len).as_ref(),
                format!("{len:x}\r\n").as_bytes(),
                "{len}"
            );
        }
    }

    #[tokio::test]
    async fn a_shared_socket_reads_writes_and_shuts_down_like_its_stream() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut client = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let mut shared = SharedTcp::new(listener.accept().await.unwrap().0);
        let other = shared.clone();
        client.write_all(b"ping").await.unwrap();
        let mut buf = [0u8; 4];
        shared.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"ping");
        write_all(
            &mut shared,
            &mut [IoSlice::new(b"po")],
            Duration::from_secs(1),
        )
        .await
        .unwrap();
        assert_eq!(other.try_write(b"ng").unwrap(), 2);
        shared.shutdown().await.unwrap();
        let mut got = Vec::new();
        client.read_to_end(&mut got).await.unwrap();
        assert_eq!(got, b"pong");
    }
}
