//! Shapes kept between objects. The engine gives every object a shape (its prototype and its
//! property names in order) and, when an object gains a property, looks for the next shape
//! among the shapes that exist; but a shape exists only while an object has it, and an object
//! passes through one shape per property while it is built. A batch parses each line into an
//! object that is gone before the next line's is made, so every object used to build its
//! shapes again: one new shape per property, copied, hashed and freed. Holding one object of
//! each shape on the way (its properties `undefined`) lets the engine find them instead.
//!
//! The shapes held are those `JSON.parse` built (see `parse`): each prefix of an object's
//! property names. An object literal in the user's code with the same names in the same order
//! (the ticker's `{ symbol, price, seq }`) finds them too.

use std::ptr;

use rquickjs::qjs;

use crate::json::drop_exception;

/// How many lists of property names [`Shapes`] holds the shapes of.
const MAX_LISTS: usize = 16;

/// The most property names of a list held.
const MAX_NAMES: usize = 16;

/// The shapes of the first objects met: a batch's lines mostly have the same names in the
/// same order. They are one context's, released by [`Shapes::release`]; another context's
/// objects do without.
pub struct Shapes {
    owner: *mut qjs::JSContext,
    held: Vec<Held>,
    /// The list matched last, compared first.
    last: usize,
}

/// One list of property names, with an object for each of its prefixes (the empty one first).
struct Held {
    /// Held (their counts raised): a name's atom cannot be freed and given to another string.
    names: Box<[qjs::JSAtom]>,
    objects: Vec<qjs::JSValue>,
}

impl Default for Shapes {
    fn default() -> Self {
        Self {
            owner: ptr::null_mut(),
            held: Vec::new(),
            last: 0,
        }
    }
}

impl Shapes {
    /// Holds the shapes an ordinary object (`JS_NewObject`) passes through as it gains the own
    /// data properties `names` (enumerable, writable, configurable), in order; nothing if they
    /// are held, if there are too many names or lists, if a name is too long to keep (a null
    /// atom), or if they are another context's.
    ///
    /// # Safety
    /// `ctx` is a live context and `names` are live atoms of it.
    pub unsafe fn hold(&mut self, ctx: *mut qjs::JSContext, names: &[qjs::JSAtom]) {
        if names.is_empty() || names.len() > MAX_NAMES || names.contains(&qjs::JS_ATOM_NULL) {
            return;
        }
        if self.owner == ctx {
            let held = |list: &Held| *list.names == *names;
            if self.held.get(self.last).is_some_and(held) {
                return;
            }
            if let Some(i) = self.held.iter().position(held) {
                self.last = i;
                return;
            }
        } else if !self.held.is_empty() {
            return;
        }
        if self.held.len() == MAX_LISTS {
            return;
        }
        self.owner = ctx;
        let mut list = Held {
            names: names
                .iter()
                .map(|&name| qjs::JS_DupAtom(ctx, name))
                .collect(),
            objects: Vec::with_capacity(names.len() + 1),
        };
        'prefixes: for len in 0..=names.len() {
            let object = qjs::JS_NewObject(ctx);
            if qjs::JS_IsException(object) {
                drop_exception(ctx);
                break;
            }
            list.objects.push(object);
            for &name in &names[..len] {
                let flags = qjs::JS_PROP_C_W_E as _;
                if qjs::JS_DefinePropertyValue(ctx, object, name, qjs::JS_UNDEFINED, flags) < 0 {
                    drop_exception(ctx);
                    break 'prefixes;
                }
            }
        }
        self.last = self.held.len();
        self.held.push(list);
    }

    /// Lets the objects and names go, if they are `ctx`'s.
    ///
    /// # Safety
    /// `ctx` is a live context.
    pub unsafe fn release(&mut self, ctx: *mut qjs::JSContext) {
        if self.owner != ctx {
            return;
        }
        for list in self.held.drain(..) {
            for object in list.objects {
                qjs::JS_FreeValue(ctx, object);
            }
            for name in list.names {
                qjs::JS_FreeAtom(ctx, name);
            }
        }
        self.owner = ptr::null_mut();
        self.last = 0;
    }
}

#[cfg(test)]
mod tests {
    use rquickjs::qjs;

    /// The objects alive in the runtime of `ctx`.
    fn objects(ctx: &rquickjs::Ctx<'_>) -> i64 {
        // SAFETY: all-zero is a valid `JSMemoryUsage` (integers only), which the engine fills.
        let mut usage: qjs::JSMemoryUsage = unsafe { std::mem::zeroed() };
        // SAFETY: the context and its runtime are live and used on this thread.
        unsafe {
            let runtime = qjs::JS_GetRuntime(ctx.as_raw().as_ptr());
            qjs::JS_ComputeMemoryUsage(runtime, &mut usage);
        }
        usage.obj_count
    }

    /// Parses `text` with the crate's `JSON.parse` and drops the value.
    fn parse(ctx: &rquickjs::Ctx<'_>, text: &str) {
        let raw = ctx.as_raw().as_ptr();
        // SAFETY: the context is live.
        let value = unsafe { crate::parse::parse(raw, text.as_bytes()) }.expect("parsed");
        // SAFETY: `parse` hands over an owned value.
        unsafe { qjs::JS_FreeValue(raw, value) };
    }

    #[test]
    fn holds_an_object_per_prefix_once_and_lets_them_go() {
        crate::tests::in_new_context(|ctx| {
            let before = objects(&ctx);
            parse(&ctx, r#"{"a":1,"b":{"c":2},"d":[{}]}"#);
            // `[a, b, d]`: 4 prefixes; `[c]`: 2; the empty object holds nothing.
            assert_eq!(objects(&ctx) - before, 6);
            parse(&ctx, r#"{"a":5,"b":{"c":6},"d":[]}"#);
            parse(&ctx, r#"{"c":7}"#);
            assert_eq!(
                objects(&ctx) - before,
                6,
                "the same names again hold nothing"
            );
            parse(&ctx, r#"{"d":1,"a":2}"#);
            assert_eq!(objects(&ctx) - before, 9, "another order is another list");
            // SAFETY: the context is live.
            unsafe { crate::parse::release(ctx.as_raw().as_ptr()) };
            assert_eq!(objects(&ctx), before);
        });
    }

    #[test]
    fn holds_a_bounded_number_of_lists() {
        crate::tests::in_new_context(|ctx| {
            let before = objects(&ctx);
            let long: Vec<String> = (0..=super::MAX_NAMES)
                .map(|i| format!("\"k{i}\":{i}"))
                .collect();
            parse(&ctx, &format!("{{{}}}", long.join(",")));
            assert_eq!(objects(&ctx), before, "too many names to hold");
            let name = "n".repeat(crate::MAX_KEPT_NAME + 1);
            parse(&ctx, &format!(r#"{{"a":1,"{name}":2}}"#));
            assert_eq!(objects(&ctx), before, "a name too long to keep");
            for i in 0..super::MAX_LISTS + 5 {
                parse(&ctx, &format!(r#"{{"key{i}":{i}}}"#));
            }
            assert_eq!(objects(&ctx) - before, 2 * super::MAX_LISTS as i64);
            // SAFETY: the context is live.
            unsafe { crate::parse::release(ctx.as_raw().as_ptr()) };
            assert_eq!(objects(&ctx), before);
        });
    }
}
