//! The JetStream peer of `durable`: a real `nats-server` ([`viewtape_tests::NatsServer`]:
//! random loopback port, JetStream on, every write fsynced, store in a temporary directory),
//! and one stream on it.
//!
//! The stream: `BENCH`, subject `bench.ticks`, file storage, 1 replica, at most 2 GiB (oldest
//! messages discarded past that, so a long run cannot fill the disk).

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{bail, Context as _};
use async_nats::jetstream;

/// The stream the bench publishes into.
pub const STREAM: &str = "BENCH";
/// Its one subject.
pub const SUBJECT: &str = "bench.ticks";
/// Largest stream size before old messages are discarded.
const MAX_STREAM_BYTES: i64 = 2 << 30;

/// Connects a client and returns its JetStream context (acks awaited up to `ack_timeout`).
///
/// # Errors
/// When the connection fails.
pub async fn connect(
    addr: SocketAddr,
    ack_timeout: Duration,
) -> anyhow::Result<jetstream::Context> {
    viewtape_tests::http::ensure_loopback(addr)?;
    let client = async_nats::ConnectOptions::new()
        .connection_timeout(Duration::from_secs(10))
        .connect(format!("nats://{addr}"))
        .await
        .with_context(|| format!("connect to nats-server at {addr}"))?;
    let mut js = jetstream::new(client);
    js.set_timeout(ack_timeout);
    Ok(js)
}

/// Creates [`STREAM`] on [`SUBJECT`]: file storage, 1 replica.
///
/// # Errors
/// When the server refuses it.
pub async fn create_stream(js: &jetstream::Context) -> anyhow::Result<()> {
    js.create_stream(jetstream::stream::Config {
        name: STREAM.to_owned(),
        subjects: vec![SUBJECT.to_owned()],
        storage: jetstream::stream::StorageType::File,
        num_replicas: 1,
        max_bytes: MAX_STREAM_BYTES,
        discard: jetstream::stream::DiscardPolicy::Old,
        ..Default::default()
    })
    .await
    .with_context(|| format!("create stream {STREAM}"))?;
    Ok(())
}

/// Publishes `body` to [`SUBJECT`] and waits for the stream's ack (stored, and with
/// `sync_interval: always`, fsynced).
///
/// # Errors
/// On a publish error, an ack timeout, or an ack from another stream / for a duplicate.
pub async fn publish(js: &jetstream::Context, body: bytes::Bytes) -> anyhow::Result<()> {
    let ack = js
        .publish(SUBJECT, body)
        .await
        .context("jetstream publish")?
        .await
        .context("jetstream publish ack")?;
    if ack.stream != STREAM || ack.duplicate {
        bail!(
            "unexpected ack: stream {:?}, duplicate {}",
            ack.stream,
            ack.duplicate
        );
    }
    Ok(())
}
