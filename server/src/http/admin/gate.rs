//! The gate of the admin routes: the token, checked on every request before anything else,
//! and the strict reading of their bodies; see [`super`] for the rules.

use std::sync::Arc;

use axum::extract::FromRequestParts;
use axum::http::header;
use axum::http::request::Parts;
use bytes::Bytes;
use sha2::{Digest, Sha256};

use crate::catalog::Catalog;
use crate::cluster::Cluster;
use crate::deploy::Deployer;
use crate::http::body::read_body;
use crate::http::query::Params;
use crate::http::ApiError;
use crate::runtime::registry::Runtimes;
use crate::snapshot::Snapshots;

/// The environment variable holding the admin token.
pub const TOKEN_ENV: &str = "VIEWTAPE_ADMIN_TOKEN";

/// Largest JSON body of an admin route (`POST /admin/restore`: an object naming one file).
const MAX_JSON_BODY: usize = 4 * 1024;

/// What the admin routes share: the token's digest, the runtimes and the snapshot actions.
#[derive(Debug)]
pub struct Admin {
    /// SHA-256 of the token.
    token: [u8; 32],
    pub(super) runtimes: Arc<Runtimes>,
    pub(super) snapshots: Arc<Snapshots>,
    pub(super) deployer: Arc<Deployer>,
    pub(super) catalog: Arc<Catalog>,
    /// A node's cluster: restores go through its stream.
    pub(super) cluster: Option<Arc<Cluster>>,
}

impl Admin {
    /// Admin over the `catalog`'s runtimes, `snapshots` and `deployer` with `token`; `None`
    /// for an empty token, which enables nothing.
    pub fn new(
        token: &str,
        catalog: Arc<Catalog>,
        snapshots: Arc<Snapshots>,
        deployer: Arc<Deployer>,
    ) -> Option<Self> {
        (!token.is_empty()).then(|| Self {
            token: Sha256::digest(token.as_bytes()).into(),
            runtimes: Arc::clone(catalog.runtimes()),
            snapshots,
            deployer,
            catalog,
            cluster: None,
        })
    }

    /// Module deploys.
    pub(super) fn deployer(&self) -> &Deployer {
        &self.deployer
    }

    /// Runtime definitions.
    pub(super) fn catalog(&self) -> &Catalog {
        &self.catalog
    }

    /// The node's cluster.
    pub(super) fn cluster(&self) -> Option<&Cluster> {
        self.cluster.as_deref()
    }

    /// The admin of a cluster's node: a restore is a record of the stream, restored by every
    /// node (a deploy is too, through the [`Deployer`]).
    #[must_use]
    pub fn in_cluster(self, cluster: Arc<Cluster>) -> Self {
        Self {
            cluster: Some(cluster),
            ..self
        }
    }

    /// Admin with the token from [`TOKEN_ENV`], if set; logs whether the routes are enabled.
    pub fn from_env(
        catalog: Arc<Catalog>,
        snapshots: Arc<Snapshots>,
        deployer: Arc<Deployer>,
    ) -> Option<Self> {
        let token = std::env::var(TOKEN_ENV).unwrap_or_default();
        let admin = Self::new(&token, catalog, snapshots, deployer);
        if admin.is_some() {
            tracing::info!("admin routes enabled ({TOKEN_ENV} is set)");
        } else {
            tracing::info!("admin routes disabled: {TOKEN_ENV} is not set");
        }
        admin
    }

    /// Checks an `Authorization` header value. The scheme is case-insensitive.
    pub(crate) fn check(&self, authorization: Option<&[u8]>) -> Result<(), ApiError> {
        let presented = authorization
            .and_then(|value| {
                let (scheme, token) = value.split_at_checked(7)?;
                scheme.eq_ignore_ascii_case(b"bearer ").then_some(token)
            })
            .ok_or_else(|| ApiError::unauthorized("a bearer token is required"))?;
        let digest: [u8; 32] = Sha256::digest(presented).into();
        if digests_equal(&digest, &self.token) {
            Ok(())
        } else {
            Err(ApiError::unauthorized("wrong token"))
        }
    }
}

/// Equal-length comparison that always looks at every byte.
fn digests_equal(a: &[u8; 32], b: &[u8; 32]) -> bool {
    let mut diff = 0u8;
    for (x, y) in a.iter().zip(b) {
        diff |= std::hint::black_box(x ^ y);
    }
    std::hint::black_box(diff) == 0
}

/// Proof that the request carried the admin token, and no query parameter (no admin route
/// takes one). Extracted before any body, so an unauthenticated request learns nothing from
/// body parsing.
pub(super) struct Authorized;

impl FromRequestParts<Arc<Admin>> for Authorized {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, admin: &Arc<Admin>) -> Result<Self, ApiError> {
        let authorization = parts.headers.get(header::AUTHORIZATION);
        admin.check(authorization.map(|value| value.as_bytes()))?;
        Params::parse(parts.uri.query(), &[], &[])?;
        Ok(Self)
    }
}

/// The JSON object of an admin route's `body` (at most [`MAX_JSON_BODY`] bytes; an empty body
/// is `{}`), holding only the `fields` its route takes, as a `T`. `shape` is what the route
/// takes, as a refusal says it.
///
/// # Errors
/// As [`json_object`]'s, and `400 bad_request` for a field missing or of the wrong type.
pub(super) async fn json_body<T: serde::de::DeserializeOwned>(
    body: axum::body::Body,
    fields: &[&str],
    shape: &str,
) -> Result<T, ApiError> {
    let object = json_object(body, MAX_JSON_BODY, fields, shape).await?;
    serde_json::from_value(serde_json::Value::Object(object))
        .map_err(|_| ApiError::bad_request(format!("expected a JSON body {shape}")))
}

/// The JSON object of an admin route's `body` (at most `max` bytes; an empty body is `{}`),
/// holding only `fields`.
///
/// # Errors
/// `413 body_too_large` past `max` (refused before the body is read when its declared length
/// says so); `400 bad_request`, in our words: not a JSON object, or a field the route does not
/// take (named).
pub(super) async fn json_object(
    body: axum::body::Body,
    max: usize,
    fields: &[&str],
    shape: &str,
) -> Result<serde_json::Map<String, serde_json::Value>, ApiError> {
    let bytes: Bytes = read_body(body, max).await?;
    let expected = || ApiError::bad_request(format!("expected a JSON body {shape}"));
    // No body at all is no fields; anything else must be a JSON object (blank lines are not).
    let object = if bytes.is_empty() {
        serde_json::Map::new()
    } else {
        match serde_json::from_slice(&bytes) {
            Ok(serde_json::Value::Object(object)) => object,
            _ => return Err(expected()),
        }
    };
    if let Some(unknown) = object.keys().find(|key| !fields.contains(&key.as_str())) {
        let unknown: String = unknown.chars().take(64).collect();
        return Err(ApiError::bad_request(format!(
            "unknown field {unknown:?} in the body; expected {shape}"
        )));
    }
    Ok(object)
}

/// Admin with `token` over an empty hub, snapshots in the temp dir, for tests without a socket.
#[cfg(test)]
pub(crate) fn test_admin(token: &str) -> Option<Admin> {
    use viewtape_journal::{EventJournal, JournalConfig};
    use viewtape_snapshots::SnapshotDir;

    use crate::hub::Hub;

    let hub = Arc::new(Hub::new(Arc::new(EventJournal::new(
        JournalConfig::default(),
    ))));
    let dir = Arc::new(SnapshotDir::open(std::env::temp_dir()).expect("temp dir"));
    let engine = crate::host::GuestEngine::new(crate::host::EngineConfig {
        pooled_instances: 1,
        ..crate::host::EngineConfig::default()
    })
    .expect("engine");
    let store =
        Arc::new(crate::runtime::registry::ModuleStore::open(std::env::temp_dir()).expect("store"));
    let runtimes: Arc<Runtimes> = Arc::default();
    let catalog = Catalog::new(
        engine.clone(),
        Arc::clone(&store),
        Arc::clone(&runtimes),
        Arc::clone(&hub),
        Arc::default(),
    );
    Admin::new(
        token,
        Arc::new(catalog),
        Arc::new(Snapshots::new(
            hub,
            dir,
            Arc::clone(&runtimes),
            Arc::default(),
        )),
        Arc::new(Deployer::new(engine, store, runtimes, None)),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn admin(token: &str) -> Option<Admin> {
        test_admin(token)
    }

    fn status(result: Result<(), ApiError>) -> u16 {
        result.map_or_else(|error| error.status().as_u16(), |()| 200)
    }

    #[test]
    fn no_token_disables_and_tokens_are_checked() {
        assert!(admin("").is_none());
        let a = admin("s3cret").unwrap();
        assert_eq!(status(a.check(Some(b"Bearer s3cret"))), 200);
        assert_eq!(status(a.check(Some(b"bearer s3cret"))), 200);
        assert_eq!(status(a.check(Some(b"BEARER s3cret"))), 200);
        assert_eq!(status(a.check(Some(b"Bearer s3cre"))), 401);
        assert_eq!(status(a.check(Some(b"Basic s3cret"))), 401);
        assert_eq!(status(a.check(Some(b"Bearer"))), 401);
        assert_eq!(status(a.check(None)), 401);
    }
}
