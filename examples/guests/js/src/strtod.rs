//! libc's `strtod`, which QuickJS's C calls, defined with Rust's parser.

/// The length of the decimal number at the start of the bytes `at` reads
/// (`[+-]digits[.digits][(e|E)[+-]digits]`, one of the first two runs of digits may be empty;
/// an exponent without digits is not part of it), `0` if there is none. `at` is read up to the
/// first byte that cannot continue the number.
#[cfg(any(target_arch = "wasm32", test))]
fn decimal_len(at: impl Fn(usize) -> u8) -> usize {
    let digits = |from: usize| (from..).find(|&i| !at(i).is_ascii_digit()).unwrap_or(from);
    let mut i = usize::from(matches!(at(0), b'+' | b'-'));
    let int_end = digits(i);
    let mut any = int_end > i;
    i = int_end;
    if at(i) == b'.' {
        let frac_end = digits(i + 1);
        any |= frac_end > i + 1;
        i = frac_end;
    }
    if !any {
        return 0;
    }
    if matches!(at(i), b'e' | b'E') {
        let sign = usize::from(matches!(at(i + 1), b'+' | b'-'));
        let exp_end = digits(i + 1 + sign);
        if exp_end > i + 1 + sign {
            i = exp_end;
        }
    }
    i
}

/// libc's `strtod`, for QuickJS's `JSON.parse`, its only caller, which hands it a number it
/// has checked against JSON's grammar. Rust's parser rounds correctly, as the libc one linked
/// otherwise (musl's) does, so each number reads as the same double; it is several times
/// faster. Decimal numbers only (no `inf`, `nan` or hexadecimal, which JSON does not have):
/// anything else reads as no number, 0 with `end` at `s`.
///
/// # Safety
/// `s` is a NUL-terminated string; `end` is null or writable.
#[cfg(target_arch = "wasm32")]
#[no_mangle]
pub unsafe extern "C" fn strtod(
    s: *const std::ffi::c_char,
    end: *mut *mut std::ffi::c_char,
) -> f64 {
    // SAFETY: the caller gives a NUL-terminated string, and the scan stops at its NUL at the
    // latest (NUL continues no number).
    let len = decimal_len(|i| unsafe { *s.cast::<u8>().add(i) });
    // SAFETY: the first `len` bytes were read above.
    let text = unsafe { std::slice::from_raw_parts(s.cast::<u8>(), len) };
    let value = std::str::from_utf8(text)
        .ok()
        .and_then(|text| text.parse::<f64>().ok());
    let (value, len) = match value {
        Some(value) => (value, len),
        None => (0.0, 0),
    };
    if !end.is_null() {
        // SAFETY: `end` is writable (the caller's contract); `s + len` is within the string.
        unsafe { *end = s.add(len).cast_mut() };
    }
    value
}

#[cfg(test)]
mod tests {
    use super::decimal_len;

    fn len(text: &str) -> usize {
        decimal_len(|i| text.as_bytes().get(i).copied().unwrap_or(0))
    }

    #[test]
    fn decimal_len_takes_what_strtod_takes() {
        for (text, expected) in [
            ("135.23,", 6),
            ("-7}", 2),
            ("+1", 2),
            ("0", 1),
            ("1e5", 3),
            ("1E+05x", 5),
            ("2.5e-3]", 6),
            ("1e", 1),
            ("1e+", 1),
            ("1.", 2),
            (".5", 2),
            (".", 0),
            ("-", 0),
            ("-.e1", 0),
            ("", 0),
            ("x1", 0),
            ("inf", 0),
        ] {
            assert_eq!(len(text), expected, "{text:?}");
        }
    }
}
