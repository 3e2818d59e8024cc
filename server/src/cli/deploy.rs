//! `viewtape deploy`: a new module sent to a running server's admin route
//! (`PUT /admin/runtimes/{runtime}/module`) over HTTP/1.1, or over TLS for an `https` server,
//! with the admin token from the environment.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context as _;
use http::Uri;

use crate::http::admin::TOKEN_ENV;

/// What `viewtape deploy` was given.
#[derive(Debug, Clone)]
pub struct DeployOptions {
    /// The runtime.
    pub runtime: String,
    /// The new module (`.wasm`, or `.js` for a JavaScript guest).
    pub wasm: PathBuf,
    /// The server: `host:port`, or a URL (`http://host:port`, `https://host[:port]`).
    pub server: String,
    /// For https: the PEM certificates to trust (default: the system's).
    pub cacert: Option<PathBuf>,
}

/// The server's answer to a deploy.
#[derive(Debug)]
pub struct DeployAnswer {
    /// Its HTTP status: 200 when the module runs.
    pub status: u16,
    /// Its body (JSON: the module and the previous one, or the error).
    pub body: String,
}

/// Reads the module, the admin token (`VIEWTAPE_ADMIN_TOKEN`) and the server's address, and
/// sends the module.
///
/// # Errors
/// The module cannot be read, the token is not set, the address is not one, or the server
/// cannot be reached; a server that refuses the module answers, in [`DeployAnswer`].
pub async fn deploy_module(options: &DeployOptions) -> anyhow::Result<DeployAnswer> {
    let module = std::fs::read(&options.wasm)
        .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", options.wasm.display()))?;
    let token = std::env::var(TOKEN_ENV)
        .map_err(|_| anyhow::anyhow!("set {TOKEN_ENV} to the server's admin token"))?;
    let target = Target::parse(&options.server)?;
    let (status, body) = put_module(
        &target,
        options.cacert.as_deref(),
        &options.runtime,
        module,
        &token,
    )
    .await?;
    Ok(DeployAnswer { status, body })
}

/// Where `viewtape deploy` sends the module.
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

/// The TLS client of `viewtape deploy --server https://…`, trusting `cacert` or the system's
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

/// `PUT /admin/runtimes/{runtime}/module` with `module` as the body, over HTTP/1.1 (TLS for
/// https); the status and the body.
async fn put_module(
    target: &Target,
    cacert: Option<&Path>,
    runtime: &str,
    module: Vec<u8>,
    token: &str,
) -> anyhow::Result<(u16, String)> {
    use http_body_util::{BodyExt as _, Full};

    let authority = target.authority();
    let stream = tokio::net::TcpStream::connect((target.host.as_str(), target.port))
        .await
        .map_err(|e| anyhow::anyhow!("cannot connect to {authority}: {e}"))?;
    // The server tells the two apart by the bytes; the type is for whatever sits between.
    let content_type = if module.starts_with(b"\0asm") {
        "application/wasm"
    } else {
        "text/javascript"
    };
    let request = hyper::Request::put(format!("/admin/runtimes/{runtime}/module"))
        .header(hyper::header::HOST, &authority)
        .header(hyper::header::AUTHORIZATION, format!("Bearer {token}"))
        .header(hyper::header::CONTENT_TYPE, content_type)
        .body(Full::new(bytes::Bytes::from(module)))?;
    let response = if target.https {
        let name = tokio_rustls::rustls::pki_types::ServerName::try_from(target.host.clone())
            .map_err(|e| anyhow::anyhow!("{}: {e}", target.host))?;
        let stream = tls_connector(cacert)?
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
    Ok((status, String::from_utf8_lossy(&body).into_owned()))
}

#[cfg(test)]
mod tests {
    use super::Target;

    #[test]
    fn deploy_targets_are_addresses_or_urls() {
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
