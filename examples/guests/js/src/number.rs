//! Numbers as JavaScript writes them (`Number.prototype.toString`, which `JSON.stringify`
//! uses), for the numbers most events carry; the others are left to the engine.

use std::fmt::Write as _;

/// Writes a number as `JSON.stringify` writes it: `Number.prototype.toString()` (ECMAScript's
/// Number::toString, the shortest digits that read back as the same double), `null` if it is
/// not finite. Returns `false`, writing nothing, for a number of 15 digits or more, which the
/// engine writes.
///
/// Two decimals of at most 15 significant digits never read as the same double. So a decimal
/// of at most 15 digits that reads back as `x` is the shortest one's value, and there is no
/// tie between two shortest candidates (which ECMAScript breaks towards the even one and
/// Rust's `{:e}`, used for the numbers [`short_decimal`] does not take, upwards).
pub fn number(x: f64, out: &mut Vec<u8>) -> bool {
    if !x.is_finite() {
        out.extend_from_slice(b"null");
        return true;
    }
    if x == 0.0 {
        // Both zeros.
        out.push(b'0');
        return true;
    }
    if short_decimal(x, out) {
        return true;
    }
    // `d[.ddd]e[-]x`.
    let mut buf = [0u8; 40];
    let mut cursor = Cursor {
        buf: &mut buf,
        len: 0,
    };
    if write!(cursor, "{:e}", x.abs()).is_err() {
        // Cannot happen (at most 17 digits and an exponent of three digits).
        return false;
    }
    let len = cursor.len;
    let text = &buf[..len];
    let e_at = text.iter().position(|&c| c == b'e').unwrap_or(len);
    let (mantissa, exponent) = text.split_at(e_at);
    let exponent: i32 = std::str::from_utf8(exponent.get(1..).unwrap_or_default())
        .ok()
        .and_then(|e| e.parse().ok())
        .unwrap_or(0);
    let mut digits = [0u8; 24];
    let mut k = 0;
    for &c in mantissa {
        if c != b'.' && k < digits.len() {
            digits[k] = c;
            k += 1;
        }
    }
    if k == 0 || k > 14 {
        return false;
    }
    let digits = &digits[..k];
    let k = k as i32;
    // The decimal point sits after the first `n` digits.
    let n = exponent + 1;
    if x < 0.0 {
        out.push(b'-');
    }
    if k <= n && n <= 21 {
        out.extend_from_slice(digits);
        out.extend(std::iter::repeat_n(b'0', (n - k) as usize));
    } else if 0 < n && n <= 21 {
        out.extend_from_slice(&digits[..n as usize]);
        out.push(b'.');
        out.extend_from_slice(&digits[n as usize..]);
    } else if -6 < n && n <= 0 {
        out.extend_from_slice(b"0.");
        out.extend(std::iter::repeat_n(b'0', (-n) as usize));
        out.extend_from_slice(digits);
    } else {
        out.push(digits[0]);
        if k > 1 {
            out.push(b'.');
            out.extend_from_slice(&digits[1..]);
        }
        let _ = write!(
            Bytes(out),
            "e{}{}",
            if n - 1 < 0 { '-' } else { '+' },
            (n - 1).abs()
        );
    }
    true
}

/// Powers of ten up to 1e15, exact as doubles.
pub const POWERS: [f64; 16] = [
    1.0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12, 1e13, 1e14, 1e15,
];

/// Writes `x` (finite, not zero) if it is `m / 10^d` for an `m` of at most 15 digits and a `d`
/// of at most 8, and at least 1e-6 (below, ECMAScript writes an exponent): prices, counts,
/// most measurements. The division of two exact doubles is rounded correctly, so
/// `m / 10^d == x` says that the decimal reads back as `x`.
fn short_decimal(x: f64, out: &mut Vec<u8>) -> bool {
    let a = x.abs();
    if !(1e-6..1e15).contains(&a) {
        return false;
    }
    for (d, &power) in POWERS[..=8].iter().enumerate() {
        let m = (a * power).round_ties_even();
        if m >= 1e15 {
            return false;
        }
        if m / power != a {
            continue;
        }
        // Below 1e15: exact as an integer. Trailing zeros, should the rounding above have
        // missed a shorter `d`, are the same value written longer.
        let (mut m, mut d) = (m as u64, d);
        while d > 0 && m % 10 == 0 {
            m /= 10;
            d -= 1;
        }
        if x < 0.0 {
            out.push(b'-');
        }
        let mut buf = [0; 20];
        let digits = digits(m, &mut buf);
        if d == 0 {
            out.extend_from_slice(digits);
        } else if digits.len() > d {
            let point = digits.len() - d;
            out.extend_from_slice(&digits[..point]);
            out.push(b'.');
            out.extend_from_slice(&digits[point..]);
        } else {
            out.extend_from_slice(b"0.");
            out.extend(std::iter::repeat_n(b'0', d - digits.len()));
            out.extend_from_slice(digits);
        }
        return true;
    }
    false
}

/// The decimal digits of `n`, written at the end of `buf`.
pub fn digits(n: u64, buf: &mut [u8; 20]) -> &[u8] {
    let mut at = buf.len();
    let mut rest = n;
    loop {
        at -= 1;
        buf[at] = b'0' + (rest % 10) as u8;
        rest /= 10;
        if rest == 0 {
            return &buf[at..];
        }
    }
}

/// `fmt::Write` into a fixed buffer.
struct Cursor<'a> {
    buf: &'a mut [u8],
    len: usize,
}

impl std::fmt::Write for Cursor<'_> {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        let end = self.len + s.len();
        let slot = self.buf.get_mut(self.len..end).ok_or(std::fmt::Error)?;
        slot.copy_from_slice(s.as_bytes());
        self.len = end;
        Ok(())
    }
}

/// `fmt::Write` into a byte buffer.
struct Bytes<'a>(&'a mut Vec<u8>);

impl std::fmt::Write for Bytes<'_> {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        self.0.extend_from_slice(s.as_bytes());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::number;

    #[test]
    fn numbers_match_number_to_string() {
        crate::tests::in_new_context(|ctx| {
            let to_string: rquickjs::Function = ctx.eval("(x) => String(x)").expect("function");
            // SplitMix64 over the bit patterns, and over decimal prices and integers.
            let mut state = 0x1234_5678_9abc_def0_u64;
            let mut next = || {
                state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
                let mut z = state;
                z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
                z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
                z ^ (z >> 31)
            };
            for i in 0..200_000u32 {
                let r = next();
                let x = match i % 8 {
                    0 => f64::from_bits(r),
                    1 => (r % 10_000_000) as f64 / 100.0,
                    2 => (r >> 11) as f64 / (1u64 << 53) as f64,
                    3 => (r as i64 as f64) / 1e10,
                    4 => -((r % 1_000_000_000) as f64) / 10f64.powi((r >> 60) as i32),
                    5 => (r % 100_000) as f64 * 10f64.powi((r >> 59) as i32 - 12),
                    6 => (r >> 14) as f64,
                    _ => ((r % 2000) as f64 - 1000.0) / 8.0,
                };
                if !x.is_finite() {
                    continue;
                }
                let mut out = Vec::new();
                let expected: String = to_string.call((x,)).expect("String(x)");
                if number(x, &mut out) {
                    assert_eq!(String::from_utf8(out).expect("utf-8"), expected, "{x:e}");
                } else {
                    // Written with the engine's digits (`writes_what_json_stringify_writes`).
                    assert!(out.is_empty());
                }
            }
        });
    }
}
