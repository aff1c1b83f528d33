//! Deadlines kept in time order, as mini-redis keeps its expirations: each
//! entry by its key, and beside them the keys ordered by when they are due,
//! so the root context's tick takes only the entries that are due (the
//! first few of the order) rather than scanning every entry.
//!
//! The filter's three kinds of waits (requests held for the router, bodies
//! awaited, waits on the session stream) each keep one of these.

use std::collections::{BTreeSet, HashMap};
use std::hash::Hash;
use std::time::SystemTime;

/// Values of type `V` by key `K`, each due at a deadline.
#[derive(Debug)]
pub struct Deadlines<K, V> {
    entries: HashMap<K, (SystemTime, V)>,
    /// The same keys, by deadline first.
    order: BTreeSet<(SystemTime, K)>,
}

impl<K, V> Default for Deadlines<K, V> {
    fn default() -> Self {
        Deadlines {
            entries: HashMap::new(),
            order: BTreeSet::new(),
        }
    }
}

impl<K: Copy + Ord + Hash, V> Deadlines<K, V> {
    /// `value` under `key`, due at `deadline`; replaces what `key` held,
    /// deadline included.
    pub fn insert(&mut self, key: K, deadline: SystemTime, value: V) {
        if let Some((old, _)) = self.entries.insert(key, (deadline, value)) {
            self.order.remove(&(old, key));
        }
        self.order.insert((deadline, key));
    }

    /// Removes and returns what `key` held.
    pub fn remove(&mut self, key: K) -> Option<V> {
        let (deadline, value) = self.entries.remove(&key)?;
        self.order.remove(&(deadline, key));
        Some(value)
    }

    /// What `key` holds.
    pub fn get(&self, key: K) -> Option<&V> {
        self.entries.get(&key).map(|(_, value)| value)
    }

    /// Every entry.
    pub fn iter(&self) -> impl Iterator<Item = (&K, &V)> {
        self.entries.iter().map(|(key, (_, value))| (key, value))
    }

    /// Every entry, to change its value (not its deadline).
    pub fn iter_mut(&mut self) -> impl Iterator<Item = (&K, &mut V)> {
        self.entries
            .iter_mut()
            .map(|(key, (_, value))| (key, value))
    }

    /// Removes and returns the entries due before `now`, earliest first.
    pub fn expired(&mut self, now: SystemTime) -> Vec<(K, V)> {
        let mut due = Vec::new();
        while let Some(&(deadline, key)) = self.order.first() {
            if deadline >= now {
                break;
            }
            self.order.pop_first();
            if let Some((_, value)) = self.entries.remove(&key) {
                due.push((key, value));
            }
        }
        due
    }

    /// How many entries there are.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when there is none.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn at(ms: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_millis(ms)
    }

    #[test]
    fn entries_expire_once_in_deadline_order_after_their_deadline() {
        let mut d = Deadlines::default();
        d.insert(1u32, at(300), 'a');
        d.insert(2, at(100), 'b');
        d.insert(3, at(200), 'c');
        d.insert(4, at(100), 'd');
        assert_eq!(d.remove(4), Some('d'));
        assert!(
            d.expired(at(100)).is_empty(),
            "due means strictly before now"
        );
        assert_eq!(d.expired(at(250)), [(2, 'b'), (3, 'c')]);
        assert!(d.expired(at(250)).is_empty());
        assert_eq!(d.len(), 1);
        assert_eq!(d.get(1), Some(&'a'));
    }

    #[test]
    fn a_new_deadline_replaces_the_old_one() {
        let mut d = Deadlines::default();
        d.insert(1u32, at(100), 'a');
        d.insert(1, at(500), 'b');
        assert!(d.expired(at(400)).is_empty(), "the old deadline is gone");
        assert_eq!(d.expired(at(501)), [(1, 'b')]);
        assert!(d.is_empty());
    }
}
