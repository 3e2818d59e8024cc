//! The server under test: a running viewtape (`--addr`, `--pid`), one the tool spawns (over
//! HTTPS with `--tls h1|h2`), or the nginx nchan peer (`--peer nchan --peer-url
//! http://127.0.0.1:PORT --pid WORKER`), and what the tool reads of it from `/proc`.

use std::net::SocketAddr;

use anyhow::{bail, Context as _};
use clap::{Args, ValueEnum};
use std::time::Duration;

use viewtape_journal::Cursor;
use viewtape_tests::{expect, http::ensure_loopback, Server};

use crate::cli::ServerOptions;
use crate::tls::ServerTls;
use crate::transport::{Dialer, Transport};

/// Which server speaks on the other end.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Peer {
    /// Ingest NDJSON into the `demo` runtime, follow `/views/prices/events`.
    Viewtape,
    /// nginx + nchan (`bench/peers/nchan.sh`): `POST /pub/prices` one message per request,
    /// eventsource on `/sub/prices`, ids `<time>:<tag>` assigned by nchan.
    Nchan,
}

/// Where the load goes.
#[derive(Debug)]
pub struct Target {
    /// The server's address (loopback).
    pub addr: SocketAddr,
    /// What it is.
    pub peer: Peer,
    /// Its process, when known (for RSS and CPU).
    pub pid: Option<u32>,
    /// How the tool connects to it.
    pub dialer: Dialer,
    /// Kept alive while benchmarking a spawned server; killed on drop.
    server: Option<Server>,
    /// The spawned server's certificate and config files, with `--tls`.
    _tls: Option<ServerTls>,
}

/// Which server the load goes to and how subscribers reach it (`fanout`, `replay`, `idle`,
/// `stalled`).
#[derive(Debug, Args)]
#[command(next_help_heading = "Server under test")]
pub struct TargetOptions {
    /// A running viewtape, or the one this tool spawns.
    #[command(flatten)]
    pub server: ServerOptions,
    /// The server under test (nchan: nginx + nchan from bench/peers/nchan.sh, at --peer-url)
    #[arg(long, value_enum, default_value_t = Peer::Viewtape)]
    pub peer: Peer,
    /// The nchan peer's address, as bench/peers/nchan.sh prints it
    #[arg(long, value_name = "http://127.0.0.1:PORT", value_parser = peer_url)]
    pub peer_url: Option<SocketAddr>,
    /// HTTPS to the spawned viewtape, with a self-signed certificate added to its config (the
    /// one given with --server-arg=--config, or none); ingest and the tape stay HTTP/1.1
    #[arg(long, value_enum, value_name = "h1|h2")]
    pub tls: Option<Transport>,
}

impl TargetOptions {
    /// What subscribers speak: `--tls`, or plain HTTP/1.1.
    pub fn transport(&self) -> Transport {
        self.tls.unwrap_or(Transport::Plain)
    }

    /// Refuses flags that do not go with the chosen server.
    ///
    /// # Errors
    /// `--peer nchan` without `--peer-url` or with `--addr`/`--server-arg`/`--tls`; `--peer-url`
    /// without `--peer nchan`; `--tls` with `--addr`.
    pub fn validate(&self) -> anyhow::Result<()> {
        let server = &self.server;
        match self.peer {
            Peer::Nchan => {
                if self.peer_url.is_none() {
                    bail!("--peer nchan needs --peer-url http://127.0.0.1:PORT (bench/peers/nchan.sh prints it)");
                }
                if !server.server_args.is_empty() || server.addr.is_some() {
                    bail!("--server-arg and --addr are for viewtape; nchan takes --peer-url");
                }
                if self.tls.is_some() {
                    bail!("--tls is for a viewtape the tool spawns");
                }
            }
            Peer::Viewtape => {
                if self.peer_url.is_some() {
                    bail!("--peer-url needs --peer nchan (viewtape takes --addr)");
                }
                if server.addr.is_some() && self.tls.is_some() {
                    bail!("--tls makes the certificate of a server the tool spawns: drop --addr");
                }
            }
        }
        Ok(())
    }
}

impl Target {
    /// Connects to the server `options` name, or spawns `viewtape serve --demo-rate 0` plus each
    /// `--server-arg`, over HTTPS with `--tls h1|h2` (see [`crate::tls`]).
    ///
    /// # Errors
    /// On options [`TargetOptions::validate`] refuses, or a server that does not start.
    pub async fn start(options: &TargetOptions) -> anyhow::Result<Self> {
        options.validate()?;
        let pid = options.server.pid;
        if let Some(addr) = options.peer_url.or(options.server.addr) {
            return Ok(Self::running(addr, options.peer, pid));
        }
        let transport = options.transport();
        let tls = match transport {
            Transport::Plain => None,
            Transport::TlsH1 | Transport::TlsH2 => Some(ServerTls::new()?),
        };
        let server_args: Vec<&str> = options
            .server
            .server_args
            .iter()
            .map(String::as_str)
            .collect();
        let server_args = match &tls {
            Some(tls) => tls.server_args(&server_args)?,
            None => options.server.server_args.clone(),
        };
        let server_args: Vec<&str> = server_args.iter().map(String::as_str).collect();
        let server = Server::start(&server_args).await?;
        eprintln!(
            "spawned viewtape (pid {}) on {} with {:?}; subscribers: {}",
            server.pid(),
            server.addr(),
            server_args,
            transport.name()
        );
        Ok(Self {
            addr: server.addr(),
            peer: options.peer,
            pid: Some(server.pid()),
            dialer: Dialer::new(server.addr(), transport, tls.as_ref()),
            server: Some(server),
            _tls: tls,
        })
    }

    /// A server the tool did not spawn, spoken to in plain HTTP.
    fn running(addr: SocketAddr, peer: Peer, pid: Option<u32>) -> Self {
        Self {
            addr,
            peer,
            pid,
            dialer: Dialer::new(addr, Transport::Plain, None),
            server: None,
            _tls: None,
        }
    }

    /// What subscribers speak.
    pub fn transport(&self) -> Transport {
        self.dialer.transport()
    }

    /// The SSE path subscribers follow.
    pub fn events_path(&self) -> &'static str {
        match self.peer {
            Peer::Viewtape => "/views/prices/events",
            Peer::Nchan => "/sub/prices",
        }
    }

    /// The SSE event type a published event arrives as (nchan sends no `event:` line).
    pub fn event_type(&self) -> &'static str {
        match self.peer {
            Peer::Viewtape => "update",
            Peer::Nchan => "message",
        }
    }

    /// The server's stderr tail when the tool spawned it.
    pub fn logs(&self) -> Option<String> {
        self.server.as_ref().map(Server::logs)
    }

    /// Publishes nothing; reads the tape (`?from=tape`) to its end and returns the newest
    /// cursor, so subscribers can resume at the head. The view must hold at least one event.
    ///
    /// # Errors
    /// On connection errors or an empty tape.
    pub async fn head_cursor(&self) -> anyhow::Result<Cursor> {
        let mut tape = self
            .dialer
            .event_stream("/views/prices/events?from=tape", &[])
            .await?;
        let mut head = expect::cursor_of(&tape.next_event().await?)?;
        for _ in 0..10_000_000 {
            match tape.next_within(Duration::from_millis(200)).await {
                Ok(Some(event)) => head = expect::cursor_of(&event)?,
                _ => break,
            }
        }
        Ok(head)
    }
}

/// `--peer-url`: [`parse_peer_url`], on loopback only.
fn peer_url(url: &str) -> anyhow::Result<SocketAddr> {
    let addr = parse_peer_url(url)?;
    ensure_loopback(addr)?;
    Ok(addr)
}

/// `http://127.0.0.1:PORT[/]` → the socket address (no path: the peer's paths are fixed).
fn parse_peer_url(url: &str) -> anyhow::Result<SocketAddr> {
    let rest = url
        .strip_prefix("http://")
        .with_context(|| format!("--peer-url {url:?}: expected http://127.0.0.1:PORT"))?;
    let rest = rest.trim_end_matches('/');
    let addr = if rest.starts_with("localhost:") {
        rest.replacen("localhost", "127.0.0.1", 1)
    } else {
        rest.to_owned()
    };
    addr.parse()
        .with_context(|| format!("--peer-url {url:?}: expected http://127.0.0.1:PORT"))
}

/// `VmRSS` of a process, in KiB.
///
/// # Errors
/// When `/proc/<pid>/status` cannot be read or has no `VmRSS`.
pub fn rss_kib(pid: u32) -> anyhow::Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("read /proc/{pid}/status"))?;
    parse_vm_rss(&status).with_context(|| format!("no VmRSS in /proc/{pid}/status"))
}

fn parse_vm_rss(status: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

/// User + system CPU time of a process, in seconds.
///
/// # Errors
/// When `/proc/<pid>/stat` cannot be read or parsed.
pub fn cpu_seconds(pid: u32) -> anyhow::Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .with_context(|| format!("read /proc/{pid}/stat"))?;
    let ticks = parse_cpu_ticks(&stat).context("parse /proc/<pid>/stat")?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    Ok(ticks as f64 / if hz > 0 { hz as f64 } else { 100.0 })
}

fn parse_cpu_ticks(stat: &str) -> Option<u64> {
    // The command name may contain spaces: fields start after the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // After ')': state is field 3; utime and stime are fields 14 and 15.
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(utime + stime)
}

/// Raises the soft `RLIMIT_NOFILE` to the hard limit; returns the new soft limit.
///
/// # Errors
/// When the limit cannot be read or set.
pub fn raise_nofile() -> anyhow::Result<u64> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the struct we pass.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        bail!("getrlimit: {}", std::io::Error::last_os_error());
    }
    if limit.rlim_cur < limit.rlim_max {
        limit.rlim_cur = limit.rlim_max;
        // SAFETY: setrlimit reads the struct we pass.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) } != 0 {
            bail!("setrlimit: {}", std::io::Error::last_os_error());
        }
    }
    Ok(limit.rlim_cur)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_proc_files() {
        assert_eq!(
            parse_vm_rss("Name:\tx\nVmRSS:\t   12345 kB\nVmData: 1 kB\n"),
            Some(12345)
        );
        let stat = "42 (a b) S 1 42 42 0 -1 4194560 100 0 0 0 7 3 0 0 20 0 1 0";
        assert_eq!(parse_cpu_ticks(stat), Some(10));
    }

    #[test]
    fn parses_peer_urls() {
        assert_eq!(
            parse_peer_url("http://127.0.0.1:8080/").unwrap(),
            "127.0.0.1:8080".parse::<SocketAddr>().unwrap()
        );
        assert_eq!(parse_peer_url("http://localhost:81").unwrap().port(), 81);
        assert!(parse_peer_url("https://127.0.0.1:1").is_err());
        assert!(parse_peer_url("http://127.0.0.1:1/sub").is_err());
        // Parsed, then refused by the loopback check.
        assert!(ensure_loopback(parse_peer_url("http://10.1.2.3:80").unwrap()).is_err());
    }

    #[test]
    fn reads_own_process() {
        let pid = std::process::id();
        assert!(rss_kib(pid).unwrap() > 0);
        assert!(cpu_seconds(pid).unwrap() >= 0.0);
        assert!(raise_nofile().unwrap() > 0);
    }
}
