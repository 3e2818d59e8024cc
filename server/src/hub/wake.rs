//! Wake-ups of a view's subscribers after a commit.
//!
//! A subscriber of every key follows the view's tick, one `watch` that a commit touching the
//! view sends once. A narrowed subscriber (`?keys=`, `?prefix=`) registers its narrowing here
//! instead and is woken only by commits that touch one of its keys (and by restores), so a
//! thousand subscribers of one key each cost a commit one lookup per event, not a thousand
//! wake-ups that find nothing to send.
//!
//! A narrowed subscriber's cursor moves past the other keys' records only when it reads the
//! tape. So that the tape's bounds never drop records it has not looked past (which would
//! reset it), every narrowed subscriber is also woken once a quarter of the view's record or
//! byte bound has been appended since the last time, and by its heartbeat when idle (the
//! tape's age bound is an hour by default; a heartbeat, seconds).

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::sync::Notify;
use viewtape_journal::CompactString;

use crate::hub::narrow::Narrow;

/// The narrowed subscribers of one view, by key and by prefix.
#[derive(Debug)]
pub(super) struct KeyedWakers {
    registered: AtomicUsize,
    inner: Mutex<Registry>,
    /// Wake everyone once this many records, or bytes, were appended since the last time.
    sweep: (usize, usize),
}

#[derive(Debug, Default)]
struct Registry {
    next: u64,
    /// Records and bytes appended since every narrowed subscriber was last woken.
    appended: (usize, usize),
    by_key: HashMap<CompactString, Vec<(u64, Arc<Notify>)>>,
    by_prefix: Vec<(u64, String, Arc<Notify>)>,
}

impl KeyedWakers {
    /// For a view whose tape keeps at most `max_records` records and `max_bytes` bytes.
    pub(super) fn new(max_records: usize, max_bytes: usize) -> Self {
        Self {
            registered: AtomicUsize::new(0),
            inner: Mutex::default(),
            sweep: ((max_records / 4).max(1), (max_bytes / 4).max(1)),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Registry> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Registers a subscriber narrowed to `narrow` (not [`Narrow::All`]); woken until the
    /// returned registration is dropped.
    pub(super) fn register(self: &Arc<Self>, narrow: &Narrow) -> KeyWake {
        let notify = Arc::new(Notify::new());
        let mut registry = self.lock();
        let id = registry.next;
        registry.next += 1;
        match narrow {
            Narrow::All => {}
            Narrow::Keys(keys) => {
                for key in keys {
                    registry
                        .by_key
                        .entry(CompactString::new(key))
                        .or_default()
                        .push((id, Arc::clone(&notify)));
                }
            }
            Narrow::Prefix(prefix) => {
                registry
                    .by_prefix
                    .push((id, prefix.clone(), Arc::clone(&notify)))
            }
        }
        self.registered.fetch_add(1, Ordering::Relaxed);
        KeyWake {
            wakers: Arc::clone(self),
            narrow: narrow.clone(),
            id,
            notify,
        }
    }

    /// Wakes the subscribers of any of `keys`, the keys of records of `bytes` each just
    /// appended; everyone when a sweep is due.
    pub(super) fn wake<'k>(&self, keys: impl Iterator<Item = (&'k str, usize)>) {
        if self.registered.load(Ordering::Relaxed) == 0 {
            return;
        }
        let mut registry = self.lock();
        let (mut records, mut bytes) = registry.appended;
        for (key, size) in keys {
            records += 1;
            bytes += size;
            for (_, notify) in registry.by_key.get(key).into_iter().flatten() {
                notify.notify_one();
            }
            for (_, prefix, notify) in &registry.by_prefix {
                if key.starts_with(prefix.as_str()) {
                    notify.notify_one();
                }
            }
        }
        registry.appended = (records, bytes);
        if records >= self.sweep.0 || bytes >= self.sweep.1 {
            Self::wake_every(&mut registry);
        }
    }

    /// Wakes every narrowed subscriber (a restore).
    pub(super) fn wake_all(&self) {
        Self::wake_every(&mut self.lock());
    }

    fn wake_every(registry: &mut Registry) {
        registry.appended = (0, 0);
        for (_, notify) in registry.by_key.values().flatten() {
            notify.notify_one();
        }
        for (_, _, notify) in &registry.by_prefix {
            notify.notify_one();
        }
    }
}

/// A narrowed subscriber's registration: woken by commits that touch its keys.
#[derive(Debug)]
pub struct KeyWake {
    wakers: Arc<KeyedWakers>,
    narrow: Narrow,
    id: u64,
    notify: Arc<Notify>,
}

impl KeyWake {
    /// Resolves once a commit touched one of its keys since the last time it resolved (or since
    /// it was registered).
    pub async fn changed(&self) {
        self.notify.notified().await;
    }
}

impl Drop for KeyWake {
    fn drop(&mut self) {
        let mut registry = self.wakers.lock();
        match &self.narrow {
            Narrow::All => {}
            Narrow::Keys(keys) => {
                for key in keys {
                    if let Some(list) = registry.by_key.get_mut(key.as_str()) {
                        list.retain(|(id, _)| *id != self.id);
                        if list.is_empty() {
                            registry.by_key.remove(key.as_str());
                        }
                    }
                }
            }
            Narrow::Prefix(_) => registry.by_prefix.retain(|(id, _, _)| *id != self.id),
        }
        self.wakers.registered.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn keys(keys: &[&str]) -> Narrow {
        Narrow::Keys(keys.iter().map(|k| (*k).to_owned()).collect())
    }

    async fn woken(wake: &KeyWake) -> bool {
        tokio::time::timeout(Duration::from_millis(20), wake.changed())
            .await
            .is_ok()
    }

    #[tokio::test]
    async fn only_commits_touching_a_subscribers_keys_wake_it() {
        let wakers = Arc::new(KeyedWakers::new(1000, 1 << 20));
        let ab = wakers.register(&keys(&["A", "B"]));
        let eu = wakers.register(&Narrow::Prefix("EU-".into()));
        wakers.wake([("C", 10), ("US-1", 10)].into_iter());
        assert!(!woken(&ab).await && !woken(&eu).await);
        wakers.wake([("B", 10)].into_iter());
        assert!(woken(&ab).await && !woken(&eu).await);
        // Two commits before it looks: one wake-up, then nothing owed.
        wakers.wake([("EU-1", 10)].into_iter());
        wakers.wake([("EU-2", 10), ("A", 10)].into_iter());
        assert!(woken(&eu).await && !woken(&eu).await);
        assert!(woken(&ab).await);
        wakers.wake_all();
        assert!(woken(&ab).await && woken(&eu).await);
    }

    #[tokio::test]
    async fn everyone_is_woken_each_quarter_of_the_tapes_bounds() {
        // A tape of 40 records or 4,000 bytes: a sweep every 10 records or 1,000 bytes.
        let wakers = Arc::new(KeyedWakers::new(40, 4000));
        let a = wakers.register(&keys(&["A"]));
        for _ in 0..9 {
            wakers.wake([("B", 1)].into_iter());
        }
        assert!(!woken(&a).await);
        wakers.wake([("B", 1)].into_iter());
        assert!(woken(&a).await);
        wakers.wake([("B", 999)].into_iter());
        assert!(!woken(&a).await);
        wakers.wake([("B", 1)].into_iter());
        assert!(woken(&a).await);
    }

    #[tokio::test]
    async fn a_dropped_registration_leaves_nothing_behind() {
        let wakers = Arc::new(KeyedWakers::new(1000, 1 << 20));
        let a = wakers.register(&keys(&["A"]));
        let also_a = wakers.register(&keys(&["A"]));
        let p = wakers.register(&Narrow::Prefix("P".into()));
        drop(a);
        drop(p);
        wakers.wake([("A", 10), ("P1", 10)].into_iter());
        assert!(woken(&also_a).await);
        drop(also_a);
        assert_eq!(wakers.registered.load(Ordering::Relaxed), 0);
        let registry = wakers.lock();
        assert!(registry.by_key.is_empty() && registry.by_prefix.is_empty());
    }
}
