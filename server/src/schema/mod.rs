//! Typed views: the JSON Schema of a view's values, where it comes from (a guest's declaration,
//! or a file the config names) and the check of every value published to it.
//!
//! A [`ViewSchemas`] is one runtime's: compiled once when its module is made to run (at start,
//! at a deploy), shared with every batch's check and with the routes that serve it.

mod depth;
mod flat;

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::Deserialize as _;
use serde_json::Value;

pub use depth::{too_deep, MAX_DEPTH};
use flat::Flat;

/// A view's schema: the document as declared, its compiled validator, and the fast path of a
/// flat object schema.
pub struct ViewSchema {
    document: Value,
    validator: jsonschema::Validator,
    flat: Option<Flat>,
}

impl std::fmt::Debug for ViewSchema {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ViewSchema")
            .field("document", &self.document)
            .finish_non_exhaustive()
    }
}

impl PartialEq for ViewSchema {
    fn eq(&self, other: &Self) -> bool {
        self.document == other.document
    }
}

impl ViewSchema {
    /// Compiles `document` as the schema of view `view`.
    ///
    /// # Errors
    /// [`SchemaError::Invalid`]: not a schema the validator can compile (an unknown `$schema`
    /// draft, a `$ref` it cannot resolve — remote and file references are never fetched).
    pub fn new(view: &str, document: Value) -> Result<Self, SchemaError> {
        let validator =
            jsonschema::validator_for(&document).map_err(|error| SchemaError::Invalid {
                view: view.to_owned(),
                reason: error.to_string(),
            })?;
        Ok(Self {
            flat: Flat::compile(&document),
            document,
            validator,
        })
    }

    /// The schema as declared.
    pub fn document(&self) -> &Value {
        &self.document
    }

    /// Whether `payload`, a value published to `view` under `key`, fits.
    ///
    /// # Errors
    /// The first [`Violation`]: the payload is not JSON, is nested deeper than [`MAX_DEPTH`], or
    /// a part of it does not fit.
    pub fn check(&self, view: &str, key: &str, payload: &[u8]) -> Result<(), Violation> {
        if self.flat.as_ref().is_some_and(|flat| flat.fits(payload)) {
            return Ok(());
        }
        let violation = |pointer: String, message: String| Violation {
            view: view.to_owned(),
            key: key.to_owned(),
            pointer,
            message,
        };
        if too_deep(payload) {
            return Err(violation(
                String::new(),
                format!("the value is nested deeper than {MAX_DEPTH} arrays and objects"),
            ));
        }
        let mut reader = serde_json::Deserializer::from_slice(payload);
        // Within the bound just checked: no deeper recursion than that.
        reader.disable_recursion_limit();
        let value = Value::deserialize(&mut reader)
            .and_then(|value| reader.end().map(|()| value))
            .map_err(|error| {
                violation(
                    String::new(),
                    format!(
                        "the value is not JSON (line {}, column {})",
                        error.line(),
                        error.column()
                    ),
                )
            })?;
        self.validator.validate(&value).map_err(|error| {
            violation(
                error.instance_path().as_str().to_owned(),
                error.masked().to_string(),
            )
        })
    }
}

/// Schemas a runtime's config gives its views (`schemas = { VIEW = "FILE.json" }` in its
/// `[[runtime]]`), by view.
pub type ConfiguredSchemas = Arc<BTreeMap<String, Arc<ViewSchema>>>;

/// The schemas of one runtime's typed views.
#[derive(Debug, Default, PartialEq)]
pub struct ViewSchemas {
    views: BTreeMap<String, Arc<ViewSchema>>,
}

impl ViewSchemas {
    /// No typed view.
    pub fn none() -> Arc<Self> {
        Arc::default()
    }

    /// The schemas a guest declared in its `init` reply (`ABI.md`, "The declaration"), over
    /// `configured` (the config's, which win for the views they name). With `views` (what the
    /// runtime declares), the guest's schemas of other views are left out: it cannot publish
    /// there, and a guest built for more views than one config uses still runs.
    ///
    /// # Errors
    /// The declaration is not the JSON object the ABI describes, or a schema does not compile.
    pub fn declared(
        declaration: Option<&[u8]>,
        configured: &BTreeMap<String, Arc<ViewSchema>>,
        views: Option<&[String]>,
    ) -> Result<Self, SchemaError> {
        let mut out = BTreeMap::new();
        if let Some(bytes) = declaration {
            #[derive(serde::Deserialize)]
            struct Declaration {
                #[serde(default)]
                schemas: BTreeMap<String, Value>,
            }
            let declaration: Declaration = serde_json::from_slice(bytes)
                .map_err(|error| SchemaError::Declaration(error.to_string()))?;
            let used = |view: &String| views.is_none_or(|views| views.contains(view));
            for (view, document) in declaration.schemas {
                if !configured.contains_key(&view) && used(&view) {
                    let schema = ViewSchema::new(&view, document)?;
                    out.insert(view, Arc::new(schema));
                }
            }
        }
        out.extend(configured.iter().map(|(v, s)| (v.clone(), Arc::clone(s))));
        Ok(Self { views: out })
    }

    /// The schema of `view`, if it is typed.
    pub fn get(&self, view: &str) -> Option<&Arc<ViewSchema>> {
        self.views.get(view)
    }

    /// Every typed view with its schema.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Arc<ViewSchema>)> {
        self.views
            .iter()
            .map(|(view, schema)| (view.as_str(), schema))
    }

    /// Whether no view is typed.
    pub fn is_empty(&self) -> bool {
        self.views.is_empty()
    }

    /// A CRC-32C of `configured` folded into `crc` (a runtime's guest config's): nodes of a
    /// cluster must agree on both.
    pub fn fold_crc(crc: u32, configured: &BTreeMap<String, Arc<ViewSchema>>) -> u32 {
        configured.iter().fold(crc, |crc, (view, schema)| {
            let crc = crc32c::crc32c_append(crc, view.as_bytes());
            crc32c::crc32c_append(crc, schema.document().to_string().as_bytes())
        })
    }

    /// The typed views whose schema `next` changes or adds, with the new schema.
    pub fn changed_in<'a>(
        &'a self,
        next: &'a ViewSchemas,
    ) -> impl Iterator<Item = (&'a str, &'a Arc<ViewSchema>)> + 'a {
        next.iter()
            .filter(|(view, schema)| self.views.get(*view) != Some(*schema))
    }
}

/// A value that does not fit its view's schema.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("the value of key {key:?} in view `{view}` does not fit the view's schema at {}: {message}", if pointer.is_empty() { "the root" } else { pointer })]
pub struct Violation {
    /// The view.
    pub view: String,
    /// The key.
    pub key: String,
    /// The JSON pointer to the part that fails (empty: the whole value).
    pub pointer: String,
    /// What fails.
    pub message: String,
}

/// A schema that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum SchemaError {
    /// The guest's declaration is not the JSON object the ABI describes.
    #[error("the guest's declaration is not valid: {0}")]
    Declaration(String),
    /// A schema does not compile.
    #[error("the schema of view `{view}` is not a usable JSON Schema: {reason}")]
    Invalid {
        /// The view.
        view: String,
        /// Why.
        reason: String,
    },
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn price() -> Value {
        json!({
            "type": "object",
            "required": ["price"],
            "properties": {"price": {"type": "number"}, "venue": {"$ref": "#/$defs/Venue"}},
            "$defs": {"Venue": {"enum": ["NYSE", "LSE"]}}
        })
    }

    #[test]
    fn a_value_that_does_not_fit_names_view_key_and_pointer() {
        let schema = ViewSchema::new("prices", price()).unwrap();
        assert!(schema.check("prices", "A", br#"{"price": 1.5}"#).is_ok());
        let violation = schema
            .check("prices", "A", br#"{"price": 1, "venue": "TSE"}"#)
            .unwrap_err();
        assert_eq!(
            (violation.view.as_str(), violation.key.as_str()),
            ("prices", "A")
        );
        assert_eq!(violation.pointer, "/venue");
        let violation = schema
            .check("prices", "B", br#"{"price": "1"}"#)
            .unwrap_err();
        assert_eq!(violation.pointer, "/price");
        assert!(violation.to_string().contains("at /price"), "{violation}");
        let violation = schema.check("prices", "C", b"not json").unwrap_err();
        assert_eq!(violation.pointer, "");
        assert!(violation.message.contains("not JSON"), "{violation}");
        // The message never repeats the value itself.
        let violation = schema
            .check("prices", "D", br#"{"price": "secret-1234"}"#)
            .unwrap_err();
        assert!(
            !violation.to_string().contains("secret-1234"),
            "{violation}"
        );
    }

    /// A value nested past 128 was "not JSON" with serde's text: the check says what it is,
    /// reads every value within the bound (128 itself, one past serde's own limit), and words
    /// text that is not JSON itself.
    #[test]
    fn the_check_names_a_value_nested_too_deep_and_reads_every_one_within() {
        let schema = ViewSchema::new("v", json!({"type": "array"})).unwrap();
        let nested = |depth: usize| format!("{}1{}", "[".repeat(depth), "]".repeat(depth));
        assert!(schema.check("v", "k", nested(MAX_DEPTH).as_bytes()).is_ok());
        for depth in [MAX_DEPTH + 1, 200_000] {
            let violation = schema
                .check("v", "k", nested(depth).as_bytes())
                .unwrap_err();
            assert!(
                violation.message.contains("nested deeper than 128"),
                "{violation}"
            );
        }
        let violation = schema.check("v", "k", b"[1,").unwrap_err();
        assert_eq!(
            violation.message,
            "the value is not JSON (line 1, column 3)"
        );
    }

    #[test]
    fn a_flat_schema_words_violations_as_the_full_check_does() {
        let flat = json!({
            "type": "object",
            "additionalProperties": false,
            "required": ["price"],
            "properties": {"price": {"type": "number"}}
        });
        let schema = ViewSchema::new("prices", flat).unwrap();
        assert!(schema.flat.is_some());
        assert!(schema.check("prices", "A", br#"{"price": 1.5}"#).is_ok());
        let violation = schema
            .check("prices", "B", br#"{"price": "1"}"#)
            .unwrap_err();
        assert_eq!(violation.pointer, "/price");
        let violation = schema
            .check("prices", "C", br#"{"price": 1, "x": 2}"#)
            .unwrap_err();
        assert!(violation.message.contains("x"), "{violation}");
        let violation = schema.check("prices", "D", b"[1").unwrap_err();
        assert!(violation.message.contains("not JSON"), "{violation}");
    }

    #[test]
    fn declarations_are_read_checked_and_the_config_wins() {
        let views = ["prices".to_owned(), "other".to_owned()];
        let declaration =
            serde_json::to_vec(&json!({"schemas": {"prices": price()}, "later": 1})).unwrap();
        let schemas =
            ViewSchemas::declared(Some(&declaration), &BTreeMap::new(), Some(&views)).unwrap();
        let prices = schemas.get("prices").unwrap();
        assert!(prices.check("prices", "A", br#"{"price": "x"}"#).is_err());
        assert!(schemas.get("other").is_none(), "untyped");

        let configured = BTreeMap::from([(
            "prices".to_owned(),
            Arc::new(ViewSchema::new("prices", json!({"type": "string"})).unwrap()),
        )]);
        let schemas = ViewSchemas::declared(Some(&declaration), &configured, Some(&views)).unwrap();
        let prices = schemas.get("prices").unwrap();
        assert!(prices.check("prices", "A", br#""text""#).is_ok());

        for bad in [&b"[1]"[..], b"{\"schemas\": {\"prices\": {\"type\": 7}}}"] {
            assert!(ViewSchemas::declared(Some(bad), &BTreeMap::new(), Some(&views)).is_err());
        }
        // A schema of a view the runtime does not declare is left out.
        let elsewhere = br#"{"schemas": {"nope": {"type": 7}, "prices": true}}"#;
        let schemas =
            ViewSchemas::declared(Some(elsewhere), &BTreeMap::new(), Some(&views)).unwrap();
        assert_eq!(
            schemas.iter().map(|(v, _)| v).collect::<Vec<_>>(),
            ["prices"]
        );
        assert!(ViewSchemas::declared(None, &BTreeMap::new(), Some(&views))
            .unwrap()
            .is_empty());
    }

    #[test]
    fn changed_schemas_are_found() {
        let views = ["prices".to_owned()];
        let declared = |schema: Value| {
            let declaration = serde_json::to_vec(&json!({"schemas": {"prices": schema}})).unwrap();
            ViewSchemas::declared(Some(&declaration), &BTreeMap::new(), Some(&views)).unwrap()
        };
        let (a, b) = (declared(price()), declared(json!({"type": "string"})));
        assert_eq!(a.changed_in(&declared(price())).count(), 0);
        assert_eq!(
            b.changed_in(&a).map(|(v, _)| v).collect::<Vec<_>>(),
            ["prices"]
        );
        assert_eq!(ViewSchemas::default().changed_in(&a).count(), 1);
    }
}
