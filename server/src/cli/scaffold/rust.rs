//! A Rust guest: a crate that builds for `wasm32-unknown-unknown` and passes its tests as
//! generated — a runtime keeping a running total per key, publishing to the view `NAME`, with
//! unit tests on the SDK's harness and a README saying how to build, test, run it over recorded
//! input and configure it in a server.
//!
//! The SDK is not on crates.io. The crate depends on it by git, on the tag of the release this
//! binary is (`v0.1.0` of the repository it was built from), which works on any machine with
//! network access; `--sdk DIR` depends on a local checkout's `runtime-guest` directory by path
//! instead. The build machine's own checkout is never written into the crate.

use std::path::{Path, PathBuf};

use super::{check_name, with_serving, write_files, ScaffoldError, INPUT};

/// What `--sdk` names for a Rust guest.
const RUST_SDK: &str = "the runtime-guest directory of a viewtape checkout";

/// The viewtape SDK (`viewtape-guest`) a new crate depends on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Sdk {
    /// The SDK of a release, by git: `repository` at `tag`.
    Git {
        /// The repository (`https://github.com/…`).
        repository: String,
        /// The release's tag (`v0.1.0`).
        tag: String,
    },
    /// A local checkout's `runtime-guest` directory.
    Path(PathBuf),
}

impl Sdk {
    /// The SDK of the release this binary is: its repository at the tag `v` + its version.
    pub fn this_release() -> Self {
        Self::Git {
            repository: env!("CARGO_PKG_REPOSITORY").to_owned(),
            tag: format!("v{}", env!("CARGO_PKG_VERSION")),
        }
    }

    /// The dependency's table in `Cargo.toml` (without its features): `git = "…", tag = "…"` or
    /// `path = "…"`; a path is checked to hold the SDK and made absolute.
    fn source(&self) -> Result<String, ScaffoldError> {
        match self {
            Self::Git { repository, tag } => Ok(format!("git = {repository:?}, tag = {tag:?}")),
            Self::Path(dir) => {
                let absolute = std::fs::canonicalize(dir)
                    .map_err(|_| ScaffoldError::no_sdk(dir.clone(), RUST_SDK))?;
                if !absolute.join("Cargo.toml").is_file() {
                    return Err(ScaffoldError::no_sdk(absolute, RUST_SDK));
                }
                let text = absolute.to_string_lossy().replace('\\', "/");
                Ok(format!("path = {text:?}"))
            }
        }
    }
}

/// Writes the crate `name` into `parent/name`, depending on `sdk`. Returns its directory.
///
/// # Errors
/// A bad name, an SDK path without the SDK, an existing directory, or a failed write.
pub fn new_guest(name: &str, parent: &Path, sdk: &Sdk) -> Result<PathBuf, ScaffoldError> {
    check_name(name)?;
    let sdk_source = sdk.source()?;
    let fill = |template: &str| {
        template
            .replace("{{name}}", name)
            .replace("{{crate}}", &name.replace('-', "_"))
            .replace("{{sdk}}", &sdk_source)
    };
    write_files(
        &parent.join(name),
        &[
            ("Cargo.toml", fill(CARGO_TOML)),
            ("src/lib.rs", fill(LIB_RS)),
            (
                "README.md",
                fill(&with_serving(
                    README_MD,
                    "target/wasm32-unknown-unknown/release/{{crate}}.wasm",
                )),
            ),
            ("input.ndjson", INPUT.to_owned()),
            (".gitignore", "/target\n".to_owned()),
        ],
    )
}

const CARGO_TOML: &str = r#"[package]
name = "{{name}}"
version = "0.1.0"
edition = "2021"
publish = false

# Its own workspace, wherever it is created.
[workspace]

[lib]
# cdylib: the .wasm the server loads; rlib: native unit tests with the SDK's harness.
crate-type = ["cdylib", "rlib"]

[dependencies]
# The viewtape SDK is not on crates.io: the release's tag in viewtape's repository, or the path
# of a checkout's `runtime-guest` directory (`viewtape new --sdk DIR`).
# Its `schema` feature derives the JSON Schema of a view's values from a Rust type.
viewtape-guest = { {{sdk}}, features = ["schema"] }
serde = { version = "1", features = ["derive"] }
serde_json = "1"

[profile.release]
opt-level = 3
lto = true
codegen-units = 1
panic = "abort"
strip = true
"#;

const LIB_RS: &str = r##"//! `{{name}}`: a viewtape ingestion runtime. Input is NDJSON, one entry per line:
//! `{"key":"alice","amount":5}`. It keeps a running total per key and publishes
//! `{"total":…}` under that key in the view `{{name}}`, a typed view: the server checks every
//! value against the schema of [`Total`] and serves it at `GET /views/{{name}}/schema`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use viewtape_guest::schemars::JsonSchema;
use viewtape_guest::{export_runtime, Context, Error, Level, Result, Runtime, Schemas};

/// The view it publishes to: declare it in the server's config (`views = ["{{name}}"]`).
pub const VIEW: &str = "{{name}}";

/// One input line.
#[derive(Deserialize)]
struct Entry {
    key: String,
    amount: i64,
}

/// What it publishes under each key: its JSON Schema is the view's.
#[derive(Serialize, JsonSchema)]
#[schemars(crate = "viewtape_guest::schemars")]
pub struct Total {
    /// The sum of the key's amounts so far.
    pub total: i64,
}

/// The running total of every key: the whole state, saved after every batch.
#[derive(Debug, Default)]
pub struct Totals {
    totals: BTreeMap<String, i64>,
}

impl Totals {
    /// The total of `key`.
    pub fn total(&self, key: &str) -> Option<i64> {
        self.totals.get(key).copied()
    }
}

impl Runtime for Totals {
    fn init(_config: &[u8]) -> Result<Self> {
        Ok(Self::default())
    }

    fn schemas(&self) -> Schemas {
        Schemas::new().view::<Total>(VIEW)
    }

    fn on_batch(&mut self, input: &[u8], ctx: &mut Context) -> Result<()> {
        for (index, line) in input.split(|&b| b == b'\n').enumerate() {
            if line.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            let entry: Entry = serde_json::from_slice(line)
                .map_err(|e| Error::msg(format!("line {}: {e}", index + 1)))?;
            let total = self.totals.entry(entry.key.clone()).or_default();
            *total = total.checked_add(entry.amount).ok_or_else(|| {
                Error::msg(format!("line {}: the total of {:?} overflows", index + 1, entry.key))
            })?;
            let total = Total { total: *total };
            ctx.publish_with(VIEW, &entry.key, |buf| serde_json::to_writer(buf, &total))
                .map_err(|e| Error::msg(format!("line {}: {e}", index + 1)))?;
        }
        ctx.log(Level::Debug, "batch done");
        Ok(())
    }

    fn save(&self) -> Vec<u8> {
        serde_json::to_vec(&self.totals).unwrap_or_default()
    }

    fn restore(&mut self, state: &[u8]) -> Result<()> {
        self.totals = serde_json::from_slice(state)
            .map_err(|e| Error::msg(format!("not a saved {{name}} state: {e}")))?;
        Ok(())
    }
}

export_runtime!(Totals);

#[cfg(test)]
mod tests {
    use viewtape_guest::testing::Harness;
    use viewtape_guest::Output;

    use super::*;

    fn harness() -> Harness<Totals> {
        Harness::<Totals>::new(b"").unwrap().declare_views(&[VIEW])
    }

    #[test]
    fn totals_accumulate_per_key() {
        let mut h = harness();
        h.batch(b"{\"key\":\"a\",\"amount\":5}\n").unwrap();
        let out = h
            .batch(b"{\"key\":\"a\",\"amount\":2}\n{\"key\":\"b\",\"amount\":1}\n")
            .unwrap();
        assert_eq!(
            out[0],
            Output::Update {
                view: VIEW.into(),
                key: "a".into(),
                payload: br#"{"total":7}"#.to_vec(),
            }
        );
        assert_eq!(h.runtime().total("b"), Some(1));
    }

    #[test]
    fn the_view_is_typed() {
        let schema = harness().schemas().get(VIEW).map(str::to_owned).unwrap();
        let schema: serde_json::Value = serde_json::from_str(&schema).unwrap();
        assert_eq!(schema["required"], serde_json::json!(["total"]));
        assert_eq!(schema["properties"]["total"]["type"], "integer");
    }

    #[test]
    fn a_bad_line_rejects_the_batch_and_keeps_the_state() {
        let mut h = harness();
        h.batch(b"{\"key\":\"a\",\"amount\":5}\n").unwrap();
        let err = h.batch(b"{\"key\":\"a\",\"amount\":1}\nnope\n").unwrap_err();
        assert!(err.to_string().starts_with("line 2:"), "{err}");
        assert_eq!(h.runtime().total("a"), Some(5), "rolled back");
    }

    #[test]
    fn the_state_survives_save_and_restore() {
        let mut h = harness();
        h.batch(b"{\"key\":\"a\",\"amount\":5}\n").unwrap();
        let state = h.save();
        h.restore(&state).unwrap();
        assert_eq!(h.runtime().total("a"), Some(5));
    }
}
"##;

const README_MD: &str = r#"# {{name}}

A viewtape ingestion runtime: NDJSON entries `{"key":"alice","amount":5}` in, a running total
per key out, in the view `{{name}}`. The view is typed: `Runtime::schemas` declares the JSON
Schema of `Total`, the server refuses a batch publishing a value that does not fit (`422`, naming
the view, the key and the failing JSON pointer) and serves the schema at
`GET /views/{{name}}/schema`.

```sh
cargo test                                              # unit tests, natively, on the SDK's harness
rustup target add wasm32-unknown-unknown                # once
cargo build --release --target wasm32-unknown-unknown   # the module
viewtape run target/wasm32-unknown-unknown/release/{{crate}}.wasm < input.ndjson
```

`viewtape run` runs the module in the real host with the real limits, batch by batch, and prints
what each batch published, its gaps and errors as NDJSON (`--state`/`--save-state` carry the state
between runs).

{{serving}}

The SDK guide (`cargo doc -p viewtape-guest --open` in the viewtape repository) explains the
rules: determinism, limits, gaps, logs.
"#;

#[cfg(test)]
mod tests {
    use super::*;

    /// A checkout's SDK, by path.
    fn checkout() -> Sdk {
        Sdk::Path(Path::new(env!("CARGO_MANIFEST_DIR")).join("../runtime-guest"))
    }

    #[test]
    fn refuses_bad_names_missing_sdks_and_existing_directories() {
        let tmp = tempfile::tempdir().unwrap();
        for name in ["", "Orders", "1st", "a/b", "a b"] {
            assert!(matches!(
                new_guest(name, tmp.path(), &checkout()),
                Err(ScaffoldError::BadName(_))
            ));
        }
        assert!(matches!(
            new_guest("orders", tmp.path(), &Sdk::Path(tmp.path().to_owned())),
            Err(ScaffoldError::NoSdk { .. })
        ));
        let dir = new_guest("orders", tmp.path(), &checkout()).unwrap();
        assert!(dir.join("src/lib.rs").is_file());
        let manifest = std::fs::read_to_string(dir.join("Cargo.toml")).unwrap();
        assert!(!manifest.contains("{{"), "{manifest}");
        assert!(matches!(
            new_guest("orders", tmp.path(), &checkout()),
            Err(ScaffoldError::Exists(_))
        ));
    }

    /// The crate used to depend on the SDK by the absolute path of the checkout the binary was
    /// built in, which exists on no user's machine: by default it names the release's tag.
    #[test]
    fn by_default_the_sdk_is_the_releases_tag_not_a_path_of_the_build_machine() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = new_guest("orders", tmp.path(), &Sdk::this_release()).unwrap();
        let manifest = std::fs::read_to_string(dir.join("Cargo.toml")).unwrap();
        let dependency = format!(
            "viewtape-guest = {{ git = \"{}\", tag = \"v{}\", features = [\"schema\"] }}",
            env!("CARGO_PKG_REPOSITORY"),
            env!("CARGO_PKG_VERSION")
        );
        assert!(manifest.contains(&dependency), "{manifest}");
        assert!(!manifest.contains("path ="), "{manifest}");
    }
}
