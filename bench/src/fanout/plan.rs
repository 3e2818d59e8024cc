//! Which key each tick carries and which ticks each subscriber is owed: the arithmetic behind
//! `--keys`, `--narrow` and the lossless check.

use viewtape_tests::Feed;

/// The symbols the publisher cycles over without `--keys`.
const DEFAULT_SYMBOLS: [&str; 10] = [
    "ACME", "BOLT", "CORE", "DASH", "EXPO", "FIZZ", "GLOW", "HALO", "IRIS", "JADE",
];

/// Which key each tick carries and which ticks each subscriber is owed.
#[derive(Debug, Clone)]
pub(super) struct Plan {
    /// The keys in the order the feed cycles over them: `seq` `s` carries
    /// `symbols[(s - 1) % K]` (as [`Feed::symbol_of`]).
    pub(super) symbols: Vec<String>,
    /// Subscriber `i` follows `symbols[i % K]` only.
    narrow: bool,
}

impl Plan {
    /// The ten default symbols, or `keys` symbols `S00000`, `S00001`, ….
    pub(super) fn new(keys: Option<usize>, narrow: bool) -> Self {
        let symbols = match keys {
            None => DEFAULT_SYMBOLS.iter().map(|s| (*s).to_owned()).collect(),
            Some(k) => (0..k.max(1)).map(|i| format!("S{i:05}")).collect(),
        };
        Self { symbols, narrow }
    }

    /// `K`, the number of keys.
    pub(super) fn keys(&self) -> u64 {
        self.symbols.len().max(1) as u64
    }

    /// A feed cycling over the keys, starting at `seq` 1.
    pub(super) fn feed(&self) -> Feed {
        let symbols: Vec<&str> = self.symbols.iter().map(String::as_str).collect();
        Feed::new(&symbols)
    }

    /// The index of the key tick `seq` carries.
    pub(super) fn key_of_seq(&self, seq: u64) -> u64 {
        seq.saturating_sub(1) % self.keys()
    }

    /// The index of the one key subscriber `index` follows; `None`: it follows every key.
    pub(super) fn key_of_subscriber(&self, index: usize) -> Option<u64> {
        self.narrow.then(|| index as u64 % self.keys())
    }

    /// The SSE path subscriber `index` opens: `base`, narrowed to its key with `--narrow`.
    pub(super) fn path(&self, base: &str, index: usize) -> String {
        match self.key_of_subscriber(index) {
            None => base.to_owned(),
            Some(key) => format!("{base}?keys={}", self.symbols[key as usize]),
        }
    }

    /// How far apart the `seq`s a subscriber receives are: 1 on the full stream, `K` on a
    /// narrowed one.
    pub(super) fn stride(&self) -> u64 {
        if self.narrow {
            self.keys()
        } else {
            1
        }
    }

    /// The first `seq` at or after `first` that subscriber `index` receives.
    pub(super) fn first_seq_for(&self, index: usize, first: u64) -> u64 {
        match self.key_of_subscriber(index) {
            None => first,
            Some(key) => {
                let k = self.keys();
                first + (key + k - self.key_of_seq(first)) % k
            }
        }
    }

    /// Of the `published` ticks from `seq` `first` on, how many subscriber `index` receives.
    pub(super) fn expected_for(&self, index: usize, first: u64, published: u64) -> u64 {
        let offset = self.first_seq_for(index, first) - first;
        if offset >= published {
            0
        } else {
            (published - offset - 1) / self.stride() + 1
        }
    }

    /// How many distinct keys `subscribers` follow (every key on full streams).
    pub(super) fn subscribed_keys(&self, subscribers: usize) -> u64 {
        if self.narrow {
            (subscribers as u64).min(self.keys())
        } else {
            self.keys()
        }
    }

    /// Of the `published` ticks from `seq` `first` on, how many reach at least one of
    /// `subscribers` (all of them on full streams).
    pub(super) fn events_reaching(&self, subscribers: usize, first: u64, published: u64) -> u64 {
        if !self.narrow {
            return if subscribers == 0 { 0 } else { published };
        }
        // Subscribers 0..K follow the distinct keys; the rest repeat them.
        (0..subscribers.min(self.symbols.len()))
            .map(|index| self.expected_for(index, first, published))
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_follow_the_feed() {
        let default = Plan::new(None, false);
        assert_eq!(default.symbols, DEFAULT_SYMBOLS);
        let plan = Plan::new(Some(5000), true);
        assert_eq!(plan.keys(), 5000);
        assert_eq!(plan.symbols[0], "S00000");
        assert_eq!(plan.symbols[4999], "S04999");
        let feed = plan.feed();
        for seq in [1, 2, 4999, 5000, 5001, 12_345] {
            assert_eq!(
                feed.symbol_of(seq),
                plan.symbols[plan.key_of_seq(seq) as usize]
            );
        }
        assert_eq!(
            plan.path("/views/prices/events", 5001),
            "/views/prices/events?keys=S00001"
        );
        assert_eq!(
            Plan::new(Some(5000), false).path("/views/prices/events", 7),
            "/views/prices/events"
        );
        assert_eq!(plan.subscribed_keys(1000), 1000);
        assert_eq!(plan.subscribed_keys(7000), 5000);
        assert_eq!(Plan::new(Some(5000), false).subscribed_keys(10), 5000);
    }

    /// [`Plan::expected_for`] and [`Plan::events_reaching`] against counting tick by tick.
    #[test]
    fn expected_deliveries_match_a_count() {
        for (keys, narrow) in [
            (Some(7), true),
            (Some(7), false),
            (None, true),
            (Some(1), true),
        ] {
            let plan = Plan::new(keys, narrow);
            for subscribers in [1, 3, 7, 10, 16] {
                for first in [1, 2, 8, 11] {
                    for published in [0, 1, 5, 7, 20, 23] {
                        let seqs = first..first + published;
                        let mut reaching = 0;
                        for i in 0..subscribers {
                            let mine: Vec<u64> = seqs
                                .clone()
                                .filter(|&s| {
                                    plan.key_of_subscriber(i)
                                        .is_none_or(|k| k == plan.key_of_seq(s))
                                })
                                .collect();
                            assert_eq!(plan.expected_for(i, first, published), mine.len() as u64);
                            if let Some(&s) = mine.first() {
                                assert_eq!(plan.first_seq_for(i, first), s);
                            }
                            // Consecutive ticks of one subscriber are `stride` apart.
                            assert!(mine.windows(2).all(|w| w[1] - w[0] == plan.stride()));
                        }
                        for s in seqs {
                            reaching += u64::from((0..subscribers).any(|i| {
                                plan.key_of_subscriber(i)
                                    .is_none_or(|k| k == plan.key_of_seq(s))
                            }));
                        }
                        assert_eq!(
                            plan.events_reaching(subscribers, first, published),
                            reaching,
                            "{keys:?} {narrow} {subscribers} {first} {published}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn one_key_of_5000_gets_a_fifth() {
        let plan = Plan::new(Some(5000), true);
        let published = 50_000;
        let expected: u64 = (0..1000)
            .map(|i| plan.expected_for(i, 5001, published))
            .sum();
        assert_eq!(expected, 10_000);
        assert_eq!(plan.events_reaching(1000, 5001, published), 10_000);
        let full = Plan::new(Some(5000), false);
        let expected: u64 = (0..1000)
            .map(|i| full.expected_for(i, 5001, published))
            .sum();
        assert_eq!(expected, 50_000_000);
    }
}
