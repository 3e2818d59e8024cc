//! The admin client that `viewtape deploy`, `viewtape runtime …` and `viewtape module put` share:
//! one request to a running server's admin routes over HTTP/1.1 (TLS for an `https` server),
//! with the admin token from the environment (`VIEWTAPE_ADMIN_TOKEN`).
//!
//! ## Answers
//! A `2xx` answer's body is what the command prints. Any other is an error of one line: the
//! status, the error's code and the server's message (never its whole JSON body), so that a
//! script sees exit code 1 and a person reads why.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context as _;
use http::Uri;

use crate::http::admin::TOKEN_ENV;

/// A running server's admin routes, with the token to call them.
#[derive(Debug)]
pub struct AdminClient {
    target: Target,
    cacert: Option<PathBuf>,
    token: String,
}

/// What the server answered.
#[derive(Debug)]
pub struct AdminAnswer {
    /// Its HTTP status.
    pub status: u16,
    /// Its body (JSON on every admin route).
    pub body: String,
}

/// The `Content-Type` of a guest module's bytes: the server tells WebAssembly and JavaScript
/// apart by the bytes themselves; the type is for whatever sits between.
pub fn module_type(module: &[u8]) -> &'static str {
    match module.starts_with(b"\0asm") {
        true => "application/wasm",
        false => "text/javascript",
    }
}

impl AdminAnswer {
    /// The body of a `2xx` answer.
    ///
    /// # Errors
    /// Any other status, as one line: the status, the error's code and the server's message.
    pub fn into_body(self) -> anyhow::Result<String> {
        if (200..300).contains(&self.status) {
            return Ok(self.body);
        }
        let json: Option<serde_json::Value> = serde_json::from_str(&self.body).ok();
        let said = |name: &str| {
            json.as_ref()
                .and_then(|json| json.get(name))
                .and_then(serde_json::Value::as_str)
                .map(str::to_owned)
        };
        let message = said("message").unwrap_or_else(|| self.body.trim().to_owned());
        let message = message.split_whitespace().collect::<Vec<_>>().join(" ");
        match said("error") {
            Some(code) => anyhow::bail!("the server answered {} {code}: {message}", self.status),
            None => anyhow::bail!("the server answered {}: {message}", self.status),
        }
    }
}

impl AdminClient {
    /// The client of `server` (`host:port`, or a URL: `http://host:port`, `https://host[:port]`),
    /// trusting `cacert` for https (default: the system's certificates), with the admin token
    /// from `VIEWTAPE_ADMIN_TOKEN`.
    ///
    /// # Errors
    /// The token is not set, or `server` is not an address.
    pub fn new(server: &str, cacert: Option<PathBuf>) -> anyhow::Result<Self> {
        let token = std::env::var(TOKEN_ENV)
            .ok()
            .filter(|token| !token.is_empty())
            .ok_or_else(|| anyhow::anyhow!("set {TOKEN_ENV} to the server's admin token"))?;
        Ok(Self {
            target: Target::parse(server)?,
            cacert,
            token,
        })
    }

    /// `method path` with `body` (of `content_type`, if any); the server's answer, whatever its
    /// status.
    ///
    /// # Errors
    /// The server cannot be reached, or the exchange breaks off.
    pub async fn send(
        &self,
        method: hyper::Method,
        path: &str,
        content_type: Option<&str>,
        body: Vec<u8>,
    ) -> anyhow::Result<AdminAnswer> {
        use http_body_util::{BodyExt as _, Full};

        let target = &self.target;
        let authority = target.authority();
        let stream = tokio::net::TcpStream::connect((target.host.as_str(), target.port))
            .await
            .map_err(|e| anyhow::anyhow!("cannot connect to {authority}: {e}"))?;
        let mut request = hyper::Request::builder()
            .method(method)
            .uri(path)
            .header(hyper::header::HOST, &authority)
            .header(
                hyper::header::AUTHORIZATION,
                format!("Bearer {}", self.token),
            );
        if let Some(content_type) = content_type {
            request = request.header(hyper::header::CONTENT_TYPE, content_type);
        }
        let request = request.body(Full::new(bytes::Bytes::from(body)))?;
        let response = if target.https {
            let name = tokio_rustls::rustls::pki_types::ServerName::try_from(target.host.clone())
                .map_err(|e| anyhow::anyhow!("{}: {e}", target.host))?;
            let stream = tls_connector(self.cacert.as_deref())?
                .connect(name, stream)
                .await
                .map_err(|e| anyhow::anyhow!("TLS with {authority}: {e}"))?;
            let (mut sender, connection) =
                hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await?;
            tokio::spawn(connection);
            sender.send_request(request).await?
        } else {
            let (mut sender, connection) =
                hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await?;
            tokio::spawn(connection);
            sender.send_request(request).await?
        };
        let status = response.status().as_u16();
        let body = response.into_body().collect().await?.to_bytes();
        Ok(AdminAnswer {
            status,
            body: String::from_utf8_lossy(&body).into_owned(),
        })
    }
}

/// The server the admin commands talk to.
#[derive(Debug, PartialEq, Eq)]
struct Target {
    https: bool,
    host: String,
    port: u16,
}

impl Target {
    /// `host:port`, `http://host[:port][/]` or `https://host[:port][/]`.
    fn parse(text: &str) -> anyhow::Result<Self> {
        const HOST_PORT_OR_URL: &str = "give host:port or a URL";
        let uri: Uri = text
            .parse()
            .map_err(|_| anyhow::anyhow!("--server {text}: {HOST_PORT_OR_URL}"))?;
        let https = match uri.scheme_str() {
            None | Some("http") => false,
            Some("https") => true,
            Some(scheme) => anyhow::bail!("--server {text}: {scheme}:// is not http or https"),
        };
        anyhow::ensure!(
            uri.path_and_query()
                .is_none_or(|path| matches!(path.as_str(), "" | "/")),
            "--server {text}: {HOST_PORT_OR_URL} without a path"
        );
        let authority = uri
            .authority()
            .filter(|authority| !authority.host().is_empty())
            .with_context(|| format!("--server {text}: {HOST_PORT_OR_URL}"))?;
        let port = authority
            .as_str()
            .rsplit_once('@')
            .map_or(authority.as_str(), |(_, host_port)| host_port)
            .strip_prefix(authority.host())
            .and_then(|rest| rest.strip_prefix(':'));
        let port = match port {
            Some(port) => port
                .parse()
                .map_err(|_| anyhow::anyhow!("--server {text}: {port:?} is not a port"))?,
            None if https => 443,
            None if uri.scheme().is_some() => 80,
            None => anyhow::bail!("--server {text}: {HOST_PORT_OR_URL}"),
        };
        Ok(Self {
            https,
            host: authority
                .host()
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_owned(),
            port,
        })
    }

    /// The `Host` header.
    fn authority(&self) -> String {
        match self.host.contains(':') {
            true => format!("[{}]:{}", self.host, self.port),
            false => format!("{}:{}", self.host, self.port),
        }
    }
}

/// The TLS client of an admin command with `--server https://…`, trusting `cacert` or the system's
/// certificates.
fn tls_connector(cacert: Option<&Path>) -> anyhow::Result<tokio_rustls::TlsConnector> {
    use tokio_rustls::rustls;
    use tokio_rustls::rustls::pki_types::pem::PemObject as _;
    use tokio_rustls::rustls::pki_types::CertificateDer;

    let bundle = match cacert {
        Some(path) => path.to_owned(),
        None => std::env::var_os("SSL_CERT_FILE").map_or_else(
            || PathBuf::from("/etc/ssl/certs/ca-certificates.crt"),
            PathBuf::from,
        ),
    };
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(&bundle)
        .map_err(|e| anyhow::anyhow!("cannot read certificates from {}: {e}", bundle.display()))?
    {
        let cert = cert.map_err(|e| anyhow::anyhow!("{}: {e}", bundle.display()))?;
        roots
            .add(cert)
            .map_err(|e| anyhow::anyhow!("{}: {e}", bundle.display()))?;
    }
    let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_root_certificates(roots)
    .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(tokio_rustls::TlsConnector::from(Arc::new(config)))
}

#[cfg(test)]
mod tests {
    use super::{AdminAnswer, Target};

    #[test]
    fn an_error_answer_is_one_line_with_the_servers_message() {
        let answer = |status, body: &str| AdminAnswer {
            status,
            body: body.to_owned(),
        };
        assert_eq!(answer(201, "{}").into_body().unwrap(), "{}");
        let said = |status, body: &str| answer(status, body).into_body().unwrap_err().to_string();
        assert_eq!(
            said(
                409,
                r#"{"error":"view_conflict","message":"view \"a\"\n taken","view":"a"}"#
            ),
            "the server answered 409 view_conflict: view \"a\" taken"
        );
        assert_eq!(
            said(502, "bad\ngateway\n"),
            "the server answered 502: bad gateway"
        );
    }

    #[test]
    fn admin_servers_are_addresses_or_urls() {
        let target = |https, host: &str, port| Target {
            https,
            host: host.to_owned(),
            port,
        };
        for (text, expected) in [
            ("127.0.0.1:8080", target(false, "127.0.0.1", 8080)),
            ("localhost:8080", target(false, "localhost", 8080)),
            ("http://localhost:8080/", target(false, "localhost", 8080)),
            ("http://example.com", target(false, "example.com", 80)),
            ("https://example.com", target(true, "example.com", 443)),
            (
                "https://example.com:8443/",
                target(true, "example.com", 8443),
            ),
            ("[::1]:8080", target(false, "::1", 8080)),
        ] {
            assert_eq!(Target::parse(text).unwrap(), expected, "{text}");
        }
        assert_eq!(
            Target::parse("[::1]:8080").unwrap().authority(),
            "[::1]:8080"
        );
        for bad in ["localhost", "ftp://x:1", "http://x:1/admin", "x:port"] {
            assert!(Target::parse(bad).is_err(), "{bad}");
        }
        let said =
            |text: &str| Target::parse(text).map_or_else(|e| e.to_string(), |_| String::new());
        assert_eq!(said("x:port"), "--server x:port: \"port\" is not a port");
        assert_eq!(
            said("ftp://x:1"),
            "--server ftp://x:1: ftp:// is not http or https"
        );
        assert_eq!(
            said("http://x:1/admin"),
            "--server http://x:1/admin: give host:port or a URL without a path"
        );
        assert_eq!(
            said("localhost"),
            "--server localhost: give host:port or a URL"
        );
    }
}
