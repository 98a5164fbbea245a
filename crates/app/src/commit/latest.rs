//! The latest state of each of many streams, as this process's own commits left them: the shared
//! core of [`super::guard_memory::GuardMemory`] and [`super::payment_memory::PaymentMemory`], whose
//! docs say why a remembered state is safe to use. Bounded: at `MAX` entries it starts over; a
//! state never replaces a later one (a late `remember` of an earlier commit is dropped).

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use asiento_domain::guard::DebitGuard;
use asiento_domain::Payment;

/// A stream's state that knows the stream version it stands for.
pub trait Versioned {
    fn version(&self) -> u64;
}

impl Versioned for DebitGuard {
    fn version(&self) -> u64 {
        self.version
    }
}

impl Versioned for Payment {
    fn version(&self) -> u64 {
        self.version
    }
}

/// See the module docs. Cheap to clone; clones share one memory.
#[derive(Debug)]
pub struct Latest<K, V, const MAX: usize> {
    states: Arc<Mutex<HashMap<K, V>>>,
}

impl<K, V, const MAX: usize> Clone for Latest<K, V, MAX> {
    fn clone(&self) -> Self {
        Latest {
            states: Arc::clone(&self.states),
        }
    }
}

impl<K, V, const MAX: usize> Default for Latest<K, V, MAX> {
    fn default() -> Self {
        Latest {
            states: Arc::default(),
        }
    }
}

impl<K: Eq + Hash + Clone, V: Versioned + Clone, const MAX: usize> Latest<K, V, MAX> {
    /// `state` was committed: remember it, unless a later state of `key` is remembered already.
    pub fn remember(&self, key: &K, state: &V) {
        let mut states = self.lock();
        if states
            .get(key)
            .is_some_and(|known| known.version() >= state.version())
        {
            return;
        }
        if states.len() >= MAX && !states.contains_key(key) {
            states.clear();
        }
        states.insert(key.clone(), state.clone());
    }

    /// The latest state of `key` remembered, if any.
    pub fn recall(&self, key: &K) -> Option<V> {
        self.lock().get(key).cloned()
    }

    /// Forgets each of `read` (the states a decision read, which then lost a version race) unless
    /// a later state of it is remembered since: the one read is stale, while a later one is most
    /// often the state the winner left.
    pub fn forget_unless_later<'a>(&self, read: impl IntoIterator<Item = (&'a K, &'a V)>)
    where
        K: 'a,
        V: 'a,
    {
        let mut states = self.lock();
        for (key, seen) in read {
            if states
                .get(key)
                .is_some_and(|known| known.version() <= seen.version())
            {
                states.remove(key);
            }
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<K, V>> {
        // Entries are inserted whole; a panic elsewhere cannot leave one half-written.
        self.states.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(version: u64) -> DebitGuard {
        DebitGuard {
            version,
            ..DebitGuard::default()
        }
    }

    #[test]
    fn a_lost_race_forgets_the_state_read_but_keeps_a_later_one() {
        let latest: Latest<&str, DebitGuard, 8> = Latest::default();
        latest.remember(&"a", &at(3));
        latest.remember(&"b", &at(5));
        // A decision read both at those versions; meanwhile this process wrote b to 6.
        let read = [("a", at(3)), ("b", at(5))];
        latest.remember(&"b", &at(6));
        latest.forget_unless_later(read.iter().map(|(key, state)| (key, state)));
        assert_eq!(latest.recall(&"a"), None, "the state read is stale");
        assert_eq!(latest.recall(&"b").map(|s| s.version), Some(6));
    }
}
