//! Who may read which views and push into which runtimes: JWTs and their grants.
//!
//! Auth is off unless configured: `VIEWTAPE_JWT_SECRET` in the environment (HS256) or
//! `[auth] public_keys = "FILE"` (a PEM public key, or a JWKS: ES256, ES384, RS256 or EdDSA;
//! read again by [`Auth::reload`], on SIGHUP). A token whose header names a `kid` is checked
//! against the JWKS key of that id (and keys without one); a token without, against every key of
//! its algorithm. A token is a JWT
//! with a required `exp`, an optional `nbf` (both with 5 s leeway; `exp`, `nbf` and `iat` are
//! NumericDates, fractions allowed) and, when `[auth] audience` is set, that `aud`; one whose
//! header lists `crit` extensions is refused, as this server understands none. Its
//! claims grant access: `views` — view names it may read, `ingest` — runtime names it may push
//! to; a trailing `*` matches a prefix (`"orders.*"`). A `views` entry may be narrowed to some
//! keys of what it names, written as the query that narrows a read (`"prices?prefix=EU-"`,
//! `"prices?keys=ACME,BOLT"`; see [`crate::hub::narrow`] and [`Grants`]). `[auth] public_views` may
//! be read without a token. A token that is presented and fails is always refused — never a
//! fallback to anonymous.
//!
//! A verified token is remembered (by its SHA-256, at most [`VERIFIED_CACHE`] of them) until its
//! `exp`: a client that reconnects, or opens a stream per view, pays the signature check once.
//!
//! | file | job |
//! |---|---|
//! | this one | the bounds, the errors |
//! | `grants` | what a token grants: names, prefixes, narrowings |
//! | `verifier` | [`Auth`]: the keys in use, their reload, verified tokens remembered |
//! | `token` | one token checked against the keys, and our words for a refusal |
//! | `keys` | the keys of a public-key file: a JWKS or one PEM key |

use std::path::PathBuf;

mod grants;
mod keys;
mod token;
mod verifier;

pub use grants::{Access, Grants};
pub use verifier::Auth;

/// Most verified tokens remembered.
pub const VERIFIED_CACHE: usize = 10_000;

/// The environment variable holding the HS256 secret.
pub const SECRET_ENV: &str = "VIEWTAPE_JWT_SECRET";

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
