//! Who may read which views and push into which runtimes: JWTs and their grants.
//!
//! Auth is off unless configured: `VIEWTAPE_JWT_SECRET` in the environment (HS256) or
//! `[auth] public_keys = "FILE"` (a PEM public key, or a JWKS: ES256, ES384, RS256 or EdDSA;
//! read again by [`Auth::reload`], on SIGHUP). A token whose header names a `kid` is checked
//! against the JWKS key of that id (and keys without one); a token without, against every key of
//! its algorithm. A token is a JWT
//! with a required `exp` (5 s leeway) and, when `[auth] audience` is set, that `aud`. Its
//! claims grant access: `views` — view names it may read, `ingest` — runtime names it may push
//! to; a trailing `*` matches a prefix (`"orders.*"`). A `views` entry may be narrowed to some
//! keys of what it names, written as the query that narrows a read (`"prices?prefix=EU-"`,
//! `"prices?keys=ACME,BOLT"`; see [`crate::narrow`] and [`Grants`]). `[auth] public_views` may
//! be read without a token. A token that is presented and fails is always refused — never a
//! fallback to anonymous.
//!
//! A verified token is remembered (by its SHA-256, at most [`VERIFIED_CACHE`] of them) until its
//! `exp`: a client that reconnects, or opens a stream per view, pays the signature check once.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Mutex, PoisonError, RwLock};

use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, JwkSet, PublicKeyUse};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde::Deserialize;

use crate::config::AuthSection;
use crate::narrow::Narrow;

/// Most verified tokens remembered.
pub const VERIFIED_CACHE: usize = 10_000;

/// The environment variable holding the HS256 secret.
pub const SECRET_ENV: &str = "VIEWTAPE_JWT_SECRET";

/// Names a grant covers: exact names, or prefixes written with a trailing `*`; each maybe
/// narrowed to some keys of what it names by a query after a `?` — `prices?prefix=EU-`,
/// `prices?keys=ACME,BOLT`, `orders.*?prefix=EU-` — read by [`Narrow::from_query`] with the
/// rules of `?keys=`/`?prefix=` on a read (at most 100 keys; the value as written, not
/// URL-decoded, without `&`). An entry whose narrowing does not read grants nothing (it fails
/// closed, and is logged).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Grants(Vec<Grant>);

/// One entry of [`Grants`].
#[derive(Clone, Debug, PartialEq, Eq)]
struct Grant {
    /// An exact name, or a prefix with a trailing `*`.
    pattern: String,
    /// The keys of what it names that it grants.
    narrow: Narrow,
}

impl Grant {
    fn names(&self, name: &str) -> bool {
        match self.pattern.strip_suffix('*') {
            Some(prefix) => name.starts_with(prefix),
            None => self.pattern == name,
        }
    }
}

impl Grants {
    /// Grants of these entries; see [`Grants`].
    pub fn new(entries: impl IntoIterator<Item = impl Into<String>>) -> Self {
        Self(
            entries
                .into_iter()
                .filter_map(|entry| {
                    let entry: String = entry.into();
                    let Some((pattern, query)) = entry.split_once('?') else {
                        return Some(Grant {
                            pattern: entry,
                            narrow: Narrow::All,
                        });
                    };
                    match Narrow::from_query(query) {
                        Ok(narrow) => Some(Grant {
                            pattern: pattern.to_owned(),
                            narrow,
                        }),
                        Err(error) => {
                            tracing::warn!(grant = %entry, %error, "a grant entry that narrows in a way this server does not read grants nothing");
                            None
                        }
                    }
                })
                .collect(),
        )
    }

    /// Whether all of `name` is granted: an entry names it without a narrowing (the one
    /// question for `ingest`, which cannot be narrowed).
    pub fn allows(&self, name: &str) -> bool {
        self.narrowings(name).any(Narrow::is_all)
    }

    /// The narrowing of every entry that names `name` ([`Narrow::All`] for one without): none
    /// when it is not granted at all.
    pub fn narrowings<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a Narrow> + 'a {
        self.0
            .iter()
            .filter(move |grant| grant.names(name))
            .map(|grant| &grant.narrow)
    }
}

/// What a valid token grants, and until when.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Access {
    /// Views it may read.
    pub views: Grants,
    /// Runtimes it may push to.
    pub ingest: Grants,
    /// Its `exp`, Unix seconds.
    pub expires_at: u64,
}

/// Why a token was refused (a `401`).
#[derive(Debug, thiserror::Error)]
#[error("invalid token: {0}")]
pub struct TokenError(String);

/// Why the auth settings could not be loaded.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AuthConfigError {
    /// The key file could not be read.
    #[error("[auth] public_keys: cannot read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The key file holds no key this server can use.
    #[error("[auth] public_keys: {path} holds no PEM public key or JWKS signing key for ES256, ES384, RS256 or EdDSA{detail}")]
    NoKey {
        /// The file.
        path: PathBuf,
        /// What was wrong with it, if known (starts with `: `).
        detail: String,
    },
}

#[derive(Deserialize)]
struct Claims {
    exp: u64,
    #[serde(default)]
    views: Vec<String>,
    #[serde(default)]
    ingest: Vec<String>,
}

/// A key that verifies tokens of one algorithm.
struct Key {
    /// Its JWKS `kid`, if it has one.
    id: Option<String>,
    key: DecodingKey,
    validation: Validation,
}

/// Verifies tokens; see the module docs.
pub struct Auth {
    /// The HS256 key of the secret, then those of the key file.
    keys: RwLock<Vec<Key>>,
    /// The HS256 secret, kept across reloads of the file.
    secret: Option<String>,
    file: Option<PathBuf>,
    audience: Option<String>,
    public_views: Grants,
    allow_query_token: bool,
    /// Tokens already verified, by SHA-256, with what they grant.
    verified: Mutex<HashMap<[u8; 32], Access>>,
}

impl std::fmt::Debug for Auth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Auth")
            .field(
                "keys",
                &self
                    .keys
                    .read()
                    .unwrap_or_else(PoisonError::into_inner)
                    .len(),
            )
            .field(
                "verified",
                &self
                    .verified
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .len(),
            )
            .field("public_views", &self.public_views)
            .field("allow_query_token", &self.allow_query_token)
            .finish()
    }
}

impl Auth {
    /// The auth of `section` and an HS256 `secret`; `None` (auth off) when neither a secret nor
    /// a key file is given.
    ///
    /// # Errors
    /// The key file cannot be read or holds no usable key.
    pub fn load(
        section: &AuthSection,
        secret: Option<&str>,
    ) -> Result<Option<Self>, AuthConfigError> {
        let auth = Self {
            keys: RwLock::default(),
            secret: secret.filter(|s| !s.is_empty()).map(str::to_owned),
            file: section.public_keys.clone(),
            audience: section.audience.clone(),
            public_views: Grants::new(section.public_views.iter().cloned()),
            allow_query_token: section.allow_query_token,
            verified: Mutex::default(),
        };
        if auth.reload()? == 0 {
            return Ok(None);
        }
        Ok(Some(auth))
    }

    /// Reads the key file again and forgets every token verified so far (a key taken out of
    /// the file no longer admits anyone). Returns the number of keys now in use.
    ///
    /// # Errors
    /// The key file cannot be read or holds no usable key; the keys in use then stay.
    pub fn reload(&self) -> Result<usize, AuthConfigError> {
        let mut keys = Vec::new();
        if let Some(secret) = &self.secret {
            keys.push(Key {
                id: None,
                key: DecodingKey::from_secret(secret.as_bytes()),
                validation: self.validation(Algorithm::HS256),
            });
        }
        if let Some(path) = &self.file {
            let text = std::fs::read(path).map_err(|source| AuthConfigError::Read {
                path: path.clone(),
                source,
            })?;
            let found = read_keys(&text).map_err(|detail| AuthConfigError::NoKey {
                path: path.clone(),
                detail: format!(": {detail}"),
            })?;
            keys.extend(found.into_iter().map(|(id, key, algorithm)| Key {
                id,
                key,
                validation: self.validation(algorithm),
            }));
        }
        let count = keys.len();
        // The cache is cleared before the new keys are let out: a token checked against the old
        // keys is remembered before this (and forgotten here) or not at all (see `verify`).
        let mut in_use = self.keys.write().unwrap_or_else(PoisonError::into_inner);
        *in_use = keys;
        self.verified
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
        drop(in_use);
        Ok(count)
    }

    /// The checks of a token signed with `algorithm`.
    fn validation(&self, algorithm: Algorithm) -> Validation {
        let mut validation = Validation::new(algorithm);
        validation.leeway = 5;
        match &self.audience {
            Some(audience) => {
                validation.set_required_spec_claims(&["exp", "aud"]);
                validation.set_audience(&[audience]);
            }
            None => {
                validation.set_required_spec_claims(&["exp"]);
                validation.validate_aud = false;
            }
        }
        validation
    }

    /// What `token` grants.
    ///
    /// # Errors
    /// [`TokenError`]: malformed, expired, badly signed, of another audience, or without `exp`.
    pub fn verify(&self, token: &str) -> Result<Access, TokenError> {
        use sha2::Digest as _;
        let digest: [u8; 32] = sha2::Sha256::digest(token.as_bytes()).into();
        let now = crate::log::unix_ms_now() / 1000;
        let mut verified = self.verified.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(access) = verified.get(&digest) {
            // The same leeway as the check that admitted it.
            if access.expires_at + 5 > now {
                return Ok(access.clone());
            }
            verified.remove(&digest);
        }
        drop(verified);
        // The keys stay read-locked until the token is remembered, so a reload cannot clear the
        // cache between the check and the insert and leave a token of a removed key in it.
        let keys = self.keys.read().unwrap_or_else(PoisonError::into_inner);
        let access = check(&keys, token)?;
        let mut verified = self.verified.lock().unwrap_or_else(PoisonError::into_inner);
        if verified.len() >= VERIFIED_CACHE {
            verified.retain(|_, access| access.expires_at + 5 > now);
            if verified.len() >= VERIFIED_CACHE {
                verified.clear();
            }
        }
        verified.insert(digest, access.clone());
        drop(verified);
        drop(keys);
        Ok(access)
    }

    /// Views anyone may read.
    pub fn public_views(&self) -> &Grants {
        &self.public_views
    }

    /// Whether `?access_token=` is accepted.
    pub fn allows_query_token(&self) -> bool {
        self.allow_query_token
    }
}

/// Checks `token`'s signature and claims against `keys`.
fn check(keys: &[Key], token: &str) -> Result<Access, TokenError> {
    let header = jsonwebtoken::decode_header(token).map_err(|error| refusal(&error, true))?;
    let mut last = None;
    for Key {
        id,
        key,
        validation,
    } in keys.iter()
    {
        let other_id = matches!((id, &header.kid), (Some(id), Some(kid)) if id != kid);
        if !validation.algorithms.contains(&header.alg) || other_id {
            continue;
        }
        match jsonwebtoken::decode::<Claims>(token, key, validation) {
            Ok(data) => {
                return Ok(Access {
                    views: Grants::new(data.claims.views),
                    ingest: Grants::new(data.claims.ingest),
                    expires_at: data.claims.exp,
                })
            }
            Err(error) => last = Some(refusal(&error, false)),
        }
    }
    Err(last.unwrap_or_else(|| {
        let algorithm = keys
            .iter()
            .any(|key| key.validation.algorithms.contains(&header.alg));
        match &header.kid {
            Some(kid) if algorithm => {
                TokenError(format!("no {:?} key with kid {kid:?}", header.alg))
            }
            _ => TokenError(format!("algorithm {:?} is not accepted here", header.alg)),
        }
    }))
}

/// Our words for why the token library refused a token: short, naming what to fix, never the
/// library's own text (serde positions, variant lists). `in_header`: decoding the header.
fn refusal(error: &jsonwebtoken::errors::Error, in_header: bool) -> TokenError {
    use jsonwebtoken::errors::ErrorKind;
    let message = match error.kind() {
        ErrorKind::Json(_) if in_header => {
            "its header is not one this server reads: it must name a signing algorithm it accepts (HS256, ES256, RS256, EdDSA, …)".to_owned()
        }
        ErrorKind::Json(_) => {
            "its claims are malformed: `exp` must be a number, `views` and `ingest` lists of strings".to_owned()
        }
        ErrorKind::MissingRequiredClaim(claim) => format!("the `{claim}` claim is missing"),
        ErrorKind::ExpiredSignature => "it has expired (`exp`): get a new one".to_owned(),
        ErrorKind::ImmatureSignature => "it is not valid yet (`nbf`)".to_owned(),
        ErrorKind::InvalidSignature => {
            "its signature does not verify: sign it with a key this server is configured with".to_owned()
        }
        ErrorKind::InvalidAudience => "its `aud` is not this server's audience".to_owned(),
        ErrorKind::InvalidIssuer => "its `iss` is not accepted".to_owned(),
        ErrorKind::InvalidAlgorithm => "its algorithm does not fit the key".to_owned(),
        _ => "it is not a JWT: send three base64url parts, header.claims.signature".to_owned(),
    };
    TokenError(message)
}

/// The keys of a public-key file: a JWKS (`{"keys": [...]}`), or one PEM public key. Each comes
/// with its `kid` and the algorithm it verifies. JWKS keys for encryption, symmetric keys,
/// curves this server does not verify and keys whose `alg` does not fit them are left out.
fn read_keys(text: &[u8]) -> Result<Vec<(Option<String>, DecodingKey, Algorithm)>, String> {
    if text.trim_ascii_start().starts_with(b"{") {
        let set: JwkSet = serde_json::from_slice(text).map_err(|error| format!("JWKS: {error}"))?;
        let keys: Vec<_> = set
            .keys
            .iter()
            .filter(|jwk| !matches!(jwk.common.public_key_use, Some(PublicKeyUse::Encryption)))
            .filter_map(|jwk| {
                let inferred = match &jwk.algorithm {
                    AlgorithmParameters::EllipticCurve(ec) => match ec.curve {
                        EllipticCurve::P256 => Algorithm::ES256,
                        EllipticCurve::P384 => Algorithm::ES384,
                        _ => return None,
                    },
                    AlgorithmParameters::RSA(_) => Algorithm::RS256,
                    AlgorithmParameters::OctetKeyPair(okp)
                        if okp.curve == EllipticCurve::Ed25519 =>
                    {
                        Algorithm::EdDSA
                    }
                    AlgorithmParameters::OctetKeyPair(_) | AlgorithmParameters::OctetKey(_) => {
                        return None
                    }
                };
                // An `alg` must fit the key: an RSA key may name any RSA algorithm, a curve only
                // its own (a symmetric one has no business in a public-key file).
                let algorithm = match jwk.common.key_algorithm {
                    Some(named) => named.to_string().parse::<Algorithm>().ok().filter(|a| {
                        *a == inferred
                            || (inferred == Algorithm::RS256
                                && matches!(
                                    a,
                                    Algorithm::RS384
                                        | Algorithm::RS512
                                        | Algorithm::PS256
                                        | Algorithm::PS384
                                        | Algorithm::PS512
                                ))
                    })?,
                    None => inferred,
                };
                let key = DecodingKey::from_jwk(jwk).ok()?;
                Some((jwk.common.key_id.clone(), key, algorithm))
            })
            .collect();
        if keys.is_empty() {
            return Err(format!("none of the JWKS's {} keys", set.keys.len()));
        }
        return Ok(keys);
    }
    DecodingKey::from_ec_pem(text)
        .map(|k| (k, Algorithm::ES256))
        .or_else(|_| DecodingKey::from_rsa_pem(text).map(|k| (k, Algorithm::RS256)))
        .or_else(|_| DecodingKey::from_ed_pem(text).map(|k| (k, Algorithm::EdDSA)))
        .map(|(key, algorithm)| vec![(None, key, algorithm)])
        .map_err(|_| "not a PEM public key".into())
}

#[cfg(test)]
mod tests {
    use jsonwebtoken::{encode, EncodingKey, Header};
    use proptest::prelude::*;

    use super::*;

    const SECRET: &str = "test-secret";

    fn auth(audience: Option<&str>) -> Auth {
        let section = AuthSection {
            audience: audience.map(str::to_owned),
            public_views: vec!["public.*".into()],
            ..AuthSection::default()
        };
        Auth::load(&section, Some(SECRET)).unwrap().unwrap()
    }

    fn now() -> u64 {
        crate::log::unix_ms_now() / 1000
    }

    fn token(claims: serde_json::Value, secret: &str) -> String {
        encode(
            &Header::default(),
            &claims,
            &EncodingKey::from_secret(secret.as_bytes()),
        )
        .unwrap()
    }

    #[test]
    fn grants_match_exact_names_and_prefixes() {
        let grants = Grants::new(["prices", "orders.*"]);
        assert!(grants.allows("prices") && grants.allows("orders.eu") && grants.allows("orders."));
        assert!(!grants.allows("prices2") && !grants.allows("order") && !grants.allows(""));
        assert!(Grants::new(["*"]).allows("anything"));
    }

    #[test]
    fn grants_may_be_narrowed_to_some_keys() {
        let grants = Grants::new([
            "prices?prefix=EU-",
            "prices?keys=ACME,BOLT",
            "orders.*?prefix=DE",
            "quotes",
        ]);
        let of = |name| grants.narrowings(name).cloned().collect::<Vec<_>>();
        assert_eq!(
            of("prices"),
            [
                Narrow::Prefix("EU-".into()),
                Narrow::Keys(["ACME".to_owned(), "BOLT".to_owned()].into())
            ]
        );
        assert_eq!(of("orders.eu"), [Narrow::Prefix("DE".into())]);
        assert_eq!(of("quotes"), [Narrow::All]);
        assert!(of("prices2").is_empty() && of("orders").is_empty());
        // Narrowed entries name the view, but do not grant all of it.
        assert!(!grants.allows("prices") && !grants.allows("orders.eu"));
        assert!(grants.allows("quotes"));

        // An entry whose narrowing does not read grants nothing: not the view, not a view of
        // that literal name.
        for bad in [
            "prices?",
            "prices?prefix=",
            "prices?keys=",
            "prices?keys=A,,B",
            "prices?prefix=EU-&keys=A",
            "prices?region=EU",
            "prices?prefix",
        ] {
            let grants = Grants::new([bad]);
            assert!(grants.narrowings("prices").next().is_none(), "{bad}");
            assert!(grants.narrowings(bad).next().is_none(), "{bad}");
        }
        let many: Vec<String> = (0..=crate::narrow::MAX_KEYS)
            .map(|i| format!("k{i}"))
            .collect();
        let too_many = format!("prices?keys={}", many.join(","));
        assert!(Grants::new([too_many])
            .narrowings("prices")
            .next()
            .is_none());
        // The value as written: a `?` or `=` after the first belongs to it.
        assert_eq!(
            Grants::new(["prices?prefix=a?b=c"])
                .narrowings("prices")
                .collect::<Vec<_>>(),
            [&Narrow::Prefix("a?b=c".into())]
        );
    }

    #[test]
    fn a_token_carries_its_narrowed_grants() {
        let auth = auth(None);
        let claims = serde_json::json!({
            "exp": now() + 60,
            "views": ["prices?prefix=EU-", "public.x?keys=A"],
            "ingest": ["demo?prefix=EU-"],
        });
        let access = auth.verify(&token(claims, SECRET)).unwrap();
        assert_eq!(
            access.views.narrowings("prices").collect::<Vec<_>>(),
            [&Narrow::Prefix("EU-".into())]
        );
        assert!(!access.views.allows("prices"));
        // Ingest cannot be narrowed: such an entry grants no pushing.
        assert!(!access.ingest.allows("demo"));
    }

    #[test]
    fn tokens_are_checked() {
        let auth = auth(Some("viewtape"));
        let good = serde_json::json!({"exp": now() + 60, "aud": "viewtape", "views": ["prices"], "ingest": ["demo"]});
        let access = auth.verify(&token(good.clone(), SECRET)).unwrap();
        assert!(access.views.allows("prices") && access.ingest.allows("demo"));
        assert!(!access.views.allows("orders"));
        for (claims, secret) in [
            (good.clone(), "wrong"),
            (
                serde_json::json!({"exp": now() - 60, "aud": "viewtape"}),
                SECRET,
            ),
            (serde_json::json!({"aud": "viewtape"}), SECRET),
            (
                serde_json::json!({"exp": now() + 60, "aud": "other"}),
                SECRET,
            ),
            (serde_json::json!({"exp": now() + 60}), SECRET),
        ] {
            assert!(
                auth.verify(&token(claims.clone(), secret)).is_err(),
                "{claims} {secret}"
            );
        }
        assert!(auth.verify("garbage").is_err());
        assert!(auth.verify("").is_err());
        // Without an audience configured, `aud` is not required.
        let open = self::auth(None);
        assert!(open
            .verify(&token(serde_json::json!({"exp": now() + 60}), SECRET))
            .is_ok());
    }

    #[test]
    fn a_remembered_token_still_expires() {
        let auth = auth(None);
        let soon = token(
            serde_json::json!({"exp": now() - 4, "views": ["v"]}),
            SECRET,
        );
        // Within the leeway: valid, and remembered.
        assert!(auth.verify(&soon).is_ok());
        assert!(auth.verify(&soon).is_ok());
        std::thread::sleep(std::time::Duration::from_millis(2_100));
        assert!(
            auth.verify(&soon).is_err(),
            "past exp + leeway, remembered or not"
        );
    }

    #[test]
    fn no_secret_and_no_keys_is_auth_off() {
        assert!(Auth::load(&AuthSection::default(), None).unwrap().is_none());
        assert!(Auth::load(&AuthSection::default(), Some(""))
            .unwrap()
            .is_none());
        let missing = AuthSection {
            public_keys: Some("/nonexistent/key.pem".into()),
            ..AuthSection::default()
        };
        assert!(matches!(
            Auth::load(&missing, None),
            Err(AuthConfigError::Read { .. })
        ));
    }

    /// Unpadded base64url, as JWKs write their numbers.
    fn base64url(bytes: &[u8]) -> String {
        use base64::Engine as _;
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
    }

    /// A new P-256 key: what signs ES256 tokens, and its public JWK (with `kid`, if given).
    fn es256(kid: Option<&str>) -> (EncodingKey, serde_json::Value) {
        let pair = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let signing = EncodingKey::from_ec_pem(pair.serialize_pem().as_bytes()).unwrap();
        // The uncompressed point: 0x04, then x and y, 32 bytes each.
        let point = pair.public_key_raw();
        assert_eq!((point.len(), point[0]), (65, 4));
        let mut jwk = serde_json::json!({
            "kty": "EC",
            "crv": "P-256",
            "use": "sig",
            "x": base64url(&point[1..33]),
            "y": base64url(&point[33..]),
        });
        if let Some(kid) = kid {
            jwk["kid"] = kid.into();
        }
        (signing, jwk)
    }

    /// An ES256 token for view `v`, with `kid` in its header if given.
    fn es256_token(signing: &EncodingKey, kid: Option<&str>, view: &str) -> String {
        let mut header = Header::new(Algorithm::ES256);
        header.kid = kid.map(str::to_owned);
        let claims = serde_json::json!({"exp": now() + 60, "views": [view]});
        encode(&header, &claims, signing).unwrap()
    }

    fn write_jwks(path: &std::path::Path, keys: &[&serde_json::Value]) {
        std::fs::write(path, serde_json::json!({ "keys": keys }).to_string()).unwrap();
    }

    #[test]
    fn a_jwks_matches_kids_and_reloads() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("jwks.json");
        let (old_key, old_jwk) = es256(Some("old"));
        write_jwks(&file, &[&old_jwk]);
        let section = AuthSection {
            public_keys: Some(file.clone()),
            ..AuthSection::default()
        };
        let auth = Auth::load(&section, None).unwrap().unwrap();

        let old = es256_token(&old_key, Some("old"), "v");
        let access = auth.verify(&old).unwrap();
        assert!(access.views.allows("v"));
        // A token naming another key id is not checked against this key, even though it signed it.
        let error = auth
            .verify(&es256_token(&old_key, Some("other"), "v"))
            .unwrap_err();
        assert!(error.to_string().contains("kid \"other\""), "{error}");
        // A token without kid is checked against every key of its algorithm.
        assert!(auth.verify(&es256_token(&old_key, None, "v")).is_ok());
        // Another key with the same kid: refused.
        let (stranger, _) = es256(None);
        assert!(auth
            .verify(&es256_token(&stranger, Some("old"), "v"))
            .is_err());

        // The file gets another key; a reload drops the old one, remembered tokens included.
        let (new_key, new_jwk) = es256(Some("new"));
        write_jwks(&file, &[&new_jwk]);
        assert_eq!(auth.reload().unwrap(), 1);
        assert!(auth.verify(&old).is_err(), "a token of a removed key");
        let new = es256_token(&new_key, Some("new"), "v");
        assert!(auth.verify(&new).is_ok());

        // A broken file: the reload fails and the keys in use stay (a token never seen before
        // still verifies with the new key, the old key stays out).
        std::fs::write(&file, "{\"keys\": [").unwrap();
        assert!(matches!(auth.reload(), Err(AuthConfigError::NoKey { .. })));
        assert!(auth.verify(&es256_token(&new_key, None, "w")).is_ok());
        assert!(auth.verify(&es256_token(&old_key, None, "w")).is_err());
        std::fs::remove_file(&file).unwrap();
        assert!(matches!(auth.reload(), Err(AuthConfigError::Read { .. })));
        assert!(auth
            .verify(&es256_token(&new_key, Some("new"), "x"))
            .is_ok());
    }

    #[test]
    fn a_jwks_without_a_signing_key_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("jwks.json");
        let section = AuthSection {
            public_keys: Some(file.clone()),
            ..AuthSection::default()
        };
        let (_, jwk) = es256(Some("k"));
        let mut for_encryption = jwk.clone();
        for_encryption["use"] = "enc".into();
        let mut wrong_alg = jwk.clone();
        wrong_alg["alg"] = "ES384".into();
        let mut symmetric_alg = jwk.clone();
        symmetric_alg["alg"] = "HS256".into();
        let oct = serde_json::json!({"kty": "oct", "k": base64url(b"a shared secret"), "kid": "s"});
        for keys in [
            vec![&oct],
            vec![&for_encryption],
            vec![&oct, &for_encryption],
            vec![&wrong_alg, &symmetric_alg],
            vec![],
        ] {
            write_jwks(&file, &keys);
            let error = Auth::load(&section, None).unwrap_err();
            assert!(
                matches!(&error, AuthConfigError::NoKey { detail, .. } if detail.contains("JWKS")),
                "{keys:?}: {error}"
            );
        }
        // Beside a usable key they are skipped, and the usable one is all there is.
        write_jwks(&file, &[&oct, &for_encryption, &jwk]);
        let auth = Auth::load(&section, None).unwrap().unwrap();
        assert_eq!(auth.reload().unwrap(), 1);
    }

    proptest! {
        #[test]
        fn any_bytes_as_a_token_are_refused_without_a_panic(text in ".{0,300}") {
            prop_assert!(auth(None).verify(&text).is_err());
        }

        #[test]
        fn any_claims_either_verify_or_are_refused(
            exp in proptest::option::of(any::<i64>()),
            views in proptest::collection::vec(".{0,12}", 0..4),
            extra in ".{0,20}",
        ) {
            let now = now() as i64;
            // Near now the leeway decides; that is checked above.
            prop_assume!(exp.is_none_or(|e| !(now - 10..=now + 10).contains(&e)));
            let mut claims = serde_json::json!({ "views": views, "x": extra });
            if let Some(exp) = exp {
                claims["exp"] = exp.into();
            }
            let result = auth(None).verify(&token(claims, SECRET));
            prop_assert_eq!(result.is_ok(), exp.is_some_and(|e| e > now));
        }
    }
}
