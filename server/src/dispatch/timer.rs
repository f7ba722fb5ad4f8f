//! When delayed rows come due. The committer arms one sleep for the earliest entry;
//! when it fires, the types named become claimable again.
//!
//! Bounded: at most [`CAPACITY`] distinct entries are kept. Past that, later entries
//! are dropped and `overflowed` is set; once the kept ones are spent, the committer
//! asks the store for the next due time, so nothing is forgotten, only re-read.

use std::{collections::BTreeSet, sync::Arc};

use spool_proto::time::UnixMillis;

pub const CAPACITY: usize = 4096;

/// What becomes due: one type of a namespace, or (`None`) everything.
pub type Due = Option<(Arc<str>, Arc<str>)>;

#[derive(Default)]
pub struct Timer {
    entries: BTreeSet<(UnixMillis, Due)>,
    overflowed: bool,
}

impl Timer {
    pub fn insert(&mut self, at: UnixMillis, due: Due) {
        if self.entries.len() >= CAPACITY {
            match self.entries.last() {
                Some(last) if last.0 > at => {
                    self.entries.pop_last();
                }
                _ => {
                    self.overflowed = true;
                    return;
                }
            }
            self.overflowed = true;
        }
        self.entries.insert((at, due));
    }

    pub fn next(&self) -> Option<UnixMillis> {
        self.entries.first().map(|e| e.0)
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

    /// True once the kept entries are spent but some were dropped: the caller must
    /// re-read the next due time from the store (and then call [`Timer::refilled`]).
    pub fn needs_refill(&self) -> bool {
        self.overflowed && self.entries.is_empty()
    }

    pub fn refilled(&mut self) {
        self.overflowed = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_earliest_and_reports_overflow() {
        let mut t = Timer::default();
        for i in 0..(CAPACITY as i64 + 10) {
            t.insert(1_000 + i, None);
        }
        t.insert(5, None);
        assert_eq!(t.next(), Some(5));
        assert!(!t.needs_refill());
        let due = t.take_due(i64::MAX);
        assert_eq!(due.len(), CAPACITY);
        assert!(t.needs_refill());
        t.refilled();
        assert!(!t.needs_refill());
    }

    #[test]
    fn take_due_leaves_the_future() {
        let mut t = Timer::default();
        t.insert(10, None);
        t.insert(20, Some(("ns".into(), "ty".into())));
        assert_eq!(t.take_due(15).len(), 1);
        assert_eq!(t.next(), Some(20));
    }
}
