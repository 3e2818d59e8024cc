//! The subscribers of a `fanout` run: what each one saw, and who reads their streams.
//!
//! Plain HTTP/1.1 subscribers are read by one thread polling all their sockets (edge-triggered
//! epoll through `mio`): per delivery one `read` and the parse, with no task wake-up and no
//! timer. The client shares a small machine with the server it measures, and a client that
//! costs more per delivery than the server makes every latency figure the client's own. Over
//! TLS or HTTP/2 each subscriber is a tokio task reading its
//! [`Subscription`](crate::transport::Subscription).
//!
//! | file | job |
//! |---|---|
//! | this one | what each subscriber saw: [`SeqCheck`], [`Tally`], the run's [`Shared`] counts |
//! | `readers` | who reads their streams: one polling thread, or a task per subscriber ([`Readers`]) |

mod readers;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use viewtape_tests::feed::scan_seq;
use viewtape_tests::SseEventRef;

use crate::histogram::Histogram;

pub use readers::Readers;

/// One subscriber's check that it receives the `seq`s due to it, in order, none skipped.
#[derive(Debug)]
pub struct SeqCheck {
    /// The `seq` it must receive next.
    next: u64,
    stride: u64,
    /// Events that were not the one due.
    violations: u64,
    /// What the first of them was.
    first_violation: Option<String>,
}

impl SeqCheck {
    pub fn new(first: u64, stride: u64) -> Self {
        Self {
            next: first,
            stride: stride.max(1),
            violations: 0,
            first_violation: None,
        }
    }

    /// Checks one received event's `seq` (`None`: it had none). After a gap it expects what
    /// follows the `seq` received, so one lost event counts once; a repeated or earlier `seq`
    /// counts and leaves the expectation as it was.
    fn see(&mut self, seq: Option<u64>) {
        let problem = match seq {
            Some(seq) if seq == self.next => {
                self.next = seq + self.stride;
                return;
            }
            Some(seq) if seq > self.next => {
                let problem = format!("seq {seq} arrived, {} was due", self.next);
                self.next = seq + self.stride;
                problem
            }
            Some(seq) => format!(
                "seq {seq} arrived again or out of order, {} was due",
                self.next
            ),
            None => format!("an event without a seq, {} was due", self.next),
        };
        self.violations += 1;
        self.first_violation.get_or_insert(problem);
    }
}

/// Shared between the publisher and the subscribers.
pub struct Shared {
    pub origin: Instant,
    /// Send time (ns since `origin`) per `seq`; 0 = not sent.
    pub sent_at: Vec<AtomicU64>,
    /// Per-subscriber delivery counts.
    pub received: Vec<AtomicU64>,
    /// Events, over all subscribers, that were not the `seq` due ([`SeqCheck`]).
    pub violations: AtomicU64,
    /// Set when the run is over: the readers stop within 100 ms.
    pub stop: AtomicBool,
    pub histograms: Mutex<Histogram>,
    pub errors: Mutex<Vec<String>>,
    /// The first [`SeqCheck`] violation of each subscriber that had one.
    pub order_errors: Mutex<Vec<String>>,
}

impl Shared {
    /// For `subscribers`, and `seq`s up to `last_seq`.
    pub fn new(subscribers: usize, last_seq: u64) -> Self {
        Self {
            origin: Instant::now(),
            sent_at: (0..=last_seq).map(|_| AtomicU64::new(0)).collect(),
            received: (0..subscribers).map(|_| AtomicU64::new(0)).collect(),
            violations: AtomicU64::new(0),
            stop: AtomicBool::new(false),
            histograms: Mutex::new(Histogram::default()),
            errors: Mutex::new(Vec::new()),
            order_errors: Mutex::new(Vec::new()),
        }
    }

    /// Deliveries so far, over all subscribers.
    pub fn delivered(&self) -> u64 {
        self.received
            .iter()
            .map(|r| r.load(Ordering::Relaxed))
            .sum()
    }
}

/// What one subscriber saw.
#[derive(Debug)]
pub struct Tally {
    index: usize,
    /// The SSE event type its deliveries carry.
    kind: &'static str,
    count: u64,
    check: SeqCheck,
    /// It failed (its error is in [`Shared::errors`]) and reads no more.
    failed: bool,
}

impl Tally {
    /// Subscriber `index`, receiving events of type `kind` checked by `check`.
    pub fn new(index: usize, kind: &'static str, check: SeqCheck) -> Self {
        Self {
            index,
            kind,
            count: 0,
            check,
            failed: false,
        }
    }

    /// Counts and checks one event. `now` is when the read that completed it returned (ns since
    /// [`Shared::origin`]; 0 until the first event of that read asks for it).
    fn see(
        &mut self,
        event: SseEventRef<'_>,
        now: &mut u64,
        shared: &Shared,
        hist: &mut Histogram,
    ) {
        if event.event != self.kind {
            self.fail(shared, &format!("unexpected {event:?}"));
            return;
        }
        if *now == 0 {
            *now = shared.origin.elapsed().as_nanos() as u64;
        }
        self.count += 1;
        let seq = scan_seq(event.data);
        self.check.see(seq);
        if let Some(sent) = seq
            .and_then(|seq| shared.sent_at.get(seq as usize))
            .map(|t| t.load(Ordering::Relaxed))
            .filter(|&t| t != 0)
        {
            hist.record(now.saturating_sub(sent) / 1000);
        }
    }

    /// Reports its first error at once; the subscriber stops reading.
    fn fail(&mut self, shared: &Shared, error: &str) {
        if std::mem::replace(&mut self.failed, true) {
            return;
        }
        if let Ok(mut errors) = shared.errors.lock() {
            errors.push(format!("subscriber {}: {error}", self.index));
        }
    }

    /// Publishes the running count.
    fn store(&self, shared: &Shared) {
        shared.received[self.index].store(self.count, Ordering::Relaxed);
    }

    /// Hands what it saw to `shared`.
    fn finish(self, shared: &Shared) {
        self.store(shared);
        shared
            .violations
            .fetch_add(self.check.violations, Ordering::Relaxed);
        if let Some(problem) = self.check.first_violation {
            if let Ok(mut all) = shared.order_errors.lock() {
                all.push(format!("subscriber {}: {problem}", self.index));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seq_check_counts_gaps_repeats_and_missing_seqs() {
        let mut check = SeqCheck::new(3, 5);
        for seq in [3, 8, 13] {
            check.see(Some(seq));
        }
        assert_eq!((check.violations, check.next), (0, 18));
        // One lost tick counts once; the check follows on after it.
        check.see(Some(23));
        check.see(Some(28));
        assert_eq!((check.violations, check.next), (1, 33));
        assert_eq!(
            check.first_violation.as_deref(),
            Some("seq 23 arrived, 18 was due")
        );
        check.see(Some(28));
        check.see(None);
        check.see(Some(33));
        assert_eq!((check.violations, check.next), (3, 38));
        let mut full = SeqCheck::new(11, 1);
        for seq in 11..100 {
            full.see(Some(seq));
        }
        assert_eq!(full.violations, 0);
    }
}
