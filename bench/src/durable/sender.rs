//! One producer's end of a peer: the batch bodies, viewtape's ingest connection and the
//! reading of its answer, and the [`Sender`] that sends a batch and awaits its durable ack.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use anyhow::{anyhow, bail, ensure, Context as _};
use async_nats::jetstream;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;
use viewtape_tests::feed::{price_of, tick};
use viewtape_tests::http::{self, ChunkedDecoder};

use super::IO_TIMEOUT;

/// A batch the ticker skipped (`--runtimes shared`) is sent again at most this often.
const MAX_RESENDS: u64 = 1000;

/// One batch body: `k` ticks of symbol `P<producer>` with `seq`s `first..first + k`.
fn ticks(producer: usize, first: u64, k: usize) -> String {
    let symbol = format!("P{producer}");
    let mut body = String::with_capacity(k * 48);
    for seq in first..first + k as u64 {
        body.push_str(&tick(&symbol, price_of(seq), seq));
    }
    body
}

/// What a viewtape 200 says.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct IngestAck {
    /// `events.prices` (0 when absent: nothing published).
    pub(crate) events: u64,
    /// `gaps.len()`.
    pub(crate) gaps: u64,
    /// `durability == "fsync"`.
    pub(crate) fsync: bool,
}

pub(crate) fn parse_ingest_ack(body: &[u8]) -> anyhow::Result<IngestAck> {
    let value: serde_json::Value = serde_json::from_slice(body).with_context(|| {
        format!(
            "ingest answer is not JSON: {:.300}",
            String::from_utf8_lossy(body)
        )
    })?;
    Ok(IngestAck {
        events: value["events"]["prices"].as_u64().unwrap_or(0),
        gaps: value["gaps"].as_array().map_or(0, |g| g.len() as u64),
        fsync: value["durability"].as_str() == Some("fsync"),
    })
}

/// A keep-alive HTTP/1.1 connection whose write and read are separate steps, so a request
/// can be written under the `seq` lock and its answer awaited outside it (also used by
/// [`crate::deploy`]).
#[derive(Debug)]
pub(crate) struct IngestConn {
    addr: SocketAddr,
    stream: TcpStream,
    buf: Vec<u8>,
}

impl IngestConn {
    pub(crate) async fn connect(addr: SocketAddr) -> anyhow::Result<Self> {
        Ok(Self {
            addr,
            stream: http::connect(addr).await?,
            buf: Vec::new(),
        })
    }

    pub(crate) async fn write(&mut self, path: &str, body: &[u8]) -> anyhow::Result<()> {
        let req = http::encode_request(self.addr, "POST", path, &[], body, true);
        tokio::time::timeout(IO_TIMEOUT, self.stream.write_all(&req))
            .await
            .context("ingest write timed out")?
            .context("ingest write")
    }

    async fn fill(&mut self) -> anyhow::Result<()> {
        self.buf.reserve(4096);
        let n = tokio::time::timeout(IO_TIMEOUT, self.stream.read_buf(&mut self.buf))
            .await
            .map_err(|_| anyhow!("no ingest answer within {IO_TIMEOUT:?}"))?
            .context("ingest read")?;
        ensure!(n > 0, "the server closed the ingest connection");
        Ok(())
    }

    /// Reads one response: status and body (`Content-Length` or chunked).
    pub(crate) async fn read(&mut self) -> anyhow::Result<(u16, Vec<u8>)> {
        let head = loop {
            if let Some((head, len)) = http::parse_head(&self.buf)? {
                self.buf.drain(..len);
                break head;
            }
            self.fill().await?;
        };
        let chunked = head
            .header("transfer-encoding")
            .is_some_and(|te| te.to_ascii_lowercase().contains("chunked"));
        let mut body = Vec::new();
        if chunked {
            let mut decoder = ChunkedDecoder::default();
            while !decoder.decode(&mut self.buf, &mut body)? {
                ensure!(body.len() < 1 << 20, "ingest answer over 1 MiB");
                self.fill().await?;
            }
        } else {
            let len: usize = head
                .header("content-length")
                .ok_or_else(|| anyhow!("ingest answer without Content-Length or chunked"))?
                .trim()
                .parse()
                .context("bad Content-Length")?;
            ensure!(len < 1 << 20, "ingest answer of {len} bytes");
            while self.buf.len() < len {
                self.fill().await?;
            }
            body.extend(self.buf.drain(..len));
        }
        Ok((head.status, body))
    }
}

/// What one acknowledged batch cost.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Ack {
    /// Times the batch was sent again after the ticker skipped it.
    pub(super) resent: u64,
    /// Gaps the server reported on the way.
    pub(super) gaps: u64,
    /// The final 200 said `durability: fsync` (JetStream: always, it was checked at start).
    pub(super) fsync: bool,
}

/// Where a viewtape producer's `seq`s come from.
#[derive(Debug, Clone)]
pub(super) enum SeqSource {
    /// Its own runtime's: the next `seq` (one producer at a time per runtime).
    Own(Arc<AtomicU64>),
    /// `demo`'s, shared by every producer: the highest `seq` handed out, locked across the
    /// request write.
    Shared(Arc<tokio::sync::Mutex<u64>>),
}

/// One producer's end of a peer.
pub(super) enum Sender {
    Viewtape {
        conn: IngestConn,
        path: String,
        seq: SeqSource,
    },
    JetStream {
        js: jetstream::Context,
        seq: Arc<AtomicU64>,
    },
}

impl Sender {
    /// Sends one batch of `k` events and waits for its durable ack.
    pub(super) async fn send(&mut self, producer: usize, k: usize) -> anyhow::Result<Ack> {
        match self {
            Self::Viewtape { conn, path, seq } => {
                let mut ack = Ack::default();
                loop {
                    match seq {
                        SeqSource::Own(next) => {
                            let first = next.fetch_add(k as u64, Ordering::Relaxed);
                            conn.write(path, ticks(producer, first, k).as_bytes())
                                .await?;
                        }
                        SeqSource::Shared(last) => {
                            let mut last = last.lock().await;
                            let first = *last + 1;
                            *last += k as u64;
                            conn.write(path, ticks(producer, first, k).as_bytes())
                                .await?;
                        }
                    }
                    let (status, body) = conn.read().await?;
                    if status != 200 {
                        bail!(
                            "POST {path}: status {status}: {:.300}",
                            String::from_utf8_lossy(&body)
                        );
                    }
                    let answer = parse_ingest_ack(&body)?;
                    ack.gaps += answer.gaps;
                    if answer.events == k as u64 {
                        ack.fsync = answer.fsync;
                        return Ok(ack);
                    }
                    ensure!(
                        answer.events == 0 && matches!(seq, SeqSource::Shared(_)),
                        "POST {path}: the ticker took {} of {k} events of a batch (does the \
                         runtime already hold higher seqs? use a fresh server)",
                        answer.events
                    );
                    ack.resent += 1;
                    ensure!(
                        ack.resent <= MAX_RESENDS,
                        "a batch was skipped {MAX_RESENDS} times (does the demo runtime \
                         already hold higher seqs? use a fresh server)"
                    );
                }
            }
            Self::JetStream { js, seq } => {
                let first = seq.fetch_add(k as u64, Ordering::Relaxed);
                let body = bytes::Bytes::from(ticks(producer, first, k));
                crate::jetstream::publish(js, body).await?;
                Ok(Ack {
                    fsync: true,
                    ..Ack::default()
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_and_acks() {
        let body = ticks(3, 41, 2);
        assert_eq!(
            body,
            "{\"symbol\":\"P3\",\"price\":11.25,\"seq\":41}\n{\"symbol\":\"P3\",\"price\":11.5,\"seq\":42}\n"
        );
        assert_eq!(
            parse_ingest_ack(br#"{"events":{"prices":2},"gaps":[]}"#).unwrap(),
            IngestAck {
                events: 2,
                gaps: 0,
                fsync: false
            }
        );
        assert_eq!(
            parse_ingest_ack(
                br#"{"events":{"prices":1},"gaps":["x"],"position":7,"durability":"fsync"}"#
            )
            .unwrap(),
            IngestAck {
                events: 1,
                gaps: 1,
                fsync: true
            }
        );
        assert_eq!(
            parse_ingest_ack(br#"{"events":{},"gaps":[]}"#)
                .unwrap()
                .events,
            0
        );
        assert!(parse_ingest_ack(b"nope").is_err());
    }
}
