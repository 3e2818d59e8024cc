//! Compiled code kept on disk between processes.
//!
//! Compiling the JS engine guest takes seconds (about 2.5 s in a release build, more in a debug
//! one), and every process that runs JavaScript would pay it: each server start, each
//! `viewtape run`, each `check-config`. So its compiled code is written to a cache directory
//! once and loaded from there (milliseconds) afterwards.
//!
//! ## What makes a cached file usable
//!
//! - Its name holds the SHA-256 of the WebAssembly it was compiled from and wasmtime's
//!   compatibility hash of the engine's settings (wasmtime's version, the compiler's flags, the
//!   CPU features it relies on), so another build or another setting never finds it.
//! - Its first 32 bytes are the SHA-256 of the rest, checked before wasmtime sees any of it: a
//!   torn or damaged file is compiled again and replaced, never loaded.
//! - It is written aside and renamed into place, so processes sharing the directory (tests
//!   running in parallel, say) see a whole file or none.
//!
//! A cache that cannot be read or written is a warning, and the code is compiled as if there
//! were none.

use std::hash::{DefaultHasher, Hash as _, Hasher as _};
use std::io::Write as _;
use std::path::{Path, PathBuf};

use sha2::{Digest as _, Sha256};
use wasmtime::{Engine, Module};

use super::{LoadError, ModuleFingerprint};

/// The environment variable that names the cache directory of every command.
const CACHE_DIR_VAR: &str = "VIEWTAPE_CACHE_DIR";

/// The cache directory: `$VIEWTAPE_CACHE_DIR` if set and not empty, else `fallback()`.
pub fn cache_dir(fallback: impl FnOnce() -> Option<PathBuf>) -> Option<PathBuf> {
    match std::env::var_os(CACHE_DIR_VAR) {
        Some(dir) if !dir.is_empty() => Some(PathBuf::from(dir)),
        _ => fallback(),
    }
}

/// The user's cache directory for viewtape: `$XDG_CACHE_HOME/viewtape`, else
/// `$HOME/.cache/viewtape`; `None` when neither is set.
pub fn user_cache_dir() -> Option<PathBuf> {
    let absolute = |var: &str| {
        std::env::var_os(var)
            .map(PathBuf::from)
            .filter(|path| path.is_absolute())
    };
    absolute("XDG_CACHE_HOME")
        .or_else(|| absolute("HOME").map(|home| home.join(".cache")))
        .map(|base| base.join("viewtape"))
}

/// `wasm` compiled for `engine`: loaded from `dir` when a sound copy is there, else compiled
/// and written there.
///
/// # Errors
/// [`LoadError::Compile`] if `wasm` does not compile.
pub(crate) fn load_or_compile(
    engine: &Engine,
    wasm: &[u8],
    dir: Option<&Path>,
) -> Result<Module, LoadError> {
    let compile =
        || Module::new(engine, wasm).map_err(|e| LoadError::Compile(e.into_boxed_dyn_error()));
    let Some(dir) = dir else {
        return compile();
    };
    let path = dir.join(file_name(engine, wasm));
    if let Some(module) = load(engine, &path) {
        return Ok(module);
    }
    let module = compile()?;
    match store(&module, &path) {
        Ok(()) => {
            tracing::info!(path = %path.display(), "compiled, and kept in the cache for every process that shares it")
        }
        Err(error) => {
            tracing::warn!(path = %path.display(), %error, "could not keep compiled code in the cache")
        }
    }
    Ok(module)
}

/// Whether `dir` holds a file of `wasm` compiled for `engine` (sound or not: a load checks).
pub(crate) fn is_kept(engine: &Engine, wasm: &[u8], dir: &Path) -> bool {
    dir.join(file_name(engine, wasm)).is_file()
}

fn file_name(engine: &Engine, wasm: &[u8]) -> String {
    let mut settings = DefaultHasher::new();
    engine.precompile_compatibility_hash().hash(&mut settings);
    let source = ModuleFingerprint::of(wasm).to_string();
    let source = source.trim_start_matches("sha256:");
    format!("{}-{:016x}.cwasm", &source[..32], settings.finish())
}

/// The module in `path`, or `None` when there is none or it is not sound (logged).
fn load(engine: &Engine, path: &Path) -> Option<Module> {
    let bytes = match std::fs::read(path) {
        Ok(bytes) => bytes,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return None,
        Err(error) => {
            tracing::warn!(path = %path.display(), %error, "cannot read cached code; compiling");
            return None;
        }
    };
    let sound = bytes.len() > 32 && Sha256::digest(&bytes[32..])[..] == bytes[..32];
    if !sound {
        tracing::warn!(path = %path.display(), "cached code is damaged; compiling it again");
        return None;
    }
    // SAFETY: `Module::deserialize` requires bytes that `Module::serialize` produced, for an
    // engine compatible with `engine`. These were written by `store` below: the SHA-256 just
    // checked proves they are the bytes it wrote, whole; the file name holds the compatibility
    // hash of `engine`'s settings, and wasmtime checks its version and settings in the
    // artifact's header again. The directory is the operator's (the data directory or the
    // user's cache), trusted as the data directory's log and snapshots are.
    match unsafe { Module::deserialize(engine, &bytes[32..]) } {
        Ok(module) => Some(module),
        Err(error) => {
            tracing::warn!(path = %path.display(), %error, "cached code does not load; compiling");
            None
        }
    }
}

fn store(module: &Module, path: &Path) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let code = module.serialize().map_err(|e| e.into_boxed_dyn_error())?;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let temp = path.with_extension(format!("{}.tmp", std::process::id()));
    let mut file = std::fs::File::create(&temp)?;
    file.write_all(&Sha256::digest(&code))?;
    file.write_all(&code)?;
    drop(file);
    std::fs::rename(&temp, path)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const WASM: &str = r#"(module (func (export "f") (result i32) i32.const 7))"#;

    fn call(engine: &Engine, module: &Module) -> i32 {
        let mut store = wasmtime::Store::new(engine, ());
        let instance = wasmtime::Instance::new(&mut store, module, &[]).expect("instance");
        let f = instance
            .get_typed_func::<(), i32>(&mut store, "f")
            .expect("f");
        f.call(&mut store, ()).expect("call")
    }

    #[test]
    fn code_is_kept_loaded_and_a_damaged_copy_is_compiled_again() {
        let dir = tempfile::tempdir().expect("dir");
        let engine = Engine::default();
        let wasm = wat::parse_str(WASM).expect("wat");
        let first = load_or_compile(&engine, &wasm, Some(dir.path())).expect("compiles");
        assert_eq!(call(&engine, &first), 7);
        let files: Vec<_> = std::fs::read_dir(dir.path())
            .expect("read")
            .map(|e| e.expect("entry").path())
            .collect();
        assert_eq!(files.len(), 1, "one file, no temporary left: {files:?}");
        let path = &files[0];
        assert!(load(&engine, path).is_some(), "the kept copy loads");

        // Flip a byte of the code: the checksum refuses it, and the next load replaces it.
        let mut bytes = std::fs::read(path).expect("read");
        let last = bytes.len() - 1;
        bytes[last] ^= 0xff;
        std::fs::write(path, &bytes).expect("write");
        assert!(
            load(&engine, path).is_none(),
            "a damaged copy is not loaded"
        );
        let again = load_or_compile(&engine, &wasm, Some(dir.path())).expect("compiles");
        assert_eq!(call(&engine, &again), 7);
        assert!(
            load(&engine, path).is_some(),
            "the damaged copy was replaced"
        );

        // A torn copy (shorter than its checksum) is refused too.
        std::fs::write(path, &bytes[..10]).expect("write");
        assert!(load(&engine, path).is_none());
    }

    #[test]
    fn another_engine_setting_is_another_file() {
        let wasm = wat::parse_str(WASM).expect("wat");
        let plain = Engine::default();
        let mut config = wasmtime::Config::new();
        config.consume_fuel(true);
        let fueled = Engine::new(&config).expect("engine");
        assert_ne!(file_name(&plain, &wasm), file_name(&fueled, &wasm));
        assert_eq!(
            file_name(&plain, &wasm),
            file_name(&Engine::default(), &wasm)
        );
    }
}
