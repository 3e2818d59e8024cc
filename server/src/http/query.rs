//! The query string of a request, read in the server's own words.
//!
//! Each route names the parameters it takes; anything else — a parameter it does not take, one
//! given twice, one that is not UTF-8 once percent-decoded — is a `400` that names the parameter
//! and lists what the route takes. Parameters a route accepts without advertising them (a
//! `?access_token=` where `[auth] allow_query_token` is off: accepted only so that its refusal
//! can say why) are never listed.

use percent_encoding::percent_decode;

use super::ApiError;

/// The parameters of one request's query, each one of those its route takes, at most once.
#[derive(Debug, Default)]
pub(super) struct Params {
    pairs: Vec<(&'static str, String)>,
}

impl Params {
    /// The parameters of `query` (the raw query string, if the request has one): each one of
    /// `takes` (listed in refusals) or `quiet` (accepted, never listed).
    ///
    /// # Errors
    /// `400 bad_request` naming the first parameter that is not taken, given more than once, or
    /// not UTF-8 after percent-decoding.
    pub(super) fn parse(
        query: Option<&str>,
        takes: &[&'static str],
        quiet: &[&'static str],
    ) -> Result<Self, ApiError> {
        let mut params = Self::default();
        let pieces = query
            .unwrap_or_default()
            .split('&')
            .filter(|piece| !piece.is_empty());
        for piece in pieces {
            let (name, value) = piece.split_once('=').unwrap_or((piece, ""));
            let name = decoded(name).ok_or_else(|| {
                ApiError::bad_request(format!(
                    "a query parameter's name is not UTF-8 after percent-decoding; {}",
                    listing(takes)
                ))
            })?;
            let Some(known) = takes
                .iter()
                .chain(quiet)
                .find(|known| **known == name)
                .copied()
            else {
                return Err(ApiError::bad_request(format!(
                    "unknown query parameter {:?}; {}",
                    shown(&name),
                    listing(takes)
                )));
            };
            if params.pairs.iter().any(|(seen, _)| *seen == known) {
                return Err(ApiError::bad_request(format!(
                    "query parameter {known:?} is given more than once"
                )));
            }
            let value = decoded(value).ok_or_else(|| {
                ApiError::bad_request(format!(
                    "query parameter {known:?} is not UTF-8 after percent-decoding"
                ))
            })?;
            params.pairs.push((known, value));
        }
        Ok(params)
    }

    /// The value of `name`, if the query gave it.
    pub(super) fn get(&self, name: &str) -> Option<&str> {
        self.pairs
            .iter()
            .find(|(known, _)| *known == name)
            .map(|(_, value)| value.as_str())
    }
}

/// What a route takes, as a refusal says it.
fn listing(takes: &[&str]) -> String {
    match takes {
        [] => "this route takes no query parameter".to_owned(),
        takes => format!("this route takes: {}", takes.join(", ")),
    }
}

/// A parameter's name as a refusal quotes it: at most 64 characters of it.
fn shown(name: &str) -> String {
    const SHOWN: usize = 64;
    match name.char_indices().nth(SHOWN) {
        Some((cut, _)) => format!("{}…", &name[..cut]),
        None => name.to_owned(),
    }
}

/// A name or value of `application/x-www-form-urlencoded` text: `+` is a space, `%XX` a byte
/// (a `%` not followed by two hex digits stands for itself); `None` when the bytes are not UTF-8.
fn decoded(text: &str) -> Option<String> {
    let spaced = text.replace('+', " ");
    String::from_utf8(percent_decode(spaced.as_bytes()).collect()).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(error: ApiError) -> String {
        assert_eq!(error.status(), axum::http::StatusCode::BAD_REQUEST);
        error.to_string()
    }

    #[test]
    fn parameters_are_decoded_and_found_by_name() {
        let params = Params::parse(
            Some("cursor=a%2Fb&keys=x+y,z&&from=tape"),
            &["cursor", "from", "keys"],
            &[],
        )
        .unwrap();
        assert_eq!(params.get("cursor"), Some("a/b"));
        assert_eq!(params.get("keys"), Some("x y,z"));
        assert_eq!(params.get("from"), Some("tape"));
        assert_eq!(params.get("until"), None);
        assert!(Params::parse(None, &[], &[]).unwrap().get("x").is_none());
        assert!(Params::parse(Some(""), &[], &[])
            .unwrap()
            .get("x")
            .is_none());
    }

    #[test]
    fn refusals_name_the_parameter_in_our_words() {
        let takes = ["cursor", "from"];
        let unknown = message(Params::parse(Some("form=tape"), &takes, &[]).unwrap_err());
        assert_eq!(
            unknown,
            "unknown query parameter \"form\"; this route takes: cursor, from"
        );
        let twice = message(Params::parse(Some("cursor=a&cursor=b"), &takes, &[]).unwrap_err());
        assert_eq!(twice, "query parameter \"cursor\" is given more than once");
        let bytes = message(Params::parse(Some("cursor=%FF"), &takes, &[]).unwrap_err());
        assert_eq!(
            bytes,
            "query parameter \"cursor\" is not UTF-8 after percent-decoding"
        );
        let name = message(Params::parse(Some("%FF=1"), &takes, &[]).unwrap_err());
        assert!(name.contains("name is not UTF-8"), "{name}");
        let none = message(Params::parse(Some("x=1"), &[], &[]).unwrap_err());
        assert_eq!(
            none,
            "unknown query parameter \"x\"; this route takes no query parameter"
        );
        let long = message(Params::parse(Some(&"y".repeat(500)), &takes, &[]).unwrap_err());
        assert!(long.len() < 200, "{long}");
    }

    #[test]
    fn a_quiet_parameter_is_taken_and_never_listed() {
        let params = Params::parse(Some("access_token=t"), &["cursor"], &["access_token"]).unwrap();
        assert_eq!(params.get("access_token"), Some("t"));
        let refused = message(
            Params::parse(Some("access_token=t&x=1"), &["cursor"], &["access_token"]).unwrap_err(),
        );
        assert!(!refused.contains("access_token"), "{refused}");
    }
}
