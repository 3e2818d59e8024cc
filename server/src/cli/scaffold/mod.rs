//! `viewtape new NAME [--lang rust|ts|js]`: writes a guest that builds and passes its tests as
//! generated — a runtime keeping a running total per key, publishing to the view `NAME` — with a
//! README saying how to build, test, run it over recorded input and configure it in a server.
//!
//! Each language's guest depends on viewtape's SDK for it, by the version of the release this
//! binary is (which works on any machine with network access), or with `--sdk DIR` on a local
//! checkout's copy of it, by path. The build machine's own checkout is never written into a guest.
//!
//! | file | job |
//! |---|---|
//! | this one | what every language shares: the name's rules, the refusals, writing the files |
//! | `rust.rs` | a Rust crate on the `viewtape-guest` SDK, built for `wasm32-unknown-unknown` |
//! | `script.rs` | a TypeScript or JavaScript npm package on `@viewtape/guest`, bundled to one `.js` |

mod rust;
mod script;

use std::path::{Path, PathBuf};

pub use rust::{new_guest, Sdk};
pub use script::{new_script_guest, NpmSdk, Script};

/// Why a guest was not written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ScaffoldError {
    /// The name cannot be a package and a view name.
    #[error("{0:?} cannot name a guest: use 1-64 of a-z 0-9 _ -, starting with a letter")]
    BadName(String),
    /// The SDK directory given does not hold the SDK.
    #[error("no viewtape SDK at {}: --sdk names {expected}", .dir.display())]
    NoSdk {
        /// The directory given.
        dir: PathBuf,
        /// What `--sdk` should name, for this language.
        expected: &'static str,
    },
    /// The target exists already.
    #[error("{} already exists", .0.display())]
    Exists(PathBuf),
    /// Writing failed.
    #[error("cannot write {}", path.display())]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

impl ScaffoldError {
    fn no_sdk(dir: PathBuf, expected: &'static str) -> Self {
        Self::NoSdk { dir, expected }
    }
}

/// A name is a crate's, an npm package's and a view's at once: 1-64 of `a-z 0-9 _ -`, starting
/// with a letter.
fn check_name(name: &str) -> Result<(), ScaffoldError> {
    let valid = name.len() <= 64
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-');
    match valid {
        true => Ok(()),
        false => Err(ScaffoldError::BadName(name.to_owned())),
    }
}

/// The recorded input every guest is generated with (`input.ndjson`), which its README runs.
const INPUT: &str = r#"{"key":"alice","amount":5}
{"key":"bob","amount":3}
{"key":"alice","amount":-2}
"#;

/// What every guest's README says about serving it, whatever its language: `{{module}}` is the
/// module's path in the package, `{{name}}` the runtime's and its view's.
const SERVING_MD: &str = r#"To serve it, add to a config in this directory (`viewtape serve --config viewtape.toml`; relative
paths in a config are relative to the config's own directory):

```toml
[[runtime]]
name = "{{name}}"
module = "{{module}}"
views = ["{{name}}"]
```

then `curl --data-binary @input.ndjson http://127.0.0.1:8080/runtimes/{{name}}/ingest` and follow
`http://127.0.0.1:8080/views/{{name}}/events`. A new build goes to a running server without a
restart, its state carried over: `viewtape deploy {{name}} {{module}}`."#;

/// A README `template` with its `{{serving}}` part filled for the module at `module`.
fn with_serving(template: &str, module: &str) -> String {
    template.replace("{{serving}}", &SERVING_MD.replace("{{module}}", module))
}

/// Writes `files` (paths relative to `dir`, and their text) into `dir`, which must not exist yet.
fn write_files(dir: &Path, files: &[(&str, String)]) -> Result<PathBuf, ScaffoldError> {
    if dir.exists() {
        return Err(ScaffoldError::Exists(dir.to_owned()));
    }
    for (file, text) in files {
        let path = dir.join(file);
        let write = |path: &Path| {
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent)?;
            }
            std::fs::write(path, text)
        };
        write(&path).map_err(|source| ScaffoldError::Io { path, source })?;
    }
    Ok(dir.to_owned())
}
