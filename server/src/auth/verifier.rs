//! [`Auth`]: the keys in use (reloaded on SIGHUP), and the tokens verified so far.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Mutex, PoisonError, RwLock};

use jsonwebtoken::{Algorithm, DecodingKey, Validation};

use super::keys::read_keys;
use super::token::{check, Key};
use super::{Access, AuthConfigError, Grants, TokenError, VERIFIED_CACHE};
use crate::config::AuthSection;

/// Seconds a token is still accepted past its `exp`, and before its `nbf`.
const LEEWAY: u64 = 5;

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
        // For `exp` and `nbf` alike: clocks differ a little.
        validation.leeway = LEEWAY;
        validation.validate_nbf = true;
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
            if access.expires_at.saturating_add(LEEWAY) > now {
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
            verified.retain(|_, access| access.expires_at.saturating_add(LEEWAY) > now);
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

#[cfg(test)]
pub(super) mod tests {
    use jsonwebtoken::{encode, EncodingKey, Header};
    use proptest::prelude::*;

    use super::*;
    use crate::hub::narrow::Narrow;

    const SECRET: &str = "test-secret";

    fn auth(audience: Option<&str>) -> Auth {
        let section = AuthSection {
            audience: audience.map(str::to_owned),
            public_views: vec!["public.*".into()],
            ..AuthSection::default()
        };
        Auth::load(&section, Some(SECRET)).unwrap().unwrap()
    }

    pub(in crate::auth) fn now() -> u64 {
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

    /// An HS256 token of `header` and `claims` as given, members the token library's header
    /// type does not have included.
    fn signed_as_is(header: serde_json::Value, claims: serde_json::Value) -> String {
        use base64::Engine as _;
        let part = |value: &serde_json::Value| {
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(value.to_string())
        };
        let message = format!("{}.{}", part(&header), part(&claims));
        let signature = jsonwebtoken::crypto::sign(
            message.as_bytes(),
            &EncodingKey::from_secret(SECRET.as_bytes()),
            jsonwebtoken::Algorithm::HS256,
        )
        .unwrap();
        format!("{message}.{signature}")
    }

    /// A token whose `nbf` was an hour ahead was accepted: `nbf` was not checked at all.
    #[test]
    fn a_token_not_valid_yet_is_refused() {
        let auth = auth(None);
        let now = now();
        let ahead = token(
            serde_json::json!({"exp": now + 7200, "nbf": now + 3600, "views": ["v"]}),
            SECRET,
        );
        let error = auth.verify(&ahead).unwrap_err();
        assert!(error.to_string().contains("`nbf`"), "{error}");
        // Within the leeway `exp` has, and past: valid.
        for nbf in [now + 3, now, now - 3600] {
            let claims = serde_json::json!({"exp": now + 60, "nbf": nbf});
            assert!(auth.verify(&token(claims, SECRET)).is_ok(), "nbf {nbf}");
        }
        // Not a NumericDate: refused, not left unchecked.
        for nbf in [
            serde_json::json!("tomorrow"),
            serde_json::json!(-1),
            serde_json::json!([now]),
        ] {
            let claims = serde_json::json!({"exp": now + 60, "nbf": nbf});
            let error = auth.verify(&token(claims, SECRET)).unwrap_err();
            assert!(error.to_string().contains("NumericDate"), "{nbf}: {error}");
        }
    }

    /// A token whose header marked an extension critical (`crit`) was accepted though the
    /// server understands no extension.
    #[test]
    fn a_token_with_critical_extensions_is_refused() {
        let auth = auth(None);
        let claims = serde_json::json!({"exp": now() + 60, "views": ["v"]});
        let plain = serde_json::json!({"alg": "HS256", "typ": "JWT", "x-note": 1});
        assert!(
            auth.verify(&signed_as_is(plain.clone(), claims.clone()))
                .is_ok(),
            "an unknown member that is not critical is ignored"
        );
        for crit in [
            serde_json::json!(["x-note"]),
            serde_json::json!(["exp"]),
            serde_json::json!([]),
            serde_json::json!(null),
            serde_json::json!("x-note"),
        ] {
            let mut header = plain.clone();
            header["crit"] = crit.clone();
            let error = auth
                .verify(&signed_as_is(header, claims.clone()))
                .unwrap_err();
            assert!(error.to_string().contains("`crit`"), "{crit}: {error}");
        }
    }

    /// A fractional `exp` (a NumericDate may have one) was refused as "`exp` must be a
    /// number"; a fractional `nbf` or `iat` is accepted too, and read as whole seconds.
    #[test]
    fn numeric_dates_may_have_fractions() {
        let auth = auth(None);
        let now = now();
        let claims = serde_json::json!({
            "exp": now as f64 + 60.75,
            "nbf": now as f64 - 0.5,
            "iat": now as f64 - 0.25,
            "views": ["v"],
        });
        let access = auth.verify(&token(claims, SECRET)).unwrap();
        assert_eq!(access.expires_at, now + 60, "rounded down");
        assert!(access.views.allows("v"));
        let past = serde_json::json!({"exp": now as f64 - 60.5});
        assert!(auth.verify(&token(past, SECRET)).is_err());
        for bad in [
            serde_json::json!({"exp": -1.5}),
            serde_json::json!({"exp": "soon"}),
            serde_json::json!({"exp": now + 60, "iat": "today"}),
        ] {
            let error = auth.verify(&token(bad.clone(), SECRET)).unwrap_err();
            assert!(error.to_string().contains("NumericDate"), "{bad}: {error}");
        }
    }

    /// A token that never expires (`exp` at the largest NumericDate) overflowed the check of
    /// the remembered tokens' expiry when presented a second time.
    #[test]
    fn a_token_that_never_expires_is_remembered() {
        let auth = auth(None);
        let forever = token(serde_json::json!({"exp": u64::MAX, "views": ["v"]}), SECRET);
        for _ in 0..2 {
            assert_eq!(auth.verify(&forever).unwrap().expires_at, u64::MAX);
        }
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
