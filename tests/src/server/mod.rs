//! Spawning the real `viewtape` binary.
//!
//! ## Finding the binary
//! `$VIEWTAPE_BIN` when set; otherwise `viewtape` in the profile directory of the running
//! executable (`target/debug/deps/foo-…` → `target/debug/viewtape`). Once per process the
//! harness runs `cargo build -p viewtape-server --bin viewtape` (with `--release` from a release
//! profile) so tests never run a stale server; set `VIEWTAPE_NO_BUILD=1` to skip that (the
//! binary must then exist).
//!
//! ## Lifecycle
//! [`Server::start`] adds `--listen 127.0.0.1:0`, a temporary `--data-dir` and
//! `--demo-rate 0` unless the caller passed them, waits (≤ 60 s) for the first stdout line
//! `viewtape listening on http://127.0.0.1:PORT/` (`https://` with TLS), and keeps draining stdout and stderr so the
//! child never blocks on a full pipe. The last 64 KiB of stderr is kept and printed when a test
//! panics with the server alive. Dropping a [`Server`] kills the child (SIGKILL).
//! [`Server::stop_graceful`] sends SIGTERM and waits for the exit status;
//! [`Server::restart`] starts the same arguments again on the same data directory.
//!
//! | file | job |
//! |---|---|
//! | this one | [`Server`]: its start, the listening line, stop, kill, restart |
//! | `requests` | requests to it: `GET`, `POST`, `/metrics`, `/readyz`, ingest, SSE |
//! | `binary` | finding or building the binary, [`cli`] runs, [`guest_wasm`], [`config_file`] |

mod binary;
mod requests;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{anyhow, bail, Context as _};
use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _, BufReader};
use tokio::process::{Child, ChildStderr, Command};

use crate::http;

pub use binary::{
    binary, cli, code_cache_dir, config_file, guest_wasm, js_counter, run_guest,
    with_custom_section, CACHE_DIR_VAR,
};

/// How long the server may take to print its listening line.
pub const START_TIMEOUT: Duration = Duration::from_secs(60);

/// How long a graceful stop may take before it counts as a failure.
pub const STOP_TIMEOUT: Duration = Duration::from_secs(30);

/// How much of the server's stderr is kept for failure reports.
const LOG_TAIL: usize = 64 * 1024;

/// The server's admin token variable; never inherited from the test runner (see
/// [`Server::start_with_env`]).
pub const ADMIN_TOKEN_ENV: &str = "VIEWTAPE_ADMIN_TOKEN";

/// The line prefix the server prints first on stdout, then `http://` or (with TLS) `https://`.
const LISTENING_PREFIX: &str = "viewtape listening on ";

/// The data directory: a temporary one owned by the harness, or the caller's.
#[derive(Debug, Clone)]
enum DataDir {
    Temp(Arc<tempfile::TempDir>),
    Given(PathBuf),
}

impl DataDir {
    fn path(&self) -> &Path {
        match self {
            Self::Temp(dir) => dir.path(),
            Self::Given(path) => path,
        }
    }
}

/// A running `viewtape serve`.
#[derive(Debug)]
pub struct Server {
    child: Option<Child>,
    pid: u32,
    addr: SocketAddr,
    /// `http`, or `https` when the server serves TLS (from its listening line).
    scheme: &'static str,
    data_dir: DataDir,
    /// The caller's arguments (without the harness's defaults).
    args: Vec<String>,
    /// Extra environment for the server process, kept across restarts.
    env: Vec<(String, String)>,
    logs: Arc<Mutex<Vec<u8>>>,
}

fn has_flag(args: &[String], flag: &str) -> bool {
    args.iter()
        .any(|a| a == flag || a.starts_with(&format!("{flag}=")))
}

/// Parses the listening line into a loopback address.
///
/// # Errors
/// When the line is not `viewtape listening on http://HOST:PORT/` (or `https://`) with a
/// loopback host.
pub fn parse_listening_line(line: &str) -> anyhow::Result<SocketAddr> {
    let rest = line
        .trim_end()
        .strip_prefix(LISTENING_PREFIX)
        .and_then(|rest| {
            rest.strip_prefix("http://")
                .or_else(|| rest.strip_prefix("https://"))
        })
        .ok_or_else(|| anyhow!("first stdout line is not the listening line: {line:?}"))?;
    let hostport = rest.strip_suffix('/').unwrap_or(rest);
    let addr: SocketAddr = hostport
        .parse()
        .with_context(|| format!("bad address in {line:?}"))?;
    http::ensure_loopback(addr)?;
    Ok(addr)
}

/// The scheme of a listening line: `"https"` when the server serves TLS, else `"http"`.
pub fn listening_scheme(line: &str) -> &'static str {
    match line.strip_prefix(LISTENING_PREFIX) {
        Some(rest) if rest.starts_with("https://") => "https",
        _ => "http",
    }
}

/// `serve` and the caller's `args`, plus the harness defaults the caller did not pass: a free
/// loopback port, `data_dir`, no demo feed.
fn serve_args(args: &[String], data_dir: &DataDir) -> Vec<String> {
    let mut full = vec!["serve".to_owned()];
    full.extend(args.iter().cloned());
    if !has_flag(args, "--listen") {
        full.extend(["--listen".into(), "127.0.0.1:0".into()]);
    }
    if !has_flag(args, "--data-dir") {
        full.extend(["--data-dir".into(), data_dir.path().display().to_string()]);
    }
    if !has_flag(args, "--demo-rate") {
        full.extend(["--demo-rate".into(), "0".into()]);
    }
    full
}

/// Drains the server's stderr into `logs`, keeping about the last [`LOG_TAIL`] bytes, so the
/// child never blocks on a full pipe.
fn keep_stderr_tail(mut stderr: ChildStderr, logs: Arc<Mutex<Vec<u8>>>) {
    tokio::spawn(async move {
        let mut buf = [0u8; 8192];
        while let Ok(n) = stderr.read(&mut buf).await {
            if n == 0 {
                break;
            }
            if let Ok(mut logs) = logs.lock() {
                logs.extend_from_slice(&buf[..n]);
                let len = logs.len();
                if len > LOG_TAIL * 2 {
                    logs.drain(..len - LOG_TAIL);
                }
            }
        }
    });
}

impl Server {
    /// Starts `viewtape serve` with `args` plus the harness defaults.
    ///
    /// # Errors
    /// When the binary is missing, exits early, or does not print the listening line in time.
    pub async fn start(args: &[&str]) -> anyhow::Result<Self> {
        Self::start_with_env(args, &[]).await
    }

    /// Starts like [`Server::start`], with extra environment variables for the server process
    /// (e.g. [`ADMIN_TOKEN_ENV`]); they are kept for [`Server::restart`].
    ///
    /// # Errors
    /// See [`Server::start`].
    pub async fn start_with_env(args: &[&str], env: &[(&str, &str)]) -> anyhow::Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("viewtape-test-")
            .tempdir()
            .context("temp data dir")?;
        Self::spawn(
            DataDir::Temp(Arc::new(dir)),
            args.iter().map(|s| (*s).to_owned()).collect(),
            env.iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        )
        .await
    }

    /// Starts with a caller-owned data directory.
    ///
    /// # Errors
    /// See [`Server::start`].
    pub async fn start_in(data_dir: &Path, args: &[&str]) -> anyhow::Result<Self> {
        Self::spawn(
            DataDir::Given(data_dir.to_owned()),
            args.iter().map(|s| (*s).to_owned()).collect(),
            Vec::new(),
        )
        .await
    }

    async fn spawn(
        data_dir: DataDir,
        args: Vec<String>,
        env: Vec<(String, String)>,
    ) -> anyhow::Result<Self> {
        let bin = binary().await?;
        let full = serve_args(&args, &data_dir);
        let mut child = Command::new(&bin)
            .args(&full)
            .env(
                "RUST_LOG",
                std::env::var("RUST_LOG").unwrap_or_else(|_| "info".into()),
            )
            // Admin routes are opt-in per test, whatever the test runner's environment says.
            .env_remove(ADMIN_TOKEN_ENV)
            // Every test's server shares one code cache (each data directory would have its
            // own, and compile the JS engine again), unless the runner names one.
            .env(CACHE_DIR_VAR, code_cache_dir(&bin))
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("spawn {}", bin.display()))?;
        let pid = child.id().ok_or_else(|| anyhow!("child has no pid"))?;

        let logs = Arc::new(Mutex::new(Vec::new()));
        if let Some(stderr) = child.stderr.take() {
            keep_stderr_tail(stderr, Arc::clone(&logs));
        }
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| anyhow!("no stdout pipe"))?;
        let mut lines = BufReader::new(stdout).lines();
        let first = tokio::time::timeout(START_TIMEOUT, lines.next_line()).await;
        let mut server = Self {
            child: Some(child),
            pid,
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            scheme: "http",
            data_dir,
            args,
            env,
            logs,
        };
        let line = match first {
            Ok(Ok(Some(line))) => line,
            Ok(Ok(None)) => {
                let status = server.wait_exit(Duration::from_secs(5)).await.ok();
                bail!(
                    "{} {full:?} closed stdout before the listening line (exit {status:?}); stderr:\n{}",
                    bin.display(),
                    server.logs()
                )
            }
            Ok(Err(e)) => bail!("reading server stdout: {e}"),
            Err(_) => bail!(
                "no listening line within {START_TIMEOUT:?}; stderr:\n{}",
                server.logs()
            ),
        };
        server.addr = parse_listening_line(&line)
            .with_context(|| format!("stderr so far:\n{}", server.logs()))?;
        server.scheme = listening_scheme(&line);
        // Keep draining stdout so the server never blocks writing to it.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        server.start_logs_read().await;
        Ok(server)
    }

    /// Waits until stderr has been read up to the line the server logs once it serves, so
    /// [`Server::logs`] holds every line of its start: stdout (the listening line) and stderr
    /// are two pipes read apart. Bounded, and quiet when `RUST_LOG` filters that line out.
    async fn start_logs_read(&self) {
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while !self.logs().contains("viewtape serving") && std::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// The address it listens on (loopback).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `"http"`, or `"https"` when it serves TLS (`[server] tls_cert`): then [`Server::get`],
    /// [`Server::metric`] and the other plain-HTTP helpers cannot reach it.
    pub fn scheme(&self) -> &'static str {
        self.scheme
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// The data directory.
    pub fn data_dir(&self) -> &Path {
        self.data_dir.path()
    }

    /// The tail of the server's stderr.
    pub fn logs(&self) -> String {
        self.logs
            .lock()
            .map(|l| String::from_utf8_lossy(&l).into_owned())
            .unwrap_or_default()
    }

    fn signal(&self, signal: libc::c_int) -> anyhow::Result<()> {
        if self.child.is_none() {
            bail!("the server is not running");
        }
        let pid = libc::pid_t::try_from(self.pid).context("pid out of range")?;
        // SAFETY: kill(2) with a pid we spawned and have not reaped (the child is still owned
        // by `self.child`, so the pid cannot have been reused).
        let rc = unsafe { libc::kill(pid, signal) };
        if rc != 0 {
            bail!("kill({pid}, {signal}): {}", std::io::Error::last_os_error());
        }
        Ok(())
    }

    /// SIGTERM, without waiting: the test watches the stop (see [`Server::wait_exit`]).
    ///
    /// # Errors
    /// When the server is not running or the signal fails.
    pub fn terminate(&self) -> anyhow::Result<()> {
        self.signal(libc::SIGTERM)
    }

    /// Waits, at most `timeout`, for the server to exit; its status.
    ///
    /// # Errors
    /// When it is not running or still runs after `timeout`.
    pub async fn wait_exit(&mut self, timeout: Duration) -> anyhow::Result<ExitStatus> {
        let child = self
            .child
            .as_mut()
            .ok_or_else(|| anyhow!("the server is not running"))?;
        let status = tokio::time::timeout(timeout, child.wait())
            .await
            .map_err(|_| anyhow!("the server did not exit within {timeout:?}"))?
            .context("wait")?;
        self.child = None;
        Ok(status)
    }

    /// SIGHUP: the server reads its TLS certificate and key and its auth key file again (in the
    /// background; its log says when).
    ///
    /// # Errors
    /// When the server is not running or the signal fails.
    pub fn hangup(&self) -> anyhow::Result<()> {
        self.signal(libc::SIGHUP)
    }

    /// SIGTERM, then waits (≤ [`STOP_TIMEOUT`]) for the exit status. The server is then stopped;
    /// [`Server::restart`] brings it back on the same data directory.
    ///
    /// # Errors
    /// When the signal fails or the server does not exit in time (it is then killed).
    pub async fn stop_graceful(&mut self) -> anyhow::Result<ExitStatus> {
        self.signal(libc::SIGTERM)?;
        match self.wait_exit(STOP_TIMEOUT).await {
            Ok(status) => Ok(status),
            Err(e) => {
                let _ = self.kill9().await;
                Err(e.context(format!("stderr:\n{}", self.logs())))
            }
        }
    }

    /// SIGINT, then waits like [`Server::stop_graceful`].
    ///
    /// # Errors
    /// See [`Server::stop_graceful`].
    pub async fn stop_interrupt(&mut self) -> anyhow::Result<ExitStatus> {
        self.signal(libc::SIGINT)?;
        self.wait_exit(STOP_TIMEOUT).await
    }

    /// SIGKILL (a crash), and reaps the child.
    ///
    /// # Errors
    /// When the server is not running or does not die.
    pub async fn kill9(&mut self) -> anyhow::Result<ExitStatus> {
        self.signal(libc::SIGKILL)?;
        self.wait_exit(STOP_TIMEOUT).await
    }

    /// Starts the same arguments again on the same data directory (a new port). Stops the
    /// current process with SIGKILL first if it is still running.
    ///
    /// # Errors
    /// See [`Server::start`].
    pub async fn restart(&mut self) -> anyhow::Result<()> {
        if self.child.is_some() {
            self.kill9().await?;
        }
        let next = Self::spawn(self.data_dir.clone(), self.args.clone(), self.env.clone()).await?;
        *self = next;
        Ok(())
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if self.child.is_some() && std::thread::panicking() {
            eprintln!(
                "---- viewtape server {} stderr (tail) ----\n{}",
                self.addr,
                self.logs()
            );
        }
        if let Some(child) = self.child.as_mut() {
            let _ = child.start_kill();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listening_line() {
        let addr = parse_listening_line("viewtape listening on http://127.0.0.1:4567/\n").unwrap();
        assert_eq!(addr, "127.0.0.1:4567".parse().unwrap());
        assert!(parse_listening_line("hello").is_err());
        assert!(parse_listening_line("viewtape listening on http://10.1.1.1:80/").is_err());
        assert_eq!(
            listening_scheme("viewtape listening on http://127.0.0.1:4567/"),
            "http"
        );
        assert_eq!(
            listening_scheme("viewtape listening on https://127.0.0.1:4567/"),
            "https"
        );
        let tls = parse_listening_line("viewtape listening on https://127.0.0.1:4568/").unwrap();
        assert_eq!(tls.port(), 4568);
        assert!(parse_listening_line("viewtape listening on ftp://127.0.0.1:1/").is_err());
    }

    #[test]
    fn flags() {
        let args = vec!["--listen=127.0.0.1:1".to_owned(), "--x".into()];
        assert!(has_flag(&args, "--listen"));
        assert!(!has_flag(&args, "--data-dir"));
    }
}
