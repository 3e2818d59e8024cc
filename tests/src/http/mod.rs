//! A minimal HTTP/1.1 client over tokio TCP, for loopback only.
//!
//! Small on purpose: the bench opens thousands of these, and the tests need a timeout on every
//! read so a broken server fails a test instead of hanging it. It speaks what the server speaks:
//! one request per connection for [`request`] (`Connection: close`), keep-alive for
//! [`HttpConn`], and response bodies framed by `Content-Length`, `chunked`, or the end of the
//! connection.
//!
//! | file | job |
//! |---|---|
//! | this one | connecting (loopback only), reading a response, [`request`], [`HttpConn`] |
//! | `wire` | the response [`Head`] and its framing, [`ChunkedDecoder`], [`encode_request`] |
//! | `error_body` | the error bodies collected from every test, and what may not be in them |

mod error_body;
mod wire;

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{anyhow, bail, Context as _};
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};
use tokio::net::TcpStream;

pub use error_body::{error_bodies_dir, error_body_problem, record_error_body};
pub(crate) use wire::Framing;
pub use wire::{encode_request, parse_head, ChunkedDecoder, Head, Response};

/// How long any single read or connect may take before the call fails: generous, as it only
/// bounds a failure — a debug build on a loaded 2-core machine took 9.5 s to answer a 1 MiB
/// batch of 22,000 ticks (under the server's own 30 s request timeout).
pub const READ_TIMEOUT: Duration = Duration::from_secs(25);

/// Bodies larger than this are refused by [`request`] (a state dump in a test is far smaller).
const MAX_BODY: usize = 64 * 1024 * 1024;

/// Refuses any address outside loopback: the harness and the bench only ever talk to a server
/// on this machine.
///
/// # Errors
/// When `addr` is not a loopback address.
pub fn ensure_loopback(addr: SocketAddr) -> anyhow::Result<()> {
    if !addr.ip().is_loopback() {
        bail!("{addr} is not a loopback address; this tool only targets 127.0.0.0/8 or ::1");
    }
    Ok(())
}

/// Connects with a timeout (loopback only).
///
/// # Errors
/// On a non-loopback address, refusal or timeout.
pub async fn connect(addr: SocketAddr) -> anyhow::Result<TcpStream> {
    ensure_loopback(addr)?;
    let stream = tokio::time::timeout(READ_TIMEOUT, TcpStream::connect(addr))
        .await
        .with_context(|| format!("connect to {addr} timed out"))?
        .with_context(|| format!("connect to {addr}"))?;
    stream.set_nodelay(true)?;
    Ok(stream)
}

/// Connects with a small kernel receive buffer (`SO_RCVBUF`), so a client that stops reading
/// pushes back on the server quickly (the slow-consumer test).
///
/// # Errors
/// See [`connect`].
pub async fn connect_with_recv_buffer(addr: SocketAddr, bytes: u32) -> anyhow::Result<TcpStream> {
    ensure_loopback(addr)?;
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    socket.set_recv_buffer_size(bytes)?;
    let stream = tokio::time::timeout(READ_TIMEOUT, socket.connect(addr))
        .await
        .with_context(|| format!("connect to {addr} timed out"))?
        .with_context(|| format!("connect to {addr}"))?;
    stream.set_nodelay(true)?;
    Ok(stream)
}

/// Reads once into `buf` with `timeout`; returns the byte count (0 at EOF).
pub(crate) async fn read_some<S: AsyncRead + Unpin>(
    stream: &mut S,
    buf: &mut Vec<u8>,
    timeout: Duration,
) -> anyhow::Result<usize> {
    let len = buf.len();
    buf.reserve(16 * 1024);
    let n = tokio::time::timeout(timeout, stream.read_buf(buf))
        .await
        .map_err(|_| anyhow!("no data from the server within {timeout:?}"))?
        .context("read")?;
    debug_assert_eq!(buf.len(), len + n);
    Ok(n)
}

/// Reads a response head; leftover body bytes stay in `buf`.
pub(crate) async fn read_head<S: AsyncRead + Unpin>(
    stream: &mut S,
    buf: &mut Vec<u8>,
) -> anyhow::Result<Head> {
    loop {
        if let Some((head, len)) = parse_head(buf)? {
            buf.drain(..len);
            return Ok(head);
        }
        if read_some(stream, buf, READ_TIMEOUT).await? == 0 {
            bail!("connection closed before the response head");
        }
    }
}

/// Reads a whole body framed per `head`; leftover bytes (a pipelined response) stay in `buf`.
async fn read_body<S: AsyncRead + Unpin>(
    stream: &mut S,
    head: &Head,
    buf: &mut Vec<u8>,
) -> anyhow::Result<Vec<u8>> {
    let mut body = Vec::new();
    match head.framing()? {
        Framing::Length(len) => {
            let len = usize::try_from(len).context("body too long")?;
            if len > MAX_BODY {
                bail!("body of {len} bytes is over {MAX_BODY}");
            }
            while buf.len() < len {
                if read_some(stream, buf, READ_TIMEOUT).await? == 0 {
                    bail!("connection closed inside the body");
                }
            }
            body.extend(buf.drain(..len));
        }
        Framing::Chunked(mut decoder) => loop {
            if decoder.decode(buf, &mut body)? {
                break;
            }
            if body.len() > MAX_BODY {
                bail!("body over {MAX_BODY} bytes");
            }
            if read_some(stream, buf, READ_TIMEOUT).await? == 0 {
                bail!("connection closed inside a chunked body");
            }
        },
        Framing::UntilClose => loop {
            body.append(buf);
            if body.len() > MAX_BODY {
                bail!("body over {MAX_BODY} bytes");
            }
            if read_some(stream, buf, READ_TIMEOUT).await? == 0 {
                break;
            }
        },
    }
    Ok(body)
}

/// One request on a fresh connection (`Connection: close`), every read bounded by
/// [`READ_TIMEOUT`].
///
/// # Errors
/// On connection, timeout or framing errors (not on HTTP error statuses).
pub async fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> anyhow::Result<Response> {
    let mut stream = connect(addr).await?;
    let req = encode_request(addr, method, path, headers, body, false);
    tokio::time::timeout(READ_TIMEOUT, stream.write_all(&req))
        .await
        .context("write timed out")?
        .context("write request")?;
    let mut buf = Vec::new();
    let head = read_head(&mut stream, &mut buf).await?;
    let body = if method == "HEAD" || head.status == 204 || head.status == 304 {
        Vec::new()
    } else {
        read_body(&mut stream, &head, &mut buf).await?
    };
    // A `HEAD` answer has no body, by the protocol.
    if method != "HEAD" {
        record_error_body(head.status, &body);
    }
    Ok(Response { head, body })
}

/// A keep-alive connection for many sequential requests (the bench's publisher): over TCP, or
/// over any byte stream to `addr` the caller opened (TLS, for the bench).
#[derive(Debug)]
pub struct HttpConn<S = TcpStream> {
    addr: SocketAddr,
    stream: S,
    buf: Vec<u8>,
}

impl HttpConn {
    /// Connects (loopback only).
    ///
    /// # Errors
    /// See [`connect`].
    pub async fn connect(addr: SocketAddr) -> anyhow::Result<Self> {
        Ok(Self::on(addr, connect(addr).await?))
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> HttpConn<S> {
    /// Requests go over `stream`, already connected to `addr` (its `Host`).
    pub fn on(addr: SocketAddr, stream: S) -> Self {
        Self {
            addr,
            stream,
            buf: Vec::new(),
        }
    }

    /// Sends one request and reads its response.
    ///
    /// # Errors
    /// On I/O, timeout or framing errors, or when the server closed the connection.
    pub async fn send(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> anyhow::Result<Response> {
        let req = encode_request(self.addr, method, path, headers, body, true);
        tokio::time::timeout(READ_TIMEOUT, self.stream.write_all(&req))
            .await
            .context("write timed out")?
            .context("write request")?;
        let head = read_head(&mut self.stream, &mut self.buf).await?;
        let body = read_body(&mut self.stream, &head, &mut self.buf).await?;
        record_error_body(head.status, &body);
        Ok(Response { head, body })
    }
}

/// Reads from `stream` until the server closes it (EOF or reset; whatever it sends before, a
/// TLS alert say, is read and dropped), at most `within`; how long that took.
///
/// # Errors
/// When it is still open after `within`.
pub async fn closed_within<S: AsyncRead + Unpin>(
    stream: &mut S,
    within: Duration,
) -> anyhow::Result<Duration> {
    let started = std::time::Instant::now();
    let mut buf = [0u8; 4096];
    loop {
        match tokio::time::timeout_at((started + within).into(), stream.read(&mut buf)).await {
            Err(_) => bail!("the server did not close the connection within {within:?}"),
            Ok(Ok(0) | Err(_)) => return Ok(started.elapsed()),
            Ok(Ok(_)) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_loopback() {
        assert!(ensure_loopback("127.0.0.1:1".parse().unwrap()).is_ok());
        assert!(ensure_loopback("[::1]:1".parse().unwrap()).is_ok());
        assert!(ensure_loopback("10.0.0.1:1".parse().unwrap()).is_err());
    }
}
