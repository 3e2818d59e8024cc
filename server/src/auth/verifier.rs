//! [`Auth`]: the keys in use (reloaded on SIGHUP), and the tokens verified so far.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Mutex, PoisonError, RwLock};

use jsonwebtoken::{Algorithm, DecodingKey, Validation};

use super::keys::read_keys;
use super::token::{check, Key};
use super::{Access, AuthConfigError, Grants, TokenError, VERIFIED_CACHE};
use crate::config::AuthSection;

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

#[cfg(test)]
pub(super) mod tests {
    use jsonwebtoken::{encode, EncodingKey, Header};
    use proptest::prelude::*;

    use super::*;
    use crate::narrow::Narrow;

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
