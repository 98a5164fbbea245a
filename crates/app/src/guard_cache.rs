//! The payment flow's memory of the debit guards it wrote itself.
//!
//! A payment decision that posts to a guarded account (`customer:…`) appends to that account's
//! guard stream at the exact version it read. So a remembered guard state that is stale (another
//! process, or another flow, appended since) can only make that append conflict; it can never
//! write a wrong balance. The conflict makes the flow forget the decision's guards, and its retry
//! reads them from the log. And a stale state cannot leak out without an append either: payment
//! decisions are provider facts, which a guard flags but never refuses. (Transfers are commands
//! that a guard refuses; they read the log every time.)
//!
//! So after each commit the flow remembers the state its appends left each guard in, and reads the
//! log only for guards it has not written since it started (or that conflicted): one statement
//! fewer per payment decision in the common case, a customer paying more than once.
//!
//! Bounded: when full, it forgets everything and starts over.

use std::collections::BTreeMap;

use asiento_domain::guard::{self, DebitGuard, GuardAppend, GuardKey};
use asiento_domain::JournalEntry;
use asiento_eventstore::EventStore;

use crate::latest::Latest;
use crate::log::{self, LogError};

/// Guards remembered at most; past that the memory starts over empty.
pub const GUARDS_MAX: usize = 65_536;

/// Shared by clones: one per process is the point.
#[derive(Debug, Clone, Default)]
pub struct GuardCache {
    states: Latest<GuardKey, DebitGuard, GUARDS_MAX>,
}

impl GuardCache {
    /// The guards every entry in `entries` touches: remembered, or read from the log.
    pub async fn load<'a>(
        &self,
        store: &dyn EventStore,
        entries: impl IntoIterator<Item = &'a JournalEntry>,
    ) -> Result<BTreeMap<GuardKey, DebitGuard>, LogError> {
        let mut guards = BTreeMap::new();
        for key in entries.into_iter().flat_map(guard::guarded_keys) {
            if guards.contains_key(&key) {
                continue;
            }
            let state = match self.states.recall(&key) {
                Some(state) => state,
                None => log::load_guard(store, &key).await?,
            };
            guards.insert(key, state);
        }
        Ok(guards)
    }

    /// Remembers what committed `appends` left each guard in; `before` is what the decision read.
    /// A state older than the one remembered (a later commit was remembered first) is dropped.
    pub fn wrote(&self, before: &BTreeMap<GuardKey, DebitGuard>, appends: &[GuardAppend]) {
        for append in appends {
            let start = before.get(&append.key).copied().unwrap_or_default();
            let after = append.events.iter().fold(start, guard::evolve);
            self.states.remember(&append.key, &after);
        }
    }

    /// Remembers states the writer tells (a step it rebased: `crate::guard_chain`).
    pub fn remember(&self, states: &[(GuardKey, DebitGuard)]) {
        for (key, state) in states {
            self.states.remember(key, state);
        }
    }

    /// Forgets `keys`: a decision on them conflicted, so what is remembered may be stale.
    pub fn forget<'a>(&self, keys: impl IntoIterator<Item = &'a GuardKey>) {
        self.states.forget(keys);
    }

    /// The state remembered for `key`, if any.
    pub fn remembered(&self, key: &GuardKey) -> Option<DebitGuard> {
        self.states.recall(key)
    }
}
