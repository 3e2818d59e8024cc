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
/// holding only `fields`, each once.
///
/// # Errors
/// `413 body_too_large` past `max` (refused before the body is read when its declared length
/// says so); `400 bad_request`, in our words: not a JSON object, a key given twice at any depth
/// (named, in `field`), or a field the route does not take (named).
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
        match strict_json(&bytes) {
            Ok(serde_json::Value::Object(object)) => object,
            Ok(_) | Err(StrictJsonError::Malformed) => return Err(expected()),
            Err(StrictJsonError::Duplicate(path)) => {
                let path: String = path.chars().take(64).collect();
                return Err(ApiError::bad_request(format!(
                    "the key {path:?} is given twice in the body: give each key once"
                ))
                .with_field("field", path));
            }
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

/// Why a body is not strict JSON.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
enum StrictJsonError {
    /// Not one JSON document (serde_json's reason is not the client's business).
    #[error("not JSON")]
    Malformed,
    /// A key repeated within one object, by its path from the top (`limits.fuel`,
    /// `views[0].x`).
    #[error("the key {0:?} is given twice")]
    Duplicate(String),
}

/// `bytes` as one JSON document, as `serde_json::from_slice` reads it but for a key repeated in
/// an object, at any depth: serde_json keeps the last one, so an operator's `{"fuel": 1,
/// "fuel": 0}` would mean what only its end says; it is refused instead.
fn strict_json(bytes: &[u8]) -> Result<serde_json::Value, StrictJsonError> {
    use serde::de::DeserializeSeed as _;
    let duplicate = std::cell::RefCell::new(None);
    let mut reader = serde_json::Deserializer::from_slice(bytes);
    let value = Strict {
        duplicate: &duplicate,
    }
    .deserialize(&mut reader)
    .and_then(|value| reader.end().map(|()| value));
    value.map_err(|_| match duplicate.into_inner() {
        Some(path) => StrictJsonError::Duplicate(path),
        None => StrictJsonError::Malformed,
    })
}

/// Reads a JSON value like `serde_json::Value`'s own `Deserialize`, refusing a repeated key;
/// the path of the key goes to `duplicate`, each enclosing object or array adding its part as
/// the refusal goes up.
struct Strict<'a> {
    duplicate: &'a std::cell::RefCell<Option<String>>,
}

impl Strict<'_> {
    /// Puts `part` (`key` or `[i]`) in front of the duplicate's path, if a duplicate is why
    /// reading failed.
    fn prefix(&self, part: &str) {
        if let Some(path) = self.duplicate.borrow_mut().as_mut() {
            let joint = if path.starts_with('[') { "" } else { "." };
            *path = format!("{part}{joint}{path}");
        }
    }
}

impl<'de> serde::de::DeserializeSeed<'de> for Strict<'_> {
    type Value = serde_json::Value;

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> serde::de::Visitor<'de> for Strict<'_> {
    type Value = serde_json::Value;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E: serde::de::Error>(self, v: bool) -> Result<Self::Value, E> {
        Ok(v.into())
    }

    fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Self::Value, E> {
        Ok(v.into())
    }

    fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Self::Value, E> {
        Ok(v.into())
    }

    fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<Self::Value, E> {
        Ok(serde_json::Number::from_f64(v).map_or(serde_json::Value::Null, Into::into))
    }

    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Self::Value, E> {
        Ok(v.into())
    }

    fn visit_string<E: serde::de::Error>(self, v: String) -> Result<Self::Value, E> {
        Ok(v.into())
    }

    fn visit_unit<E: serde::de::Error>(self) -> Result<Self::Value, E> {
        Ok(serde_json::Value::Null)
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut items = Vec::new();
        loop {
            let item = seq.next_element_seed(Strict {
                duplicate: self.duplicate,
            });
            match item {
                Ok(Some(item)) => items.push(item),
                Ok(None) => return Ok(serde_json::Value::Array(items)),
                Err(error) => {
                    self.prefix(&format!("[{}]", items.len()));
                    return Err(error);
                }
            }
        }
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut object = serde_json::Map::new();
        while let Some(key) = map.next_key::<String>()? {
            if object.contains_key(&key) {
                *self.duplicate.borrow_mut() = Some(key);
                return Err(serde::de::Error::custom("a key is given twice"));
            }
            let value = map.next_value_seed(Strict {
                duplicate: self.duplicate,
            });
            match value {
                Ok(value) => object.insert(key, value),
                Err(error) => {
                    self.prefix(&key);
                    return Err(error);
                }
            };
        }
        Ok(serde_json::Value::Object(object))
    }
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
        Default::default(),
        crate::config::ServerConfig::default().max_runtimes,
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
    fn a_key_given_twice_is_refused_by_its_path() {
        let read = strict_json(br#"{"a": 1, "b": [{"c": 2.5}, null, "x"], "d": {}}"#);
        assert_eq!(
            read,
            Ok(serde_json::json!({"a": 1, "b": [{"c": 2.5}, null, "x"], "d": {}}))
        );
        let duplicate = |path: &str| Err(StrictJsonError::Duplicate(path.to_owned()));
        assert_eq!(strict_json(br#"{"a": 1, "a": 1}"#), duplicate("a"));
        assert_eq!(
            strict_json(br#"{"limits": {"fuel": 1, "fuel": 0}}"#),
            duplicate("limits.fuel")
        );
        assert_eq!(
            strict_json(br#"{"s": {"v": [[], {"x": 1, "x": 2}]}}"#),
            duplicate("s.v[1].x")
        );
        assert_eq!(strict_json(br#"[{"x": 1, "x": 2}]"#), duplicate("[0].x"));
        for malformed in [&b"{"[..], b"{} {}", b"[1,]", b"", br#"{"a": 1 "b": 1}"#] {
            assert_eq!(strict_json(malformed), Err(StrictJsonError::Malformed));
        }
    }

    #[tokio::test]
    async fn admin_bodies_are_read_strictly() {
        let read =
            |body: &'static str| json_object(axum::body::Body::from(body), 64, &["a", "b"], "{…}");
        let object = read(r#"{"a": {"x": 1}, "b": 2}"#).await.expect("read");
        assert_eq!(object.len(), 2);
        let twice = read(r#"{"a": {"x": 1, "x": 1}}"#)
            .await
            .expect_err("refused");
        assert_eq!(twice.status(), 400);
        assert!(twice.to_string().contains("\"a.x\""), "{twice}");
        let long = read(r#"{"a": "                                                            "}"#);
        assert_eq!(long.await.expect_err("refused").status(), 413);
        assert_eq!(read("[1]").await.expect_err("refused").status(), 400);
        assert_eq!(
            read(r#"{"c": 1}"#).await.expect_err("refused").status(),
            400
        );
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
