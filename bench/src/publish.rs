//! Publishing into the target: viewtape ingest (NDJSON ticks in batches, one request per batch)
//! or nchan's publisher endpoint (one `POST /pub/prices` per message, body = the tick; nchan has
//! no batch publish, so its messages are spread over several keep-alive connections). Over TLS
//! (`--tls`) when the server has it, always HTTP/1.1.

use std::net::SocketAddr;

use anyhow::{bail, Context as _};
use clap::Args;
use tokio::task::JoinSet;
use viewtape_tests::{http::HttpConn, Feed};

use crate::cli::usize_in;
use crate::target::{Peer, Target};
use crate::transport::Conn;

/// Ticks per viewtape ingest request (~50 B each, well under the 1 MiB body limit).
pub const INGEST_BATCH: usize = 5_000;

/// How many publish connections (`fanout`, `replay`).
#[derive(Debug, Args)]
pub struct PublishOptions {
    /// Keep-alive publish connections for nchan, which takes one message per request (1..=64;
    /// viewtape ingests each tick's events as one NDJSON batch on one connection)
    #[arg(long, default_value_t = 8, value_parser = usize_in(1..=64))]
    pub publishers: usize,
}

/// Publishes ticks of a [`Feed`] into the target.
#[derive(Debug)]
pub struct Publisher {
    peer: Peer,
    addr: SocketAddr,
    conns: Vec<HttpConn<Conn>>,
    /// nchan: the newest message id a publish response reported.
    last_id: Option<String>,
}

impl Publisher {
    /// Opens `connections` keep-alive connections (viewtape uses the first only).
    ///
    /// # Errors
    /// On connection errors.
    pub async fn connect(target: &Target, connections: usize) -> anyhow::Result<Self> {
        let n = match target.peer {
            Peer::Viewtape => 1,
            Peer::Nchan => connections.max(1),
        };
        let mut conns = Vec::with_capacity(n);
        for _ in 0..n {
            conns.push(HttpConn::on(target.addr, target.dialer.connect().await?));
        }
        Ok(Self {
            peer: target.peer,
            addr: target.addr,
            conns,
            last_id: None,
        })
    }

    /// Publishes the next `n` ticks of `feed`; returns the number of HTTP requests it took.
    ///
    /// # Errors
    /// On I/O errors or a non-2xx status.
    pub async fn publish(&mut self, feed: &mut Feed, n: usize) -> anyhow::Result<u64> {
        match self.peer {
            Peer::Viewtape => {
                let mut left = n;
                let mut requests = 0;
                while left > 0 {
                    let take = left.min(INGEST_BATCH);
                    ingest_batch(&mut self.conns[0], &feed.batch(take)).await?;
                    left -= take;
                    requests += 1;
                }
                Ok(requests)
            }
            Peer::Nchan => {
                let lines: Vec<String> =
                    (0..n).map(|_| feed.line().trim_end().to_owned()).collect();
                self.publish_nchan(lines).await?;
                Ok(n as u64)
            }
        }
    }

    async fn publish_nchan(&mut self, lines: Vec<String>) -> anyhow::Result<()> {
        if lines.len() <= 1 || self.conns.len() == 1 {
            for line in &lines {
                let id = nchan_post(&mut self.conns[0], line).await?;
                self.note_id(id);
            }
            return Ok(());
        }
        // Spread over the connections; each task takes its connection and gives it back.
        let per = lines.len().div_ceil(self.conns.len());
        let mut chunks = lines.chunks(per).map(<[String]>::to_vec);
        let mut tasks = JoinSet::new();
        for mut conn in self.conns.drain(..) {
            let chunk = chunks.next().unwrap_or_default();
            tasks.spawn(async move {
                let mut newest = None;
                for line in &chunk {
                    match nchan_post(&mut conn, line).await {
                        Ok(id) => newest = newer(newest, id),
                        Err(e) => return (conn, Err(e)),
                    }
                }
                (conn, Ok(newest))
            });
        }
        let mut first_error = None;
        while let Some(done) = tasks.join_next().await {
            let (conn, result) = done.context("publisher task")?;
            self.conns.push(conn);
            match result {
                Ok(id) => self.note_id(id),
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    fn note_id(&mut self, id: Option<String>) {
        self.last_id = newer(self.last_id.take(), id);
    }

    /// The id subscribers resume after to start at the head (nothing replayed): viewtape's
    /// newest cursor, read from the tape, or the newest id nchan reported for our publishes.
    /// Publish at least one event first.
    ///
    /// # Errors
    /// On an empty tape / nothing published yet.
    pub async fn head_id(&self, target: &Target) -> anyhow::Result<String> {
        match self.peer {
            Peer::Viewtape => Ok(target.head_cursor().await?.to_string()),
            Peer::Nchan => self
                .last_id
                .clone()
                .with_context(|| format!("nothing published to nchan at {} yet", self.addr)),
        }
    }
}

/// One ingest into `demo` on a keep-alive connection; anything but 200 is an error.
pub(crate) async fn ingest_batch(conn: &mut HttpConn<Conn>, body: &str) -> anyhow::Result<()> {
    let resp = conn
        .send("POST", "/runtimes/demo/ingest", &[], body.as_bytes())
        .await
        .context("ingest")?;
    if resp.status() != 200 {
        bail!("ingest: status {}: {}", resp.status(), resp.text());
    }
    Ok(())
}

/// One message to nchan's publisher; returns the message id it reports.
async fn nchan_post(conn: &mut HttpConn<Conn>, body: &str) -> anyhow::Result<Option<String>> {
    let resp = conn
        .send(
            "POST",
            "/pub/prices",
            &[("Accept", "application/json")],
            body.as_bytes(),
        )
        .await
        .context("nchan publish")?;
    if !(200..300).contains(&resp.status()) {
        bail!("nchan publish: status {}: {}", resp.status(), resp.text());
    }
    Ok(nchan_last_id(&resp.text()))
}

/// `"last_message_id": "1795947521:3"` from nchan's JSON channel info.
fn nchan_last_id(info: &str) -> Option<String> {
    let at = info.find("\"last_message_id\"")? + "\"last_message_id\"".len();
    let rest = info[at..].trim_start().strip_prefix(':')?.trim_start();
    let rest = rest.strip_prefix('"')?;
    Some(rest[..rest.find('"')?].to_owned())
}

/// The later of two nchan ids `<time>:<tag>` (compared numerically).
fn newer(a: Option<String>, b: Option<String>) -> Option<String> {
    fn key(id: &str) -> (u64, u64) {
        let (time, tag) = id.split_once(':').unwrap_or((id, "0"));
        (time.parse().unwrap_or(0), tag.parse().unwrap_or(0))
    }
    match (a, b) {
        (Some(a), Some(b)) => Some(if key(&b) >= key(&a) { b } else { a }),
        (a, b) => a.or(b),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_nchan_channel_info() {
        let info = r#"{"messages": 2, "requested": -1, "subscribers": 0, "last_message_id": "1795947518:1" }"#;
        assert_eq!(nchan_last_id(info).as_deref(), Some("1795947518:1"));
        assert_eq!(nchan_last_id("queued messages: 1"), None);
    }

    #[test]
    fn newer_ids_compare_numerically() {
        let s = |x: &str| Some(x.to_owned());
        assert_eq!(newer(s("10:9"), s("10:10")), s("10:10"));
        assert_eq!(newer(s("11:0"), s("10:99")), s("11:0"));
        assert_eq!(newer(None, s("1:0")), s("1:0"));
        assert_eq!(newer(s("1:0"), None), s("1:0"));
    }
}
