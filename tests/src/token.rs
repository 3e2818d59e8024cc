//! Tokens as an identity provider would mint them for the server's `[auth]`.

use std::time::{SystemTime, UNIX_EPOCH};

use jsonwebtoken::{encode, EncodingKey, Header};

/// Now, in Unix seconds.
pub fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// An HS256 token signed with `secret` for audience `aud`, valid for `seconds` (negative:
/// expired), granting `views` to read and `ingest` to push into.
pub fn hs256(secret: &str, seconds: i64, aud: &str, views: &[&str], ingest: &[&str]) -> String {
    let claims = serde_json::json!({
        "exp": i64::try_from(now()).unwrap_or(i64::MAX) + seconds,
        "aud": aud,
        "views": views,
        "ingest": ingest,
    });
    encode(
        &Header::default(),
        &claims,
        &EncodingKey::from_secret(secret.as_bytes()),
    )
    .unwrap_or_default()
}

/// An HS256 token of `claims` exactly as given, signed with `secret`.
pub fn hs256_claims(secret: &str, claims: &serde_json::Value) -> String {
    encode(
        &Header::default(),
        claims,
        &EncodingKey::from_secret(secret.as_bytes()),
    )
    .unwrap_or_default()
}
