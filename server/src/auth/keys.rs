//! The keys of a public-key file (`[auth] public_keys`): a JWKS, or one PEM public key.

use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, JwkSet, PublicKeyUse};
use jsonwebtoken::{Algorithm, DecodingKey};

/// Why a public-key file yields no key.
#[derive(Debug, thiserror::Error)]
pub(super) enum KeysError {
    /// It looks like a JWKS and is not one.
    #[error("JWKS: {0}")]
    Jwks(#[source] serde_json::Error),
    /// A JWKS none of whose keys this server verifies with (of how many).
    #[error("none of the JWKS's {0} keys")]
    NoneUsable(usize),
    /// Not a JWKS, and no PEM public key of a kind this server verifies with.
    #[error("not a PEM public key")]
    NotPem,
}

/// The keys of a public-key file: a JWKS (`{"keys": [...]}`), or one PEM public key. Each comes
/// with its `kid` and the algorithm it verifies. JWKS keys for encryption, symmetric keys,
/// curves this server does not verify and keys whose `alg` does not fit them are left out.
pub(super) fn read_keys(
    text: &[u8],
) -> Result<Vec<(Option<String>, DecodingKey, Algorithm)>, KeysError> {
    if text.trim_ascii_start().starts_with(b"{") {
        let set: JwkSet = serde_json::from_slice(text).map_err(KeysError::Jwks)?;
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
            return Err(KeysError::NoneUsable(set.keys.len()));
        }
        return Ok(keys);
    }
    DecodingKey::from_ec_pem(text)
        .map(|k| (k, Algorithm::ES256))
        .or_else(|_| DecodingKey::from_rsa_pem(text).map(|k| (k, Algorithm::RS256)))
        .or_else(|_| DecodingKey::from_ed_pem(text).map(|k| (k, Algorithm::EdDSA)))
        .map(|(key, algorithm)| vec![(None, key, algorithm)])
        .map_err(|_| KeysError::NotPem)
}

#[cfg(test)]
mod tests {
    use jsonwebtoken::{encode, EncodingKey, Header};

    use super::*;
    use crate::auth::verifier::tests::now;
    use crate::auth::{Auth, AuthConfigError};
    use crate::config::AuthSection;

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
}
