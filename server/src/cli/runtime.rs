//! `viewtape runtime put|get|delete` and `viewtape module put`: runtimes as data, changed on a
//! running server through its admin routes (`PUT|GET|DELETE /admin/runtimes/{runtime}`,
//! `POST /admin/modules`), with the [admin client](super::admin) `viewtape deploy` uses.
//!
//! ## Modules
//! `--module` takes what a `PUT` takes (`builtin:<guest>`, `sha256:<hex>` of a module kept
//! already) or a file: a file is uploaded first (`POST /admin/modules`) and the runtime names
//! the SHA-256 the server answers, so one command creates a runtime from a build.

use std::path::{Path, PathBuf};

use hyper::Method;
use viewtape_journal::ViewName;

use super::admin::{module_type, AdminClient};

/// A runtime's definition as `viewtape runtime put` is given it.
#[derive(Debug, Clone, Default)]
pub struct RuntimeDefinition {
    /// `builtin:<guest>`, `sha256:<hex>`, or a module file to upload.
    pub module: String,
    /// The views and patterns (`chat.*`) it publishes to.
    pub views: Vec<String>,
    /// The text handed to the guest's `init`, if any.
    pub config: Option<String>,
    /// JSON Schemas by view: `(view, file)`.
    pub schemas: Vec<(String, PathBuf)>,
}

/// What the runtime and module commands do on the server.
#[derive(Debug, Clone)]
pub enum AdminCommand {
    /// `viewtape runtime put NAME …`: create or replace.
    PutRuntime {
        /// The runtime.
        name: String,
        /// What it is made of.
        definition: RuntimeDefinition,
    },
    /// `viewtape runtime get NAME`.
    GetRuntime {
        /// The runtime.
        name: String,
    },
    /// `viewtape runtime delete NAME`.
    DeleteRuntime {
        /// The runtime.
        name: String,
    },
    /// `viewtape module put FILE`.
    PutModule {
        /// The module file.
        file: PathBuf,
    },
}

/// Runs `command` against `server` (`host:port` or a URL; `cacert` for https) with the admin
/// token of `VIEWTAPE_ADMIN_TOKEN`; the body of the server's answer (JSON).
///
/// # Errors
/// A file cannot be read, a schema is not JSON, a name is not one, the token is not set, the
/// server cannot be reached, or it refuses (its status, code and message, in one line).
pub async fn admin_command(
    server: &str,
    cacert: Option<PathBuf>,
    command: AdminCommand,
) -> anyhow::Result<String> {
    let client = AdminClient::new(server, cacert)?;
    match command {
        AdminCommand::PutRuntime { name, definition } => {
            let path = runtime_path(&name)?;
            let body = definition_body(&client, definition).await?;
            client
                .send(Method::PUT, &path, Some("application/json"), body)
                .await?
                .into_body()
        }
        AdminCommand::GetRuntime { name } => client
            .send(Method::GET, &runtime_path(&name)?, None, Vec::new())
            .await?
            .into_body(),
        AdminCommand::DeleteRuntime { name } => client
            .send(Method::DELETE, &runtime_path(&name)?, None, Vec::new())
            .await?
            .into_body(),
        AdminCommand::PutModule { file } => put_module(&client, &file).await,
    }
}

/// `/admin/runtimes/{name}`, for a name the server takes.
fn runtime_path(name: &str) -> anyhow::Result<String> {
    ViewName::new(name)
        .map_err(|_| anyhow::anyhow!("runtime name {name:?}: use 1-128 of A-Z a-z 0-9 . _ -"))?;
    Ok(format!("/admin/runtimes/{name}"))
}

/// `POST /admin/modules` with the bytes of `file`; the server's answer.
async fn put_module(client: &AdminClient, file: &Path) -> anyhow::Result<String> {
    let module =
        std::fs::read(file).map_err(|e| anyhow::anyhow!("cannot read {}: {e}", file.display()))?;
    client
        .send(
            Method::POST,
            "/admin/modules",
            Some(module_type(&module)),
            module,
        )
        .await?
        .into_body()
}

/// Whether `--module` names a module the server knows rather than a file to upload.
fn names_a_module(module: &str) -> bool {
    module.starts_with("builtin:") || module.starts_with("sha256:")
}

/// The JSON body of `PUT /admin/runtimes/{runtime}`, the module uploaded first if it is a file.
async fn definition_body(
    client: &AdminClient,
    definition: RuntimeDefinition,
) -> anyhow::Result<Vec<u8>> {
    // Read every schema before anything reaches the server: a bad file changes nothing.
    let mut schemas = serde_json::Map::new();
    for (view, file) in &definition.schemas {
        let text = std::fs::read_to_string(file)
            .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", file.display()))?;
        let schema: serde_json::Value = serde_json::from_str(&text)
            .map_err(|e| anyhow::anyhow!("--schema {view}={}: not JSON: {e}", file.display()))?;
        schemas.insert(view.clone(), schema);
    }
    let module = if names_a_module(&definition.module) {
        definition.module
    } else {
        let answer = put_module(client, Path::new(&definition.module)).await?;
        let kept: serde_json::Value = serde_json::from_str(&answer)?;
        kept["module"]
            .as_str()
            .ok_or_else(|| anyhow::anyhow!("POST /admin/modules answered no module: {answer}"))?
            .to_owned()
    };
    let mut body = serde_json::json!({ "module": module, "views": definition.views });
    if let Some(config) = definition.config {
        body["config"] = config.into();
    }
    if !schemas.is_empty() {
        body["schemas"] = schemas.into();
    }
    Ok(serde_json::to_vec(&body)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_module_is_a_name_the_server_knows_or_a_file() {
        assert!(names_a_module("builtin:json"));
        assert!(names_a_module("sha256:00"));
        assert!(!names_a_module("guest.wasm"));
        assert!(!names_a_module("./builtin/x.wasm"));
    }

    #[test]
    fn runtime_names_are_checked_before_a_request() {
        assert_eq!(runtime_path("chat").unwrap(), "/admin/runtimes/chat");
        for bad in ["", "a/b", "a b", "../x"] {
            assert!(runtime_path(bad).is_err(), "{bad:?}");
        }
    }
}
