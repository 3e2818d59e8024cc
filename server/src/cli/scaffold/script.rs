//! A TypeScript or JavaScript guest: an npm package whose `npm run build`
//! bundles `src/guest.ts` (or `.js`) with esbuild into one ES module with no imports left,
//! `dist/guest.js` — the module a server runs — and whose `npm test` runs node:test tests on
//! `@viewtape/guest`'s harness, which runs that module in the `viewtape` binary's own engine.
//!
//! `@viewtape/guest` is a package of viewtape's repository: by default the guest depends on the
//! version of the release this binary is; `--sdk DIR` depends on a checkout's `clients/guest`
//! directory instead (a `file:` dependency), or on a tarball `npm pack` wrote there.

use std::path::{Path, PathBuf};

use super::{check_name, with_serving, write_files, ScaffoldError, INPUT};

/// What `--sdk` names for a TypeScript or JavaScript guest.
const NPM_SDK: &str = "the clients/guest directory of a viewtape checkout (or a tarball of it)";
/// The npm name of the SDK.
const NPM_SDK_NAME: &str = "@viewtape/guest";
/// The build and type-check tools a new package pins (those `clients/` builds with).
const ESBUILD: &str = "0.28.2";
const TYPESCRIPT: &str = "7.0.2";

/// The language of a script guest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Script {
    /// `src/guest.ts`, type-checked by `tsc` before every test run.
    TypeScript,
    /// `src/guest.js`.
    JavaScript,
}

/// The `@viewtape/guest` a new package depends on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NpmSdk {
    /// The release's, from the npm registry, by version.
    Registry {
        /// The version (`0.1.0`).
        version: String,
    },
    /// A checkout's `clients/guest` directory, or a tarball of it.
    Path(PathBuf),
}

impl NpmSdk {
    /// The package of the release this binary is: its version.
    pub fn this_release() -> Self {
        Self::Registry {
            version: env!("CARGO_PKG_VERSION").to_owned(),
        }
    }

    /// The dependency's specifier in `package.json`, as a JSON string: the version, or `file:`
    /// and the absolute path, checked to hold the SDK.
    fn specifier(&self) -> Result<String, ScaffoldError> {
        let specifier = match self {
            Self::Registry { version } => version.clone(),
            Self::Path(path) => {
                let missing = || ScaffoldError::no_sdk(path.clone(), NPM_SDK);
                let absolute = std::fs::canonicalize(path).map_err(|_| missing())?;
                if absolute.is_dir() {
                    let manifest = std::fs::read(absolute.join("package.json"))
                        .map_err(|_| ScaffoldError::no_sdk(absolute.clone(), NPM_SDK))?;
                    let name = serde_json::from_slice::<serde_json::Value>(&manifest)
                        .ok()
                        .and_then(|manifest| manifest["name"].as_str().map(str::to_owned));
                    if name.as_deref() != Some(NPM_SDK_NAME) {
                        return Err(ScaffoldError::no_sdk(absolute, NPM_SDK));
                    }
                } else if !absolute.to_string_lossy().ends_with(".tgz") {
                    return Err(ScaffoldError::no_sdk(absolute, NPM_SDK));
                }
                format!("file:{}", absolute.to_string_lossy().replace('\\', "/"))
            }
        };
        Ok(serde_json::Value::String(specifier).to_string())
    }
}

/// Writes the package `name` into `parent/name`, in `script`, depending on `sdk`. Returns its
/// directory.
///
/// # Errors
/// A bad name, an SDK path without the SDK, an existing directory, or a failed write.
pub fn new_script_guest(
    name: &str,
    parent: &Path,
    script: Script,
    sdk: &NpmSdk,
) -> Result<PathBuf, ScaffoldError> {
    check_name(name)?;
    let specifier = sdk.specifier()?;
    let fill = |template: &str| {
        template
            .replace("{{name}}", name)
            .replace("{{sdk}}", &specifier)
            .replace("{{esbuild}}", ESBUILD)
            .replace("{{typescript}}", TYPESCRIPT)
    };
    let (source, package, guest) = match script {
        Script::TypeScript => ("src/guest.ts", PACKAGE_TS, GUEST_TS),
        Script::JavaScript => ("src/guest.js", PACKAGE_JS, GUEST_JS),
    };
    let mut files = vec![
        ("package.json", fill(package)),
        (source, fill(guest)),
        ("test/guest.test.mjs", fill(TEST)),
        (
            "README.md",
            fill(&with_serving(README_MD, "dist/guest.js")).replace("{{source}}", source),
        ),
        ("input.ndjson", INPUT.to_owned()),
        (".gitignore", "node_modules/\ndist/\n".to_owned()),
    ];
    if script == Script::TypeScript {
        files.push(("tsconfig.json", TSCONFIG.to_owned()));
    }
    write_files(&parent.join(name), &files)
}

const PACKAGE_TS: &str = r#"{
  "name": "{{name}}",
  "version": "0.1.0",
  "private": true,
  "description": "A viewtape ingestion runtime: a running total per key, in the view {{name}}.",
  "type": "module",
  "engines": {
    "node": ">=20"
  },
  "scripts": {
    "build": "esbuild src/guest.ts --bundle --format=esm --platform=neutral --target=es2022 --outfile=dist/guest.js",
    "typecheck": "tsc -p tsconfig.json",
    "pretest": "npm run typecheck && npm run build",
    "test": "node --test test/guest.test.mjs"
  },
  "devDependencies": {
    "@viewtape/guest": {{sdk}},
    "esbuild": "{{esbuild}}",
    "typescript": "{{typescript}}"
  }
}
"#;

const PACKAGE_JS: &str = r#"{
  "name": "{{name}}",
  "version": "0.1.0",
  "private": true,
  "description": "A viewtape ingestion runtime: a running total per key, in the view {{name}}.",
  "type": "module",
  "engines": {
    "node": ">=20"
  },
  "scripts": {
    "build": "esbuild src/guest.js --bundle --format=esm --platform=neutral --target=es2022 --outfile=dist/guest.js",
    "pretest": "npm run build",
    "test": "node --test test/guest.test.mjs"
  },
  "devDependencies": {
    "@viewtape/guest": {{sdk}},
    "esbuild": "{{esbuild}}"
  }
}
"#;

/// The guest's world is the engine's: ES2022 and no DOM, no Node (no timers, no I/O).
const TSCONFIG: &str = r#"{
  "compilerOptions": {
    "target": "ES2022",
    "module": "ESNext",
    "moduleResolution": "Bundler",
    "lib": ["ES2022"],
    "types": [],
    "strict": true,
    "noUncheckedIndexedAccess": true,
    "isolatedModules": true,
    "noEmit": true
  },
  "include": ["src"]
}
"#;

const GUEST_TS: &str = r#"// {{name}}: a viewtape ingestion runtime. Input is NDJSON, one entry per line:
// {"key":"alice","amount":5}. It keeps a running total per key and publishes {"total":…} under
// that key in the view `{{name}}`, a typed view: the server checks every value against
// `schemas` and serves the schema at GET /views/{{name}}/schema.
//
// `npm run build` bundles this file into dist/guest.js, the module the server runs: imports of
// types leave nothing, other imports are bundled in.
import type { Ctx, Schemas } from '@viewtape/guest';

/** The view it publishes to: declare it in the server's config (`views = ["{{name}}"]`). */
const VIEW = '{{name}}';

/** The whole state, saved as JSON after every batch: the running total of every key. */
export interface State {
  totals: Record<string, number>;
}

interface Entry {
  key: string;
  amount: number;
}

export function init(_config: string): State {
  return { totals: {} };
}

/** Throwing rejects the whole batch: nothing of it is published, and the state stays as it was. */
export function onBatch(state: State, input: string, ctx: Ctx): State {
  // A Map, not the object itself: a key such as "__proto__" is data, not a prototype.
  const totals = new Map(Object.entries(state.totals));
  const lines = input.split('\n');
  for (let i = 0; i < lines.length; i++) {
    const line = lines[i]?.trim();
    if (!line) continue;
    const entry = parse(line, i + 1);
    const total = (totals.get(entry.key) ?? 0) + entry.amount;
    if (!Number.isSafeInteger(total)) {
      throw new Error(`line ${i + 1}: the total of ${JSON.stringify(entry.key)} overflows`);
    }
    totals.set(entry.key, total);
    ctx.publish(VIEW, entry.key, { total });
  }
  ctx.log('debug', 'batch done');
  return { totals: Object.fromEntries(totals) };
}

function parse(line: string, number: number): Entry {
  let value: unknown;
  try {
    value = JSON.parse(line);
  } catch (error) {
    throw new Error(`line ${number}: not JSON: ${(error as Error).message}`);
  }
  const { key, amount } = (value ?? {}) as Record<string, unknown>;
  if (typeof key !== 'string' || key === '') throw new Error(`line ${number}: "key" is not a non-empty string`);
  if (typeof amount !== 'number' || !Number.isSafeInteger(amount)) {
    throw new Error(`line ${number}: "amount" is not an integer`);
  }
  return { key, amount };
}

/** The JSON Schema of the view's values. */
export const schemas: Schemas = {
  [VIEW]: {
    type: 'object',
    required: ['total'],
    properties: { total: { type: 'integer' } },
    additionalProperties: false,
  },
};
"#;

const GUEST_JS: &str = r#"// {{name}}: a viewtape ingestion runtime. Input is NDJSON, one entry per line:
// {"key":"alice","amount":5}. It keeps a running total per key and publishes {"total":…} under
// that key in the view `{{name}}`, a typed view: the server checks every value against
// `schemas` and serves the schema at GET /views/{{name}}/schema.
//
// `npm run build` bundles this file into dist/guest.js, the module the server runs: other
// imports are bundled in. The JSDoc types are @viewtape/guest's, for editors that read them.

/** The view it publishes to: declare it in the server's config (`views = ["{{name}}"]`). */
const VIEW = '{{name}}';

/**
 * The whole state, saved as JSON after every batch: the running total of every key.
 * @typedef {{ totals: Record<string, number> }} State
 */

/** @param {string} _config @returns {State} */
export function init(_config) {
  return { totals: {} };
}

/**
 * Throwing rejects the whole batch: nothing of it is published, and the state stays as it was.
 * @param {State} state
 * @param {string} input
 * @param {import('@viewtape/guest').Ctx} ctx
 * @returns {State}
 */
export function onBatch(state, input, ctx) {
  // A Map, not the object itself: a key such as "__proto__" is data, not a prototype.
  const totals = new Map(Object.entries(state.totals));
  const lines = input.split('\n');
  for (let i = 0; i < lines.length; i++) {
    const line = lines[i].trim();
    if (!line) continue;
    const entry = parse(line, i + 1);
    const total = (totals.get(entry.key) ?? 0) + entry.amount;
    if (!Number.isSafeInteger(total)) {
      throw new Error(`line ${i + 1}: the total of ${JSON.stringify(entry.key)} overflows`);
    }
    totals.set(entry.key, total);
    ctx.publish(VIEW, entry.key, { total });
  }
  ctx.log('debug', 'batch done');
  return { totals: Object.fromEntries(totals) };
}

/** @param {string} line @param {number} number @returns {{ key: string, amount: number }} */
function parse(line, number) {
  let value;
  try {
    value = JSON.parse(line);
  } catch (error) {
    throw new Error(`line ${number}: not JSON: ${error.message}`);
  }
  const { key, amount } = value ?? {};
  if (typeof key !== 'string' || key === '') throw new Error(`line ${number}: "key" is not a non-empty string`);
  if (!Number.isSafeInteger(amount)) throw new Error(`line ${number}: "amount" is not an integer`);
  return { key, amount };
}

/** The JSON Schema of the view's values. @type {import('@viewtape/guest').Schemas} */
export const schemas = {
  [VIEW]: {
    type: 'object',
    required: ['total'],
    properties: { total: { type: 'integer' } },
    additionalProperties: false,
  },
};
"#;

const TEST: &str = r#"// The guest as the server runs it: dist/guest.js (`npm test` builds it first) in the viewtape
// binary's engine, through @viewtape/guest's harness. The binary: VIEWTAPE_BIN, else `viewtape`
// on PATH.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { fileURLToPath } from 'node:url';

import { runGuest } from '@viewtape/guest/harness';

const guest = fileURLToPath(new URL('../dist/guest.js', import.meta.url));
const VIEW = '{{name}}';
const entry = (key, amount) => JSON.stringify({ key, amount });

test('totals accumulate per key', async () => {
  const g = await runGuest(guest);
  try {
    await g.feed([entry('alice', 5)]);
    const out = await g.feed([entry('alice', 2), entry('bob', 1)]);
    assert.equal(out.error, undefined);
    assert.deepEqual(out.published, [
      { view: VIEW, key: 'alice', value: { total: 7 } },
      { view: VIEW, key: 'bob', value: { total: 1 } },
    ]);
    assert.deepEqual(out.logs, [{ level: 'debug', message: 'batch done' }]);
    assert.deepEqual(g.state(), { totals: { alice: 7, bob: 1 } });
  } finally {
    await g.close();
  }
});

test('a bad line rejects the whole batch and keeps the state', async () => {
  const g = await runGuest(guest);
  try {
    await g.feed([entry('alice', 5)]);
    const out = await g.feed([entry('alice', 1), 'nope']);
    assert.match(out.error ?? '', /line 2: not JSON/);
    assert.deepEqual(out.published, []);
    assert.deepEqual(g.state(), { totals: { alice: 5 } });
  } finally {
    await g.close();
  }
});

test('the state carries over a restart', async () => {
  const first = await runGuest(guest);
  await first.feed([entry('alice', 5)]);
  const saved = first.savedState();
  await first.close();
  const second = await runGuest(guest, { savedState: saved });
  try {
    const out = await second.feed([entry('alice', 1)]);
    assert.deepEqual(out.published, [{ view: VIEW, key: 'alice', value: { total: 6 } }]);
  } finally {
    await second.close();
  }
});
"#;

const README_MD: &str = r#"# {{name}}

A viewtape ingestion runtime, in `{{source}}`: NDJSON entries `{"key":"alice","amount":5}` in, a
running total per key out, in the view `{{name}}`. The view is typed: the `schemas` export
declares the JSON Schema of its values, the server refuses a batch publishing a value that does
not fit (`422`, naming the view, the key and the failing JSON pointer) and serves the schema at
`GET /views/{{name}}/schema`.

```sh
npm install
npm test                                   # builds dist/guest.js, then runs test/ in viewtape's engine
viewtape run dist/guest.js < input.ndjson  # what each batch publishes, its gaps and errors, as NDJSON
```

`npm run build` bundles the guest with esbuild into one ES module, `dist/guest.js`: the file the
server runs. The tests use `@viewtape/guest`'s harness, which runs that file with the `viewtape`
binary (`VIEWTAPE_BIN`, else the one on PATH), so they see what a server would publish: the same
engine, limits and schema checks, and a batch that throws counts for nothing.

{{serving}}

A guest is deterministic: `Date.now()` and `new Date()` are the batch's ingest time as the log
holds it (the same on every node and at every replay; the harness's `feed(lines, { at })` sets
it), `Math.random()` is seeded from the runtime's count of batches and that time, and there are
no timers and no I/O. A loop that never ends runs out of fuel and an allocation past the memory
limit fails the batch, as for any guest.
"#;

#[cfg(test)]
mod tests {
    use super::*;

    /// A checkout's SDK, by path.
    fn checkout() -> NpmSdk {
        NpmSdk::Path(Path::new(env!("CARGO_MANIFEST_DIR")).join("../clients/guest"))
    }

    #[test]
    fn writes_a_typescript_package_on_the_checkouts_sdk_by_path() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = new_script_guest("orders", tmp.path(), Script::TypeScript, &checkout()).unwrap();
        let manifest: serde_json::Value =
            serde_json::from_slice(&std::fs::read(dir.join("package.json")).unwrap()).unwrap();
        let sdk =
            std::fs::canonicalize(Path::new(env!("CARGO_MANIFEST_DIR")).join("../clients/guest"))
                .unwrap();
        assert_eq!(
            manifest["devDependencies"]["@viewtape/guest"],
            format!("file:{}", sdk.display())
        );
        assert!(manifest["scripts"]["build"]
            .as_str()
            .unwrap()
            .contains("--bundle --format=esm"));
        let guest = std::fs::read_to_string(dir.join("src/guest.ts")).unwrap();
        assert!(guest.contains("const VIEW = 'orders';"), "{guest}");
        for file in [
            "tsconfig.json",
            "test/guest.test.mjs",
            "README.md",
            "input.ndjson",
        ] {
            let text = std::fs::read_to_string(dir.join(file)).unwrap();
            assert!(!text.contains("{{"), "{file}: {text}");
        }
        assert!(matches!(
            new_script_guest("orders", tmp.path(), Script::TypeScript, &checkout()),
            Err(ScaffoldError::Exists(_))
        ));
    }

    #[test]
    fn a_javascript_package_on_the_releases_version() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = new_script_guest(
            "orders",
            tmp.path(),
            Script::JavaScript,
            &NpmSdk::this_release(),
        )
        .unwrap();
        let manifest: serde_json::Value =
            serde_json::from_slice(&std::fs::read(dir.join("package.json")).unwrap()).unwrap();
        assert_eq!(
            manifest["devDependencies"]["@viewtape/guest"],
            env!("CARGO_PKG_VERSION")
        );
        assert!(manifest["devDependencies"].get("typescript").is_none());
        assert!(dir.join("src/guest.js").is_file());
        assert!(!dir.join("tsconfig.json").exists());
    }

    #[test]
    fn refuses_bad_names_and_directories_without_the_sdk() {
        let tmp = tempfile::tempdir().unwrap();
        assert!(matches!(
            new_script_guest("Orders", tmp.path(), Script::TypeScript, &checkout()),
            Err(ScaffoldError::BadName(_))
        ));
        // The Rust SDK's directory is not the npm one.
        let rust_sdk = NpmSdk::Path(Path::new(env!("CARGO_MANIFEST_DIR")).join("../runtime-guest"));
        let refused = new_script_guest("orders", tmp.path(), Script::TypeScript, &rust_sdk);
        assert!(
            matches!(&refused, Err(ScaffoldError::NoSdk { .. })),
            "{refused:?}"
        );
        assert!(!tmp.path().join("orders").exists());
    }
}
