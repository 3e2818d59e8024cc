//! `JSON.stringify` for the values `ctx.publish` is given most: plain objects and arrays of
//! strings, numbers, booleans and null, written straight into a byte buffer.
//!
//! QuickJS's own `JSON.stringify` builds a JavaScript string through its generic machinery (an
//! array of the keys per object, a string per number, a stack array for cycles) that the
//! engine then copies out as UTF-8: most of the cost of an event. [`write`] produces the same
//! bytes for the values it takes and refuses ([`Refused`]) any other before it has run any of
//! the user's code — it reads own data properties only, never a getter, a `toJSON` or a proxy
//! trap — so the caller can hand a refused value to `JSON.stringify` as if this had not run.
//!
//! Taken: `null`, booleans, numbers, strings (without lone surrogates), and objects whose
//! class and prototype are the intrinsic `Object`'s or `Array`'s, that have no `toJSON` (nor
//! their prototype), whose enumerable string-keyed properties (array elements) are data
//! properties with such values, `undefined` or symbols (skipped in an object, `null` in an
//! array), nested at most [`MAX_DEPTH`] deep (so a cycle is refused, not followed). Arrays
//! with holes, functions, `BigInt`s, boxed primitives, dates and every other class are
//! refused.

use std::ptr;

use rquickjs::{qjs, Ctx, Object, Value};

use crate::number::{digits, number};

/// The nesting `write` follows before it refuses a value (a cycle, say).
pub const MAX_DEPTH: u32 = 64;

/// `write` did not take the value: nothing observable happened, the buffer is as it was.
#[derive(Debug, PartialEq, Eq)]
pub struct Refused;

/// What tells a plain object or array, taken from the realm before the user's code runs (the
/// user may reassign `Object` and `Array`, not the intrinsics).
#[derive(Clone, Copy, Debug)]
pub struct Intrinsics {
    object_class: u32,
    array_class: u32,
    /// The intrinsic prototypes, by address: compared, never dereferenced. They live as long
    /// as the context.
    object_proto: usize,
    array_proto: usize,
}

/// The address of an object value (`0` for any other value).
fn address(value: &Value<'_>) -> usize {
    if value.is_object() {
        // SAFETY: the value is an object, whose JSValue holds a pointer; it is only read.
        unsafe { qjs::JS_VALUE_GET_PTR(value.as_raw()) as usize }
    } else {
        0
    }
}

impl Intrinsics {
    /// Reads them from a realm where no user code has run yet.
    ///
    /// # Errors
    /// The engine's, if it cannot allocate an object.
    pub fn new(ctx: &Ctx<'_>) -> rquickjs::Result<Self> {
        let object = Object::new(ctx.clone())?;
        let array = rquickjs::Array::new(ctx.clone())?;
        let object_proto = object.get_prototype().ok_or(rquickjs::Error::Unknown)?;
        let array_proto = array.get_prototype().ok_or(rquickjs::Error::Unknown)?;
        // SAFETY: both values are live objects of this context.
        let (object_class, array_class) = unsafe {
            (
                qjs::JS_GetClassID(object.as_raw()),
                qjs::JS_GetClassID(array.as_raw()),
            )
        };
        Ok(Self {
            object_class,
            array_class,
            object_proto: address(object_proto.as_value()),
            array_proto: address(array_proto.as_value()),
        })
    }
}

/// Appends `JSON.stringify(value)` to `out`, or refuses the value leaving `out` as it was.
pub fn write(
    ctx: &Ctx<'_>,
    intrinsics: &Intrinsics,
    keys: &mut Keys,
    value: &Value<'_>,
    out: &mut Vec<u8>,
) -> Result<(), Refused> {
    // SAFETY: `value` is a live value of the context `ctx` names, held for the whole call.
    unsafe { write_raw(ctx.as_raw().as_ptr(), intrinsics, keys, value.as_raw(), out) }
}

/// Appends the JSON of a runtime's state to `out`, or refuses it leaving `out` as it was: as
/// [`write`], but a value JSON would not give back as it is — a number that is not finite
/// (written `null`), an array element that is `undefined` or a symbol (`null`) — is refused too.
pub fn write_state(
    ctx: &Ctx<'_>,
    intrinsics: &Intrinsics,
    value: &Value<'_>,
    out: &mut Vec<u8>,
) -> Result<(), Refused> {
    let raw = ctx.as_raw().as_ptr();
    let mut keys = Keys::default();
    let start = out.len();
    let mut writer = Writer {
        ctx: raw,
        intrinsics,
        keys: &mut keys,
        out,
        strict: true,
    };
    // SAFETY: `value` is a live value of the context `ctx` names, held for the whole call.
    let result = match unsafe { writer.value(value.as_raw(), 0) } {
        Ok(Kind::Written) => Ok(()),
        Ok(Kind::Nothing) | Err(Refused) => Err(Refused),
    };
    if result.is_err() {
        out.truncate(start);
    }
    // SAFETY: the context is live; the keys hold its atoms only.
    unsafe { keys.release(raw) };
    result
}

/// [`write`] for a raw context and value.
///
/// # Safety
/// `value` is a live value of `ctx`, held for the whole call; `keys` holds atoms of `ctx` only.
pub unsafe fn write_raw(
    ctx: *mut qjs::JSContext,
    intrinsics: &Intrinsics,
    keys: &mut Keys,
    value: qjs::JSValue,
    out: &mut Vec<u8>,
) -> Result<(), Refused> {
    let start = out.len();
    let mut writer = Writer {
        ctx,
        intrinsics,
        keys,
        out,
        strict: false,
    };
    // `undefined` and symbols have no JSON: `JSON.stringify` says so.
    let result = match writer.value(value, 0) {
        Ok(Kind::Written) => Ok(()),
        Ok(Kind::Nothing) | Err(Refused) => Err(Refused),
    };
    if result.is_err() {
        writer.out.truncate(start);
    }
    result
}

/// How many property names [`Keys`] keeps.
const MAX_KEYS: usize = 64;

/// The property names met first, quoted: an event's keys are mostly the last event's. Each
/// atom is held (its count raised) so the engine cannot free it and give its number to another
/// string; [`Keys::release`] lets them go. They are one context's: another context's writes
/// do without.
#[derive(Debug)]
pub struct Keys {
    owner: *mut qjs::JSContext,
    quoted: Vec<(qjs::JSAtom, Vec<u8>)>,
}

impl Default for Keys {
    fn default() -> Self {
        Self {
            owner: ptr::null_mut(),
            quoted: Vec::new(),
        }
    }
}

impl Keys {
    /// Lets the held atoms go, if they are `ctx`'s.
    ///
    /// # Safety
    /// `ctx` is a live context.
    pub unsafe fn release(&mut self, ctx: *mut qjs::JSContext) {
        if self.owner != ctx {
            return;
        }
        for (atom, _) in self.quoted.drain(..) {
            qjs::JS_FreeAtom(ctx, atom);
        }
        self.owner = ptr::null_mut();
    }
}

struct Writer<'a> {
    ctx: *mut qjs::JSContext,
    intrinsics: &'a Intrinsics,
    keys: &'a mut Keys,
    out: &'a mut Vec<u8>,
    /// Refuses what JSON would not give back as it is ([`write_state`]).
    strict: bool,
}

/// The engine's predefined atom `toJSON` (predefined atoms are never freed).
const TO_JSON: qjs::JSAtom = qjs::JS_ATOM_toJSON as qjs::JSAtom;

/// An owned `JSValue`, freed when dropped.
struct Owned {
    ctx: *mut qjs::JSContext,
    value: qjs::JSValue,
}

impl Drop for Owned {
    fn drop(&mut self) {
        // SAFETY: the value was handed over owned (a duplicate) by the engine and is freed once.
        unsafe { qjs::JS_FreeValue(self.ctx, self.value) };
    }
}

/// What an element or a property value is, for the caller to decide how it is written.
enum Kind {
    /// `undefined` or a symbol: no JSON of its own.
    Nothing,
    /// Written.
    Written,
}

impl Writer<'_> {
    /// # Safety
    /// `value` is a live value of `self.ctx`.
    unsafe fn value(&mut self, value: qjs::JSValue, depth: u32) -> Result<Kind, Refused> {
        match qjs::JS_VALUE_GET_NORM_TAG(value) {
            qjs::JS_TAG_NULL => self.out.extend_from_slice(b"null"),
            qjs::JS_TAG_BOOL => self
                .out
                .extend_from_slice(if qjs::JS_VALUE_GET_BOOL(value) {
                    b"true"
                } else {
                    b"false"
                }),
            qjs::JS_TAG_INT => {
                let n = qjs::JS_VALUE_GET_INT(value);
                if n < 0 {
                    self.out.push(b'-');
                }
                self.out
                    .extend_from_slice(digits(u64::from(n.unsigned_abs()), &mut [0; 20]));
            }
            qjs::JS_TAG_FLOAT64 => {
                if self.strict && !qjs::JS_VALUE_GET_FLOAT64(value).is_finite() {
                    return Err(Refused);
                }
                if !number(qjs::JS_VALUE_GET_FLOAT64(value), self.out) {
                    // The engine's digits (a number's string runs no user code).
                    self.string(value, false)?;
                }
            }
            qjs::JS_TAG_STRING | qjs::JS_TAG_STRING_ROPE => self.string(value, true)?,
            qjs::JS_TAG_UNDEFINED | qjs::JS_TAG_SYMBOL => return Ok(Kind::Nothing),
            qjs::JS_TAG_OBJECT => self.object(value, depth)?,
            _ => return Err(Refused),
        }
        Ok(Kind::Written)
    }

    /// Writes a string, `quoted` as JSON or as it is; or a number's string (`quoted` false).
    ///
    /// # Safety
    /// `value` is a live string or number of `self.ctx`.
    unsafe fn string(&mut self, value: qjs::JSValue, quoted: bool) -> Result<(), Refused> {
        let mut len = 0;
        let ptr = qjs::JS_ToCStringLen2(self.ctx, &mut len, value, false);
        self.engine_text(ptr, len, quoted)
    }

    /// Writes the C string the engine made (`ptr`, `len`), `quoted` as JSON or as it is, and
    /// frees it. Refused when the engine failed (a null `ptr`), and when the text is not UTF-8:
    /// a lone surrogate comes out as its own three bytes, and `JSON.stringify` escapes it,
    /// which this leaves to it.
    ///
    /// # Safety
    /// `ptr` is null or a C string of `self.ctx` of `len` bytes, not freed yet.
    unsafe fn engine_text(
        &mut self,
        ptr: *const std::ffi::c_char,
        len: qjs::size_t,
        quoted: bool,
    ) -> Result<(), Refused> {
        if ptr.is_null() {
            drop_exception(self.ctx);
            return Err(Refused);
        }
        let Ok(len) = usize::try_from(len) else {
            qjs::JS_FreeCString(self.ctx, ptr);
            return Err(Refused);
        };
        let bytes = std::slice::from_raw_parts(ptr.cast::<u8>(), len);
        let result = if !is_utf8(bytes) {
            Err(Refused)
        } else if quoted {
            quote(bytes, self.out);
            Ok(())
        } else {
            self.out.extend_from_slice(bytes);
            Ok(())
        };
        qjs::JS_FreeCString(self.ctx, ptr);
        result
    }

    /// Whether `object` (a live object) has an own property `atom`, read without running code.
    ///
    /// # Safety
    /// `object` is a live object of `self.ctx`, of an ordinary class.
    unsafe fn has_own(&mut self, object: qjs::JSValue, atom: qjs::JSAtom) -> Result<bool, Refused> {
        match qjs::JS_GetOwnProperty(self.ctx, ptr::null_mut(), object, atom) {
            0 => Ok(false),
            1 => Ok(true),
            _ => {
                drop_exception(self.ctx);
                Err(Refused)
            }
        }
    }

    /// # Safety
    /// `value` is a live object of `self.ctx`.
    unsafe fn object(&mut self, value: qjs::JSValue, depth: u32) -> Result<(), Refused> {
        if depth >= MAX_DEPTH {
            return Err(Refused);
        }
        let class = qjs::JS_GetClassID(value);
        let proto = if class == self.intrinsics.object_class {
            self.intrinsics.object_proto
        } else if class == self.intrinsics.array_class {
            self.intrinsics.array_proto
        } else {
            return Err(Refused);
        };
        // Neither a proxy nor an exotic object (refused above): reading the prototype runs
        // nothing.
        let actual = Owned {
            ctx: self.ctx,
            value: qjs::JS_GetPrototype(self.ctx, value),
        };
        if !qjs::JS_IsObject(actual.value) || qjs::JS_VALUE_GET_PTR(actual.value) as usize != proto
        {
            return Err(Refused);
        }
        // `toJSON` on the object or on its prototype chain: the intrinsic prototypes (that of
        // `Array.prototype` is `Object.prototype`, whose own is null).
        let to_json = TO_JSON;
        if self.has_own(value, to_json)?
            || self.has_own(actual.value, to_json)?
            || (class == self.intrinsics.array_class && {
                let object_proto = Owned {
                    ctx: self.ctx,
                    value: qjs::JS_GetPrototype(self.ctx, actual.value),
                };
                !qjs::JS_IsObject(object_proto.value)
                    || self.has_own(object_proto.value, to_json)?
            })
        {
            return Err(Refused);
        }
        if class == self.intrinsics.array_class {
            self.array(value, depth)
        } else {
            self.plain(value, depth)
        }
    }

    /// The value of the own property `atom` of `object` if it is a data property; refused if
    /// it is an accessor or absent.
    ///
    /// # Safety
    /// `object` is a live ordinary object of `self.ctx`.
    unsafe fn data(&mut self, object: qjs::JSValue, atom: qjs::JSAtom) -> Result<Owned, Refused> {
        let mut desc = qjs::JSPropertyDescriptor {
            flags: 0,
            value: qjs::JS_UNDEFINED,
            getter: qjs::JS_UNDEFINED,
            setter: qjs::JS_UNDEFINED,
        };
        match qjs::JS_GetOwnProperty(self.ctx, &mut desc, object, atom) {
            1 => {}
            0 => return Err(Refused),
            _ => {
                drop_exception(self.ctx);
                return Err(Refused);
            }
        }
        let value = Owned {
            ctx: self.ctx,
            value: desc.value,
        };
        let getter = Owned {
            ctx: self.ctx,
            value: desc.getter,
        };
        let setter = Owned {
            ctx: self.ctx,
            value: desc.setter,
        };
        if desc.flags & qjs::JS_PROP_GETSET as i32 != 0
            || !qjs::JS_IsUndefined(getter.value)
            || !qjs::JS_IsUndefined(setter.value)
        {
            return Err(Refused);
        }
        Ok(value)
    }

    /// # Safety
    /// `value` is a live array (of the intrinsic class and prototype) of `self.ctx`.
    unsafe fn array(&mut self, value: qjs::JSValue, depth: u32) -> Result<(), Refused> {
        let mut len = 0i64;
        // An array's `length` is a data property: reading it runs nothing.
        if qjs::JS_GetLength(self.ctx, value, &mut len) < 0 {
            drop_exception(self.ctx);
            return Err(Refused);
        }
        let len = u32::try_from(len).map_err(|_| Refused)?;
        self.out.push(b'[');
        for i in 0..len {
            if i > 0 {
                self.out.push(b',');
            }
            let atom = qjs::JS_NewAtomUInt32(self.ctx, i);
            if atom == qjs::JS_ATOM_NULL {
                drop_exception(self.ctx);
                return Err(Refused);
            }
            let element = self.data(value, atom);
            qjs::JS_FreeAtom(self.ctx, atom);
            // A hole would be read through the prototypes: refused with the accessors.
            let element = element?;
            if qjs::JS_IsFunction(self.ctx, element.value) {
                return Err(Refused);
            }
            if let Kind::Nothing = self.value(element.value, depth + 1)? {
                if self.strict {
                    return Err(Refused);
                }
                self.out.extend_from_slice(b"null");
            }
        }
        self.out.push(b']');
        Ok(())
    }

    /// # Safety
    /// `value` is a live plain object (of the intrinsic class and prototype) of `self.ctx`.
    unsafe fn plain(&mut self, value: qjs::JSValue, depth: u32) -> Result<(), Refused> {
        let mut tab: *mut qjs::JSPropertyEnum = ptr::null_mut();
        let mut len = 0u32;
        let flags = (qjs::JS_GPN_STRING_MASK | qjs::JS_GPN_ENUM_ONLY) as i32;
        if qjs::JS_GetOwnPropertyNames(self.ctx, &mut tab, &mut len, value, flags) < 0 {
            drop_exception(self.ctx);
            return Err(Refused);
        }
        let result = self.properties(value, tab, len, depth);
        qjs::JS_FreePropertyEnum(self.ctx, tab, len);
        result
    }

    /// # Safety
    /// `tab` holds `len` property names of the live plain object `value`.
    unsafe fn properties(
        &mut self,
        value: qjs::JSValue,
        tab: *const qjs::JSPropertyEnum,
        len: u32,
        depth: u32,
    ) -> Result<(), Refused> {
        self.out.push(b'{');
        let mut first = true;
        for i in 0..len as usize {
            let atom = (*tab.add(i)).atom;
            let property = self.data(value, atom)?;
            if qjs::JS_IsFunction(self.ctx, property.value) {
                return Err(Refused);
            }
            let tag = qjs::JS_VALUE_GET_NORM_TAG(property.value);
            if tag == qjs::JS_TAG_UNDEFINED || tag == qjs::JS_TAG_SYMBOL {
                continue;
            }
            if !first {
                self.out.push(b',');
            }
            first = false;
            self.key(atom)?;
            self.out.push(b':');
            self.value(property.value, depth + 1)?;
        }
        self.out.push(b'}');
        Ok(())
    }

    /// # Safety
    /// `atom` is a live string atom of `self.ctx`.
    unsafe fn key(&mut self, atom: qjs::JSAtom) -> Result<(), Refused> {
        if self.keys.owner == self.ctx {
            if let Some((_, quoted)) = self.keys.quoted.iter().find(|(held, _)| *held == atom) {
                self.out.extend_from_slice(quoted);
                return Ok(());
            }
        }
        let start = self.out.len();
        self.text_of(atom)?;
        if self.keys.quoted.is_empty() {
            self.keys.owner = self.ctx;
        }
        let short = self.out.len() - start <= crate::MAX_KEPT_NAME + 2;
        if self.keys.owner == self.ctx && self.keys.quoted.len() < MAX_KEYS && short {
            let quoted = self.out[start..].to_vec();
            self.keys
                .quoted
                .push((qjs::JS_DupAtom(self.ctx, atom), quoted));
        }
        Ok(())
    }

    /// Writes the string `atom` names, quoted.
    ///
    /// # Safety
    /// `atom` is a live string atom of `self.ctx`.
    unsafe fn text_of(&mut self, atom: qjs::JSAtom) -> Result<(), Refused> {
        let mut len = 0;
        let ptr = qjs::JS_AtomToCStringLen(self.ctx, &mut len, atom);
        self.engine_text(ptr, len, true)
    }
}

/// `JSON.stringify(value)` by the engine (user code may run: getters, `toJSON`), `None` for a
/// value that has no JSON (`undefined`, a function).
///
/// # Errors
/// What the engine threw (a cycle, a `BigInt`, a throwing getter).
pub fn stringify<'js>(ctx: &Ctx<'js>, value: Value<'js>) -> rquickjs::Result<Option<String>> {
    ctx.json_stringify(value)?
        .map(|s| s.to_string())
        .transpose()
}

/// Whether `bytes` are UTF-8, ASCII checked first (the common case, and quicker).
pub fn is_utf8(bytes: &[u8]) -> bool {
    bytes.is_ascii() || std::str::from_utf8(bytes).is_ok()
}

/// Clears the exception a failed engine call left (out of memory, say): the fast path refuses
/// what it was making, and the engine's own path (`JSON.stringify`, `JSON.parse`) meets the
/// same condition and reports it.
///
/// # Safety
/// `ctx` is a live context of the engine, used on its thread.
pub(crate) unsafe fn drop_exception(ctx: *mut qjs::JSContext) {
    let exception = qjs::JS_GetException(ctx);
    qjs::JS_FreeValue(ctx, exception);
}

/// A JSON string of UTF-8 `text`, escaped as `JSON.stringify` escapes it: `"`, `\`, and the
/// control characters (`\b`, `\t`, `\n`, `\f`, `\r`, else `\u00xx`, lowercase).
pub fn quote(text: &[u8], out: &mut Vec<u8>) {
    out.reserve(text.len() + 2);
    out.push(b'"');
    let mut from = 0;
    for (i, &b) in text.iter().enumerate() {
        let escaped: &[u8] = match b {
            b'"' => b"\\\"",
            b'\\' => b"\\\\",
            b'\n' => b"\\n",
            b'\r' => b"\\r",
            b'\t' => b"\\t",
            0x08 => b"\\b",
            0x0c => b"\\f",
            0..=0x1f => b"",
            _ => continue,
        };
        out.extend_from_slice(&text[from..i]);
        if escaped.is_empty() {
            const HEX: &[u8; 16] = b"0123456789abcdef";
            out.extend_from_slice(b"\\u00");
            out.push(HEX[usize::from(b >> 4)]);
            out.push(HEX[usize::from(b & 15)]);
        } else {
            out.extend_from_slice(escaped);
        }
        from = i + 1;
    }
    out.extend_from_slice(&text[from..]);
    out.push(b'"');
}

#[cfg(test)]
mod tests;
