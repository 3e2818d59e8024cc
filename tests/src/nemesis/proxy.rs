//! Link proxies: one TCP proxy per (viewtape node, NATS server) pair, so the harness can break
//! one node's path to one server without touching the others.
//!
//! ## Modes
//! - [`LinkMode::Forward`]: bytes flow both ways.
//! - [`LinkMode::Blackhole`]: every connection stays open, and no byte is forwarded either way;
//!   new connections are accepted and held. This is a network that stopped delivering without
//!   saying so — the fault only timeouts and pings can see.
//! - [`LinkMode::Close`]: every connection is dropped (with a reset), and new ones are reset at
//!   once, as a refused port.
//!
//! Back to `Forward`, held connections go on where they stopped (their bytes were held, not
//! dropped): a partition that heals.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// Connections one link holds at most: a node opens one or two; more is a leak, refused.
const MAX_CONNECTIONS: usize = 64;
/// How long a connect to the NATS server behind a link may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// The bytes one direction reads before it writes them on.
const CHUNK: usize = 16 * 1024;

/// What a link does with its bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkMode {
    /// Bytes flow.
    Forward,
    /// Connections stay open; nothing flows.
    Blackhole,
    /// Connections are dropped and new ones refused.
    Close,
}

/// One proxy: listens on a loopback port of its own, forwards to `upstream`; stops when dropped.
#[derive(Debug)]
pub struct Link {
    addr: SocketAddr,
    /// Connections open now (held ones included).
    open: Arc<AtomicUsize>,
    mode: watch::Sender<LinkMode>,
    task: tokio::task::JoinHandle<()>,
}

impl Link {
    /// Listens on a free loopback port, forwarding to `upstream`.
    ///
    /// # Errors
    /// When no port can be bound.
    pub async fn start(upstream: SocketAddr) -> anyhow::Result<Self> {
        crate::http::ensure_loopback(upstream)?;
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .context("bind a link proxy")?;
        let addr = listener.local_addr()?;
        let (mode, watching) = watch::channel(LinkMode::Forward);
        let open = Arc::new(AtomicUsize::new(0));
        let task = tokio::spawn(accept_loop(listener, upstream, watching, Arc::clone(&open)));
        Ok(Self {
            addr,
            open,
            mode,
            task,
        })
    }

    /// The address a node connects to (`nats://ADDR`).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Switches the mode of every connection, held or new.
    pub fn set(&self, mode: LinkMode) {
        self.mode.send_replace(mode);
    }

    /// Connections open now: a node's NATS client holds one on the server it uses.
    pub fn connections(&self) -> usize {
        self.open.load(Ordering::Relaxed)
    }

    /// The current mode.
    pub fn mode(&self) -> LinkMode {
        *self.mode.borrow()
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        // Closes every connection too: each watches the mode channel, whose sender goes.
        self.mode.send_replace(LinkMode::Close);
        self.task.abort();
    }
}

async fn accept_loop(
    listener: TcpListener,
    upstream: SocketAddr,
    mode: watch::Receiver<LinkMode>,
    open: Arc<AtomicUsize>,
) {
    while let Ok((client, _)) = listener.accept().await {
        if *mode.borrow() == LinkMode::Close || open.load(Ordering::Relaxed) >= MAX_CONNECTIONS {
            refuse(client);
            continue;
        }
        open.fetch_add(1, Ordering::Relaxed);
        let (open, mode) = (Arc::clone(&open), mode.clone());
        tokio::spawn(async move {
            connection(client, upstream, mode).await;
            open.fetch_sub(1, Ordering::Relaxed);
        });
    }
}

/// Drops `stream` with a reset (`SO_LINGER` 0), as a refused or broken connection.
fn refuse(stream: TcpStream) {
    let _ = stream.set_zero_linger();
    drop(stream);
}

/// Waits until `mode` lets bytes through: `true` for forward, `false` once closed.
async fn passable(mode: &mut watch::Receiver<LinkMode>) -> bool {
    loop {
        match *mode.borrow_and_update() {
            LinkMode::Forward => return true,
            LinkMode::Close => return false,
            LinkMode::Blackhole => {}
        }
        if mode.changed().await.is_err() {
            return false;
        }
    }
}

/// Resolves once `mode` is [`LinkMode::Close`] (or its sender is gone).
async fn closed(mut mode: watch::Receiver<LinkMode>) {
    let _ = mode.wait_for(|m| *m == LinkMode::Close).await;
}

/// One proxied connection: held while blackholed (a connection accepted then is connected
/// upstream once it heals), dropped with a reset on close.
async fn connection(client: TcpStream, upstream: SocketAddr, mut mode: watch::Receiver<LinkMode>) {
    let closing = mode.clone();
    let session = async {
        if !passable(&mut mode).await {
            return;
        }
        let Ok(Ok(server)) =
            tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(upstream)).await
        else {
            return;
        };
        let _ = server.set_nodelay(true);
        let _ = client.set_nodelay(true);
        let (client_read, client_write) = client.into_split();
        let (server_read, server_write) = server.into_split();
        // Either direction ending ends both: NATS does not half-close.
        tokio::select! {
            () = pump(client_read, server_write, mode.clone()) => {}
            () = pump(server_read, client_write, mode.clone()) => {}
        }
    };
    tokio::select! {
        () = session => {}
        () = closed(closing) => {}
    }
}

/// Copies `from` to `to`, holding each chunk while the link is blackholed.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut mode: watch::Receiver<LinkMode>,
) {
    let mut buf = vec![0u8; CHUNK];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if !passable(&mut mode).await {
            return;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An echo server, a link in front of it, and each mode's effect on a round trip.
    #[tokio::test]
    async fn modes_forward_hold_and_close() -> anyhow::Result<()> {
        let echo = TcpListener::bind("127.0.0.1:0").await?;
        let upstream = echo.local_addr()?;
        tokio::spawn(async move {
            while let Ok((mut s, _)) = echo.accept().await {
                tokio::spawn(async move {
                    let mut buf = [0u8; 64];
                    while let Ok(n) = s.read(&mut buf).await {
                        if n == 0 || s.write_all(&buf[..n]).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        let link = Link::start(upstream).await?;
        let mut conn = TcpStream::connect(link.addr()).await?;
        let mut buf = [0u8; 4];
        conn.write_all(b"ping").await?;
        conn.read_exact(&mut buf).await?;
        assert_eq!(&buf, b"ping");

        link.set(LinkMode::Blackhole);
        conn.write_all(b"held").await?;
        let quiet = tokio::time::timeout(Duration::from_millis(200), conn.read(&mut buf)).await;
        assert!(quiet.is_err(), "nothing flows while blackholed");
        link.set(LinkMode::Forward);
        conn.read_exact(&mut buf).await?;
        assert_eq!(&buf, b"held", "held bytes flow once healed");

        link.set(LinkMode::Close);
        let n = tokio::time::timeout(Duration::from_secs(2), conn.read(&mut buf)).await?;
        assert!(matches!(n, Ok(0) | Err(_)), "closed: {n:?}");
        let mut fresh = TcpStream::connect(link.addr()).await?;
        let n = tokio::time::timeout(Duration::from_secs(2), fresh.read(&mut buf)).await?;
        assert!(matches!(n, Ok(0) | Err(_)), "refused: {n:?}");
        Ok(())
    }
}
