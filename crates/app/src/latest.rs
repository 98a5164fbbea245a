//! The latest state of each of many streams, as this process's own commits left them: the shared
//! core of [`crate::guard_cache::GuardCache`] and [`crate::payment_memory::PaymentMemory`], whose
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

    /// Forgets `keys` (what is remembered of them may be stale).
    pub fn forget<'a>(&self, keys: impl IntoIterator<Item = &'a K>)
    where
        K: 'a,
    {
        let mut states = self.lock();
        for key in keys {
            states.remove(key);
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<K, V>> {
        // Entries are inserted whole; a panic elsewhere cannot leave one half-written.
        self.states.lock().unwrap_or_else(PoisonError::into_inner)
    }
}
