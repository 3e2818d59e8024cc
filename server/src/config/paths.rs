//! Paths in a config file: a relative one is relative to the file's directory, not to the
//! directory the server was started from, so that a config and the files beside it can move
//! together and `viewtape check-config` and `viewtape serve` find the same files from anywhere.
//!
//! Every key that names a file is resolved here, once, as the file is read
//! ([`Config::load_source`]): `server.tls_cert`, `server.tls_key`, `auth.public_keys`, and each
//! runtime's `wasm` (but `builtin:` guests), `schemas` and `source.file`. Absolute paths are kept
//! as written.

use std::path::{Path, PathBuf};

use super::Config;

impl Config {
    /// Makes every relative path in the config relative to `dir`, the config file's directory.
    pub(super) fn resolve_paths(&mut self, dir: &Path) {
        let resolve = |path: &mut PathBuf| *path = dir.join(&*path);
        for path in [&mut self.server.tls_cert, &mut self.server.tls_key]
            .into_iter()
            .chain([&mut self.auth.public_keys])
            .flatten()
        {
            resolve(path);
        }
        for runtime in &mut self.runtimes {
            if !runtime.wasm.starts_with("builtin:") {
                runtime.wasm = dir.join(&runtime.wasm).to_string_lossy().into_owned();
            }
            runtime.schemas.values_mut().for_each(resolve);
            if let Some(source) = &mut runtime.source {
                resolve(&mut source.file);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Relative paths used to be read from the working directory, so that a config that loaded
    /// from its own directory named missing files from anywhere else.
    #[test]
    fn relative_paths_are_the_config_files_directorys_and_absolute_ones_stay() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("viewtape.toml");
        std::fs::write(
            &path,
            r#"
            [server]
            tls_cert = "tls/cert.pem"
            tls_key = "/etc/viewtape/key.pem"
            [auth]
            public_keys = "keys.pem"
            [[runtime]]
            name = "a"
            wasm = "guests/a.wasm"
            views = ["a"]
            schemas = { a = "a.schema.json" }
            source = { file = "../logs/app.log" }
            [[runtime]]
            name = "b"
            wasm = "builtin:ticker"
            views = ["b"]
            "#,
        )
        .unwrap();
        let config = Config::load(&path).unwrap();
        let at = |relative: &str| dir.path().join(relative);
        assert_eq!(config.server.tls_cert, Some(at("tls/cert.pem")));
        assert_eq!(
            config.server.tls_key,
            Some(PathBuf::from("/etc/viewtape/key.pem"))
        );
        assert_eq!(config.auth.public_keys, Some(at("keys.pem")));
        let a = &config.runtimes[0];
        assert_eq!(PathBuf::from(&a.wasm), at("guests/a.wasm"));
        assert_eq!(a.schemas["a"], at("a.schema.json"));
        assert_eq!(
            a.source.as_ref().map(|source| &source.file),
            Some(&at("../logs/app.log"))
        );
        assert_eq!(config.runtimes[1].wasm, "builtin:ticker");
    }

    /// A config named without a directory (`--config viewtape.toml`) is in the working
    /// directory: its paths stay relative to it.
    #[test]
    fn a_config_in_the_working_directory_keeps_its_relative_paths() {
        let mut config = Config::default();
        config.auth.public_keys = Some(PathBuf::from("keys.pem"));
        config.resolve_paths(Path::new("viewtape.toml").parent().unwrap());
        assert_eq!(config.auth.public_keys, Some(PathBuf::from("keys.pem")));
    }
}
