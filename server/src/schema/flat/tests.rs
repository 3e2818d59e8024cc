//! The fast path's tests: each shape it takes, and that it never says "fits" where the full
//! validator refuses.

use super::*;
use proptest::prelude::*;
use serde_json::json;

/// What schemars makes of the built-in ticker's tick.
fn tick_schema() -> Value {
    json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "Tick",
        "type": "object",
        "additionalProperties": false,
        "required": ["symbol", "price", "seq"],
        "properties": {
            "price": {"description": "The price.", "format": "double", "type": "number"},
            "seq": {"format": "uint64", "minimum": 0, "type": "integer"},
            "symbol": {"minLength": 1, "type": "string"}
        }
    })
}

#[test]
fn a_tick_takes_the_fast_path_and_a_bad_one_does_not() {
    let flat = Flat::compile(&tick_schema()).expect("a flat schema");
    assert!(flat.fits(br#"{"symbol":"ACME","price":12.5,"seq":7}"#));
    assert!(flat.fits(br#" {"seq":0,"price":-3,"symbol":"\u00e9"} "#));
    assert!(flat.fits(
        b"{ \"symbol\" :\t\"\xc3\xa9\\\"\" ,\r\n\"price\": -0.5e-3 , \"seq\":18446744073709551615}\n"
    ));
    for bad in [
        &br#"{"symbol":"","price":1,"seq":1}"#[..],
        br#"{"symbol":"A","price":1,"seq":-1}"#,
        br#"{"symbol":"A","price":1,"seq":1.0}"#,
        br#"{"symbol":"A","price":"1","seq":1}"#,
        br#"{"symbol":"A","price":1}"#,
        br#"{"symbol":"A","price":1,"seq":1,"x":0}"#,
        br#"{"symbol":"A","price":1,"seq":1} x"#,
        br#"[{"symbol":"A","price":1,"seq":1}]"#,
        b"not json",
        br#"{"symbol":"A","price":1e400,"seq":1}"#,
        br#"{"symbol":"A","price":01,"seq":1}"#,
        br#"{"symbol":"A","price":1.,"seq":1}"#,
        br#"{"symbol":"A","price":-,"seq":1}"#,
        br#"{"symbol":"A","price":1e,"seq":1}"#,
        br#"{"symbol":"A","price":1,"seq":18446744073709551616}"#,
        br#"{"symbol":"A","price":1,"seq":-0}"#,
        br#"{"symbol":"A","price":1,"seq":1,}"#,
        br#"{"symbol":"A","price":1,"seq":1"#,
        br#"{"symbol":"\ud800","price":1,"seq":1}"#,
        br#"{"symbol":"\x","price":1,"seq":1}"#,
        br#"{"symbol":"A\","price":1,"seq":1}"#,
        b"{\"symbol\":\"a\tb\",\"price\":1,\"seq\":1}",
        b"{\"symbol\":\"\xff\",\"price\":1,\"seq\":1}",
    ] {
        assert!(!flat.fits(bad), "{}", String::from_utf8_lossy(bad));
    }
}

#[test]
fn nested_values_are_read_whole() {
    let flat =
        Flat::compile(&json!({"type": "object", "properties": {"a": {}}})).expect("a flat schema");
    assert!(flat.fits(br#"{"a":[1,{"b":"\u00e9"}],"c":{}}"#));
    for bad in [
        &b"{\"a\":[\"\xff\"]}"[..],
        br#"{"a":["\ud800"]}"#,
        br#"{"a":[1,]}"#,
        br#"{"a":[1}"#,
    ] {
        assert!(!flat.fits(bad), "{}", String::from_utf8_lossy(bad));
    }
}

#[test]
fn a_keyword_outside_the_shape_means_no_fast_path() {
    let mut nested = tick_schema();
    nested["properties"]["venue"] = json!({"type": "object"});
    let mut formatted = tick_schema();
    formatted["properties"]["symbol"]["format"] = json!("email");
    let mut reffed = tick_schema();
    reffed["$defs"] = json!({});
    let mut exclusive = tick_schema();
    exclusive["properties"]["seq"]["exclusiveMinimum"] = json!(0);
    for schema in [
        nested,
        formatted,
        reffed,
        exclusive,
        json!({"properties": {}}),
        json!({"type": ["object", "null"]}),
        json!({"type": "object", "required": ["undeclared"]}),
        json!(true),
    ] {
        assert!(Flat::compile(&schema).is_none(), "{schema}");
    }
}

/// A generated flat schema over properties `a`, `b`, `c`.
fn schemas() -> impl Strategy<Value = Value> {
    let kinds = prop::sample::subsequence(
        vec!["string", "number", "integer", "boolean", "null"],
        0..=3,
    );
    let property = (
        kinds,
        prop::option::of(0u64..3),
        prop::option::of(0u64..3),
        prop::option::of(-2i64..3),
        prop::option::of(-2i64..3),
    )
        .prop_map(|(kinds, min_len, max_len, min, max)| {
            let mut p = Map::new();
            match kinds.as_slice() {
                [] => {}
                [one] => drop(p.insert("type".into(), json!(one))),
                many => drop(p.insert("type".into(), json!(many))),
            }
            let mut put = |k: &str, v: Option<i64>| {
                if let Some(v) = v {
                    p.insert(k.into(), json!(v));
                }
            };
            put("minLength", min_len.map(|n| n as i64));
            put("maxLength", max_len.map(|n| n as i64));
            put("minimum", min);
            put("maximum", max);
            Value::Object(p)
        });
    let drafts = prop::sample::select(vec![
        "http://json-schema.org/draft-04/schema#",
        "http://json-schema.org/draft-07/schema#",
        "https://json-schema.org/draft/2020-12/schema",
    ]);
    (
        prop::collection::btree_map(prop::sample::select(vec!["a", "b", "c"]), property, 0..=3),
        prop::sample::subsequence(vec!["a", "b", "c"], 0..=2),
        prop::option::of(any::<bool>()),
        drafts,
    )
        .prop_map(|(properties, required, additional, draft)| {
            let required: Vec<&str> = required
                .into_iter()
                .filter(|name| properties.contains_key(name))
                .collect();
            let mut schema = json!({"$schema": draft, "type": "object", "properties": properties});
            if !required.is_empty() {
                schema["required"] = json!(required);
            }
            if let Some(additional) = additional {
                schema["additionalProperties"] = json!(additional);
            }
            schema
        })
}

/// A generated payload: mostly objects over `a`–`d` (keys may repeat), with values of every
/// kind and the numbers whose reading differs between drafts.
fn payloads() -> impl Strategy<Value = String> {
    let value = prop::sample::select(vec![
        "\"\"",
        "\"x\"",
        "\"xy\"",
        "\"\\u00e9\\u00e9\"",
        "\"\\n\"",
        "\"\\ud800\"",
        "\"\\ud83d\\ude00\"",
        "\"\\\"\"",
        "\"\\q\"",
        "\"\t\"",
        "\"é\"",
        "0",
        "1",
        "-1",
        "2",
        "-3",
        "1.0",
        "1.5",
        "-0",
        "1e2",
        "2.0e0",
        "18446744073709551616",
        "18446744073709551615",
        "9223372036854775808",
        "-9223372036854775808",
        "-9223372036854775809",
        "1e400",
        "-1e400",
        "1E+2",
        "0.5e-3",
        "1e-400",
        "01",
        "1.",
        "-",
        ".5",
        " 1 ",
        "true",
        "false",
        "null",
        "[]",
        "[1]",
        "{}",
        "{\"a\":1}",
        "[\"\\ud800\"]",
        "[1,]",
    ]);
    let object = prop::collection::vec(
        (prop::sample::select(vec!["a", "b", "c", "d"]), value),
        0..5,
    )
    .prop_map(|members| {
        let members: Vec<String> = members
            .iter()
            .map(|(k, v)| format!("\"{k}\":{v}"))
            .collect();
        format!("{{{}}}", members.join(" ,\n"))
    });
    prop_oneof![
        8 => object,
        1 => prop::sample::select(vec!["1", "\"a\"", "[]", "null", "{\"a\":1", "{} {}"])
            .prop_map(str::to_owned),
    ]
}

#[derive(Debug, Clone, Copy)]
enum Edit {
    Replace,
    Insert,
    Remove,
}

/// One edit of a payload: where, which byte, and how.
fn edit() -> impl Strategy<Value = (usize, u8, Edit)> {
    let bytes = prop::sample::select(b"\"\\019-.eE+ \t\n\x01\xff\xc3\xa9{}[],:ud8atnx".to_vec());
    let how = prop::sample::select(vec![Edit::Replace, Edit::Insert, Edit::Remove]);
    (0usize..64, bytes, how)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2_000))]

    /// The fast path never lets through what the full validator refuses.
    #[test]
    fn what_fits_fast_is_valid(schema in schemas(), payload in payloads()) {
        let flat = Flat::compile(&schema);
        prop_assert!(flat.is_some(), "generated schemas are flat: {}", schema);
        if flat.is_some_and(|flat| flat.fits(payload.as_bytes())) {
            let validator = jsonschema::validator_for(&schema).unwrap();
            let value: Value = serde_json::from_str(&payload).unwrap();
            prop_assert!(validator.is_valid(&value), "{} against {}", payload, schema);
        }
    }

    /// Nor does it for a tick edited byte by byte: bytes replaced, inserted or removed,
    /// among them quotes, backslashes, digits, control characters and broken UTF-8.
    #[test]
    fn an_edited_tick_fits_only_if_valid(edits in prop::collection::vec(edit(), 1..5)) {
        let schema = tick_schema();
        let flat = Flat::compile(&schema).unwrap();
        let mut payload =
            br#"{"symbol":"AC\u00e9E","price":-12.5e1,"seq":7,"symbol":"B"}"#.to_vec();
        for (at, byte, how) in edits {
            let at = at.min(payload.len());
            match how {
                Edit::Replace if at < payload.len() => payload[at] = byte,
                Edit::Insert => payload.insert(at, byte),
                Edit::Remove if at < payload.len() => drop(payload.remove(at)),
                _ => {}
            }
        }
        if flat.fits(&payload) {
            let value: Value = serde_json::from_slice(&payload).unwrap();
            let validator = jsonschema::validator_for(&schema).unwrap();
            prop_assert!(validator.is_valid(&value), "{}", String::from_utf8_lossy(&payload));
        }
    }

    /// Any bytes at all, and JSON-ish ones: no panic, and what fits is what `serde_json`
    /// reads and the full validator accepts.
    #[test]
    fn any_bytes_fit_only_if_valid(
        payload in prop_oneof![
            prop::collection::vec(any::<u8>(), 0..80),
            prop::collection::vec(
                prop::sample::select(b"{}[]\":,0123456789.-+eE \t\n\\uabcdefsymbolpriceq\xff\xc3\xa9\x01".to_vec()),
                0..80,
            ),
        ],
    ) {
        let schema = tick_schema();
        let flat = Flat::compile(&schema).unwrap();
        if flat.fits(&payload) {
            let value: Result<Value, _> = serde_json::from_slice(&payload);
            prop_assert!(value.is_ok(), "{}", String::from_utf8_lossy(&payload));
            let validator = jsonschema::validator_for(&schema).unwrap();
            prop_assert!(validator.is_valid(&value.unwrap()), "{}", String::from_utf8_lossy(&payload));
        }
    }
}
