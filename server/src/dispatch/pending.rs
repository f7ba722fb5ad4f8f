//! Waiters on outcomes: `Wait` calls parked until their activity changes state.
//!
//! Keyed by `(namespace, workflow_id, activity_id)`. A waiter registers *before* it
//! reads the row, so a change committed between the read and the park still wakes
//! it. Entries live only while someone waits; the store is never polled.

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
}

impl Pending {
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

    #[tokio::test]
    async fn a_notify_after_enable_is_not_lost_and_entries_are_removed() {
        let pending = Arc::new(Pending::default());
        let waiter = pending.watch(key());
        let changed = waiter.changed();
        pending.notify(&key());
        tokio::time::timeout(std::time::Duration::from_secs(1), changed)
            .await
            .map_err(|_| "notify was lost")
            .unwrap_or_else(|e| panic!("{e}"));
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
        tokio::time::timeout(std::time::Duration::from_secs(1), changed)
            .await
            .map_err(|_| "notify was lost")
            .unwrap_or_else(|e| panic!("{e}"));
        drop(second);
        assert_eq!(pending.len(), 0);
    }
}
