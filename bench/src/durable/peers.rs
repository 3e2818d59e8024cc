//! The servers under test, started once for the whole invocation, and the senders that
//! connect to them.

use std::net::SocketAddr;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use anyhow::Context as _;
use viewtape_tests::{NatsServer, Server};

use super::options::{per_producer_config, producer_runtime, Options, Peer, Runtimes};
use super::sender::{IngestConn, Sender, SeqSource};
use super::IO_TIMEOUT;

/// The servers, started once for the whole invocation.
pub(super) struct Peers {
    viewtape: Option<ViewtapeTarget>,
    nats: Option<NatsTarget>,
}

struct ViewtapeTarget {
    addr: SocketAddr,
    pid: Option<u32>,
    server: Option<Server>,
    /// `demo`'s highest `seq` handed out (`--runtimes shared`).
    shared_seq: Arc<tokio::sync::Mutex<u64>>,
    /// Per producer runtime, its next `seq` (`--runtimes per-producer`).
    own_seqs: Vec<Arc<AtomicU64>>,
    /// The generated config (kept until the end).
    _config: Option<tempfile::TempDir>,
}

struct NatsTarget {
    server: NatsServer,
    seq: Arc<AtomicU64>,
}

impl Peers {
    pub(super) async fn start(options: &Options) -> anyhow::Result<Self> {
        let mut peers = Self {
            viewtape: None,
            nats: None,
        };
        if options.peers().contains(&Peer::Viewtape) {
            let most = options.most_producers();
            let own_seqs = (0..most).map(|_| Arc::new(AtomicU64::new(1))).collect();
            let target = match options.server.addr {
                Some(addr) => ViewtapeTarget {
                    addr,
                    pid: options.server.pid,
                    server: None,
                    shared_seq: Arc::default(),
                    own_seqs,
                    _config: None,
                },
                None => {
                    let mut args: Vec<String> = Vec::new();
                    let config = match options.runtimes {
                        Runtimes::PerProducer => {
                            let dir = tempfile::Builder::new()
                                .prefix("viewtape-bench-config-")
                                .tempdir()
                                .context("temp dir for the server config")?;
                            let path = dir.path().join("durable.toml");
                            std::fs::write(
                                &path,
                                per_producer_config(most, options.log, &options.wasm),
                            )
                            .with_context(|| format!("write {}", path.display()))?;
                            args.extend(["--config".to_owned(), path.display().to_string()]);
                            Some(dir)
                        }
                        Runtimes::Shared => None,
                    };
                    args.extend(options.server.server_args.iter().cloned());
                    let args: Vec<&str> = args.iter().map(String::as_str).collect();
                    let server = Server::start(&args).await?;
                    eprintln!(
                        "spawned viewtape (pid {}) on {} with {:?}",
                        server.pid(),
                        server.addr(),
                        args
                    );
                    ViewtapeTarget {
                        addr: server.addr(),
                        pid: Some(server.pid()),
                        server: Some(server),
                        shared_seq: Arc::default(),
                        own_seqs,
                        _config: config,
                    }
                }
            };
            peers.viewtape = Some(target);
        }
        if options.peers().contains(&Peer::JetStream) {
            let server = NatsServer::start_with(&options.nats_server, options.pin.pin).await?;
            server.check_sync_always().await?;
            eprintln!(
                "spawned nats-server (pid {}) on {}, JetStream sync_always",
                server.pid(),
                server.addr()
            );
            let js = crate::jetstream::connect(server.addr(), IO_TIMEOUT).await?;
            crate::jetstream::create_stream(&js).await?;
            peers.nats = Some(NatsTarget {
                server,
                seq: Arc::new(AtomicU64::new(1)),
            });
        }
        Ok(peers)
    }

    pub(super) fn pid(&self, peer: Peer) -> Option<u32> {
        match peer {
            Peer::Viewtape => self.viewtape.as_ref().and_then(|v| v.pid),
            Peer::JetStream => self.nats.as_ref().map(|n| n.server.pid()),
        }
    }

    /// `n` connected senders for `peer`.
    pub(super) async fn senders(
        &self,
        peer: Peer,
        n: usize,
        options: &Options,
    ) -> anyhow::Result<Vec<Sender>> {
        let mut senders = Vec::with_capacity(n);
        match peer {
            Peer::Viewtape => {
                let v = self.viewtape.as_ref().context("viewtape not started")?;
                for i in 0..n {
                    let (runtime, seq) = match options.runtimes {
                        Runtimes::PerProducer => (
                            producer_runtime(i),
                            SeqSource::Own(Arc::clone(
                                v.own_seqs.get(i).context("more producers than runtimes")?,
                            )),
                        ),
                        Runtimes::Shared => (
                            "demo".to_owned(),
                            SeqSource::Shared(Arc::clone(&v.shared_seq)),
                        ),
                    };
                    senders.push(Sender::Viewtape {
                        conn: IngestConn::connect(v.addr).await?,
                        path: format!("/runtimes/{runtime}/ingest"),
                        seq,
                    });
                }
            }
            Peer::JetStream => {
                let nats = self.nats.as_ref().context("nats-server not started")?;
                let mut contexts = Vec::new();
                for _ in 0..options.nats_connections.min(n) {
                    contexts.push(crate::jetstream::connect(nats.server.addr(), IO_TIMEOUT).await?);
                }
                for i in 0..n {
                    senders.push(Sender::JetStream {
                        js: contexts[i % contexts.len()].clone(),
                        seq: Arc::clone(&nats.seq),
                    });
                }
            }
        }
        Ok(senders)
    }

    pub(super) fn logs(&self, peer: Peer) -> Option<String> {
        match peer {
            Peer::Viewtape => self
                .viewtape
                .as_ref()
                .and_then(|v| v.server.as_ref())
                .map(Server::logs),
            Peer::JetStream => self.nats.as_ref().map(|n| n.server.logs()),
        }
    }

    pub(super) async fn stop(&mut self) -> anyhow::Result<()> {
        let mut result = Ok(());
        if let Some(nats) = self.nats.as_mut() {
            result = nats.server.stop().await;
        }
        if let Some(server) = self.viewtape.as_mut().and_then(|v| v.server.as_mut()) {
            if let Err(e) = server.kill9().await {
                eprintln!("stopping viewtape: {e:#}");
            }
        }
        result
    }
}
