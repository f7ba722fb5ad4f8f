//! An attempt's identity as the wire names it, `(workflow_id, activity_id,
//! attempt)`, as a map key that is looked up by borrowed ids: the server and the
//! SDK look attempts up once per result, ack and heartbeat, and a key built for
//! each lookup would cost two allocations every time.
//!
//! The invariant that makes borrowed lookups sound: an [`AttemptKey`] hashes and
//! compares exactly as its [`Ids`] do (the `Borrow` contract).

use std::{
    borrow::Borrow,
    hash::{Hash, Hasher},
};

/// An owned attempt key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AttemptKey {
    pub workflow_id: String,
    pub activity_id: String,
    pub attempt: u32,
}

impl AttemptKey {
    pub fn new(
        workflow_id: impl Into<String>,
        activity_id: impl Into<String>,
        attempt: u32,
    ) -> Self {
        Self {
            workflow_id: workflow_id.into(),
            activity_id: activity_id.into(),
            attempt,
        }
    }
}

/// An attempt's ids, owned or borrowed: what a map of [`AttemptKey`]s is looked up
/// by (`map.get(Ids::new(w, a, n).key())`).
pub trait AttemptIds {
    fn ids(&self) -> (&str, &str, u32);
}

impl AttemptIds for AttemptKey {
    fn ids(&self) -> (&str, &str, u32) {
        (&self.workflow_id, &self.activity_id, self.attempt)
    }
}

/// Borrowed ids, to look a key up without building one.
#[derive(Clone, Copy, Debug)]
pub struct Ids<'a> {
    workflow_id: &'a str,
    activity_id: &'a str,
    attempt: u32,
}

impl<'a> Ids<'a> {
    pub fn new(workflow_id: &'a str, activity_id: &'a str, attempt: u32) -> Self {
        Self {
            workflow_id,
            activity_id,
            attempt,
        }
    }

    /// What a map of [`AttemptKey`]s takes as a key to look up.
    pub fn key(&self) -> &(dyn AttemptIds + 'a) {
        self
    }
}

impl AttemptIds for Ids<'_> {
    fn ids(&self) -> (&str, &str, u32) {
        (self.workflow_id, self.activity_id, self.attempt)
    }
}

impl Hash for AttemptKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.ids().hash(state);
    }
}

impl<'a> Borrow<dyn AttemptIds + 'a> for AttemptKey {
    fn borrow(&self) -> &(dyn AttemptIds + 'a) {
        self
    }
}

impl Hash for dyn AttemptIds + '_ {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.ids().hash(state);
    }
}

impl PartialEq for dyn AttemptIds + '_ {
    fn eq(&self, other: &Self) -> bool {
        self.ids() == other.ids()
    }
}

impl Eq for dyn AttemptIds + '_ {}

#[cfg(test)]
mod tests {
    use std::collections::{HashMap, HashSet};

    use super::*;

    #[test]
    fn a_key_is_found_by_borrowed_ids_and_only_by_its_own() {
        let mut map = HashMap::new();
        map.insert(AttemptKey::new("wf", "a", 1), "first");
        map.insert(AttemptKey::new("wf", "a", 2), "second");
        map.insert(AttemptKey::new("wf-a", "", 1), "other split");
        assert_eq!(map.get(Ids::new("wf", "a", 1).key()), Some(&"first"));
        assert_eq!(map.get(Ids::new("wf", "a", 2).key()), Some(&"second"));
        assert_eq!(map.get(Ids::new("wf-a", "", 1).key()), Some(&"other split"));
        assert_eq!(map.get(Ids::new("wf", "a", 3).key()), None);
        assert_eq!(map.get(Ids::new("w", "fa", 1).key()), None);
        assert_eq!(map.remove(Ids::new("wf", "a", 1).key()), Some("first"));
        assert_eq!(map.len(), 2);

        let set: HashSet<AttemptKey> = [AttemptKey::new("x", "y", 7)].into();
        assert!(set.contains(Ids::new("x", "y", 7).key()));
        assert!(!set.contains(Ids::new("x", "y", 8).key()));
    }
}
