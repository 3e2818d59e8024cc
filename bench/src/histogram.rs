//! A log-linear latency histogram: exact below 64, then 64 sub-buckets per power of two
//! (relative error ≤ 1/64 ≈ 1.6%). Fixed size, no allocation per sample, mergeable.

/// Sub-buckets per power of two.
const SUB: u64 = 64;
const SUB_BITS: u32 = 6;
/// Enough buckets for any u64.
const BUCKETS: usize = ((64 - SUB_BITS as usize) + 1) * SUB as usize;

/// Counts of values (e.g. microseconds).
#[derive(Clone)]
pub struct Histogram {
    counts: Vec<u64>,
    total: u64,
    max: u64,
}

impl std::fmt::Debug for Histogram {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Histogram")
            .field("total", &self.total)
            .field("max", &self.max)
            .finish_non_exhaustive()
    }
}

impl Default for Histogram {
    fn default() -> Self {
        Self {
            counts: vec![0; BUCKETS],
            total: 0,
            max: 0,
        }
    }
}

fn index(value: u64) -> usize {
    if value < SUB {
        return value as usize;
    }
    let exp = 63 - value.leading_zeros(); // >= SUB_BITS
    let shift = exp - SUB_BITS;
    let sub = (value >> shift) & (SUB - 1);
    ((exp - SUB_BITS + 1) as u64 * SUB + sub) as usize
}

/// The lowest value of a bucket.
fn low(index: usize) -> u64 {
    let index = index as u64;
    if index < SUB {
        return index;
    }
    let group = index / SUB; // >= 1
    let sub = index % SUB;
    let exp = group - 1 + u64::from(SUB_BITS);
    (1u64 << exp) | (sub << (exp - u64::from(SUB_BITS)))
}

impl Histogram {
    /// Records one value.
    pub fn record(&mut self, value: u64) {
        self.counts[index(value)] += 1;
        self.total += 1;
        self.max = self.max.max(value);
    }

    /// Adds another histogram's counts.
    pub fn merge(&mut self, other: &Self) {
        for (a, b) in self.counts.iter_mut().zip(&other.counts) {
            *a += b;
        }
        self.total += other.total;
        self.max = self.max.max(other.max);
    }

    /// How many values were recorded.
    pub fn samples(&self) -> u64 {
        self.total
    }

    /// The largest value recorded.
    pub fn max(&self) -> u64 {
        self.max
    }

    /// The value at quantile `q` in `0.0..=1.0` (the low edge of its bucket), 0 when empty.
    pub fn quantile(&self, q: f64) -> u64 {
        if self.total == 0 {
            return 0;
        }
        let rank = ((q.clamp(0.0, 1.0) * self.total as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (i, count) in self.counts.iter().enumerate() {
            seen += count;
            if seen >= rank {
                return low(i).min(self.max);
            }
        }
        self.max
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_monotonic_and_tight() {
        let mut last = 0;
        for v in (0..200_000u64).chain([u64::MAX / 3, u64::MAX]) {
            let i = index(v);
            assert!(i < BUCKETS, "{v}");
            assert!(i >= last, "{v}");
            last = i;
            let lo = low(i);
            assert!(lo <= v, "{v}: low {lo}");
            assert!((v - lo) as f64 <= v as f64 / 64.0, "{v}: low {lo}");
        }
    }

    #[test]
    fn quantiles_within_two_percent() {
        let mut h = Histogram::default();
        for v in 1..=100_000u64 {
            h.record(v);
        }
        for (q, want) in [(0.5, 50_000.0), (0.99, 99_000.0), (1.0, 100_000.0)] {
            let got = h.quantile(q) as f64;
            assert!((got - want).abs() / want < 0.02, "q{q}: {got} vs {want}");
        }
        assert_eq!(h.max(), 100_000);
        let mut merged = Histogram::default();
        merged.merge(&h);
        merged.merge(&h);
        assert_eq!(merged.samples(), 200_000);
        assert_eq!(Histogram::default().quantile(0.5), 0);
    }
}
