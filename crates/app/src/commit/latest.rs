//! The latest state of each of many streams, as this process's own commits left them: the shared
//! core of [`super::guard_memory::GuardMemory`] and [`super::payment_memory::PaymentMemory`], whose
//! docs say why a remembered state is safe to use. A state never replaces a later one (a late
//! `remember` of an earlier commit is dropped).
//!
//! Bounded: at `MAX` entries, remembering a new stream forgets the one remembered longest ago
//! (first in, first out). Forgetting one entry at a time keeps the memory at its bound under a
//! steady load, where forgetting all at once would swing the process's size between empty and
//! full (and lose every state at once, each then read back from the log).
//!
//! A table that churns at its bound must not grow either. Each forgotten entry can leave a
//! tombstone; once they use up the table's spare room, the table is rehashed, in place only if its
//! entries take at most half its capacity, otherwise into a table twice the size. So the memory
//! makes room for twice its bound when it first fills (the rehashes are then all in place), and a
//! state lives in a box of its own, so that the table's slots are a few words each: a payment's
//! state inline made 550-byte slots, and its table doubled by 18 MB at once, once a run, about
//! 130,000 payments after it filled.

use std::collections::{HashMap, VecDeque};
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
    states: Arc<Mutex<States<K, V>>>,
}

/// The entries and the order they came in. Each entry carries the number of its arrival; `order`
/// lists arrivals oldest first, and an arrival whose entry was forgotten or replaced since (its
/// number no longer the entry's) is skipped when it comes up.
#[derive(Debug)]
struct States<K, V> {
    entries: HashMap<K, (u64, Box<V>)>,
    order: VecDeque<(u64, K)>,
    arrivals: u64,
    /// The table has room for twice the bound (module docs).
    room_made: bool,
}

impl<K, V> Default for States<K, V> {
    fn default() -> Self {
        States {
            entries: HashMap::new(),
            order: VecDeque::new(),
            arrivals: 0,
            room_made: false,
        }
    }
}

impl<K: Eq + Hash + Clone, V> States<K, V> {
    /// Adds `key`, new to the memory, forgetting the oldest entries beyond `max`.
    fn insert_new(&mut self, key: &K, state: V, max: usize) {
        let max = max.max(1);
        if !self.room_made && self.entries.len() + 1 >= max {
            self.entries
                .reserve((2 * max).saturating_sub(self.entries.len()));
            self.room_made = true;
        }
        while self.entries.len() >= max {
            let Some((arrival, oldest)) = self.order.pop_front() else {
                break;
            };
            if self
                .entries
                .get(&oldest)
                .is_some_and(|(a, _)| *a == arrival)
            {
                self.entries.remove(&oldest);
            }
        }
        self.arrivals += 1;
        self.entries
            .insert(key.clone(), (self.arrivals, Box::new(state)));
        self.order.push_back((self.arrivals, key.clone()));
        // Forgotten entries leave their arrivals behind; drop them before they outnumber the
        // entries, so the order stays within twice the bound.
        if self.order.len() > 2 * max {
            let entries = &self.entries;
            self.order
                .retain(|(arrival, key)| entries.get(key).is_some_and(|(a, _)| a == arrival));
        }
    }
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
        match states.entries.get_mut(key) {
            Some((_, known)) if known.version() >= state.version() => {}
            Some((_, known)) => **known = state.clone(),
            None => states.insert_new(key, state.clone(), MAX),
        }
    }

    /// The latest state of `key` remembered, if any.
    pub fn recall(&self, key: &K) -> Option<V> {
        self.lock()
            .entries
            .get(key)
            .map(|(_, state)| V::clone(state))
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
                .entries
                .get(key)
                .is_some_and(|(_, known)| known.version() <= seen.version())
            {
                states.entries.remove(key);
            }
        }
    }

    fn lock(&self) -> MutexGuard<'_, States<K, V>> {
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

    /// Streams 1, 2 and 3 remembered in that order, at version 1, in a memory of three.
    fn full_of_three() -> Latest<u32, DebitGuard, 3> {
        let latest = Latest::default();
        for key in 1..=3 {
            latest.remember(&key, &at(1));
        }
        latest
    }

    /// A decision that read `key` at `version` lost its race.
    fn lost_race<const MAX: usize>(latest: &Latest<u32, DebitGuard, MAX>, key: u32, version: u64) {
        latest.forget_unless_later([(&key, &at(version))]);
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

    #[test]
    fn when_full_the_state_remembered_longest_ago_is_forgotten_first() {
        let latest = full_of_three();
        // A later state of 1 keeps its place: the order is the order streams came in.
        latest.remember(&1, &at(2));
        latest.remember(&4, &at(1));
        assert_eq!(latest.recall(&1), None, "the oldest goes first");
        for key in 2..=4 {
            assert!(latest.recall(&key).is_some(), "{key} stays");
        }
        // A forgotten entry frees its place; its arrival is skipped when it comes up.
        lost_race(&latest, 2, 1);
        latest.remember(&5, &at(1));
        latest.remember(&2, &at(3));
        assert_eq!(latest.recall(&3), None, "3 came before 4 and 5");
        for key in [2, 4, 5] {
            assert!(latest.recall(&key).is_some(), "{key} stays");
        }
    }

    #[test]
    fn a_stream_remembered_again_after_being_forgotten_keeps_its_new_place() {
        let latest = full_of_three();
        lost_race(&latest, 1, 1);
        latest.remember(&1, &at(2));
        // 1's first arrival is the oldest in the order, but 1 came back after 2 and 3.
        latest.remember(&4, &at(1));
        assert_eq!(latest.recall(&2), None, "2 is the oldest entry");
        for key in [1, 3, 4] {
            assert!(latest.recall(&key).is_some(), "{key} stays");
        }
    }

    #[test]
    fn the_table_never_grows_once_full_however_long_it_churns() {
        let latest: Latest<u32, DebitGuard, 1_024> = Latest::default();
        for key in 0..1_024 {
            latest.remember(&key, &at(1));
        }
        let full = latest.lock().entries.capacity();
        // Each new stream forgets the oldest: a tombstone and an insert, two hundred times over.
        for key in 1_024..200_000 {
            latest.remember(&key, &at(1));
            let capacity = latest.lock().entries.capacity();
            assert!(
                capacity <= full,
                "after {key} streams the table has room for {capacity} entries, {full} when full"
            );
        }
        assert_eq!(latest.lock().entries.len(), 1_024);
    }

    #[test]
    fn the_order_stays_bounded_however_often_entries_are_forgotten() {
        let latest: Latest<u32, DebitGuard, 4> = Latest::default();
        for round in 0..1_000u32 {
            latest.remember(&(round % 7), &at(1));
            lost_race(&latest, round % 7, 1);
        }
        let states = latest.lock();
        assert!(
            states.order.len() <= 8,
            "{} arrivals kept",
            states.order.len()
        );
        assert!(states.entries.is_empty());
    }
}
