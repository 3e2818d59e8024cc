//! `viewtape check-config FILE`, and what `viewtape serve --config FILE` checks before it starts
//! anything: the same function, so both refuse a file with the same words.
//!
//! Checked: the syntax; every key known, of its type and with a possible value
//! ([`Config::load_source`]); every runtime's declared views; and every file the config names
//! loads — each runtime's module (read, compiled, a guest of this ABI) and schema files (read,
//! compiled), the TLS certificate and
//! key (and that they go together), the auth key file. Every refusal names the file, the line
//! and the key.
//!
//! Given a data directory, it also says what the next start over it does with each
//! `[[runtime]]` ([`declarations`]): the log wins over a config read again.

use std::collections::{BTreeMap, HashSet};
use std::path::Path;

use viewtape_snapshots::log::{LogDir, LogError};
use viewtape_snapshots::SnapshotDir;

use crate::auth::Auth;
use crate::config::{Config, ConfigError, Problem};
use crate::host::{EngineConfig, GuestEngine, GuestModule, ModuleFingerprint};
use crate::listener::tls::{Tls, TlsError, TlsFile};
use crate::log::{Declaring, Definition, Entry, LogPosition, Logged};
use crate::snapshot::SnapshotBody;

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

/// What the log over a data directory holds of one runtime.
enum Held {
    /// It runs, as a define record made it (`Some`) or as a config declares it (`None`).
    Runs(Option<Definition>),
    /// A record deleted it; the config declaration that last declared it.
    Deleted(Option<String>),
}

/// What the next single-node start over `data_dir` does with each `[[runtime]]` of `config`
/// ([`Declaring`]), by name: read from its newest valid snapshot and its log's records after
/// it, as the start reads them. (A cluster's stream decides for its nodes instead.) A runtime
/// that ran as an older config declared it and was then deleted is taken as declared by this
/// config: nothing in the data directory says which config that was.
///
/// # Errors
/// A module or the log cannot be read, or a declaration does not make a definition.
pub fn declarations(
    config: &Config,
    data_dir: &Path,
) -> Result<BTreeMap<String, Declaring>, Problem> {
    let mut configured = BTreeMap::new();
    for (i, section) in config.runtimes.iter().enumerate() {
        let wasm = section.wasm_bytes().map_err(|error| {
            Problem::new(
                format!("runtime[{i}].module"),
                format!("cannot read {}: {error}", section.wasm),
            )
        })?;
        let definition = section.definition(i, ModuleFingerprint::of(&wasm))?;
        configured.insert(section.name.clone(), definition);
    }
    let mut held: BTreeMap<String, Held> = BTreeMap::new();
    let mut from = LogPosition::ZERO;
    let snapshots = data_dir.join("snapshots");
    if snapshots.is_dir() {
        let newest = SnapshotDir::open_existing(&snapshots)
            .and_then(|dir| dir.load_newest_valid::<SnapshotBody>())
            .map_err(|error| Problem::new("data-dir", error.to_string()))?;
        if let Some(loaded) = newest.loaded {
            let body = loaded.body;
            from = body.log_position.unwrap_or(LogPosition::ZERO);
            for dump in body.runtimes {
                held.insert(dump.name, Held::Runs(dump.definition));
            }
            for (name, declared) in body.deleted {
                held.insert(name, Held::Deleted(Some(declared)));
            }
        }
    }
    let log = data_dir.join("log");
    if log.is_dir() {
        let unreadable = |error: LogError| Problem::new("data-dir", error.to_string());
        LogDir::open_existing(&log)
            .map_err(unreadable)?
            .read_after(from, |record| {
                match Entry::decode(&record.payload) {
                    Ok(Entry::Define(entry)) => {
                        held.insert(entry.runtime, Held::Runs(Some(entry.definition)));
                    }
                    Ok(Entry::Retire(entry)) => {
                        let declared = match held.remove(&entry.runtime) {
                            Some(Held::Runs(Some(defined))) => defined.declared,
                            Some(Held::Runs(None)) => {
                                configured.get(&entry.runtime).map(Definition::digest)
                            }
                            Some(Held::Deleted(declared)) => declared,
                            None => None,
                        };
                        held.insert(entry.runtime, Held::Deleted(declared));
                    }
                    _ => {}
                }
                Ok::<(), LogError>(())
            })
            .map_err(unreadable)?;
    }
    Ok(configured
        .iter()
        .map(|(name, definition)| {
            let logged = match held.get(name) {
                Some(Held::Runs(Some(defined))) => Logged::Defined(defined),
                Some(Held::Runs(None)) => Logged::AsConfigured,
                Some(Held::Deleted(declared)) => Logged::Absent(declared.as_deref()),
                None => Logged::Absent(None),
            };
            (name.clone(), definition.declaring(logged))
        })
        .collect())
}
