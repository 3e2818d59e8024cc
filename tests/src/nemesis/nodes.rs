//! The three viewtape nodes of the nemesis, each reaching the NATS cluster only through its own
//! link proxies (one per NATS server, its "own" server first in its `nats_url`), on a listen port
//! chosen up front so that a restarted node comes back where clients look for it, as behind a
//! load balancer.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{bail, Context as _};

use super::nats_cluster::{free_ports, NatsCluster};
use super::proxy::{Link, LinkMode};
use crate::Server;

/// The runtime every producer ingests into: `builtin:json`, which publishes each line's key and
/// value as written, so a frame names the batch it came from.
pub const RUNTIME: &str = "nemesis";
/// Its one view, whose tape the checker compares.
pub const VIEW: &str = "tape";
/// The JetStream stream the nodes share (the server's default name).
pub const STREAM: &str = "viewtape";
/// How long a node may take to be ready after a start.
pub const READY_TIMEOUT: Duration = Duration::from_secs(90);
/// Attempts at restarting a node whose port is briefly still taken.
const RESTART_ATTEMPTS: u32 = 10;

/// A node's config: the stream replicated on all three servers and synced on each, a tape long
/// enough to hold a long run whole.
fn config_text(nats_urls: &[String]) -> String {
    format!(
        "[journal]\nmax_age = \"24h\"\nmax_records_per_view = 5000000\nmax_bytes_per_view = \"1GiB\"\n\n\
         [cluster]\nnats_url = \"{}\"\nreplicas = 3\nstream_synced = true\n\n\
         [[runtime]]\nname = \"{RUNTIME}\"\nmodule = \"builtin:json\"\nviews = [\"{VIEW}\"]\n",
        nats_urls.join(",")
    )
}

/// The nodes, their addresses and their links.
#[derive(Debug)]
pub struct Nodes {
    /// The processes; a killed one has no child until restarted.
    pub servers: Vec<Server>,
    /// Each node's fixed loopback address.
    pub addrs: Vec<SocketAddr>,
    /// `links[node][server]`: node `node`'s path to NATS server `server`.
    links: Vec<Vec<Link>>,
    /// Whether each node is up, as the harness left it.
    up: Vec<bool>,
    /// Their config files, removed on drop.
    _configs: Vec<tempfile::NamedTempFile>,
}

impl Nodes {
    /// `n` nodes on `nats`, started one after another, each ready before the next (the first
    /// creates the stream).
    ///
    /// # Errors
    /// When a link, a config or a node does not start, or a node is not ready in time.
    pub async fn start(nats: &NatsCluster, n: usize) -> anyhow::Result<Self> {
        let ports = free_ports(n)?;
        let (mut servers, mut addrs, mut links, mut configs) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for (node, port) in ports.into_iter().enumerate() {
            let mut own = Vec::new();
            for peer in &nats.peers {
                own.push(Link::start(peer.addr()).await?);
            }
            // Its own server first, then the others in order.
            let count = own.len();
            let urls: Vec<String> = (0..count)
                .map(|k| format!("nats://{}", own[(node + k) % count].addr()))
                .collect();
            let config = crate::server::config_file(&config_text(&urls))?;
            let listen = format!("127.0.0.1:{port}");
            let path = config.path().display().to_string();
            let server = Server::start(&["--config", &path, "--listen", &listen]).await?;
            server
                .ready(READY_TIMEOUT)
                .await
                .with_context(|| format!("node {node} at its start"))?;
            addrs.push(server.addr());
            servers.push(server);
            links.push(own);
            configs.push(config);
        }
        let up = vec![true; servers.len()];
        Ok(Self {
            servers,
            addrs,
            links,
            up,
            _configs: configs,
        })
    }

    /// Node `node`'s link to NATS server `server`.
    pub fn link(&self, node: usize, server: usize) -> Option<&Link> {
        self.links.get(node)?.get(server)
    }

    /// Sets every link back to forwarding.
    pub fn heal_links(&self) {
        for link in self.links.iter().flatten() {
            link.set(LinkMode::Forward);
        }
    }

    /// Whether node `node` is up, as the harness left it.
    pub fn is_up(&self, node: usize) -> bool {
        self.up.get(node).copied().unwrap_or(false)
    }

    /// `kill -9` of node `node`.
    ///
    /// # Errors
    /// When it is not running or does not die.
    pub async fn kill(&mut self, node: usize) -> anyhow::Result<()> {
        let server = self.servers.get_mut(node).context("no such node")?;
        self.up[node] = false;
        server.kill9().await?;
        Ok(())
    }

    /// Starts node `node` again on its data directory and port; a port still held by the dead
    /// process's connections is tried again a few times.
    ///
    /// # Errors
    /// When it does not start.
    pub async fn restart(&mut self, node: usize) -> anyhow::Result<()> {
        let server = self.servers.get_mut(node).context("no such node")?;
        let mut last = None;
        for _ in 0..RESTART_ATTEMPTS {
            match server.restart().await {
                Ok(()) => {
                    self.up[node] = true;
                    if server.addr() != self.addrs[node] {
                        bail!(
                            "node {node} came back on {}, not {}",
                            server.addr(),
                            self.addrs[node]
                        );
                    }
                    return Ok(());
                }
                Err(e) => last = Some(e),
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        Err(last.unwrap_or_else(|| anyhow::anyhow!("no attempt")))
            .with_context(|| format!("restart node {node}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_lists_its_proxies_and_a_replicated_synced_stream() {
        let text = config_text(&["nats://127.0.0.1:1".into(), "nats://127.0.0.1:2".into()]);
        assert!(
            text.contains("nats_url = \"nats://127.0.0.1:1,nats://127.0.0.1:2\""),
            "{text}"
        );
        assert!(text.contains("replicas = 3\nstream_synced = true"));
        assert!(text.contains("module = \"builtin:json\""));
    }
}
