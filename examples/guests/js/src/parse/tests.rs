use rquickjs::{Ctx, Function, Value};

/// What `parse` makes of `text` equals what the engine's parser makes of it (deeply: key
/// order, -0, types), or `parse` leaves it to the engine; in a new context.
fn check(text: &str, taken: bool) {
    crate::tests::in_new_context(|ctx| {
        check_in(&ctx, text, taken);
        // SAFETY: the context is live.
        unsafe { super::release(ctx.as_raw().as_ptr()) };
    });
}

/// As [`check`], in `ctx`, with what earlier parses there left known.
fn check_in(ctx: &Ctx<'_>, text: &str, taken: bool) {
    {
        let raw = ctx.as_raw().as_ptr();
        // Twice: the second time with the names known.
        // SAFETY: the context is live.
        let first = unsafe { super::parse(raw, text.as_bytes()) };
        // SAFETY: `parse` hands over an owned value of this context.
        let first = first.map(|value| unsafe { Value::from_raw(ctx.clone(), value) });
        // SAFETY: the context is live.
        let parsed = unsafe { super::parse(raw, text.as_bytes()) };
        assert_eq!(parsed.is_some(), taken, "{text:?}");
        assert_eq!(first.is_some(), taken, "{text:?}");
        drop(first);
        let Some(parsed) = parsed else {
            return;
        };
        // SAFETY: `parse` hands over an owned value of this context.
        let parsed = unsafe { Value::from_raw(ctx.clone(), parsed) };
        let expected = ctx.json_parse(text).expect("the engine parses it");
        let same: Function = ctx
            .eval(
                "(function same(a, b) {
                    if (typeof a !== typeof b) return false;
                    if (typeof a !== 'object' || a === null || b === null) return Object.is(a, b);
                    if (Array.isArray(a) !== Array.isArray(b)) return false;
                    if (Object.getPrototypeOf(a) !== Object.getPrototypeOf(b)) return false;
                    const ka = Reflect.ownKeys(a), kb = Reflect.ownKeys(b);
                    if (ka.length !== kb.length) return false;
                    for (let i = 0; i < ka.length; i++) {
                      if (ka[i] !== kb[i]) return false;
                      const da = Object.getOwnPropertyDescriptor(a, ka[i]);
                      const db = Object.getOwnPropertyDescriptor(b, kb[i]);
                      if (da.writable !== db.writable || da.enumerable !== db.enumerable
                          || da.configurable !== db.configurable) return false;
                      if (!same(a[ka[i]], b[kb[i]])) return false;
                    }
                    return true;
                })",
            )
            .expect("same");
        let equal: bool = same.call((parsed, expected)).expect("compare");
        assert!(equal, "{text:?}");
    }
}

#[test]
fn parses_a_batch_as_the_engine_parses() {
    // One context: names met in other orders, prefixes of names held, a name again.
    crate::tests::in_new_context(|ctx| {
        for text in [
            r#"{"symbol":"A","price":1.5,"seq":1}"#,
            r#"{"symbol":"B","price":2,"seq":2}"#,
            r#"{"seq":3,"symbol":"C","price":-0}"#,
            r#"{"symbol":"D"}"#,
            r#"{"symbol":"E","price":3,"seq":4,"venue":"X"}"#,
            r#"{"price":{"symbol":"F","price":{"seq":5}},"seq":6}"#,
            r#"{"symbol":"G","symbol":"H","price":7}"#,
            r#"{"seq":8,"seq":9}"#,
            r#"{"symbol":"I","price":1.5,"seq":10}"#,
        ] {
            check_in(&ctx, text, true);
        }
        // SAFETY: the context is live.
        unsafe { super::release(ctx.as_raw().as_ptr()) };
    });
}

#[test]
fn keeps_no_name_too_long_to_keep() {
    crate::tests::in_new_context(|ctx| {
        let long = "n".repeat(crate::MAX_KEPT_NAME + 1);
        let short = "n".repeat(crate::MAX_KEPT_NAME);
        check_in(&ctx, &format!(r#"{{"{long}":1,"{short}":2}}"#), true);
        check_in(&ctx, &format!(r#"{{"{long}":3,"{short}":4}}"#), true);
        let kept: Vec<usize> =
            super::NAMES.with_borrow(|names| names.names.iter().map(|(n, _)| n.len()).collect());
        assert_eq!(kept, [crate::MAX_KEPT_NAME]);
        // SAFETY: the context is live.
        unsafe { super::release(ctx.as_raw().as_ptr()) };
    });
}

#[test]
fn short_decimals_are_read_as_in_full() {
    // A fixed xorshift stream: decimals of 1 to 15 digits, the point anywhere.
    let mut state = 0x9e37_79b9_7f4a_7c15_u64;
    for _ in 0..200_000 {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let len = 1 + (state % 15) as usize;
        let point = ((state >> 8) % (len as u64 + 1)) as usize;
        let digits: String = (0..len)
            .map(|i| char::from(b'0' + ((state >> (i * 4 % 60)) % 10) as u8))
            .collect();
        let (int, frac) = digits.split_at(point);
        let int = if int.is_empty() { "0" } else { int };
        let text = format!("{int}.{frac}");
        let text = text.trim_end_matches('.');
        let expected: f64 = text.parse().expect("a decimal");
        let got = super::decimal_value(int.as_bytes(), frac.as_bytes());
        let short = int.len() + frac.len() <= 15;
        assert_eq!(got.is_some(), short, "{text}");
        if let Some(got) = got {
            assert_eq!(got.to_bits(), expected.to_bits(), "{text}");
        }
    }
    assert_eq!(
        super::decimal_value(b"1234567890", b"123456"),
        None,
        "16 digits"
    );
}

#[test]
fn parses_as_the_engine_parses() {
    for text in [
        r#"{"symbol":"S0","price":135.23,"seq":1}"#,
        r#"{"symbol":"SYM0001","price":101.0001,"seq":1,"venue":"XNAS","note":"xxxx"}"#,
        " \t\r\n{ \"a\" : [ 1 , 2.5e3 , -0 , 0 , -1.5E-7 , 1e400 , 123456789012345678901234567890 ] } \n",
        "[]",
        "{}",
        "[[[]],{}]",
        "\"plain\"",
        "\"esc \\\" \\\\ \\/ \\b \\f \\n \\r \\t \\u0041 \\u00e9 \\u2028 \\ud83d\\ude00\"",
        "\"raw é ☃ 😀\"",
        "true",
        "false",
        "null",
        "0",
        "-0",
        "0.5",
        "2.2250738585072011e-308",
        "5e-324",
        "9007199254740993",
        r#"{"a":1,"b":2,"a":3}"#,
        r#"{"__proto__":{"x":1},"10":"ten","2":"two","b":null}"#,
        r#"{"":""}"#,
        "[1,\"two\",[3,{\"four\":[5]}],true,false,null]",
    ] {
        check(text, true);
    }
}

#[test]
fn leaves_to_the_engine_what_it_does_not_take() {
    for text in [
        "",
        " ",
        "{",
        "[1,]",
        "{\"a\":1,}",
        "{\"a\" 1}",
        "{a:1}",
        "01",
        "1.",
        ".5",
        "+1",
        "1e",
        "-",
        "NaN",
        "Infinity",
        "tru",
        "nul",
        "\"unterminated",
        "\"tab\tinside\"",
        "\"\\x41\"",
        "\"\\u12\"",
        "\"lone \\ud800\"",
        "\"lone \\udc00\"",
        "\"pair? \\ud800\\u0041\"",
        "[1] 2",
        "\u{feff}1",
        "\u{a0}1",
        "\u{b}1",
    ] {
        check(text, false);
    }
    let deep = format!("{}1{}", "[".repeat(70), "]".repeat(70));
    check(&deep, false);
    let ok = format!("{}1{}", "[".repeat(60), "]".repeat(60));
    check(&ok, true);
}
