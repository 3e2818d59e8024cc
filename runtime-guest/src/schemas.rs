//! What a runtime declares about its views' values: a JSON Schema per typed view, handed to
//! the host once, when the runtime is made (`ABI.md`, "The declaration").

/// The JSON Schemas of a runtime's typed views, returned by
/// [`Runtime::schemas`](crate::Runtime::schemas).
///
/// The host validates every value published to a typed view against its schema and rejects a
/// batch with a value that does not fit, whole; views without a schema take any value. With
/// the `schema` feature, [`Schemas::view`] derives a schema from a Rust type through
/// [`schemars`](https://docs.rs/schemars); without it, [`Schemas::view_json`] takes one written
/// by hand.
///
/// ```
/// # use viewtape_guest::Schemas;
/// let schemas = Schemas::new().view_json("counts", r#"{"type": "integer", "minimum": 0}"#);
/// assert_eq!(schemas.views().collect::<Vec<_>>(), ["counts"]);
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Schemas {
    views: Vec<(String, String)>,
}

impl Schemas {
    /// No typed view.
    pub fn new() -> Self {
        Self::default()
    }

    /// Types `view` with `schema`, a JSON Schema (draft 2020-12) as JSON text. The host checks
    /// the text when the runtime is made: a schema it cannot read refuses the runtime.
    pub fn view_json(mut self, view: &str, schema: impl Into<String>) -> Self {
        self.views.retain(|(name, _)| name != view);
        self.views.push((view.to_owned(), schema.into()));
        self
    }

    /// Types `view` with the JSON Schema of `T`, as `schemars` derives it: publish values of
    /// `T` serialized with `serde_json` to that view.
    #[cfg(feature = "schema")]
    pub fn view<T: schemars::JsonSchema>(self, view: &str) -> Self {
        let schema = schemars::schema_for!(T);
        self.view_json(view, schema.as_value().to_string())
    }

    /// The typed views, in the order declared.
    pub fn views(&self) -> impl Iterator<Item = &str> {
        self.views.iter().map(|(view, _)| view.as_str())
    }

    /// The schema of `view` as JSON text, if it is typed.
    pub fn get(&self, view: &str) -> Option<&str> {
        self.views
            .iter()
            .find(|(name, _)| name == view)
            .map(|(_, schema)| schema.as_str())
    }

    /// The declaration the host reads (`ABI.md`): `{"schemas":{"VIEW":SCHEMA,…}}`, or nothing
    /// when no view is typed.
    pub(crate) fn declaration(&self) -> Option<Vec<u8>> {
        if self.views.is_empty() {
            return None;
        }
        let mut out = b"{\"schemas\":{".to_vec();
        for (n, (view, schema)) in self.views.iter().enumerate() {
            if n > 0 {
                out.push(b',');
            }
            json_string(&mut out, view);
            out.push(b':');
            out.extend_from_slice(schema.as_bytes());
        }
        out.extend_from_slice(b"}}");
        Some(out)
    }
}

/// Appends `text` as a JSON string (a view name is plain ASCII; any other name still arrives
/// intact, for the host to refuse by name).
fn json_string(out: &mut Vec<u8>, text: &str) {
    out.push(b'"');
    for c in text.chars() {
        match c {
            '"' | '\\' => {
                out.push(b'\\');
                out.push(c as u8);
            }
            c if u32::from(c) < 0x20 => {
                out.extend_from_slice(format!("\\u{:04x}", u32::from(c)).as_bytes())
            }
            c => out.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes()),
        }
    }
    out.push(b'"');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_declaration_names_each_view_once() {
        let schemas = Schemas::new()
            .view_json("a", "true")
            .view_json("b", r#"{"type":"string"}"#)
            .view_json("a", r#"{"type":"number"}"#);
        assert_eq!(
            String::from_utf8(schemas.declaration().unwrap()).unwrap(),
            r#"{"schemas":{"b":{"type":"string"},"a":{"type":"number"}}}"#
        );
        assert_eq!(Schemas::new().declaration(), None);
        let odd = Schemas::new().view_json("a\"b\\\n", "true");
        assert_eq!(
            String::from_utf8(odd.declaration().unwrap()).unwrap(),
            r#"{"schemas":{"a\"b\\\u000a":true}}"#
        );
    }
}
