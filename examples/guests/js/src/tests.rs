use crate::JsGuest;
use viewtape_guest::testing::Harness;
use viewtape_guest::{abi, Output};

/// Runs `f` in a new context of a new engine runtime.
pub(crate) fn in_new_context<R>(f: impl for<'js> FnOnce(rquickjs::Ctx<'js>) -> R) -> R {
    let runtime = rquickjs::Runtime::new().expect("runtime");
    let context = rquickjs::Context::full(&runtime).expect("context");
    context.with(f)
}

fn guest(source: &str) -> Harness<JsGuest> {
    Harness::new(&abi::js_init_input(
        abi::JS_MODE_RUN,
        source.as_bytes(),
        b"",
    ))
    .expect("the module loads")
}

/// Each value published under `i` and, as a string, `JSON.stringify` of it under `json i`.
const VALUES: &str = r#"
const values = () => [
  { symbol: 'ACME', price: 12.5, seq: 7 }, [1, 'two', null, [3], { a: undefined }], 'raw text',
  0.1 + 0.2, -0, 1e21, true, null, { toJSON() { return 'mine'; } }, new Date(0),
  { get g() { return 'got'; } }, { nested: { deeper: [1.25, 'é', '\n'] } }, new Number(4),
  Object.assign(Object.create(null), { bare: 1 }), { '\ud800': 'lone' },
];
export function onBatch(state, input, ctx) {
  values().forEach((v, i) => {
ctx.publish('v', String(i), v);
if (typeof v !== 'string') ctx.publish('v', `json ${i}`, JSON.stringify(v));
  });
  ctx.publish('v', 'bytes', new Uint8Array([104, 105]));
}
"#;

#[test]
fn publish_writes_what_json_stringify_writes() {
    let mut h = guest(VALUES);
    for _ in 0..2 {
        let out = h.batch(b"").expect("batch");
        let payload = |key: &str| {
            out.iter()
                .find_map(|o| match o {
                    Output::Update {
                        key: k, payload, ..
                    } if k == key => Some(payload.clone()),
                    _ => None,
                })
                .unwrap_or_else(|| panic!("no {key}"))
        };
        for i in 0..15 {
            let json = format!("json {i}");
            if out
                .iter()
                .any(|o| matches!(o, Output::Update { key, .. } if *key == json))
            {
                assert_eq!(
                    String::from_utf8(payload(&i.to_string())),
                    String::from_utf8(payload(&json)),
                    "value {i}"
                );
            }
        }
        assert_eq!(payload("2"), b"raw text");
        assert_eq!(payload("bytes"), b"hi");
    }
}

#[test]
fn json_parse_looks_and_fails_as_the_builtin() {
    let mut h = guest(
        r#"
export function onBatch(state, input, ctx) {
  const d = Object.getOwnPropertyDescriptor(JSON, 'parse');
  ctx.publish('v', 'shape', [JSON.parse.name, JSON.parse.length, d.writable, d.enumerable,
d.configurable, typeof JSON.parse]);
  ctx.publish('v', 'revived', JSON.parse('{"a":1,"b":[2]}', (k, v) => typeof v === 'number' ? v * 10 : v));
  ctx.publish('v', 'coerced', JSON.parse({ toString() { return '[7]'; } }));
  ctx.publish('v', 'parsed', JSON.parse(input));
  try { JSON.parse('{"a":'); } catch (e) {
ctx.publish('v', 'error', `${e.name}: ${e.message}`);
ctx.publish('v', 'stack', e.stack);
  }
  ctx.publish('v', 'ignored', JSON.parse('[1]', 'not a function'));
}
"#,
    );
    let out = h
        .batch(r#"{"x":[1.5,"\u00e9"],"y":null}"#.as_bytes())
        .expect("batch");
    let payload = |key: &str| published(&out, key);
    assert_eq!(
        payload("shape"),
        r#"["parse",2,true,false,true,"function"]"#
    );
    assert_eq!(payload("revived"), r#"{"a":10,"b":[20]}"#);
    assert_eq!(payload("coerced"), "[7]");
    assert_eq!(payload("parsed"), r#"{"x":[1.5,"é"],"y":null}"#);
    assert!(
        payload("error").starts_with("SyntaxError: "),
        "{}",
        payload("error")
    );
}

#[test]
fn publish_refuses_what_it_refused_before() {
    for (call, expected) in [
        ("ctx.publish('v', 'k', undefined)", "the value has no JSON"),
        ("ctx.publish('v', 'k', () => 1)", "the value has no JSON"),
        ("ctx.publish('v', 'k', 10n)", "BigInt"),
        ("ctx.publish('v', 1, {})", "String"),
        ("ctx.publish(null, 'k', {})", "String"),
        ("ctx.publish('v', 'k')", "3 where expected"),
        ("ctx.publish('v', '\\ud800', 'x')", "utf"),
        (
            "const o = {}; o.o = o; ctx.publish('v', 'k', o)",
            "circular",
        ),
    ] {
        let mut h = guest(&format!(
            "export function onBatch(state, input, ctx) {{ {call}; }}"
        ));
        let error = h.batch(b"").expect_err(call).to_string();
        assert!(
            error.to_lowercase().contains(&expected.to_lowercase()),
            "{call}: {error}"
        );
    }
}

/// The string published under `key`.
fn published(out: &[Output], key: &str) -> String {
    out.iter()
        .find_map(|o| match o {
            Output::Update {
                key: k, payload, ..
            } if k == key => String::from_utf8(payload.clone()).ok(),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no {key}"))
}

#[test]
fn a_state_that_json_does_not_give_back_is_refused_naming_where() {
    for (made, expected) in [
        ("state.seen = new Set([1])", "state.seen is a Set"),
        ("state.m = { by: new Map() }", "state.m.by is a Map"),
        ("state.at = new Date(0)", "state.at is a Date"),
        ("state.list = [1, NaN]", "state.list[1] is NaN"),
        ("state.x = Infinity", "state.x is Infinity"),
        ("state.list = [undefined]", "state.list[0] is undefined"),
        ("state.list = [1, , 2]", "state.list[1] is a hole"),
        (
            "class Point { constructor() { this.x = 1; } } state.p = new Point()",
            "state.p is a Point",
        ),
        ("state.bytes = new Uint8Array(2)", "state.bytes is a Uint8Array"),
        ("state.f = () => 1", "state.f is a function"),
        (
            "state['a key'] = { toJSON() { return 1; } }",
            "state[\"a key\"] has a toJSON",
        ),
        (
            "Object.prototype.toJSON = function () { return {}; }",
            "state has a toJSON",
        ),
        (
            "state.g = 1; Object.defineProperty(state, 'h', { get() { return 2; }, enumerable: true })",
            "state.h is a getter",
        ),
    ] {
        let mut h = guest(&format!(
            "export function onBatch(state, input, ctx) {{ {made}; ctx.publish('v', 'k', 1); }}"
        ));
        let error = h.batch(b"").expect_err(made).to_string();
        assert!(error.contains(expected), "{made}: {error}");
        assert!(error.contains("does not survive JSON"), "{made}: {error}");
    }
    // What JSON keeps as it is stays taken: `undefined` members are dropped, -0 is 0, and the
    // engine's own writer takes what the fast one leaves (a lone surrogate).
    let mut h = guest(
        "export function onBatch(state, input, ctx) { state.gone = undefined; state.z = -0; \
         state.s = '\\ud800'; state.deep = [[[{ a: [1.5, 'x', null, true] }]]]; }",
    );
    h.batch(b"").expect("plain data");
    let saved = String::from_utf8_lossy(&h.save()).into_owned();
    assert!(
        saved.ends_with(r#""state":{"z":0,"s":"\ud800","deep":[[[{"a":[1.5,"x",null,true]}]]]}}"#),
        "{saved}"
    );
}

#[test]
fn async_batches_run_their_jobs_to_the_end() {
    let mut h = guest(
        r#"
const later = async (n) => { await null; return n * 2; };
export async function onBatch(state, input, ctx) {
  state.n = (state.n ?? 0) + await later(1);
  Promise.resolve().then(() => ctx.publish('v', 'then', state.n));
  ctx.publish('v', 'n', state.n);
  return state;
}
"#,
    );
    let out = h.batch(b"").expect("batch");
    assert_eq!(published(&out, "n"), "2");
    assert_eq!(published(&out, "then"), "2");
    let out = h.batch(b"").expect("batch");
    assert_eq!(published(&out, "n"), "4");
    let saved = String::from_utf8_lossy(&h.save()).into_owned();
    assert!(saved.ends_with(r#""state":{"n":4}}"#), "{saved}");

    let mut h =
        guest("export async function onBatch(state) { await Promise.reject(new Error('late')); }");
    let error = h.batch(b"").expect_err("rejected").to_string();
    assert!(error.contains("Error: late"), "{error}");
    let mut h = guest("export async function onBatch(state) { await new Promise(() => {}); }");
    let error = h.batch(b"").expect_err("never settles").to_string();
    assert!(error.contains("never settled"), "{error}");
}

#[test]
fn nothing_tells_when_the_collector_ran() {
    let mut h = guest(
        "export function onBatch(state, input, ctx) { ctx.publish('v', 'k', [typeof WeakRef, \
         typeof FinalizationRegistry, typeof WeakMap]); }",
    );
    let out = h.batch(b"").expect("batch");
    assert_eq!(
        published(&out, "k"),
        r#"["undefined","undefined","function"]"#
    );
}
