//! `viewtape deploy`: a new module sent to a running server's admin route
//! (`PUT /admin/runtimes/{runtime}/module`) through the [admin client](super::admin).

use std::path::PathBuf;

use super::admin::{module_type, AdminAnswer, AdminClient};

/// What `viewtape deploy` was given.
#[derive(Debug, Clone)]
pub struct DeployOptions {
    /// The runtime.
    pub runtime: String,
    /// The new module (`.wasm`, or `.js` for a JavaScript guest).
    pub wasm: PathBuf,
    /// The server: `host:port`, or a URL (`http://host:port`, `https://host[:port]`).
    pub server: String,
    /// For https: the PEM certificates to trust (default: the system's).
    pub cacert: Option<PathBuf>,
}

/// Reads the module, the admin token (`VIEWTAPE_ADMIN_TOKEN`) and the server's address, and
/// sends the module.
///
/// # Errors
/// The module cannot be read, the token is not set, the address is not one, or the server
/// cannot be reached; a server that refuses the module answers, in [`AdminAnswer`].
pub async fn deploy_module(options: &DeployOptions) -> anyhow::Result<AdminAnswer> {
    let module = std::fs::read(&options.wasm)
        .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", options.wasm.display()))?;
    let client = AdminClient::new(&options.server, options.cacert.clone())?;
    client
        .send(
            hyper::Method::PUT,
            &format!("/admin/runtimes/{}/module", options.runtime),
            Some(module_type(&module)),
            module,
        )
        .await
}
