use super::*;

/// `JSON.stringify` of what `source` evaluates to, and what `write` makes of it.
fn both(source: &str) -> (Option<String>, Result<String, Refused>) {
    crate::tests::in_new_context(|ctx| {
        let intrinsics = Intrinsics::new(&ctx).expect("intrinsics");
        let value: Value = ctx.eval(source).expect("eval");
        let mut out = b"kept".to_vec();
        let mut keys = Keys::default();
        let written = write(&ctx, &intrinsics, &mut keys, &value, &mut out)
            .map(|()| String::from_utf8(out[4..].to_vec()).expect("utf-8"));
        // Again, with the keys known.
        let mut again = Vec::new();
        let twice = write(&ctx, &intrinsics, &mut keys, &value, &mut again)
            .map(|()| String::from_utf8(again).expect("utf-8"));
        assert_eq!(twice, written, "{source}, the second time");
        // SAFETY: the keys are atoms of this live context.
        unsafe { keys.release(ctx.as_raw().as_ptr()) };
        let expected = ctx
            .json_stringify(value)
            .expect("stringify")
            .map(|s| s.to_string().expect("string"));
        (expected, written)
    })
}

#[track_caller]
fn same(source: &str) {
    let (expected, written) = both(source);
    assert_eq!(written.ok(), expected, "{source}");
}

#[track_caller]
fn refused(source: &str) {
    crate::tests::in_new_context(|ctx| {
        let intrinsics = Intrinsics::new(&ctx).expect("intrinsics");
        let value: Value = ctx.eval(source).expect("eval");
        let mut out = b"kept".to_vec();
        let mut keys = Keys::default();
        assert_eq!(
            write(&ctx, &intrinsics, &mut keys, &value, &mut out),
            Err(Refused),
            "{source}"
        );
        assert_eq!(out, b"kept", "a refusal leaves the buffer as it was");
        // SAFETY: the context is live.
        unsafe { keys.release(ctx.as_raw().as_ptr()) };
    });
}

#[test]
fn writes_what_json_stringify_writes() {
    for source in [
        "null",
        "true",
        "false",
        "0",
        "-0",
        "42",
        "-7",
        "2147483647",
        "2147483648",
        "-2147483649",
        "1.5",
        "135.23",
        "0.1 + 0.2",
        "1e21",
        "1e20",
        "123456789012345680000",
        "1e-6",
        "1e-7",
        "1.2345e-7",
        "5e-324",
        "1.7976931348623157e308",
        "-1.5e300",
        "NaN",
        "Infinity",
        "-Infinity",
        "2 ** 53",
        "2 ** 53 + 2",
        "1 / 3",
        "[0.000001, 0.0000015, 1e-7, 0.1, 0.01, 12.5, -0.5, 999999999999999, 1e15, 123.456]",
        "-634706844839396.2",
        "[0.5e16 + 1, 2 ** 60, 123456789012345.6]",
        "'plain'",
        "''",
        "'quote \" backslash \\\\ nl \\n cr \\r tab \\t bs \\b ff \\f nul \\0 us \\x1f del \\x7f'",
        "'latin1 é ü ÿ'",
        "'wide ☃ and an astral 😀'",
        "'\\u2028\\u2029'",
        "({})",
        "[]",
        "({ symbol: 'ACME', price: 12.5, seq: 7 })",
        "({ b: 1, a: 2, 10: 'ten', 2: 'two', '-1': 'minus' })",
        "({ u: undefined, s: Symbol('x'), n: null, k: 'kept' })",
        "[1, 'two', null, undefined, Symbol('x'), true, [3, [4]], { a: [] }]",
        "({ nested: { deeper: { deepest: [1.25, -0, 1e-9] } } })",
        "({ 'key \"quoted\"\\n': 1, 'é': 2, '😀': 3 })",
        "(() => { const o = { a: 1 }; Object.defineProperty(o, 'hidden', { value: 2, enumerable: false }); return o; })()",
        "(() => { const a = [1, 2, 3]; a.extra = 'ignored'; return a; })()",
        "(() => { const o = { a: 1, b: 2 }; delete o.a; o.a = 3; return o; })()",
    ] {
        same(source);
    }
}

#[test]
fn refuses_what_it_does_not_copy_exactly() {
    for source in [
        "undefined",
        "Symbol('x')",
        "10n",
        "({ big: 10n })",
        "'lone \\ud800 surrogate'",
        "({ '\\udc00': 1 })",
        "[1, , 3]",
        "({ get a() { return 1; } })",
        "(() => { const a = [1]; Object.defineProperty(a, 0, { get() { return 2; } }); return a; })()",
        "({ toJSON() { return 'mine'; } })",
        "new Date(0)",
        "new Number(1)",
        "new String('s')",
        "new Boolean(true)",
        "({ f() {} })",
        "[function () {}]",
        "Object.create(null)",
        "new (class Point { constructor() { this.x = 1; } })()",
        "new Proxy({}, {})",
        "new Map()",
        "new Uint8Array(2)",
        "(() => { const o = {}; o.self = o; return o; })()",
        "(() => { let v = 1; for (let i = 0; i < 100; i++) v = [v]; return v; })()",
    ] {
        refused(source);
    }
}

#[test]
fn keeps_no_key_too_long_to_keep() {
    let long = "k".repeat(crate::MAX_KEPT_NAME + 1);
    let short = "k".repeat(crate::MAX_KEPT_NAME);
    crate::tests::in_new_context(|ctx| {
        let intrinsics = Intrinsics::new(&ctx).expect("intrinsics");
        let value: Value = ctx
            .eval(format!("({{ {long}: 1, {short}: 2 }})"))
            .expect("eval");
        let mut keys = Keys::default();
        for _ in 0..2 {
            let mut out = Vec::new();
            write(&ctx, &intrinsics, &mut keys, &value, &mut out).expect("written");
            assert_eq!(out, format!(r#"{{"{long}":1,"{short}":2}}"#).into_bytes());
        }
        let kept: Vec<usize> = keys.quoted.iter().map(|(_, quoted)| quoted.len()).collect();
        assert_eq!(kept, [crate::MAX_KEPT_NAME + 2]);
        // SAFETY: the keys are atoms of this live context.
        unsafe { keys.release(ctx.as_raw().as_ptr()) };
    });
}

#[test]
fn refuses_when_a_prototype_has_to_json() {
    refused("Object.prototype.toJSON = () => 1; ({ a: 1 })");
    refused("Array.prototype.toJSON = () => 1; [1]");
    refused("Object.prototype.toJSON = () => 1; [1]");
}
