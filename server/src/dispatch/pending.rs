//! Waiters on outcomes: `Wait` calls parked until their activity changes state.
//!
//! Keyed by `(namespace, workflow_id, activity_id)`. A waiter registers *before* it
//! reads the row, so a change committed between the read and the park still wakes
//! it. Entries live only while someone waits; the store is never polled.
//!
//! Parked calls are bounded per caller and in all (`--max-waits-per-token`,
//! `--max-waits`): each holds a [`ParkedPlace`] while it waits.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
};

use tokio::sync::Notify;

use crate::store::Key;

#[derive(Default)]
pub struct Pending {
    /// Per key: how many waiters hold a [`Waiter`], and the `Notify` they park on.
    waiters: Mutex<HashMap<Key, (usize, Arc<Notify>)>>,
    parked: Arc<Parked>,
}

/// How many calls are parked, per caller and in all, and the caps on both.
struct Parked {
    per_caller: usize,
    total: usize,
    /// Parked in all, and per caller (a caller with none has no entry).
    state: Mutex<(usize, HashMap<Arc<str>, usize>)>,
}

impl Default for Parked {
    fn default() -> Self {
        Self {
            per_caller: usize::MAX,
            total: usize::MAX,
            state: Mutex::default(),
        }
    }
}

/// Why a call may not park.
#[derive(Debug, PartialEq, Eq)]
pub enum Full {
    /// Its caller has this many parked already.
    Caller(usize),
    /// This node has this many parked already.
    Total(usize),
}

/// One parked call's place; dropping it frees the place.
pub struct ParkedPlace {
    parked: Arc<Parked>,
    caller: Arc<str>,
}

impl Drop for ParkedPlace {
    fn drop(&mut self) {
        let mut state = self.parked.state.lock().unwrap_or_else(|e| e.into_inner());
        state.0 = state.0.saturating_sub(1);
        if let Some(n) = state.1.get_mut(&self.caller) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                state.1.remove(&self.caller);
            }
        }
    }
}

impl Pending {
    /// Waiters with at most `per_caller` calls parked per caller and `total` in all.
    pub fn with_limits(per_caller: usize, total: usize) -> Self {
        Self {
            waiters: Mutex::default(),
            parked: Arc::new(Parked {
                per_caller,
                total,
                state: Mutex::default(),
            }),
        }
    }

    /// A place for one more call of `caller` to park, unless a cap is reached.
    pub fn park(&self, caller: &Arc<str>) -> Result<ParkedPlace, Full> {
        let parked = &self.parked;
        let mut state = parked.state.lock().unwrap_or_else(|e| e.into_inner());
        if state.0 >= parked.total {
            return Err(Full::Total(state.0));
        }
        let mine = state.1.get(caller).copied().unwrap_or(0);
        if mine >= parked.per_caller {
            return Err(Full::Caller(mine));
        }
        state.0 += 1;
        *state.1.entry(caller.clone()).or_insert(0) += 1;
        Ok(ParkedPlace {
            parked: parked.clone(),
            caller: caller.clone(),
        })
    }

    /// Registers interest in `key`; the returned waiter is woken by [`Pending::notify`]
    /// for any change committed after this call.
    pub fn watch(self: &Arc<Self>, key: Key) -> Waiter {
        let notify = {
            let mut map = self.waiters.lock().unwrap_or_else(|e| e.into_inner());
            let entry = map
                .entry(key.clone())
                .or_insert_with(|| (0, Arc::new(Notify::new())));
            entry.0 += 1;
            entry.1.clone()
        };
        Waiter {
            pending: self.clone(),
            key,
            notify,
        }
    }

    /// Wakes every waiter of `key`. Called after the change is committed.
    pub fn notify(&self, key: &Key) {
        let map = self.waiters.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, notify)) = map.get(key) {
            notify.notify_waiters();
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.waiters.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

/// A registered interest; dropping it unregisters.
pub struct Waiter {
    pending: Arc<Pending>,
    key: Key,
    notify: Arc<Notify>,
}

impl Waiter {
    /// A future that completes at the next notify. Create it (and `enable` it) before
    /// reading the state it guards.
    pub fn changed(&self) -> std::pin::Pin<Box<tokio::sync::futures::Notified<'_>>> {
        let mut notified = Box::pin(self.notify.notified());
        notified.as_mut().enable();
        notified
    }
}

impl Drop for Waiter {
    fn drop(&mut self) {
        let mut map = self
            .pending
            .waiters
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if let Some(entry) = map.get_mut(&self.key) {
            entry.0 -= 1;
            if entry.0 == 0 {
                map.remove(&self.key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> Key {
        Key {
            namespace: "default".into(),
            workflow_id: "w".into(),
            activity_id: "a".into(),
        }
    }

    /// Waits for `changed`, failing the test if the notify that fires it was lost.
    async fn notified(changed: impl std::future::Future<Output = ()>) {
        tokio::time::timeout(std::time::Duration::from_secs(1), changed)
            .await
            .unwrap_or_else(|_| panic!("notify was lost"));
    }

    #[tokio::test]
    async fn a_notify_after_enable_is_not_lost_and_entries_are_removed() {
        let pending = Arc::new(Pending::default());
        let waiter = pending.watch(key());
        let changed = waiter.changed();
        pending.notify(&key());
        notified(changed).await;
        assert_eq!(pending.len(), 1);
        drop(waiter);
        assert_eq!(pending.len(), 0);
    }

    /// One key, two waiters: dropping one keeps the other's registration, and a
    /// later notify still reaches it.
    #[tokio::test]
    async fn a_waiter_leaving_does_not_unregister_another() {
        let pending = Arc::new(Pending::default());
        let first = pending.watch(key());
        let second = pending.watch(key());
        drop(first);
        assert_eq!(pending.len(), 1);
        let changed = second.changed();
        pending.notify(&key());
        notified(changed).await;
        drop(second);
        assert_eq!(pending.len(), 0);
    }

    #[test]
    fn parked_calls_are_capped_per_caller_and_in_all() {
        let pending = Pending::with_limits(2, 3);
        let (a, b): (Arc<str>, Arc<str>) = ("a".into(), "b".into());
        let first = pending.park(&a).map_err(|e| format!("{e:?}"));
        let _second = pending.park(&a).map_err(|e| format!("{e:?}"));
        assert_eq!(pending.park(&a).err(), Some(Full::Caller(2)));
        let _third = pending.park(&b).map_err(|e| format!("{e:?}"));
        assert_eq!(pending.park(&b).err(), Some(Full::Total(3)));
        drop(first);
        assert!(pending.park(&a).is_ok(), "a place freed is taken again");
    }
}
