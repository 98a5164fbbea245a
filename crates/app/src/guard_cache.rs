//! The memory of the debit guards this process wrote itself, shared by the payment flow and the
//! ledger flow.
//!
//! A decision that posts to a guarded account appends to that account's guard stream at the exact
//! version it read. So a remembered guard state that is stale (another process, or another flow,
//! appended since) can only make that append conflict; it can never write a wrong balance. The
//! conflict makes the flow forget the states it read ([`GuardCache::lost_race`]), and its retry
//! reads them from the log, unless this process remembered a later state of a guard since: the
//! race was then most often lost to one of its own steps in flight, and the retry decides against
//! what that step left (stale too, it only conflicts once more, and is then read from the log).
//! A stale state must not leak out without an append either:
//!
//! - payment decisions are provider facts, which a guard flags but never refuses;
//! - a ledger command that a remembered state refuses (`insufficient_funds`, a frozen account) is
//!   decided again against the log before the refusal is answered ([`Loaded::remembered`]): only
//!   what the log says refuses a command.
//!
//! So after each commit a flow remembers the state its appends left each guard in, and reads the
//! log only for guards this process has not written since it started (or that conflicted): no
//! read at all for a transfer between accounts this process moved money on before.
//!
//! Bounded: when full, it forgets everything and starts over.

use std::collections::{BTreeMap, BTreeSet};

use asiento_domain::guard::{self, DebitGuard, GuardAppend, GuardKey};
use asiento_domain::JournalEntry;
use asiento_eventstore::EventStore;

use crate::latest::Latest;
use crate::log::{self, LogError};

/// Guards remembered at most; past that the memory starts over empty.
pub const GUARDS_MAX: usize = 65_536;

/// Guard states loaded for a decision.
#[derive(Debug, Clone)]
pub struct Loaded {
    pub states: BTreeMap<GuardKey, DebitGuard>,
    /// Some of them came from memory, not the log: a refusal decided against them must be
    /// decided again against the log ([`GuardCache::forget`] them first).
    pub remembered: bool,
}

/// Shared by clones: one per process is the point.
#[derive(Debug, Clone, Default)]
pub struct GuardCache {
    states: Latest<GuardKey, DebitGuard, GUARDS_MAX>,
}

impl GuardCache {
    /// The guards every entry in `entries` touches: remembered, or read from the log (those at
    /// once, each in a statement of its own).
    pub async fn load<'a>(
        &self,
        store: &dyn EventStore,
        entries: impl IntoIterator<Item = &'a JournalEntry>,
    ) -> Result<Loaded, LogError> {
        let mut states = BTreeMap::new();
        let mut missing = BTreeSet::new();
        for key in entries.into_iter().flat_map(guard::guarded_keys) {
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

    /// A decision on `read` lost a version race: forgets those guards, except where this process
    /// remembered a later state since (the winner was one of its own steps), which the decision
    /// is then taken again against without reading the log.
    pub fn lost_race(&self, read: &BTreeMap<GuardKey, DebitGuard>) {
        self.states.forget_unless_later(read);
    }

    /// The state remembered for `key`, if any.
    pub fn remembered(&self, key: &GuardKey) -> Option<DebitGuard> {
        self.states.recall(key)
    }
}
