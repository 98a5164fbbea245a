//! Turns: the ledger commands of this process on one guard are decided and written one at a time,
//! first come, first served.
//!
//! A command decides against the state of its guards and appends at the version it read. Two
//! commands of this process that read one state of a guard cannot both be written: the later
//! conflicts and decides again. On a busy account (a customer paying out to several merchants
//! while its holds are ended) every command waiting wakes when the one before it is written,
//! reads the state it left and races the others for the next version; the losers back off, longer
//! after each loss, while the others keep racing, and one of them can lose every race it is given
//! and give up (`app/tests/hold_endings.rs`). So a command takes its turn on its guards
//! ([`Turns::take`]) before it reads them, keeps it through its retries, and gives it up once it
//! is answered, after its outcome is in memory: the next in line (tokio's mutex queues its
//! waiters in order) reads what it left. What can still overtake a command in its turn is a
//! provider fact (its step is marked while it is written, and a command reads its guards only
//! once none is: `GuardMemory::load_after_writes`) or another process; it decides again, in turn.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use asiento_domain::guard::GuardKey;
use tokio::sync::OwnedMutexGuard;

/// The queue of each guard a command of this process holds or waits for. A guard nobody holds or
/// waits for has none.
#[derive(Debug, Default)]
pub(super) struct Turns {
    queues: Mutex<HashMap<GuardKey, Arc<tokio::sync::Mutex<()>>>>,
}

impl Turns {
    fn queues(&self) -> MutexGuard<'_, HashMap<GuardKey, Arc<tokio::sync::Mutex<()>>>> {
        // Entries are added and removed whole under the lock: a panic cannot leave one half-made.
        self.queues.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Waits for the turn on `keys` (each once, taken in key order, so that two commands never
    /// each hold a guard the other waits for) and puts it in `turn`. A turn that already holds
    /// exactly these guards is kept; one on other guards is given up first.
    pub(super) async fn take(self: &Arc<Self>, mut keys: Vec<GuardKey>, turn: &mut Turn) {
        keys.sort();
        keys.dedup();
        if turn.keys == keys && turn.held.len() == keys.len() {
            return;
        }
        turn.give_up();
        let queues: Vec<_> = {
            let mut queues = self.queues();
            keys.iter()
                .map(|key| Arc::clone(queues.entry(key.clone()).or_default()))
                .collect()
        };
        // Named before waiting: a wait cancelled half-way still gives up what it took.
        turn.turns = Some(Arc::clone(self));
        turn.keys = keys;
        for queue in queues {
            turn.held.push(queue.lock_owned().await);
        }
    }
}

/// A command's turn on its guards: empty until taken ([`Turns::take`]), given up when dropped.
#[derive(Debug, Default)]
#[must_use = "the turn lasts only while this is held"]
pub struct Turn {
    keys: Vec<GuardKey>,
    held: Vec<OwnedMutexGuard<()>>,
    turns: Option<Arc<Turns>>,
}

impl Turn {
    fn give_up(&mut self) {
        self.held.clear();
        let Some(turns) = self.turns.take() else {
            return;
        };
        let mut queues = turns.queues();
        for key in self.keys.drain(..) {
            // Only the map's own reference left: nobody holds or waits for this guard.
            if queues
                .get(&key)
                .is_some_and(|queue| Arc::strong_count(queue) == 1)
            {
                queues.remove(&key);
            }
        }
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        self.give_up();
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::time::Duration;

    use asiento_domain::{AccountName, Currency, TenantId};

    use super::*;

    fn key(account: &str) -> GuardKey {
        GuardKey {
            tenant: TenantId::parse("acme").unwrap(),
            account: AccountName::parse(account).unwrap(),
            currency: Currency::parse("USD").unwrap(),
        }
    }

    #[tokio::test]
    async fn commands_on_one_guard_take_their_turns_in_the_order_they_asked() {
        let turns = Arc::new(Turns::default());
        let mut first = Turn::default();
        turns
            .take(vec![key("customer:1:available")], &mut first)
            .await;
        let (order, mut waiting) = (Arc::new(Mutex::new(Vec::new())), Vec::new());
        for n in 0..4 {
            let (turns, order) = (Arc::clone(&turns), Arc::clone(&order));
            waiting.push(tokio::spawn(async move {
                let mut turn = Turn::default();
                turns
                    .take(vec![key("customer:1:available")], &mut turn)
                    .await;
                order.lock().unwrap().push(n);
                tokio::time::sleep(Duration::from_millis(5)).await;
            }));
            // Each asks once the one before it is waiting.
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(order.lock().unwrap().is_empty(), "the first holds the turn");
        drop(first);
        for task in waiting {
            task.await.unwrap();
        }
        assert_eq!(*order.lock().unwrap(), vec![0, 1, 2, 3]);
        assert!(turns.queues().is_empty(), "no queue outlives its last turn");
    }

    #[tokio::test]
    async fn a_turn_is_kept_for_the_same_guards_and_given_up_for_others() {
        let turns = Arc::new(Turns::default());
        let (a, b) = (key("customer:1:available"), key("customer:2:available"));
        let mut turn = Turn::default();
        turns
            .take(vec![b.clone(), a.clone(), a.clone()], &mut turn)
            .await;
        // Asked again for the same guards, in another order: kept, not waited for.
        tokio::time::timeout(
            Duration::from_secs(1),
            turns.take(vec![a.clone(), b.clone()], &mut turn),
        )
        .await
        .unwrap();
        turns.take(vec![a.clone()], &mut turn).await;
        assert_eq!(turns.queues().len(), 1, "b is given up");
        let mut other = Turn::default();
        tokio::time::timeout(Duration::from_secs(1), turns.take(vec![b], &mut other))
            .await
            .unwrap();
        assert!(
            tokio::time::timeout(Duration::from_millis(50), turns.take(vec![a], &mut other))
                .await
                .is_err(),
            "a is still held"
        );
    }
}
