//! A tiny deterministic PRNG (xorshift64*), so a seed names one fault schedule and one
//! workload shape on every machine, without a dependency.

/// xorshift64* (Vigna): 64 bits of state, never zero.
#[derive(Debug, Clone)]
pub struct Prng(u64);

impl Prng {
    /// A generator for `seed` (any value: zero is mapped to a fixed non-zero state). Seeds are
    /// mixed with splitmix64 first, so nearby seeds give unrelated sequences.
    pub fn new(seed: u64) -> Self {
        let mut z = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        Self(if z == 0 { 0x2545_F491_4F6C_DD1D } else { z })
    }

    /// A generator of its own for a sub-task (a producer, a reader), derived from this seed and
    /// `stream`: the tasks' choices do not depend on how their steps interleave.
    pub fn fork(seed: u64, stream: u64) -> Self {
        Self::new(seed ^ stream.wrapping_mul(0xD1B5_4A32_D192_ED03))
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// A number in `0..n` (`0` when `n` is 0); the modulo bias is irrelevant at these sizes.
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next_u64() % n
        }
    }

    /// An index into a slice of `len` items (`0` when empty).
    pub fn index(&mut self, len: usize) -> usize {
        // usize → u64 is lossless on every supported target; the result is below `len`.
        usize::try_from(self.below(len as u64)).unwrap_or(0)
    }

    /// A number in `low..=high` (milliseconds, usually).
    pub fn between(&mut self, low: u64, high: u64) -> u64 {
        low + self.below(high.saturating_sub(low) + 1)
    }

    /// `true` once in `n` draws on average.
    pub fn one_in(&mut self, n: u64) -> bool {
        self.below(n) == 0
    }
}

#[cfg(test)]
mod tests {
    use super::Prng;

    #[test]
    fn a_seed_names_one_sequence() {
        let a: Vec<u64> = (0..5)
            .scan(Prng::new(7), |r, _| Some(r.next_u64()))
            .collect();
        let b: Vec<u64> = (0..5)
            .scan(Prng::new(7), |r, _| Some(r.next_u64()))
            .collect();
        let c: Vec<u64> = (0..5)
            .scan(Prng::new(8), |r, _| Some(r.next_u64()))
            .collect();
        assert_eq!(a, b);
        assert_ne!(a, c);
        let mut r = Prng::new(0);
        for _ in 0..1000 {
            assert!(r.below(3) < 3);
            assert!((2..=5).contains(&r.between(2, 5)));
        }
    }
}
