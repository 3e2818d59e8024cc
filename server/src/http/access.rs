//! Who is asking: the token of a request and what it may do, the same way on every route and
//! whichever transport carried the request. See [`crate::auth`] for the rules.
//!
//! A token comes from `Authorization: Bearer …`, else the `viewtape_token` cookie (what a
//! browser's `EventSource` can send), else `?access_token=` where `[auth] allow_query_token` is
//! on. Missing where one is needed, malformed, expired or badly signed: `401` with
//! `WWW-Authenticate: Bearer`. Valid without the grant: `403`.
//!
//! A grant narrowed to some keys of a view (`prices?prefix=EU-`) lets its caller read only
//! them: [`Caller::read`] is the one place that decides which keys a read of a view carries,
//! for every route that reveals them.

use axum::http::{header, HeaderMap};

use super::{ApiError, AppState};
use crate::auth::{Access, Auth};
use crate::hub::narrow::{Narrow, NotGranted};

/// What a read without auth, or under a full grant, carries.
static EVERY_KEY: Narrow = Narrow::All;

/// The cookie a browser sends its token in.
pub const TOKEN_COOKIE: &str = "viewtape_token";

/// The caller of one request.
pub(super) struct Caller<'a> {
    auth: Option<&'a Auth>,
    access: Option<Access>,
}

impl<'a> Caller<'a> {
    /// Who sent `headers` (and `query_token`, a `?access_token=`).
    ///
    /// # Errors
    /// `401` for a token presented and refused, or an `Authorization` of another scheme.
    pub(super) fn of(
        state: &'a AppState,
        headers: &HeaderMap,
        query_token: Option<&str>,
    ) -> Result<Self, ApiError> {
        let Some(auth) = state.auth.as_deref() else {
            return Ok(Self {
                auth: None,
                access: None,
            });
        };
        let token = match headers.get(header::AUTHORIZATION) {
            Some(value) => Some(
                value
                    .to_str()
                    .ok()
                    .and_then(|v| v.split_at_checked(7))
                    .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer "))
                    .map(|(_, token)| token.trim())
                    .ok_or_else(|| ApiError::unauthorized("Authorization must be `Bearer <token>`"))?,
            ),
            // The query is looked at only without a header or a cookie: they come first,
            // whether or not it would be accepted.
            None => match (cookie(headers), query_token) {
                (Some(token), _) => Some(token),
                (None, Some(_)) if !auth.allows_query_token() => {
                    return Err(ApiError::unauthorized(
                        "?access_token= is not accepted here ([auth] allow_query_token): send the token in Authorization or the viewtape_token cookie",
                    ))
                }
                (None, query) => query,
            },
        };
        let access = token
            .map(|token| {
                auth.verify(token)
                    .map_err(|error| ApiError::unauthorized(error.to_string()))
            })
            .transpose()?;
        Ok(Self {
            auth: Some(auth),
            access,
        })
    }

    /// The narrowing of every grant that lets the caller read `view` (or some keys of it) — a
    /// public view's, its token's — [`Narrow::All`] for a full one; empty when none does.
    pub(super) fn grants<'s>(&'s self, view: &'s str) -> Vec<&'s Narrow> {
        let Some(auth) = self.auth else {
            return vec![&EVERY_KEY];
        };
        let mut grants: Vec<&Narrow> = auth.public_views().narrowings(view).collect();
        if let Some(access) = &self.access {
            grants.extend(access.views.narrowings(view));
        }
        grants
    }

    /// The keys of `view` the caller reads when it asks for `asked` (`?keys=`/`?prefix=`, or
    /// [`Narrow::All`]): `asked` itself when its grants cover it; without a narrowing of its
    /// own, the one its grants give (see [`Narrow::granted`]).
    ///
    /// # Errors
    /// `401` without a token where one is needed; `403` with one that does not grant the view,
    /// or grants it narrowed and `asked` reaches outside the grant, or asks for every key while
    /// the grants are narrowed in ways one narrowing cannot join.
    pub(super) fn read(&self, view: &str, asked: Narrow) -> Result<Narrow, ApiError> {
        let grants = self.grants(view);
        if grants.is_empty() {
            return Err(match self.access {
                None => ApiError::unauthorized(format!("view {view:?} needs a token")),
                Some(_) => ApiError::forbidden(
                    "forbidden",
                    format!("the token does not grant view {view:?}"),
                ),
            });
        }
        let listed = || {
            grants
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(" or ")
        };
        let whose = match self.access {
            None => "without a token, only",
            Some(_) => "only",
        };
        let refusal = match asked.clone().granted(&grants) {
            Ok(narrow) => return Ok(narrow),
            Err(NotGranted::Outside) => format!(
                "view {view:?} is granted {whose} with {}; {asked} reaches outside it: narrow the read within the grant",
                listed()
            ),
            Err(NotGranted::Unjoinable) => format!(
                "view {view:?} is granted {whose} with {}, which one narrowing cannot join: narrow the read with ?keys= or ?prefix= within one of them",
                listed()
            ),
        };
        Err(match self.access {
            None => ApiError::unauthorized(refusal),
            Some(_) => ApiError::forbidden("forbidden", refusal),
        })
    }

    /// `Ok` if the caller may push into `runtime`.
    ///
    /// # Errors
    /// `401` without a token, `403` with one that does not grant it.
    pub(super) fn ingest(&self, runtime: &str) -> Result<(), ApiError> {
        if self.auth.is_none()
            || self
                .access
                .as_ref()
                .is_some_and(|a| a.ingest.allows(runtime))
        {
            return Ok(());
        }
        Err(match self.access {
            None => ApiError::unauthorized(format!("runtime {runtime:?} needs a token")),
            Some(_) => ApiError::forbidden(
                "forbidden",
                format!("the token does not grant ingest into runtime {runtime:?}"),
            ),
        })
    }

    /// When the caller's token expires (Unix seconds); `None` without one.
    pub(super) fn expires_at(&self) -> Option<u64> {
        self.access.as_ref().map(|a| a.expires_at)
    }
}

/// The `viewtape_token` cookie, from every `Cookie` header.
fn cookie(headers: &HeaderMap) -> Option<&str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(';'))
        .find_map(|pair| {
            let (name, value) = pair.trim().split_once('=')?;
            (name == TOKEN_COOKIE).then_some(value.trim())
        })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use axum::http::{HeaderValue, StatusCode};
    use jsonwebtoken::{encode, EncodingKey, Header};

    use super::*;
    use crate::config::AuthSection;

    fn state(allow_query_token: bool) -> AppState {
        let section = AuthSection {
            allow_query_token,
            ..AuthSection::default()
        };
        let auth = Auth::load(&section, Some("secret")).unwrap().map(Arc::new);
        crate::http::test_state(auth)
    }

    #[test]
    fn the_header_and_the_cookie_come_before_the_query_whether_or_not_it_is_allowed() {
        let exp = crate::log::unix_ms_now() / 1000 + 60;
        let claims = serde_json::json!({ "exp": exp, "views": ["prices"] });
        let good = encode(
            &Header::default(),
            &claims,
            &EncodingKey::from_secret(b"secret"),
        )
        .unwrap();
        let mut bearer = HeaderMap::new();
        let value = HeaderValue::from_str(&format!("Bearer {good}")).unwrap();
        bearer.insert(header::AUTHORIZATION, value);
        let mut cookie = HeaderMap::new();
        let value = HeaderValue::from_str(&format!("theme=dark; {TOKEN_COOKIE}={good}")).unwrap();
        cookie.insert(header::COOKIE, value);
        for allowed in [false, true] {
            let state = state(allowed);
            for headers in [&bearer, &cookie] {
                let caller = Caller::of(&state, headers, Some("garbage")).unwrap();
                assert!(
                    caller.read("prices", Narrow::All).is_ok(),
                    "allowed: {allowed}"
                );
            }
            let refused = Caller::of(&state, &HeaderMap::new(), Some("garbage")).err();
            assert_eq!(
                refused.map(|e| e.status()),
                Some(StatusCode::UNAUTHORIZED),
                "allowed: {allowed}"
            );
        }
    }
}
