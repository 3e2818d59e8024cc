//! Three `nats-server`s as one JetStream cluster on loopback, each with its own store, fsyncing
//! every write (`sync_interval: always`), each killed (`kill -9`), paused (`SIGSTOP`) and
//! brought back on the same ports and store, as a crash and an operator's restart would.
//!
//! Unlike [`crate::NatsServer`], whose port is picked by the server itself, a cluster's routes
//! must name every peer's port before any of them starts: the ports are chosen up front
//! ([`free_ports`]) and kept across restarts. `no_advertise` keeps the servers from telling
//! clients of each other's addresses, so a viewtape node only ever reaches NATS through the
//! link proxies the harness puts in between ([`super::proxy`]).

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{anyhow, bail, Context as _};
use tokio::io::{AsyncBufReadExt as _, BufReader};
use tokio::process::{Child, Command};

/// How long a server may take to log "Server is ready".
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a killed server may take to be reaped.
const STOP_TIMEOUT: Duration = Duration::from_secs(5);
/// How long the cluster may take to elect its JetStream meta leader.
const JETSTREAM_TIMEOUT: Duration = Duration::from_secs(60);
/// The cluster's name (JetStream reports it in stream info).
const CLUSTER_NAME: &str = "nemesis";

/// `n` distinct free loopback ports. The listeners are held until all are picked, so no port is
/// named twice; another process may still take one before it is used (rare on a test machine).
///
/// # Errors
/// When the OS gives no port.
pub fn free_ports(n: usize) -> anyhow::Result<Vec<u16>> {
    let listeners = (0..n)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0"))
        .collect::<Result<Vec<_>, _>>()
        .context("bind a free loopback port")?;
    listeners
        .iter()
        .map(|l| Ok(l.local_addr()?.port()))
        .collect()
}

/// What a server is doing, as the harness left it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Liveness {
    /// Running and scheduled.
    Running,
    /// Stopped with `SIGSTOP`: its sockets stay open, nothing answers.
    Paused,
    /// Killed and reaped.
    Dead,
}

/// One server of the cluster.
#[derive(Debug)]
pub struct NatsPeer {
    /// Its `server_name`, which JetStream names a stream's leader by.
    pub name: String,
    /// The client port.
    pub port: u16,
    cluster_port: u16,
    routes: Vec<u16>,
    child: Option<Child>,
    pid: u32,
    liveness: Liveness,
    logs: Arc<Mutex<Vec<u8>>>,
    /// Its config and store, removed when the peer is dropped (after the process is gone).
    dir: tempfile::TempDir,
}

/// The config file of one peer.
fn config_text(name: &str, port: u16, cluster_port: u16, routes: &[u16], store: &str) -> String {
    // NATS config strings are JSON-like: quote with JSON escaping.
    let store = serde_json::Value::String(store.to_owned());
    let routes = routes
        .iter()
        .map(|p| format!("nats-route://127.0.0.1:{p}"))
        .collect::<Vec<_>>()
        .join(", ");
    format!(
        "server_name: {name}\nhost: 127.0.0.1\nport: {port}\n\
         jetstream {{\n  store_dir: {store}\n  sync_interval: always\n}}\n\
         cluster {{\n  name: {CLUSTER_NAME}\n  listen: 127.0.0.1:{cluster_port}\n  \
         routes: [{routes}]\n  no_advertise: true\n}}\n"
    )
}

impl NatsPeer {
    /// The client address.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// What the harness last did to it.
    pub fn liveness(&self) -> Liveness {
        self.liveness
    }

    /// The tail of its log.
    pub fn logs(&self) -> String {
        self.logs
            .lock()
            .map(|l| String::from_utf8_lossy(&l).into_owned())
            .unwrap_or_default()
    }

    async fn spawn(&mut self) -> anyhow::Result<()> {
        let conf = self.dir.path().join("nats.conf");
        let store = self.dir.path().join("store").display().to_string();
        let text = config_text(
            &self.name,
            self.port,
            self.cluster_port,
            &self.routes,
            &store,
        );
        std::fs::write(&conf, text).with_context(|| format!("write {}", conf.display()))?;
        let bin = std::env::var("VIEWTAPE_NATS_SERVER")
            .unwrap_or_else(|_| crate::nats::DEFAULT_BIN.into());
        let (child, pid, stderr) = crate::nats::run_with_config(Command::new(&bin), &bin, &conf)?;
        let keep = crate::nats::log_tail(Arc::clone(&self.logs));
        let mut lines = BufReader::new(stderr).lines();
        let ready = async {
            while let Some(line) = lines.next_line().await? {
                keep(&line);
                if line.contains("Server is ready") {
                    return Ok(());
                }
            }
            Err(std::io::Error::other(
                "nats-server exited before it was ready",
            ))
        };
        match tokio::time::timeout(START_TIMEOUT, ready).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => bail!("{}: {e}\n{}", self.name, self.logs()),
            Err(_) => bail!(
                "{} not ready within {START_TIMEOUT:?}\n{}",
                self.name,
                self.logs()
            ),
        }
        // Keep draining the log so the server never blocks on a full pipe.
        tokio::spawn(async move {
            while let Ok(Some(line)) = lines.next_line().await {
                keep(&line);
            }
        });
        (self.child, self.pid, self.liveness) = (Some(child), pid, Liveness::Running);
        Ok(())
    }

    fn signal(&self, signal: libc::c_int) -> anyhow::Result<()> {
        if self.child.is_none() {
            bail!("{} is not running", self.name);
        }
        let pid = libc::pid_t::try_from(self.pid).context("pid out of range")?;
        // SAFETY: kill(2) on the child we spawned and have not reaped (`self.child` still owns
        // it), so the pid cannot have been reused.
        if unsafe { libc::kill(pid, signal) } != 0 {
            bail!("kill({pid}, {signal}): {}", std::io::Error::last_os_error());
        }
        Ok(())
    }

    /// `kill -9`, and reaps it. A paused server dies too (SIGKILL needs no scheduling).
    ///
    /// # Errors
    /// When it is not running or survives.
    pub async fn kill(&mut self) -> anyhow::Result<()> {
        self.signal(libc::SIGKILL)?;
        if let Some(mut child) = self.child.take() {
            tokio::time::timeout(STOP_TIMEOUT, child.wait())
                .await
                .map_err(|_| anyhow!("{} survived SIGKILL", self.name))??;
        }
        self.liveness = Liveness::Dead;
        Ok(())
    }

    /// `SIGSTOP`: the process keeps its sockets and answers nothing, as a machine that froze.
    ///
    /// # Errors
    /// When it is not running.
    pub fn pause(&mut self) -> anyhow::Result<()> {
        self.signal(libc::SIGSTOP)?;
        self.liveness = Liveness::Paused;
        Ok(())
    }

    /// `SIGCONT` after [`NatsPeer::pause`].
    ///
    /// # Errors
    /// When it is not running.
    pub fn resume(&mut self) -> anyhow::Result<()> {
        self.signal(libc::SIGCONT)?;
        self.liveness = Liveness::Running;
        Ok(())
    }

    /// Starts it again on the same ports and store after [`NatsPeer::kill`].
    ///
    /// # Errors
    /// When it is still running or does not come back.
    pub async fn restart(&mut self) -> anyhow::Result<()> {
        if self.child.is_some() {
            bail!("{} is still running", self.name);
        }
        self.spawn().await
    }
}

/// Three peers routed to each other.
#[derive(Debug)]
pub struct NatsCluster {
    /// The peers, `n0`, `n1`, `n2`.
    pub peers: Vec<NatsPeer>,
}

impl NatsCluster {
    /// Starts `n` peers (three for a quorum that survives one loss) and waits until JetStream
    /// answers on the cluster.
    ///
    /// # Errors
    /// When a peer does not start, or JetStream has no meta leader in time.
    pub async fn start(n: usize) -> anyhow::Result<Self> {
        let ports = free_ports(2 * n)?;
        let (client, cluster) = ports.split_at(n);
        let mut peers = Vec::with_capacity(n);
        for i in 0..n {
            let dir = tempfile::Builder::new()
                .prefix("viewtape-nemesis-nats-")
                .tempdir()
                .context("temp dir for nats-server")?;
            peers.push(NatsPeer {
                name: format!("n{i}"),
                port: client[i],
                cluster_port: cluster[i],
                routes: cluster
                    .iter()
                    .copied()
                    .filter(|p| *p != cluster[i])
                    .collect(),
                child: None,
                pid: 0,
                liveness: Liveness::Dead,
                logs: Arc::default(),
                dir,
            });
        }
        // One after another: "Server is ready" comes before the routes are up, so no peer's
        // start waits for another's.
        for peer in &mut peers {
            peer.spawn().await?;
        }
        let cluster = Self { peers };
        cluster.wait_jetstream().await?;
        Ok(cluster)
    }

    /// The client URLs of every peer, direct (no proxy): for the harness's own operator client.
    pub fn urls(&self) -> Vec<String> {
        self.peers
            .iter()
            .map(|p| format!("nats://{}", p.addr()))
            .collect()
    }

    /// Waits until JetStream answers an account info request (the meta group has a leader).
    async fn wait_jetstream(&self) -> anyhow::Result<()> {
        let deadline = tokio::time::Instant::now() + JETSTREAM_TIMEOUT;
        let js = operator(&self.urls()).await?;
        let mut last = String::new();
        while tokio::time::Instant::now() < deadline {
            match tokio::time::timeout(Duration::from_secs(3), js.query_account()).await {
                Ok(Ok(_)) => return Ok(()),
                Ok(Err(e)) => last = e.to_string(),
                Err(_) => last = "timed out".into(),
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        bail!(
            "JetStream not up within {JETSTREAM_TIMEOUT:?}: {last}\n{}",
            self.peers[0].logs()
        )
    }

    /// The index of the peer leading `stream`'s RAFT group, as JetStream reports it; `None`
    /// when no leader is known (mid-election) or the info does not come within a few seconds.
    pub async fn leader(&self, js: &async_nats::jetstream::Context, stream: &str) -> Option<usize> {
        let info = async {
            let mut stream = js.get_stream(stream).await.ok()?;
            let info = stream.info().await.ok()?;
            info.cluster.as_ref()?.leader.clone()
        };
        let leader = tokio::time::timeout(Duration::from_secs(3), info)
            .await
            .ok()??;
        self.peers.iter().position(|p| p.name == leader)
    }
}

/// A JetStream context connected to any of `urls`, reconnecting on its own: the harness's
/// window into the cluster (stream info), never a viewtape node's path.
///
/// # Errors
/// When no server answers the first connect.
pub async fn operator(urls: &[String]) -> anyhow::Result<async_nats::jetstream::Context> {
    let addrs = urls
        .iter()
        .map(|u| u.parse::<async_nats::ServerAddr>())
        .collect::<Result<Vec<_>, _>>()
        .context("server address")?;
    let client = async_nats::ConnectOptions::new()
        .connection_timeout(Duration::from_secs(3))
        .request_timeout(Some(Duration::from_secs(3)))
        .retry_on_initial_connect()
        .connect(addrs)
        .await
        .context("connect the operator client")?;
    Ok(async_nats::jetstream::new(client))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peer_routes_to_the_others_and_advertises_nothing() {
        let text = config_text("n1", 4001, 5001, &[5000, 5002], "/tmp/s");
        assert!(text.contains("server_name: n1\n"), "{text}");
        assert!(text.contains("port: 4001\n"));
        assert!(text.contains("sync_interval: always"));
        assert!(text.contains("listen: 127.0.0.1:5001"));
        assert!(text.contains("routes: [nats-route://127.0.0.1:5000, nats-route://127.0.0.1:5002]"));
        assert!(text.contains("no_advertise: true"));
        let ports = free_ports(4).unwrap_or_default();
        assert_eq!(ports.len(), 4);
    }
}
