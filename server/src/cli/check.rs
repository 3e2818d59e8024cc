//! `viewtape check-config FILE`, and what `viewtape serve --config FILE` checks before it starts
//! anything: the same function, so both refuse a file with the same words.
//!
//! Checked: the syntax; every key known, of its type and with a possible value
//! ([`Config::load_source`]); every runtime's declared views; and every file the config names
//! loads — each runtime's module (read, compiled, a guest of this ABI) and schema files (read,
//! compiled), the TLS certificate and
//! key (and that they go together), the auth key file. Every refusal names the file, the line
//! and the key.

use std::collections::HashSet;
use std::path::Path;

use crate::auth::Auth;
use crate::config::{Config, ConfigError, Problem};
use crate::host::{EngineConfig, GuestEngine, GuestModule, ModuleFingerprint};
use crate::listener::tls::{Tls, TlsError, TlsFile};

/// Reads and checks the config file at `path`, with `adjust` (command-line flags) applied to it
/// before the checks; the config, ready for `viewtape serve`.
///
/// # Errors
/// The first problem found, naming the file, the line and the key.
pub fn check_file(path: &Path, adjust: impl FnOnce(&mut Config)) -> Result<Config, ConfigError> {
    let (mut config, source) = Config::load_source(path)?;
    adjust(&mut config);
    config
        .check_values()
        .and_then(|()| check_files(&config))
        .map_err(|problem| source.error(problem))?;
    Ok(config)
}

/// Checks that everything `config` names loads: modules, TLS files, the auth key file.
///
/// # Errors
/// The first that does not, with its key.
pub fn check_files(config: &Config) -> Result<(), Problem> {
    let engine = GuestEngine::new(EngineConfig {
        cache_dir: crate::host::cache_dir(crate::host::user_cache_dir),
        ..EngineConfig::default()
    })
    .map_err(|error| Problem::new("runtime", format!("no guest engine: {error}")))?;
    // Runtimes on one module (the built-in ticker, say) have it compiled once.
    let mut loaded = HashSet::new();
    for (i, runtime) in config.runtimes.iter().enumerate() {
        let key = format!("runtime[{i}].module");
        let wasm = runtime.wasm_bytes().map_err(|error| {
            Problem::new(&key, format!("cannot read {}: {error}", runtime.wasm))
        })?;
        if loaded.insert(ModuleFingerprint::of(&wasm)) {
            GuestModule::new(&engine, &wasm).map_err(|error| {
                Problem::new(&key, format!("{} does not load: {error}", runtime.wasm))
            })?;
        }
        runtime.load_schemas(i)?;
    }
    if let (Some(cert), Some(key)) = (&config.server.tls_cert, &config.server.tls_key) {
        Tls::load(cert, key).map_err(|error| {
            let key = match &error {
                TlsError::File { what, .. } => what.config_key(),
                // The key does not go with the certificate: the key is named.
                TlsError::Pair { .. } => TlsFile::Key.config_key(),
            };
            Problem::new(key, error.to_string())
        })?;
    }
    if config.auth.public_keys.is_some() {
        Auth::load(&config.auth, None)
            .map_err(|error| Problem::new("auth.public_keys", error.to_string()))?;
    }
    Ok(())
}
