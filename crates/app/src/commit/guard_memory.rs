//! The memory of the debit guards this process wrote itself, shared by the payment flow and the
//! ledger flow.
//!
//! A decision that posts to a guarded account appends to that account's guard stream at the exact
//! version it read. So a remembered guard state that is stale (another process, or another flow,
//! appended since) can only make that append conflict; it can never write a wrong balance. The
//! conflict makes the writer forget the states it read ([`GuardMemory::lost_race`]), and the retry
//! reads them from the log, unless this process remembered a later state of a guard since: the
//! race was then most often lost to one of its own steps in flight, and the retry decides against
//! what that step left (stale too, it only conflicts once more, and is then read from the log).
//! A stale state must not leak out without an append either:
//!
//! - payment decisions are provider facts, which a guard flags but never refuses;
//! - a ledger command that a remembered state refuses (`insufficient_funds`, a frozen account) is
//!   decided again against the log before the refusal is answered ([`Loaded::remembered`]): only
//!   what the log says refuses a command. What the memory holds stays (it is a state the log
//!   held); a command decided on it that is not refused conflicts, and the writer forgets it.
//!
//! So after each commit the writer remembers the state its appends left each guard in
//! (`super::writer`), and a flow reads the log only for guards this process has not written since
//! it started (or that conflicted): no read at all for a transfer between accounts this process
//! moved money on before.
//!
//! A ledger command that reads a guard while a step of this process is writing it (with group
//! commit) would decide against the state that step is changing, and could only lose the race to
//! it: a statement spent for nothing, and a retry. So a command first takes its turn on its guards
//! ([`GuardMemory::take_turn`]: commands of this process on one guard go one at a time, in the
//! order they came, `super::turns`), then waits, a bounded time, until no step of this process (a
//! provider fact, or a command that takes no turn) is writing them
//! ([`GuardMemory::load_after_writes`]; a step marks its guards while it is written,
//! [`GuardMemory::writing`]), and then decides against what the writer left in memory.
//!
//! Bounded: when full, remembering a new guard forgets the one remembered longest ago.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use asiento_domain::guard::{self, DebitGuard, GuardKey};
use asiento_domain::JournalEntry;
use asiento_eventstore::EventStore;
use tokio::sync::Notify;

use super::latest::Latest;
use super::step::GuardWrite;
use super::turns::{Turn, Turns};
use crate::log::{self, LogError};

/// Guards remembered at most; past that the one remembered longest ago is forgotten.
pub const GUARDS_MAX: usize = 65_536;

/// Guard states loaded for a decision.
#[derive(Debug, Clone)]
pub struct Loaded {
    pub states: BTreeMap<GuardKey, DebitGuard>,
    /// Some of them came from memory, not the log: a refusal decided against them must be
    /// decided again against the log (`log::load_guards`).
    pub remembered: bool,
}

/// How long a command waits, at most, for the steps of this process writing its guards: past
/// that it decides on what it has, which at worst loses a race and is decided again.
pub const WRITES_WAIT_MAX: Duration = Duration::from_millis(500);

/// Shared by clones: one per process is the point.
#[derive(Debug, Clone, Default)]
pub struct GuardMemory {
    states: Latest<GuardKey, DebitGuard, GUARDS_MAX>,
    writing: Arc<Writing>,
    turns: Arc<Turns>,
}

/// The guards steps of this process are writing.
#[derive(Debug, Default)]
struct Writing {
    counts: Mutex<HashMap<GuardKey, Busy>>,
}

/// A guard being written: by how many steps, and the signal given when the last is done, which
/// wakes only the commands waiting for this guard.
#[derive(Debug, Default)]
struct Busy {
    steps: usize,
    done: Arc<Notify>,
}

impl Writing {
    fn counts(&self) -> std::sync::MutexGuard<'_, HashMap<GuardKey, Busy>> {
        // Counts change whole under the lock; a panic elsewhere cannot leave one half-written.
        self.counts.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A step's guards marked as being written ([`GuardMemory::writing`]), until it is dropped.
#[must_use = "the guards are marked only while this is held"]
pub struct WritingGuards {
    writing: Arc<Writing>,
    keys: Vec<GuardKey>,
}

impl Drop for WritingGuards {
    fn drop(&mut self) {
        let mut counts = self.writing.counts();
        for key in &self.keys {
            if let Some(busy) = counts.get_mut(key) {
                busy.steps -= 1;
                if busy.steps == 0 {
                    // Under the lock, where waiters register: none can miss it.
                    if let Some(busy) = counts.remove(key) {
                        busy.done.notify_waiters();
                    }
                }
            }
        }
    }
}

impl GuardMemory {
    /// The guards every entry in `entries` touches: remembered, or read from the log (those at
    /// once, each in a statement of its own).
    pub async fn load<'a>(
        &self,
        store: &dyn EventStore,
        entries: impl IntoIterator<Item = &'a JournalEntry>,
    ) -> Result<Loaded, LogError> {
        self.load_keys(store, entries.into_iter().flat_map(guard::guarded_keys))
            .await
    }

    /// [`GuardMemory::load`] of the guards `keys`.
    async fn load_keys(
        &self,
        store: &dyn EventStore,
        keys: impl IntoIterator<Item = GuardKey>,
    ) -> Result<Loaded, LogError> {
        let mut states = BTreeMap::new();
        let mut missing = BTreeSet::new();
        for key in keys {
            match self.states.recall(&key) {
                Some(state) => {
                    states.insert(key, state);
                }
                None => {
                    missing.insert(key);
                }
            }
        }
        let remembered = !states.is_empty();
        let read =
            futures::future::try_join_all(missing.iter().map(|key| log::load_guard(store, key)))
                .await?;
        states.extend(missing.into_iter().zip(read));
        Ok(Loaded { states, remembered })
    }

    /// Waits for this process's turn to decide and write a command on the guards `entries` touch
    /// (`super::turns`), and puts it in `turn`; a turn on exactly those guards is kept.
    pub async fn take_turn<'a>(
        &self,
        entries: impl IntoIterator<Item = &'a JournalEntry>,
        turn: &mut Turn,
    ) {
        let keys = entries.into_iter().flat_map(guard::guarded_keys).collect();
        self.turns.take(keys, turn).await;
    }

    /// [`GuardMemory::load`], once no step of this process is writing any of the guards (or
    /// after [`WRITES_WAIT_MAX`]).
    pub async fn load_after_writes<'a>(
        &self,
        store: &dyn EventStore,
        entries: impl IntoIterator<Item = &'a JournalEntry>,
    ) -> Result<Loaded, LogError> {
        let keys: Vec<GuardKey> = entries.into_iter().flat_map(guard::guarded_keys).collect();
        let deadline = tokio::time::Instant::now() + WRITES_WAIT_MAX;
        loop {
            let done = {
                let counts = self.writing.counts();
                let Some(busy) = keys.iter().find_map(|key| counts.get(key)) else {
                    break;
                };
                // Registered under the lock, where the write's end is signalled: not missed.
                Arc::clone(&busy.done).notified_owned()
            };
            if tokio::time::timeout_at(deadline, done).await.is_err() {
                break;
            }
        }
        self.load_keys(store, keys).await
    }

    /// Marks `keys` as being written by a step of this process until the result is dropped,
    /// which must be after the step's outcome is in memory ([`GuardMemory::wrote`],
    /// [`GuardMemory::lost_race`]).
    pub(super) fn writing(&self, keys: impl IntoIterator<Item = GuardKey>) -> WritingGuards {
        let keys: Vec<GuardKey> = keys.into_iter().collect();
        let mut counts = self.writing.counts();
        for key in &keys {
            counts.entry(key.clone()).or_default().steps += 1;
        }
        WritingGuards {
            writing: Arc::clone(&self.writing),
            keys,
        }
    }

    /// Remembers what a committed decision left each guard in (`written`: the states it read and
    /// what it appended to them), as a read of the log would give it. A state older than the one
    /// remembered (a later commit was remembered first) is dropped.
    pub(super) fn wrote(&self, written: &GuardWrite) {
        for append in &written.appends {
            let start = written.read.get(&append.key).copied().unwrap_or_default();
            debug_assert_eq!(
                start.version, append.expected_version,
                "a written append's guard state is the one it was decided against"
            );
            // As a read of the log gives it (`log::load_guard`): from the last event written.
            if let Some(last) = append.events.last() {
                let version = start.version + append.events.len() as u64;
                self.states
                    .remember(&append.key, &DebitGuard::from_last(version, last));
            }
        }
    }

    /// Remembers states the writer tells (a step it rebased: `plan`).
    pub(super) fn remember(&self, states: &[(GuardKey, DebitGuard)]) {
        for (key, state) in states {
            self.states.remember(key, state);
        }
    }

    /// A decision on `read` was not written (it lost a version race, or failed): forgets those
    /// guards, except where this process remembered a later state since (the winner was one of
    /// its own steps), which the decision is then taken again against without reading the log.
    pub(super) fn lost_race(&self, read: &BTreeMap<GuardKey, DebitGuard>) {
        self.states.forget_unless_later(read);
    }

    /// The state remembered for `key`, if any.
    pub fn remembered(&self, key: &GuardKey) -> Option<DebitGuard> {
        self.states.recall(key)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::future::Future;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use asiento_domain::{AccountName, Amount, Currency, EntryId, Leg, TenantId};
    use asiento_eventstore::{scratch, Database};

    use super::*;

    fn transfer_entry() -> JournalEntry {
        entry_between("customer:1:available", "customer:2:available")
    }

    fn entry_between(from: &str, to: &str) -> JournalEntry {
        let currency = Currency::parse("USD").unwrap();
        let leg = |account: &str, minor| {
            Leg::new(
                AccountName::parse(account).unwrap(),
                currency,
                Amount::new(minor),
            )
        };
        JournalEntry::new(
            EntryId::from_uuid(uuid::Uuid::now_v7()),
            TenantId::parse("acme").unwrap(),
            vec![leg(from, -500), leg(to, 500)],
            None,
        )
        .unwrap()
    }

    fn at(version: u64) -> DebitGuard {
        DebitGuard {
            version,
            ..DebitGuard::default()
        }
    }

    /// A cache that remembers `entry`'s guards at `version`, and a store it need not read.
    async fn remembering(
        entry: &JournalEntry,
        version: u64,
    ) -> (GuardMemory, Arc<dyn EventStore>, tempfile::TempDir) {
        let (dir, url) = scratch::temp_sqlite_url();
        let store = Database::connect(&url).await.unwrap().event_store();
        let cache = GuardMemory::default();
        let states: Vec<(GuardKey, DebitGuard)> = guard::guarded_keys(entry)
            .into_iter()
            .map(|key| (key, at(version)))
            .collect();
        assert!(!states.is_empty(), "the entry touches guarded accounts");
        cache.remember(&states);
        (cache, store, dir)
    }

    #[tokio::test]
    async fn a_transfer_waits_for_this_process_writing_its_guards_and_reads_what_that_left() {
        let entry = transfer_entry();
        let (cache, store, _dir) = remembering(&entry, 1).await;
        let keys = guard::guarded_keys(&entry);
        let writing = cache.writing(keys.clone());
        let load = {
            let (cache, entry) = (cache.clone(), entry.clone());
            tokio::spawn(async move {
                cache
                    .load_after_writes(store.as_ref(), [&entry])
                    .await
                    .unwrap()
            })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(
            !load.is_finished(),
            "it waits while a command of this process writes its guards"
        );
        let written: Vec<(GuardKey, DebitGuard)> =
            keys.iter().map(|key| (key.clone(), at(2))).collect();
        cache.remember(&written);
        drop(writing);
        let loaded = load.await.unwrap();
        assert!(loaded.remembered);
        assert!(
            loaded.states.values().all(|state| state.version == 2),
            "then it decides against what that command left: {:?}",
            loaded.states
        );
    }

    #[tokio::test]
    async fn a_waiting_transfer_is_woken_by_the_writes_of_its_own_guards_only() {
        struct Wakes(AtomicUsize);
        impl futures::task::ArcWake for Wakes {
            fn wake_by_ref(wakes: &Arc<Self>) {
                wakes.0.fetch_add(1, Ordering::SeqCst);
            }
        }
        let entry = transfer_entry();
        let (cache, store, _dir) = remembering(&entry, 1).await;
        let mine = cache.writing(guard::guarded_keys(&entry));
        let other = cache.writing(guard::guarded_keys(&entry_between(
            "customer:3:available",
            "customer:4:available",
        )));
        let wakes = Arc::new(Wakes(AtomicUsize::new(0)));
        let waker = futures::task::waker(Arc::clone(&wakes));
        let mut load = std::pin::pin!(cache.load_after_writes(store.as_ref(), [&entry]));
        assert!(load
            .as_mut()
            .poll(&mut std::task::Context::from_waker(&waker))
            .is_pending());
        drop(other);
        assert_eq!(
            wakes.0.load(Ordering::SeqCst),
            0,
            "another guard's write ending does not wake it"
        );
        drop(mine);
        assert_eq!(
            wakes.0.load(Ordering::SeqCst),
            1,
            "its own guard's write ending does"
        );
        assert!(load.await.unwrap().states.values().all(|s| s.version == 1));
    }

    #[tokio::test]
    async fn a_write_that_does_not_end_holds_a_transfer_back_a_bounded_time() {
        let entry = transfer_entry();
        let (cache, store, _dir) = remembering(&entry, 1).await;
        let _writing = cache.writing(guard::guarded_keys(&entry));
        let loaded = tokio::time::timeout(
            WRITES_WAIT_MAX * 4,
            cache.load_after_writes(store.as_ref(), [&entry]),
        )
        .await
        .expect("the wait is bounded")
        .unwrap();
        assert!(loaded.states.values().all(|state| state.version == 1));
    }

    #[test]
    fn a_guard_written_by_two_commands_is_free_once_both_are_done() {
        let cache = GuardMemory::default();
        let keys = guard::guarded_keys(&transfer_entry());
        let first = cache.writing(keys.clone());
        let second = cache.writing(keys.clone());
        drop(first);
        assert!(keys
            .iter()
            .all(|key| cache.writing.counts().get(key).map(|busy| busy.steps) == Some(1)));
        drop(second);
        assert!(cache.writing.counts().is_empty());
    }
}
