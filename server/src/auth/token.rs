//! One token checked against the keys in use, and our words for why one is refused.

use jsonwebtoken::{DecodingKey, Validation};
use serde::Deserialize;

use super::{Access, Grants, TokenError};

#[derive(Deserialize)]
struct Claims {
    exp: u64,
    #[serde(default)]
    views: Vec<String>,
    #[serde(default)]
    ingest: Vec<String>,
}

/// A key that verifies tokens of one algorithm.
pub(super) struct Key {
    /// Its JWKS `kid`, if it has one.
    pub(super) id: Option<String>,
    pub(super) key: DecodingKey,
    pub(super) validation: Validation,
}

/// Checks `token`'s signature and claims against `keys`.
pub(super) fn check(keys: &[Key], token: &str) -> Result<Access, TokenError> {
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
