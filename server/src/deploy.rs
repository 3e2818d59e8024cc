//! Deploying a new module to a running runtime, without a restart: compile it, keep it in the
//! [`ModuleStore`], and hand it to the runtime, which swaps it in between two batches with the
//! guest's state carried over ([`RuntimeHandle::deploy`](crate::runtime::RuntimeHandle::deploy)).
//! The admin route `PUT /admin/runtimes/{runtime}/module` and `viewtape deploy` go through
//! [`Deployer::deploy`]. On a cluster the module goes to the bucket too, by SHA-256, and the
//! deploy is a record of the stream: every node fetches the module and switches at its
//! position.
//!
//! ## Where a deploy goes
//!
//! This file is the home of deploys; the other files a deploy passes through are the layers
//! it crosses, each doing its own part:
//!
//! | file | part |
//! |---|---|
//! | `cli/deploy.rs` | `viewtape deploy`: the client that sends the module to the admin route |
//! | `http/admin.rs` | `PUT /admin/runtimes/{runtime}/module`, answered from [`Deployer::deploy`] |
//! | this one | [`Deployer`]: compile, keep (store, bucket), hand to the runtime |
//! | `runtime/registry.rs` | the [`ModuleStore`]: every module ever deployed, by fingerprint |
//! | `runtime/deploy.rs` | the runtime's side: the swap between two batches, a deploy record logged |
//! | `recovery/replay.rs`, `cluster/apply.rs` | a logged deploy replayed at start, or applied from a cluster's stream |
//! | `serve/start.rs` | a module changed in the config while the server was stopped: a deploy at start |
//!
//! The module store stays beside the registry, below the cluster: the cluster's apply loop
//! keeps the modules it fetches there, and the deployer names the cluster.

use std::sync::Arc;

use bytes::Bytes;

use crate::cluster::Cluster;
use crate::host::{GuestEngine, GuestModule};
use crate::runtime::registry::{ModuleStore, Runtimes};
use crate::runtime::{DeployError, Deployed};

/// Largest module a deploy takes.
pub const MAX_MODULE_BYTES: usize = 64 << 20;

/// Why a deploy did not happen; the runtime runs its old module, untouched.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DeployActionError {
    /// No runtime has that name.
    #[error("no runtime named {0:?}")]
    NoSuchRuntime(String),
    /// The bytes are not a guest module this host can run.
    #[error("runtime {runtime:?}: the module does not load: {message}")]
    Load {
        /// The runtime.
        runtime: String,
        /// Why, in the server's words ([`crate::host::LoadError::public_message`]).
        message: String,
    },
    /// The runtime refused it or could not log it.
    #[error(transparent)]
    Runtime(#[from] DeployError),
    /// The module could not be kept in the data dir.
    #[error("cannot keep the module in {path}: {source}")]
    Storage {
        /// Where.
        path: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A blocking task failed.
    #[error("deploy task failed: {0}")]
    Task(#[from] tokio::task::JoinError),
    /// The cluster's bucket could not take the module.
    #[error("the cluster's bucket cannot take the module: {0}")]
    Bucket(String),
}

/// Deploys modules to the server's runtimes.
#[derive(Debug)]
pub struct Deployer {
    engine: GuestEngine,
    store: Arc<ModuleStore>,
    runtimes: Arc<Runtimes>,
    cluster: Option<Arc<Cluster>>,
}

impl Deployer {
    /// Deploys with `engine`, keeping modules in `store` (and in `cluster`'s bucket).
    pub fn new(
        engine: GuestEngine,
        store: Arc<ModuleStore>,
        runtimes: Arc<Runtimes>,
        cluster: Option<Arc<Cluster>>,
    ) -> Self {
        Self {
            engine,
            store,
            runtimes,
            cluster,
        }
    }

    /// Compiles `wasm`, keeps it, and swaps it into `runtime` with the guest's state carried
    /// over. One deploy at a time per runtime (its task takes them in turn, between batches).
    ///
    /// # Errors
    /// [`DeployActionError`]; the runtime runs its old module, untouched.
    pub async fn deploy(&self, runtime: &str, wasm: Bytes) -> Result<Deployed, DeployActionError> {
        let registered = self
            .runtimes
            .get(runtime)
            .ok_or_else(|| DeployActionError::NoSuchRuntime(runtime.to_owned()))?;
        let module = self.keep(runtime, wasm).await?;
        Ok(registered.handle.deploy(module).await?)
    }

    /// Compiles `wasm` (for `runtime`, as errors name it) and keeps it in the store (and the
    /// cluster's bucket), so that any runtime may run it: what `POST /admin/modules` does, and
    /// the first half of a deploy. Keeping the same bytes twice is one module.
    ///
    /// # Errors
    /// [`DeployActionError`]: it does not load, or cannot be kept.
    pub async fn keep(&self, runtime: &str, wasm: Bytes) -> Result<GuestModule, DeployActionError> {
        let engine = self.engine.clone();
        let compile = wasm.clone();
        let module = tokio::task::spawn_blocking(move || GuestModule::new(&engine, &compile))
            .await?
            .map_err(|error| {
                tracing::info!(%runtime, %error, "module refused: it does not load");
                DeployActionError::Load {
                    runtime: runtime.to_owned(),
                    message: error.public_message().into_owned(),
                }
            })?;
        if let Some(cluster) = &self.cluster {
            cluster
                .put_module(&wasm)
                .await
                .map_err(|error| DeployActionError::Bucket(error.to_string()))?;
        }
        let store = Arc::clone(&self.store);
        tokio::task::spawn_blocking(move || store.put(&wasm))
            .await?
            .map_err(|source| DeployActionError::Storage {
                path: self.store.dir().display().to_string(),
                source,
            })?;
        Ok(module)
    }
}
