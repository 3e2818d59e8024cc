//! Values that parse but are impossible: every refusal names its key.
//!
//! The checks run in a fixed order (runtimes, `[auth]`, `[server]` limits, `[cluster]`, HTTPS
//! and CORS), and the first problem found is the one reported.

use std::collections::HashSet;

use viewtape_journal::{ViewClaim, ViewName};

use super::BUILTIN_GUESTS;
use super::{AuthSection, ClusterSection, Config, Problem, RuntimeSection, ServerConfig};

impl Config {
    pub(super) fn validate(&self) -> Result<(), Problem> {
        let mut names = HashSet::new();
        for (i, runtime) in self.runtimes.iter().enumerate() {
            validate_runtime(i, runtime, &mut names)?;
            validate_overlaps(i, &self.runtimes)?;
        }
        validate_public_views(&self.auth)?;
        validate_connections(&self.server)?;
        validate_cluster(&self.cluster)?;
        validate_web(&self.server)
    }

    /// Checks a config that did not come from a file (the embedded default, or one changed by
    /// command-line flags) as [`Config::load`] checks a file.
    ///
    /// # Errors
    /// What is wrong, and where.
    pub fn check_values(&self) -> Result<(), Problem> {
        self.validate()
    }
}

/// The `i`th `[[runtime]]`; `names` holds the names of the runtimes before it.
fn validate_runtime<'a>(
    i: usize,
    runtime: &'a RuntimeSection,
    names: &mut HashSet<&'a String>,
) -> Result<(), Problem> {
    let key = |name: &str| format!("runtime[{i}].{name}");
    ViewName::new(&runtime.name).map_err(|_| {
        Problem::new(
            key("name"),
            format!(
                "runtime name {:?}: use 1-128 of A-Z a-z 0-9 . _ -",
                runtime.name
            ),
        )
    })?;
    if !names.insert(&runtime.name) {
        return Err(Problem::new(
            key("name"),
            format!("runtime {:?} is configured twice", runtime.name),
        ));
    }
    validate_views(i, runtime)?;
    if let Some(builtin) = runtime.wasm.strip_prefix("builtin:") {
        if !BUILTIN_GUESTS.iter().any(|(name, _)| *name == builtin) {
            return Err(Problem::new(
                key("module"),
                format!(
                    "runtime {:?}: no built-in guest {builtin:?} (built-in: {})",
                    runtime.name,
                    BUILTIN_GUESTS.map(|(name, _)| name).join(", ")
                ),
            ));
        }
    }
    runtime.limits.check().map_err(|problem| {
        Problem::new(
            key(&problem.key),
            format!("runtime {:?}: {}", runtime.name, problem.message),
        )
    })?;
    Ok(())
}

/// The `i`th `[[runtime]]`'s views: some declared, each name valid, a schema only for one of
/// them.
fn validate_views(i: usize, runtime: &RuntimeSection) -> Result<(), Problem> {
    let key = |name: &str| format!("runtime[{i}].{name}");
    if runtime.views.is_empty() {
        return Err(Problem::new(
            key("views"),
            format!(
                "runtime {:?}: declare the views it publishes to (views = [\"…\"])",
                runtime.name
            ),
        ));
    }
    for view in &runtime.views {
        ViewClaim::new(view).map_err(|_| {
            Problem::new(
                key("views"),
                format!(
                    "runtime {:?}: view {view:?}: use 1-128 of A-Z a-z 0-9 . _ -, or such a prefix then * (a pattern: chat.*)",
                    runtime.name
                ),
            )
        })?;
    }
    if let Some(view) = runtime.schemas.keys().find(|v| !runtime.views.contains(v)) {
        return Err(Problem::new(
            format!("runtime[{i}].schemas.{view}"),
            format!(
                "runtime {:?}: a schema for view {view:?}, which it does not declare \
                 (views = {:?})",
                runtime.name, runtime.views
            ),
        ));
    }
    Ok(())
}

/// The `i`th `[[runtime]]`'s views against those of the runtimes before it (whose claims are
/// valid already): no pattern of one runtime takes another's view or overlaps another's pattern
/// (as `PUT /admin/runtimes/{runtime}` refuses with `409 view_conflict`). Two runtimes of a
/// config naming the same view stay allowed, as configs always could: their events share the
/// view's tape.
fn validate_overlaps(i: usize, runtimes: &[RuntimeSection]) -> Result<(), Problem> {
    let runtime = &runtimes[i];
    let claims = |runtime: &RuntimeSection| -> Vec<(String, ViewClaim)> {
        runtime
            .views
            .iter()
            .filter_map(|view| Some((view.clone(), ViewClaim::new(view).ok()?)))
            .collect()
    };
    for (view, claim) in claims(runtime) {
        for earlier in &runtimes[..i] {
            if let Some((theirs, _)) = claims(earlier).into_iter().find(|(_, other)| {
                (claim.is_pattern() || other.is_pattern()) && other.overlaps(&claim)
            }) {
                return Err(Problem::new(
                    format!("runtime[{i}].views"),
                    format!(
                        "runtime {:?}: view {view:?} overlaps {theirs:?} of runtime {:?}: \
                         a view has one runtime",
                        runtime.name, earlier.name
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// `[auth] public_views`: every narrowing one that this server reads.
fn validate_public_views(auth: &AuthSection) -> Result<(), Problem> {
    for entry in &auth.public_views {
        if let Some((_, query)) = entry.split_once('?') {
            crate::hub::narrow::Narrow::from_query(query).map_err(|error| {
                Problem::new(
                    "auth.public_views",
                    format!("{entry:?} narrows in a way this server does not read: {error}"),
                )
            })?;
        }
    }
    Ok(())
}

/// `[server]`: the connection caps and the timeouts.
fn validate_connections(server: &ServerConfig) -> Result<(), Problem> {
    if server.max_connections == 0 {
        return Err(Problem::new("server.max_connections", "must be above zero"));
    }
    if server.http_connection_limit() < server.max_connections {
        return Err(Problem::new(
            "server.max_http_connections",
            format!(
                "{} must be at least server.max_connections ({}): every SSE stream is a connection",
                server.http_connection_limit(),
                server.max_connections
            ),
        ));
    }
    for (key, value) in [
        ("header_timeout", server.header_timeout),
        ("idle_timeout", server.idle_timeout),
        ("write_timeout", server.write_timeout),
    ] {
        if value.is_zero() {
            return Err(Problem::new(format!("server.{key}"), "must be above zero"));
        }
    }
    Ok(())
}

/// `[cluster]`: the stream's and the bucket's names, the replicas.
fn validate_cluster(cluster: &ClusterSection) -> Result<(), Problem> {
    let stream_name = |name: &str| {
        !name.is_empty()
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    };
    for (key, value) in [
        ("cluster.stream", &cluster.stream),
        ("cluster.bucket", &cluster.bucket),
    ] {
        if !stream_name(value) {
            return Err(Problem::new(
                key,
                format!("{value:?}: letters, digits, '-' and '_' only"),
            ));
        }
    }
    if cluster.replicas == 0 || cluster.replicas > 5 {
        return Err(Problem::new("cluster.replicas", "must be 1 to 5"));
    }
    if cluster.batches_per_message == 0 {
        return Err(Problem::new(
            "cluster.batches_per_message",
            "must be above zero (1: every batch its own message)",
        ));
    }
    Ok(())
}

/// `[server]`: HTTPS and the cross-origin origins.
fn validate_web(server: &ServerConfig) -> Result<(), Problem> {
    if server.tls_cert.is_some() != server.tls_key.is_some() {
        let key = match server.tls_cert {
            Some(_) => "server.tls_cert",
            None => "server.tls_key",
        };
        return Err(Problem::new(
            key,
            "server.tls_cert and server.tls_key go together: set both for HTTPS, or neither",
        ));
    }
    for origin in &server.cors_origins {
        if !is_origin(origin) {
            return Err(Problem::new(
                "server.cors_origins",
                format!(
                    "{origin:?} is not an origin; write scheme://host[:port], as a browser \
                     sends it (no path, no trailing slash, no \"*\")"
                ),
            ));
        }
    }
    Ok(())
}

/// Whether `text` is an origin as browsers send it in `Origin`: `http(s)://host[:port]`.
fn is_origin(text: &str) -> bool {
    let Some((scheme, host)) = text.split_once("://") else {
        return false;
    };
    matches!(scheme, "http" | "https")
        && !host.is_empty()
        && host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b':' | b'[' | b']'))
}

#[cfg(test)]
mod tests {
    use super::super::load::tests::load;

    #[test]
    fn impossible_settings_are_refused() {
        for (text, needle) in [
            (
                "[[runtime]]\nname = \"a b\"\nwasm = \"builtin:ticker\"\n",
                "runtime name",
            ),
            (
                "[[runtime]]\nname = \"a\"\nwasm = \"builtin:nope\"\nviews = [\"v\"]\n",
                "no built-in guest",
            ),
            (
                "[[runtime]]\nname = \"a\"\nwasm = \"builtin:ticker\"\n",
                "declare the views",
            ),
            (
                "[[runtime]]\nname = \"a\"\nwasm = \"builtin:json\"\nviews = [\"chat.7\"]\n\
                 [[runtime]]\nname = \"b\"\nwasm = \"builtin:json\"\nviews = [\"chat.*\"]\n",
                "view \"chat.*\" overlaps \"chat.7\" of runtime \"a\"",
            ),
            (
                "[[runtime]]\nname = \"a\"\nwasm = \"builtin:json\"\nviews = [\"chat.*\"]\n\
                 [[runtime]]\nname = \"b\"\nwasm = \"builtin:json\"\nviews = [\"chat.room.*\"]\n",
                "view \"chat.room.*\" overlaps \"chat.*\" of runtime \"a\"",
            ),
            ("[server]\nmax_body = \"12 parsecs\"\n", "not a byte size"),
            ("[server]\ncors_origins = [\"*\"]\n", "not an origin"),
            ("[server]\ntls_cert = \"c.pem\"\n", "go together"),
            (
                "[server]\ncors_origins = [\"https://a.example/\"]\n",
                "not an origin",
            ),
            (
                "[server]\ncors_origins = [\"a.example\"]\n",
                "not an origin",
            ),
        ] {
            let error = load(text).unwrap_err().to_string();
            assert!(error.contains(needle), "{text:?}: {error}");
            assert!(
                error.contains(", line ") && error.contains(", key "),
                "{text:?}: {error}"
            );
        }
    }

    #[test]
    fn runtimes_whose_views_do_not_overlap_are_accepted() {
        let text = "[[runtime]]\nname = \"a\"\nwasm = \"builtin:json\"\nviews = [\"chat.*\", \"orders\"]\n\
                    [[runtime]]\nname = \"b\"\nwasm = \"builtin:json\"\nviews = [\"chats\", \"order\", \"rooms.*\"]\n\
                    [[runtime]]\nname = \"c\"\nwasm = \"builtin:json\"\nviews = [\"orders\"]\n";
        let config = load(text).unwrap();
        assert_eq!(
            config.runtimes.len(),
            3,
            "two runtimes may share a view they name"
        );
    }
}
