//! `--tls h1|h2`: HTTPS for the server the tool spawns. A self-signed certificate for
//! `127.0.0.1` is made here (rcgen, ECDSA P-256, ring) and written with its key beside a copy of
//! the server's config (`--server-arg=--config --server-arg=FILE`, or an empty one) that gains
//! `[server] tls_cert` / `tls_key`; the clients trust that certificate only.

use std::path::Path;
use std::sync::Arc;

use anyhow::{bail, Context as _};
use tokio_rustls::rustls::crypto::ring::default_provider;
use tokio_rustls::rustls::pki_types::CertificateDer;
use tokio_rustls::rustls::{ClientConfig, RootCertStore};

/// The ALPN protocol of HTTP/1.1. Each client config offers one protocol only, so which one
/// the server speaks is the bench's choice.
pub const ALPN_H1: &[u8] = b"http/1.1";
/// The ALPN protocol of HTTP/2.
pub const ALPN_H2: &[u8] = b"h2";

/// The certificate and config files of a spawned HTTPS server, and the client configs that
/// trust it.
#[derive(Debug)]
pub struct ServerTls {
    dir: tempfile::TempDir,
    /// Offers `http/1.1` (requests, and HTTP/1.1 subscribers).
    pub h1: Arc<ClientConfig>,
    /// Offers `h2`.
    pub h2: Arc<ClientConfig>,
}

impl ServerTls {
    /// A fresh self-signed certificate for `127.0.0.1` and `localhost`, in a temp directory.
    ///
    /// # Errors
    /// When the certificate cannot be made or written.
    pub fn new() -> anyhow::Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("viewtape-bench-tls-")
            .tempdir()
            .context("temp dir for the certificate")?;
        let made = rcgen::generate_simple_self_signed(vec![
            "127.0.0.1".to_owned(),
            "localhost".to_owned(),
        ])
        .context("self-signed certificate")?;
        write(&dir.path().join("cert.pem"), &made.cert.pem())?;
        write(&dir.path().join("key.pem"), &made.key_pair.serialize_pem())?;
        let cert: CertificateDer<'static> = made.cert.der().clone();
        Ok(Self {
            h1: Arc::new(client_config(&cert, ALPN_H1)?),
            h2: Arc::new(client_config(&cert, ALPN_H2)?),
            dir,
        })
    }

    /// `server_args` with its `--config FILE` (or `--config=FILE`) replaced by a copy that adds
    /// `[server] tls_cert` and `tls_key`; without one, a config holding only those.
    ///
    /// # Errors
    /// When the config cannot be read, is not TOML, or the copy cannot be written.
    pub fn server_args(&self, server_args: &[&str]) -> anyhow::Result<Vec<String>> {
        let mut args = Vec::with_capacity(server_args.len() + 2);
        let mut config = None;
        let mut iter = server_args.iter();
        while let Some(&arg) = iter.next() {
            if arg == "--config" {
                let Some(&path) = iter.next() else {
                    bail!("--server-arg=--config needs a file after it");
                };
                config = Some(path);
            } else if let Some(path) = arg.strip_prefix("--config=") {
                config = Some(path);
            } else {
                args.push(arg.to_owned());
            }
        }
        let text = match config {
            Some(path) => std::fs::read_to_string(path).with_context(|| format!("read {path}"))?,
            None => String::new(),
        };
        let out = self.dir.path().join("viewtape.toml");
        write(&out, &with_tls(&text, self.dir.path())?)?;
        args.extend(["--config".to_owned(), out.display().to_string()]);
        Ok(args)
    }
}

/// The config `text` with `[server] tls_cert` / `tls_key` naming the files in `dir`.
fn with_tls(text: &str, dir: &Path) -> anyhow::Result<String> {
    let mut config: toml::Table = text.parse().context("the server config is not TOML")?;
    let server = config
        .entry("server")
        .or_insert_with(|| toml::Table::new().into())
        .as_table_mut()
        .context("`server` in the config is not a table")?;
    for (key, file) in [("tls_cert", "cert.pem"), ("tls_key", "key.pem")] {
        server.insert(key.to_owned(), dir.join(file).display().to_string().into());
    }
    toml::to_string(&config).context("writing the config")
}

fn write(path: &Path, text: &str) -> anyhow::Result<()> {
    std::fs::write(path, text).with_context(|| format!("write {}", path.display()))
}

/// A client trusting only `cert`, offering `alpn`, on ring (as the server).
fn client_config(cert: &CertificateDer<'static>, alpn: &[u8]) -> anyhow::Result<ClientConfig> {
    let mut roots = RootCertStore::empty();
    roots.add(cert.clone()).context("trust the certificate")?;
    let mut config = ClientConfig::builder_with_provider(Arc::new(default_provider()))
        .with_safe_default_protocol_versions()
        .context("TLS versions")?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![alpn.to_vec()];
    Ok(config)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adds_tls_to_the_config() {
        let dir = Path::new("/tmp/x");
        let text = with_tls(
            "[server]\nmax_connections = 20000\n[[runtime]]\nname = \"m\"\n",
            dir,
        )
        .unwrap();
        let config: toml::Table = text.parse().unwrap();
        let server = config["server"].as_table().unwrap();
        assert_eq!(server["max_connections"].as_integer(), Some(20_000));
        assert_eq!(server["tls_cert"].as_str(), Some("/tmp/x/cert.pem"));
        assert_eq!(server["tls_key"].as_str(), Some("/tmp/x/key.pem"));
        assert_eq!(config["runtime"].as_array().unwrap().len(), 1);
        let empty: toml::Table = with_tls("", dir).unwrap().parse().unwrap();
        assert_eq!(empty["server"]["tls_key"].as_str(), Some("/tmp/x/key.pem"));
        assert!(with_tls("server = 1\n", dir).is_err());
    }

    #[test]
    fn rewrites_the_config_argument() {
        let tls = ServerTls::new().unwrap();
        let config = tls.dir.path().join("given.toml");
        std::fs::write(&config, "[server]\nmax_connections = 7\n").unwrap();
        let given = config.display().to_string();
        let args = tls
            .server_args(&["--config", &given, "--demo-rate", "0"])
            .unwrap();
        assert_eq!(args[..2], ["--demo-rate", "0"]);
        assert_eq!(args[2], "--config");
        let written = std::fs::read_to_string(&args[3]).unwrap();
        assert!(written.contains("max_connections = 7"), "{written}");
        assert!(written.contains("tls_cert"), "{written}");
        let args = tls.server_args(&[&format!("--config={given}")]).unwrap();
        assert_eq!(args.len(), 2);
        assert!(tls.server_args(&["--config"]).is_err());
    }
}
