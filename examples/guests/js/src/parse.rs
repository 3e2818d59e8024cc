//! `JSON.parse` for the text a batch hands it most: strict JSON without a reviver, parsed in
//! Rust into the same values the engine's parser builds (objects, arrays, strings, numbers,
//! `true`, `false`, `null`, through the same engine calls), and everything else, errors
//! included, left to the engine's `JSON.parse`.
//!
//! The engine's parser reads each token into a JavaScript string or number through its
//! generic lexer; this reads the UTF-8 bytes once and makes each value directly. It takes
//! only text it reads exactly as the engine does: JSON's grammar with its four whitespace
//! characters, no lone surrogate (escaped or not), at most [`MAX_DEPTH`] levels of nesting.
//! Text it refuses is parsed again by the engine's parser, `JS_ParseJSON`, as the builtin
//! parses it, which throws the error it always threw. Neither runs any of the user's code
//! (without a reviver), so parsing twice shows nowhere but in time.

use std::cell::RefCell;

use rquickjs::qjs;

use crate::json::drop_exception;
use crate::number::POWERS;
use crate::shapes::Shapes;

thread_local! {
    /// The property names `JSON.parse` met first, with their atoms (see [`Names`]).
    static NAMES: RefCell<Names> = RefCell::new(Names::default());
    /// The shapes of the objects `JSON.parse` made first (see [`Shapes`]).
    static SHAPES: RefCell<Shapes> = RefCell::new(Shapes::default());
}

/// How many property names [`Names`] keeps.
const MAX_NAMES: usize = 64;

/// The property names met first, with their atoms: the lines of a batch mostly have the same
/// keys, and the engine makes a string for a name before it finds the atom it already has.
/// Each atom is held (its count raised) so it stays the name's; [`release`] lets them
/// go. They are one context's: another context's parses do without.
struct Names {
    owner: *mut qjs::JSContext,
    names: Vec<(Box<[u8]>, qjs::JSAtom)>,
    /// Where the name after the last one found would be: an object's names mostly come in
    /// the order of the last object's.
    next: usize,
    /// The atoms of the properties of the objects being parsed, the innermost last (not
    /// held: the objects hold them).
    path: Vec<qjs::JSAtom>,
}

impl Default for Names {
    fn default() -> Self {
        Self {
            owner: std::ptr::null_mut(),
            names: Vec::new(),
            next: 0,
            path: Vec::new(),
        }
    }
}

impl Names {
    /// The atom of `name` (UTF-8), owned by the caller; `JS_ATOM_NULL` if the engine failed.
    ///
    /// # Safety
    /// `ctx` is a live context of the engine, used on its thread.
    unsafe fn atom(&mut self, ctx: *mut qjs::JSContext, name: &[u8]) -> qjs::JSAtom {
        if self.owner == ctx {
            let found = match self.names.get(self.next) {
                Some((known, _)) if **known == *name => Some(self.next),
                _ => self.names.iter().position(|(known, _)| **known == *name),
            };
            if let Some(i) = found {
                self.next = i + 1;
                return qjs::JS_DupAtom(ctx, self.names[i].1);
            }
        }
        let atom = qjs::JS_NewAtomLen(ctx, name.as_ptr().cast(), name.len() as _);
        if atom == qjs::JS_ATOM_NULL {
            return atom;
        }
        if self.names.is_empty() {
            self.owner = ctx;
        }
        if self.owner == ctx && self.names.len() < MAX_NAMES && name.len() <= crate::MAX_KEPT_NAME {
            self.names.push((name.into(), qjs::JS_DupAtom(ctx, atom)));
        }
        atom
    }
}

/// Lets go of the atoms and shapes `JSON.parse` holds, if they are `ctx`'s.
///
/// # Safety
/// `ctx` is a live context.
pub unsafe fn release(ctx: *mut qjs::JSContext) {
    // SAFETY: the caller's `ctx` is live.
    SHAPES.with_borrow_mut(|shapes| unsafe { shapes.release(ctx) });
    NAMES.with_borrow_mut(|names| {
        if names.owner != ctx {
            return;
        }
        for (_, atom) in names.names.drain(..) {
            // SAFETY: the atom is held by the cache, of this live context.
            unsafe { qjs::JS_FreeAtom(ctx, atom) };
        }
        names.owner = std::ptr::null_mut();
    });
}

/// The nesting this parser follows before it leaves the text to the engine's parser.
const MAX_DEPTH: u32 = 64;

/// `JSON.parse(text[, reviver])` as the engine calls it. A string without a reviver (a second
/// argument that is a function) is parsed here, or if refused here by `JS_ParseJSON`, what the
/// builtin calls for it, under the same name (`<input>`): the same value or error, and the
/// same stack (this function's frame standing for the builtin's). Any other call goes to the
/// builtin `JSON.parse`, `data[0]`.
///
/// # Safety
/// Called by the engine: `argv` holds `argc` live values and `data` the one value the function
/// was made with.
pub unsafe extern "C" fn parse_fast(
    ctx: *mut qjs::JSContext,
    this: qjs::JSValue,
    argc: std::ffi::c_int,
    argv: *mut qjs::JSValue,
    _magic: std::ffi::c_int,
    data: *mut qjs::JSValue,
) -> qjs::JSValue {
    let reviver = argc >= 2 && qjs::JS_IsFunction(ctx, *argv.add(1));
    if argc < 1 || reviver || !qjs::JS_IsString(*argv) {
        return qjs::JS_Call(ctx, *data, this, argc, argv);
    }
    let mut len = 0;
    let text = qjs::JS_ToCStringLen2(ctx, &mut len, *argv, false);
    if text.is_null() {
        return qjs::JS_EXCEPTION;
    }
    let parsed = usize::try_from(len).ok().and_then(|n| {
        let bytes = std::slice::from_raw_parts(text.cast::<u8>(), n);
        // A lone surrogate comes out as three bytes that are not UTF-8: the engine's.
        crate::json::is_utf8(bytes)
            .then(|| parse(ctx, bytes))
            .flatten()
    });
    let value = match parsed {
        Some(value) => value,
        None => qjs::JS_ParseJSON(ctx, text, len, c"<input>".as_ptr()),
    };
    qjs::JS_FreeCString(ctx, text);
    value
}

/// The value `bytes` (UTF-8) hold as JSON, owned by the caller; `None` for text this leaves to
/// the engine's parser, with nothing made left behind and no exception pending.
///
/// # Safety
/// `ctx` is a live context.
pub unsafe fn parse(ctx: *mut qjs::JSContext, bytes: &[u8]) -> Option<qjs::JSValue> {
    NAMES.with_borrow_mut(|names| {
        SHAPES.with_borrow_mut(|shapes| {
            names.path.clear();
            let mut parser = Parser {
                ctx,
                bytes,
                at: 0,
                scratch: Vec::new(),
                names,
                shapes,
            };
            // SAFETY: the caller's `ctx` is live.
            let value = unsafe { parser.value(0) }?;
            parser.whitespace();
            (parser.at == bytes.len()).then(|| value.into_raw())
        })
    })
}

/// An owned value, freed when dropped unless handed over.
struct Owned {
    ctx: *mut qjs::JSContext,
    value: qjs::JSValue,
}

impl Owned {
    /// Takes a value the engine made, `None` (its exception dropped) if it failed.
    ///
    /// # Safety
    /// `ctx` is the live context that made `value`, which the caller owns and hands over.
    unsafe fn new(ctx: *mut qjs::JSContext, value: qjs::JSValue) -> Option<Self> {
        if qjs::JS_IsException(value) {
            drop_exception(ctx);
            return None;
        }
        Some(Self { ctx, value })
    }

    fn into_raw(self) -> qjs::JSValue {
        let value = self.value;
        std::mem::forget(self);
        value
    }
}

impl Drop for Owned {
    fn drop(&mut self) {
        // SAFETY: the value is owned here and freed once.
        unsafe { qjs::JS_FreeValue(self.ctx, self.value) };
    }
}

/// The value of the decimal `int.frac` (ASCII digits), if it has at most 15 digits: then the
/// digits make an integer below 2^53 and the power of ten is exact, both as doubles, and their
/// quotient, rounded correctly, is the decimal's nearest double. Most numbers in a batch
/// (prices, counts) are such; the others are parsed in full.
fn decimal_value(int: &[u8], frac: &[u8]) -> Option<f64> {
    if int.len() + frac.len() > 15 {
        return None;
    }
    let m = int
        .iter()
        .chain(frac)
        .fold(0u64, |m, &digit| m * 10 + u64::from(digit - b'0'));
    Some(m as f64 / POWERS[frac.len()])
}

struct Parser<'a> {
    ctx: *mut qjs::JSContext,
    bytes: &'a [u8],
    at: usize,
    /// A string with escapes, decoded.
    scratch: Vec<u8>,
    names: &'a mut Names,
    shapes: &'a mut Shapes,
}

impl Parser<'_> {
    fn peek(&self) -> Option<u8> {
        self.bytes.get(self.at).copied()
    }

    fn whitespace(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.at += 1;
        }
    }

    /// Steps over `byte` after whitespace, if it is next.
    fn eat(&mut self, byte: u8) -> bool {
        self.whitespace();
        let next = self.peek() == Some(byte);
        if next {
            self.at += 1;
        }
        next
    }

    /// The value at the cursor, `depth` levels down; `None` for text this parser leaves to the
    /// engine's.
    ///
    /// # Safety
    /// The parser's context is live, used on its thread.
    unsafe fn value(&mut self, depth: u32) -> Option<Owned> {
        self.whitespace();
        match self.peek()? {
            b'{' => self.object(depth),
            b'[' => self.array(depth),
            b'"' => {
                let ctx = self.ctx;
                let value = self.string(|text, _| {
                    // SAFETY: `text` is UTF-8 (the input is; escapes are decoded to it).
                    unsafe { qjs::JS_NewStringLen(ctx, text.as_ptr().cast(), text.len() as _) }
                })?;
                Owned::new(ctx, value)
            }
            b't' => self.literal(b"true", qjs::JS_TRUE),
            b'f' => self.literal(b"false", qjs::JS_FALSE),
            b'n' => self.literal(b"null", qjs::JS_NULL),
            b'-' | b'0'..=b'9' => self.number(),
            _ => None,
        }
    }

    fn literal(&mut self, word: &[u8], value: qjs::JSValue) -> Option<Owned> {
        let rest = self.bytes.get(self.at..)?;
        if !rest.starts_with(word) {
            return None;
        }
        self.at += word.len();
        Some(Owned {
            ctx: self.ctx,
            value,
        })
    }

    /// `-?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?`, read as the nearest double (as the
    /// engine's `strtod` reads it).
    fn number(&mut self) -> Option<Owned> {
        let start = self.at;
        let digits = |parser: &mut Self| {
            let from = parser.at;
            while parser.peek().is_some_and(|b| b.is_ascii_digit()) {
                parser.at += 1;
            }
            parser.at > from
        };
        let negative = self.peek() == Some(b'-');
        if negative {
            self.at += 1;
        }
        let int_start = self.at;
        match self.peek()? {
            b'0' => {
                self.at += 1;
                if self.peek().is_some_and(|b| b.is_ascii_digit()) {
                    return None;
                }
            }
            b'1'..=b'9' => {
                digits(self);
            }
            _ => return None,
        }
        let int = int_start..self.at;
        let mut frac = self.at..self.at;
        if self.peek() == Some(b'.') {
            self.at += 1;
            let frac_start = self.at;
            if !digits(self) {
                return None;
            }
            frac = frac_start..self.at;
        }
        let number = if matches!(self.peek(), Some(b'e' | b'E')) {
            self.at += 1;
            if matches!(self.peek(), Some(b'+' | b'-')) {
                self.at += 1;
            }
            if !digits(self) {
                return None;
            }
            None
        } else {
            decimal_value(&self.bytes[int], &self.bytes[frac])
                .map(|x| if negative { -x } else { x })
        };
        let number = match number {
            Some(number) => number,
            None => std::str::from_utf8(&self.bytes[start..self.at])
                .ok()?
                .parse()
                .ok()?,
        };
        Some(Owned {
            ctx: self.ctx,
            value: qjs::JS_NewFloat64(number),
        })
    }

    /// Reads the string at `self.at` (its opening quote) and hands `make` its UTF-8 (and the
    /// names known).
    fn string<R>(&mut self, make: impl FnOnce(&[u8], &mut Names) -> R) -> Option<R> {
        let start = self.at + 1;
        let mut at = start;
        loop {
            match *self.bytes.get(at)? {
                b'"' => {
                    self.at = at + 1;
                    return Some(make(&self.bytes[start..at], self.names));
                }
                b'\\' => break,
                0..=0x1f => return None,
                _ => at += 1,
            }
        }
        // Escapes: decoded into the scratch buffer.
        self.scratch.clear();
        self.scratch.extend_from_slice(&self.bytes[start..at]);
        loop {
            match *self.bytes.get(at)? {
                b'"' => {
                    self.at = at + 1;
                    return Some(make(&self.scratch, self.names));
                }
                b'\\' => {
                    let escaped = *self.bytes.get(at + 1)?;
                    at += 2;
                    let byte = match escaped {
                        b'"' => b'"',
                        b'\\' => b'\\',
                        b'/' => b'/',
                        b'b' => 0x08,
                        b'f' => 0x0c,
                        b'n' => b'\n',
                        b'r' => b'\r',
                        b't' => b'\t',
                        b'u' => {
                            let unit = self.hex4(at)?;
                            at += 4;
                            let c = match unit {
                                0xd800..=0xdbff => {
                                    // Only a pair makes a character; a lone half is left to
                                    // the engine (a string that UTF-8 cannot hold).
                                    if self.bytes.get(at..at + 2)? != b"\\u" {
                                        return None;
                                    }
                                    let low = self.hex4(at + 2)?;
                                    if !(0xdc00..=0xdfff).contains(&low) {
                                        return None;
                                    }
                                    at += 6;
                                    0x10000 + ((unit - 0xd800) << 10) + (low - 0xdc00)
                                }
                                0xdc00..=0xdfff => return None,
                                _ => unit,
                            };
                            let c = char::from_u32(c)?;
                            let mut buf = [0; 4];
                            self.scratch
                                .extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
                            continue;
                        }
                        _ => return None,
                    };
                    self.scratch.push(byte);
                }
                0..=0x1f => return None,
                byte => {
                    self.scratch.push(byte);
                    at += 1;
                }
            }
        }
    }

    /// The four hex digits at `at`.
    fn hex4(&self, at: usize) -> Option<u32> {
        let digits = self.bytes.get(at..at + 4)?;
        let text = std::str::from_utf8(digits).ok()?;
        if !text.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        u32::from_str_radix(text, 16).ok()
    }

    /// The object at the cursor (after its `{`); as [`Parser::value`].
    ///
    /// # Safety
    /// As [`Parser::value`].
    unsafe fn object(&mut self, depth: u32) -> Option<Owned> {
        if depth >= MAX_DEPTH {
            return None;
        }
        self.at += 1;
        let object = Owned::new(self.ctx, qjs::JS_NewObject(self.ctx))?;
        if self.eat(b'}') {
            return Some(object);
        }
        let first = self.names.path.len();
        loop {
            self.whitespace();
            if self.peek() != Some(b'"') {
                return None;
            }
            let ctx = self.ctx;
            let (atom, kept) = self.string(|name, names| {
                // SAFETY: `ctx` is live; `name` is UTF-8.
                let atom = unsafe { names.atom(ctx, name) };
                (atom, name.len() <= crate::MAX_KEPT_NAME)
            })?;
            if atom == qjs::JS_ATOM_NULL {
                drop_exception(ctx);
                return None;
            }
            let defined = if self.eat(b':') {
                self.value(depth + 1).map(|value| {
                    // SAFETY: the engine takes the value over, defined or not.
                    unsafe {
                        qjs::JS_DefinePropertyValue(
                            ctx,
                            object.value,
                            atom,
                            value.into_raw(),
                            qjs::JS_PROP_C_W_E as _,
                        )
                    }
                })
            } else {
                None
            };
            // The object holds the atom from here on; a name too long to keep is a null atom,
            // which `Shapes::hold` passes over.
            self.names
                .path
                .push(if kept { atom } else { qjs::JS_ATOM_NULL });
            qjs::JS_FreeAtom(ctx, atom);
            match defined {
                Some(ok) if ok >= 0 => {}
                Some(_) => {
                    drop_exception(ctx);
                    return None;
                }
                None => return None,
            }
            if self.eat(b'}') {
                self.shapes.hold(ctx, &self.names.path[first..]);
                self.names.path.truncate(first);
                return Some(object);
            }
            if !self.eat(b',') {
                return None;
            }
        }
    }

    /// The array at the cursor (after its `[`); as [`Parser::value`].
    ///
    /// # Safety
    /// As [`Parser::value`].
    unsafe fn array(&mut self, depth: u32) -> Option<Owned> {
        if depth >= MAX_DEPTH {
            return None;
        }
        self.at += 1;
        let array = Owned::new(self.ctx, qjs::JS_NewArray(self.ctx))?;
        if self.eat(b']') {
            return Some(array);
        }
        let mut index = 0u32;
        loop {
            let element = self.value(depth + 1)?;
            if qjs::JS_DefinePropertyValueUint32(
                self.ctx,
                array.value,
                index,
                element.into_raw(),
                qjs::JS_PROP_C_W_E as _,
            ) < 0
            {
                drop_exception(self.ctx);
                return None;
            }
            index = index.checked_add(1)?;
            if self.eat(b']') {
                return Some(array);
            }
            if !self.eat(b',') {
                return None;
            }
        }
    }
}

#[cfg(test)]
mod tests;
