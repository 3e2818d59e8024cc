//! The server's settings: defaults, and the TOML file given with `--config`.
//!
//! Every key, with its default, is in the README's config reference; a test holds the reference
//! to these definitions (every key documented, no key that does not exist, defaults as shown).
//!
//! | file | job |
//! |---|---|
//! | this one | the whole config and its embedded default |
//! | `sections` | `[server]`, `[auth]`, `[cluster]`, `[log]`, `[journal]` with their defaults |
//! | `runtime` | `[[runtime]]`: the guest, its limits, source and schemas; the built-in guests |
//! | `load` | reading a file: syntax, keys and types, with the line of each key |
//! | `paths` | relative paths in a file are the file's directory's |
//! | `validate` | values that parse but are impossible |
//! | `error` | why a file is refused, and where |
//! | `size` | byte sizes (`"64MiB"`) |
//! | `spans` | where a key is in a file |

use serde::{Deserialize, Serialize};

mod error;
mod load;
mod paths;
mod runtime;
mod sections;
mod size;
mod spans;
mod validate;

pub use error::{ConfigError, Problem, Source};
pub use runtime::{LimitsSection, RuntimeSection, BUILTIN_GUESTS};
pub use sections::{
    AuthSection, ClusterSection, FsyncMode, JournalSection, LogSection, ServerConfig,
};

/// Everything `viewtape serve` runs with.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// HTTP and snapshot settings.
    pub server: ServerConfig,
    /// Journal retention.
    pub journal: JournalSection,
    /// The log.
    pub log: LogSection,
    /// Access control.
    pub auth: AuthSection,
    /// Replicas on a JetStream stream.
    pub cluster: ClusterSection,
    /// The runtimes to host. A file without any `[[runtime]]` runs the
    /// embedded demo runtime.
    #[serde(rename = "runtime")]
    pub runtimes: Vec<RuntimeSection>,
}

impl Default for Config {
    /// The embedded default: runtime `demo` running the ticker guest into
    /// the view `prices`.
    fn default() -> Self {
        Self {
            server: ServerConfig::default(),
            journal: JournalSection::default(),
            log: LogSection::default(),
            auth: AuthSection::default(),
            cluster: ClusterSection::default(),
            runtimes: vec![RuntimeSection {
                name: "demo".to_owned(),
                wasm: "builtin:ticker".to_owned(),
                views: vec!["prices".to_owned()],
                config: String::new(),
                schemas: Default::default(),
                limits: LimitsSection::default(),
                source: None,
            }],
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::path::PathBuf;

    use super::*;
    use runtime::SourceSection;

    /// The README's config reference: the TOML block after its marker.
    fn readme_reference() -> String {
        let readme = include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md"));
        let after = readme
            .split_once("<!-- config-reference")
            .expect("the README has a config reference")
            .1;
        let block = after.split_once("```toml\n").unwrap().1;
        block.split_once("```").unwrap().0.to_owned()
    }

    /// Every leaf key of a serialized config, with array indices left out, and its value.
    fn leaves(
        value: &serde_json::Value,
        prefix: &str,
        out: &mut BTreeMap<String, serde_json::Value>,
    ) {
        match value {
            serde_json::Value::Object(map) => {
                for (key, value) in map {
                    let path = match prefix {
                        "" => key.clone(),
                        _ => format!("{prefix}.{key}"),
                    };
                    leaves(value, &path, out);
                }
            }
            // Tables in an array (`[[runtime]]`): their keys, under the array's name.
            serde_json::Value::Array(items)
                if items.iter().all(|item| item.is_object()) && !items.is_empty() =>
            {
                for item in items {
                    leaves(item, prefix, out);
                }
            }
            _ => {
                out.insert(prefix.to_owned(), value.clone());
            }
        }
    }

    #[test]
    fn the_readme_reference_is_every_key_with_its_default() {
        let text = readme_reference();
        let documented: Config = toml::from_str(&text).expect("the reference is a valid config");
        let mut shown = BTreeMap::new();
        leaves(&serde_json::to_value(&documented).unwrap(), "", &mut shown);

        // Every key there is: the defaults, with a runtime that has every optional part.
        let mut every = Config::default();
        every.runtimes[0].source = Some(SourceSection {
            file: PathBuf::from("/var/log/app.log"),
        });
        every.runtimes[0]
            .schemas
            .insert("prices".into(), PathBuf::from("prices.schema.json"));
        let mut defaults = BTreeMap::new();
        leaves(&serde_json::to_value(&every).unwrap(), "", &mut defaults);
        // The keys written in the block (parsing filled in the rest with defaults), without
        // array indices; unknown ones were refused by parsing already.
        let written: std::collections::BTreeSet<String> = spans::Spans::of(&text)
            .paths()
            .map(|path| path.replace("[0]", ""))
            .collect();
        let missing: Vec<_> = defaults.keys().filter(|k| !written.contains(*k)).collect();
        assert!(
            missing.is_empty(),
            "keys the README reference leaves out: {missing:?}"
        );
        // Shown values are the defaults, but for keys without one (shown as an example).
        for (key, default) in &defaults {
            if default.is_null()
                || ["runtime.source.file", "runtime.schemas.prices"].contains(&key.as_str())
            {
                continue;
            }
            assert_eq!(
                &shown[key], default,
                "the README shows another default for {key}"
            );
        }
    }
}
