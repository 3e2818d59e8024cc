//! The fast path of a check: a schema of the shape most views have — an object of named
//! properties, each a plain type (`string`, `number`, `integer`, `boolean`, `null`), with
//! `required`, `additionalProperties: false`, string lengths and integer bounds — checked by a
//! scan of the payload's bytes. Only a string with escapes or non-ASCII text, and a nested value,
//! are handed to `serde_json` to read.
//!
//! It only ever says "fits" for a value the full validator accepts; anything it is unsure of
//! (a float where an integer is wanted, a float near overflow, a bound it does not compare
//! exactly, a nested value checked against a type) goes to the full validator, which also words
//! every violation. A schema with any keyword outside this shape has no fast path at all.

use std::borrow::Cow;

use serde_json::{Map, Value};

/// Keywords that only annotate: they never make a value fail.
const ANNOTATIONS: [&str; 9] = [
    "title",
    "description",
    "examples",
    "default",
    "$comment",
    "deprecated",
    "readOnly",
    "writeOnly",
    "$schema",
];

/// Most properties a flat schema may have (one bit each in the `required` mask).
const MAX_PROPERTIES: usize = 64;

/// A flat object schema, compiled for the fast path.
#[derive(Debug)]
pub(super) struct Flat {
    properties: Vec<(String, Property)>,
    /// One bit per property that must be present.
    required: u64,
    /// `additionalProperties: false`.
    closed: bool,
}

/// What one property allows.
#[derive(Debug, Default)]
struct Property {
    /// Allowed JSON types; empty: any value.
    types: Vec<Kind>,
    min_length: Option<u64>,
    max_length: Option<u64>,
    minimum: Option<i128>,
    maximum: Option<i128>,
}

/// The JSON types a flat property can name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    String,
    Number,
    Integer,
    Boolean,
    Null,
}

impl Kind {
    fn parse(name: &Value) -> Option<Self> {
        Some(match name.as_str()? {
            "string" => Self::String,
            "number" => Self::Number,
            "integer" => Self::Integer,
            "boolean" => Self::Boolean,
            "null" => Self::Null,
            _ => return None,
        })
    }
}

impl Flat {
    /// The fast path of `document`, if it has the flat shape (module docs).
    pub(super) fn compile(document: &Value) -> Option<Self> {
        let top = document.as_object()?;
        let mut flat = Flat {
            properties: Vec::new(),
            required: 0,
            closed: false,
        };
        let mut required = &Vec::new();
        for (keyword, value) in top {
            match keyword.as_str() {
                "type" if value == "object" => {}
                "properties" => {
                    for (name, schema) in value.as_object()? {
                        flat.properties
                            .push((name.clone(), Property::compile(schema)?));
                    }
                }
                "required" => required = value.as_array()?,
                "additionalProperties" => flat.closed = !value.as_bool()?,
                other if ANNOTATIONS.contains(&other) => {}
                _ => return None,
            }
        }
        // An object is what the shape is about: without `"type": "object"`, anything else
        // would fit too.
        if top.get("type")? != "object" || flat.properties.len() > MAX_PROPERTIES {
            return None;
        }
        for name in required {
            let index = flat.index(name.as_str()?.as_bytes())?;
            flat.required |= 1 << index;
        }
        Some(flat)
    }

    fn index(&self, name: &[u8]) -> Option<usize> {
        self.properties
            .iter()
            .position(|(n, _)| n.as_bytes() == name)
    }

    /// Whether `payload` certainly fits; `false` also when unsure.
    pub(super) fn fits(&self, payload: &[u8]) -> bool {
        self.read(&mut Scan(payload)).is_some()
    }

    /// Reads the payload's object member by member: `None` as soon as something does not fit
    /// or is not certainly JSON.
    fn read(&self, scan: &mut Scan<'_>) -> Option<()> {
        scan.take(b'{')?;
        let mut seen = 0u64;
        if !scan.took(b'}') {
            loop {
                let key = scan.string()?;
                scan.take(b':')?;
                let value = scan.value()?;
                match self.index(&key.bytes) {
                    Some(index) => {
                        self.properties[index].1.fits(value).then_some(())?;
                        seen |= 1 << index;
                    }
                    None => (!self.closed).then_some(())?,
                }
                if !scan.took(b',') {
                    scan.take(b'}')?;
                    break;
                }
            }
        }
        (seen & self.required == self.required).then_some(())?;
        scan.end()
    }
}

impl Property {
    fn compile(schema: &Value) -> Option<Self> {
        let mut property = Property::default();
        let schema = schema.as_object()?;
        for (keyword, value) in schema {
            match keyword.as_str() {
                "type" => {
                    property.types = match value {
                        Value::Array(names) => {
                            names.iter().map(Kind::parse).collect::<Option<_>>()?
                        }
                        name => vec![Kind::parse(name)?],
                    }
                }
                "minLength" => property.min_length = Some(value.as_u64()?),
                "maxLength" => property.max_length = Some(value.as_u64()?),
                "minimum" => property.minimum = Some(integer(value)?),
                "maximum" => property.maximum = Some(integer(value)?),
                // Formats check strings only: on any other type they are a no-op.
                "format" if !property_takes_strings(schema) => {}
                other if ANNOTATIONS.contains(&other) => {}
                _ => return None,
            }
        }
        Some(property)
    }

    /// Whether `value` certainly fits.
    fn fits(&self, value: Scalar) -> bool {
        let any = self.types.is_empty();
        let has = |kind| self.types.contains(&kind);
        match value {
            Scalar::String(chars) => {
                (any || has(Kind::String))
                    && self.min_length.is_none_or(|min| chars >= min)
                    && self.max_length.is_none_or(|max| chars <= max)
            }
            Scalar::Integer(n) => {
                (any || has(Kind::Integer) || has(Kind::Number))
                    && self.minimum.is_none_or(|min| n >= min)
                    && self.maximum.is_none_or(|max| n <= max)
            }
            // A float is never an integer here (`1.0` is one in some drafts, not in others),
            // and its bounds are not compared: the full validator decides.
            Scalar::Float => {
                (any || has(Kind::Number)) && self.minimum.is_none() && self.maximum.is_none()
            }
            Scalar::Boolean => any || has(Kind::Boolean),
            Scalar::Null => any || has(Kind::Null),
            Scalar::Nested => any,
        }
    }
}

/// Whether a property's schema lets strings through (then `format` would check them).
fn property_takes_strings(schema: &Map<String, Value>) -> bool {
    match schema.get("type") {
        None => true,
        Some(Value::Array(names)) => names.iter().any(|n| n == "string"),
        Some(name) => name == "string",
    }
}

/// A bound given as an integer, exactly.
fn integer(value: &Value) -> Option<i128> {
    let number = value.as_number()?;
    number
        .as_u64()
        .map(i128::from)
        .or_else(|| number.as_i64().map(i128::from))
}

/// What the fast path learns of one property's value.
#[derive(Debug, Clone, Copy)]
enum Scalar {
    /// A string, by its length in characters (what `minLength` counts).
    String(u64),
    /// An integer that fits an `i64` or a `u64`, written without a fraction or an exponent.
    Integer(i128),
    Float,
    Boolean,
    Null,
    /// An array or an object.
    Nested,
}

/// The largest magnitude (digits before the point plus the exponent) of a float taken as
/// certainly finite: far from `f64::MAX`'s 309, past which `serde_json` refuses a number.
const FINITE_DIGITS: u64 = 300;

/// A string's text, as UTF-8, and its length in characters (what `minLength` counts).
struct Text<'a> {
    bytes: Cow<'a, [u8]>,
    chars: u64,
}

/// The unread rest of a payload. Every read takes only what is certainly JSON as
/// `serde_json` reads it, and says `None` to anything else, which the full check then words.
struct Scan<'a>(&'a [u8]);

impl<'a> Scan<'a> {
    fn skip_whitespace(&mut self) {
        while let [b' ' | b'\t' | b'\n' | b'\r', rest @ ..] = self.0 {
            self.0 = rest;
        }
    }

    /// Takes `byte` if it comes next, after any whitespace.
    fn took(&mut self, byte: u8) -> bool {
        self.skip_whitespace();
        match self.0 {
            [first, rest @ ..] if *first == byte => {
                self.0 = rest;
                true
            }
            _ => false,
        }
    }

    fn take(&mut self, byte: u8) -> Option<()> {
        self.took(byte).then_some(())
    }

    /// Only whitespace is left.
    fn end(&mut self) -> Option<()> {
        self.skip_whitespace();
        self.0.is_empty().then_some(())
    }

    /// A string.
    fn string(&mut self) -> Option<Text<'a>> {
        self.skip_whitespace();
        let whole = self.0;
        let body = whole.strip_prefix(b"\"")?;
        // Most strings here are short and plain ASCII: one pass finds their end.
        let end = body
            .iter()
            .position(|&b| matches!(b, b'"' | b'\\' | ..0x20 | 0x80..))?;
        if body[end] == b'"' {
            self.0 = &body[end + 1..];
            return Some(Text {
                bytes: Cow::Borrowed(&body[..end]),
                chars: end as u64,
            });
        }
        // Escapes, surrogate pairs and the rest of UTF-8 are `serde_json`'s to read.
        let text: String = self.serde()?;
        Some(Text {
            chars: text.chars().count() as u64,
            bytes: Cow::Owned(text.into_bytes()),
        })
    }

    /// One value, as far as a property's check needs to know it.
    fn value(&mut self) -> Option<Scalar> {
        self.skip_whitespace();
        Some(match self.0.first()? {
            b'"' => Scalar::String(self.string()?.chars),
            b't' => self.literal(b"true", Scalar::Boolean)?,
            b'f' => self.literal(b"false", Scalar::Boolean)?,
            b'n' => self.literal(b"null", Scalar::Null)?,
            b'[' | b'{' => {
                // Nested values are rare here: `serde_json` reads them whole, into a `Value`
                // (skipping them as `IgnoredAny` would check neither UTF-8 nor surrogates).
                self.serde::<Value>()?;
                Scalar::Nested
            }
            _ => self.number()?,
        })
    }

    /// The next value as `serde_json` reads it, into a `T`.
    fn serde<T: serde::de::DeserializeOwned>(&mut self) -> Option<T> {
        let mut values = serde_json::Deserializer::from_slice(self.0).into_iter::<T>();
        let value = values.next()?.ok()?;
        self.0 = &self.0[values.byte_offset()..];
        Some(value)
    }

    fn literal(&mut self, word: &[u8], scalar: Scalar) -> Option<Scalar> {
        self.0 = self.0.strip_prefix(word)?;
        Some(scalar)
    }

    /// A number, read as `serde_json` reads it: an integer that fits an `i64` or a `u64` is
    /// one; `-0`, a larger integer, and anything with a fraction or an exponent is a float.
    fn number(&mut self) -> Option<Scalar> {
        let bytes = self.0;
        let digits = |from: usize| {
            let count = bytes
                .get(from..)?
                .iter()
                .take_while(|b| b.is_ascii_digit())
                .count();
            (count > 0).then_some(count)
        };
        let negative = bytes.first() == Some(&b'-');
        let sign = usize::from(negative);
        let whole = digits(sign)?;
        if whole > 1 && bytes[sign] == b'0' {
            return None;
        }
        let mut at = sign + whole;
        let mut float = false;
        if bytes.get(at) == Some(&b'.') {
            at += 1 + digits(at + 1)?;
            float = true;
        }
        let mut exponent = 0u64;
        if matches!(bytes.get(at), Some(b'e' | b'E')) {
            at += 1;
            let raises = bytes.get(at) != Some(&b'-');
            at += usize::from(matches!(bytes.get(at), Some(b'+' | b'-')));
            let count = digits(at)?;
            if raises {
                exponent = std::str::from_utf8(&bytes[at..at + count])
                    .ok()?
                    .parse()
                    .unwrap_or(u64::MAX);
            }
            at += count;
            float = true;
        }
        self.0 = &bytes[at..];
        if !float {
            let magnitude = bytes[sign..sign + whole].iter().try_fold(0u64, |n, &d| {
                n.checked_mul(10)?.checked_add(u64::from(d - b'0'))
            });
            match (negative, magnitude) {
                (false, Some(n)) => return Some(Scalar::Integer(n.into())),
                (true, Some(n)) if n != 0 && n <= i64::MIN.unsigned_abs() => {
                    return Some(Scalar::Integer(-i128::from(n)))
                }
                _ => {}
            }
        }
        ((whole as u64).saturating_add(exponent) <= FINITE_DIGITS).then_some(Scalar::Float)
    }
}

#[cfg(test)]
mod tests;
