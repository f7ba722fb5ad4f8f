//! When delayed rows come due. The committer arms one sleep for the earliest time
//! the timer knows of; when it fires, the types named become claimable again.
//!
//! The store is the source of truth; the timer is a bounded cache of its next due
//! times. It keeps at most [`CAPACITY`] entries. Whatever it cannot keep (a later
//! time when full, or one evicted for an earlier one), and everything before the
//! first read, it records as `unknown_after`: from that instant on, the caller must
//! mark everything due and re-read the next due times from the store. So no row is
//! ever forgotten, only re-read.

use std::{collections::BTreeSet, sync::Arc};

use spool_proto::time::UnixMillis;

pub const CAPACITY: usize = 4096;

/// What becomes due: one type of a namespace, or (`None`) everything.
pub type Due = Option<(Arc<str>, Arc<str>)>;

pub struct Timer {
    entries: BTreeSet<(UnixMillis, Due)>,
    /// The earliest time this timer may have lost track of (`None`: it knows every
    /// due time the store has).
    unknown_after: Option<UnixMillis>,
}

impl Default for Timer {
    /// A timer that knows nothing yet: the store must be read at once.
    fn default() -> Self {
        Self {
            entries: BTreeSet::new(),
            unknown_after: Some(UnixMillis::MIN),
        }
    }
}

impl Timer {
    pub fn insert(&mut self, at: UnixMillis, due: Due) {
        if self.entries.len() >= CAPACITY {
            match self.entries.last() {
                Some(last) if last.0 > at => {
                    let evicted = last.0;
                    self.entries.pop_last();
                    self.lose(evicted);
                }
                _ => {
                    self.lose(at);
                    return;
                }
            }
        }
        self.entries.insert((at, due));
    }

    fn lose(&mut self, at: UnixMillis) {
        self.unknown_after = Some(self.unknown_after.map_or(at, |t| t.min(at)));
    }

    /// When the caller must next act: the earliest entry, or the time from which
    /// the store must be read again.
    pub fn next(&self) -> Option<UnixMillis> {
        let first = self.entries.first().map(|e| e.0);
        match (first, self.unknown_after) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Removes and returns everything due at `now`.
    pub fn take_due(&mut self, now: UnixMillis) -> Vec<Due> {
        let mut due = Vec::new();
        while let Some(first) = self.entries.first() {
            if first.0 > now {
                break;
            }
            if let Some((_, d)) = self.entries.pop_first() {
                due.push(d);
            }
        }
        due
    }

    /// True when rows this timer does not know of may be due by `now`: the caller
    /// marks everything due and re-reads the store (then calls [`Timer::read`]).
    pub fn must_read_store(&self, now: UnixMillis) -> bool {
        self.unknown_after.is_some_and(|t| t <= now)
    }

    /// Makes the store be read again by `at` at the latest (a safety net for what
    /// other nodes may have changed without this one hearing of it).
    pub fn read_again_by(&mut self, at: UnixMillis) {
        self.lose(at);
    }

    /// After a failed read: try again at `at`.
    pub fn read_again_at(&mut self, at: UnixMillis) {
        self.unknown_after = Some(at);
    }

    /// Records a read of the store's next due times (earliest first). An
    /// incomplete read may have left out rows due at or after its last time.
    pub fn read(&mut self, times: Vec<(UnixMillis, Due)>, complete: bool) {
        self.unknown_after = if complete {
            None
        } else {
            times.last().map(|t| t.0)
        };
        for (at, due) in times {
            self.insert(at, due);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn starts_by_asking_for_the_store() {
        let t = Timer::default();
        assert!(t.must_read_store(0));
        assert_eq!(t.next(), Some(UnixMillis::MIN));
    }

    #[test]
    fn what_it_cannot_keep_makes_it_read_the_store_in_time() {
        let mut t = Timer::default();
        t.read(Vec::new(), true);
        assert!(!t.must_read_store(i64::MAX));
        for i in 0..CAPACITY as i64 {
            t.insert(1_000 + i, None);
        }
        // Full: a later time is not kept, but remembered as unknown.
        t.insert(50_000, None);
        assert!(!t.must_read_store(49_999));
        assert!(t.must_read_store(50_000));
        // An earlier time evicts the latest kept one, which becomes the unknown.
        t.insert(5, None);
        assert_eq!(t.next(), Some(5));
        assert!(t.must_read_store(1_000 + CAPACITY as i64 - 1));
        assert!(!t.must_read_store(1_000 + CAPACITY as i64 - 2));
    }

    #[test]
    fn an_incomplete_read_leaves_the_rest_for_later() {
        let mut t = Timer::default();
        t.read(vec![(100, None), (200, None)], false);
        assert!(!t.must_read_store(199));
        assert!(t.must_read_store(200));
        let mut complete = Timer::default();
        complete.read(vec![(10, None)], true);
        assert!(!complete.must_read_store(i64::MAX));
    }

    #[test]
    fn take_due_leaves_the_future() {
        let mut t = Timer::default();
        t.read(Vec::new(), true);
        t.insert(10, None);
        t.insert(20, Some(("ns".into(), "ty".into())));
        assert_eq!(t.take_due(15).len(), 1);
        assert_eq!(t.next(), Some(20));
    }
}
