//! One token checked against the keys in use, and our words for why one is refused.

use base64::Engine as _;
use jsonwebtoken::{DecodingKey, Validation};
use serde::{Deserialize, Deserializer};

use super::{Access, Grants, TokenError};

#[derive(Deserialize)]
struct Claims {
    exp: NumericDate,
    /// Compared with the clock by the token library (with the leeway `exp` has); read here too,
    /// so that one that is not a NumericDate refuses the token rather than going unchecked.
    #[serde(default, rename = "nbf")]
    _not_before: Option<NumericDate>,
    /// Not compared with anything; read so that one that is not a NumericDate refuses the token.
    #[serde(default, rename = "iat")]
    _issued_at: Option<NumericDate>,
    #[serde(default)]
    views: Vec<String>,
    #[serde(default)]
    ingest: Vec<String>,
}

/// A NumericDate: seconds since 1970, a fraction allowed (`1767225600.5`); kept as whole
/// seconds, rounded down. Negative, and anything but a number, is refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct NumericDate(u64);

impl<'de> Deserialize<'de> for NumericDate {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let number = serde_json::Number::deserialize(deserializer)?;
        if let Some(seconds) = number.as_u64() {
            return Ok(Self(seconds));
        }
        match number.as_f64() {
            // `as` rounds toward zero and saturates at `u64::MAX`.
            Some(seconds) if seconds.is_finite() && seconds >= 0.0 => Ok(Self(seconds as u64)),
            _ => Err(serde::de::Error::custom(
                "a NumericDate is a number of seconds since 1970, not negative",
            )),
        }
    }
}

/// Refuses a token whose header has `crit`: it lists extensions a verifier must understand
/// to accept the token at all, and this server understands none. (The token library's header
/// type drops members it does not know, `crit` among them: the header is read whole here.)
fn refuse_critical_extensions(token: &str) -> Result<(), TokenError> {
    // The header as the token library finds it: what comes before the last two dots.
    let header = token.rsplitn(3, '.').nth(2).unwrap_or_default();
    let fields = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(header)
        .ok()
        .and_then(|json| {
            serde_json::from_slice::<serde_json::Map<String, serde_json::Value>>(&json).ok()
        });
    match fields {
        Some(fields) if !fields.contains_key("crit") => Ok(()),
        Some(_) => Err(TokenError(
            "its header lists extensions (`crit`) that this server does not understand".to_owned(),
        )),
        None => Err(TokenError(HEADER_UNREAD.to_owned())),
    }
}

/// Why a token whose header does not read is refused.
const HEADER_UNREAD: &str = "its header is not one this server reads: it must name a signing algorithm it accepts (HS256, ES256, RS256, EdDSA, …)";

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
    refuse_critical_extensions(token)?;
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
                    expires_at: data.claims.exp.0,
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
        ErrorKind::Json(_) if in_header => HEADER_UNREAD.to_owned(),
        ErrorKind::Json(_) => {
            "its claims are malformed: `exp` (and `nbf`, `iat` if given) must be NumericDates — seconds since 1970, a fraction allowed — and `views` and `ingest` lists of strings".to_owned()
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
