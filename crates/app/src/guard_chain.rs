//! Several provider facts on one account in one group-commit batch, chained instead of refused.
//!
//! Each request decides its guard events against the guard state it read, and expects that
//! version. Two facts on one account (a marketplace seller paid twice at once) read the same
//! version, so in one batch the second always conflicted, and the whole batch, other tenants'
//! requests included, fell back to one transaction per request. A provider fact is never refused
//! by its guard, so its events depend on the state only through the balances they carry and the
//! overdraft flags: [`chain`] rebases each such append onto the state the previous step of the
//! batch leaves (`asiento_domain::guard::rebase_fact`), expecting that step's version. A batch that
//! still cannot commit (a fact decided before an earlier batch wrote its guard) is rebased once
//! more onto the guards' states read from the log ([`rebase_onto_log`]) and tried again. A batch
//! that commits neither way is written step by step as each request decided it, never rebased: a
//! step chained onto one that is not written would carry the balances that one would have left,
//! under a version some other write can take (`app/tests/group_commit.rs`
//! `no_step_carries_the_balances_of_a_step_not_written_*`).
//!
//! Only a step that says its guard appends are provider facts (`Work::facts`: a payment
//! decision) is rebased; a command's (a transfer, a hold's ending, a declaration), which its guard
//! may refuse, is left as it is, and conflicts if another step moved its guard first.

use std::collections::HashMap;
use std::sync::Arc;

use asiento_domain::guard::{self, DebitGuard, GuardEvent, GuardKey};
use asiento_domain::StreamKind;
use asiento_eventstore::{EventStore, ExpectedVersion, StreamAppend};

use crate::group_commit::Work;
use crate::log::{self, LogError};

/// What a rebased step leaves its guards in, once written: its request remembers these instead
/// of the states it computed itself.
pub type GuardStates = Vec<(GuardKey, DebitGuard)>;

/// Rebases, in batch order, every guard append that expects an older version than an earlier
/// step of the batch leaves its guard at. Per step: the states its guards are left in when it
/// was rebased.
pub(crate) fn chain(steps: &mut [Work]) -> Vec<Option<GuardStates>> {
    // The common batch names each stream once: nothing to chain, nothing to decode.
    if !shares_a_stream(steps) {
        return vec![None; steps.len()];
    }
    chain_onto(steps, HashMap::new())
}

/// [`chain`], starting from each guard's state in the log: for a batch that could not commit
/// because a fact was decided before another batch wrote its guard.
pub(crate) async fn rebase_onto_log(
    store: &dyn EventStore,
    steps: &mut [Work],
) -> Result<Vec<Option<GuardStates>>, LogError> {
    let mut tips = HashMap::new();
    for append in steps.iter().flat_map(|step| step.appends.iter()) {
        if tips.contains_key(&append.stream_id) {
            continue;
        }
        if let Some((key, _, _)) = guard_append(append) {
            tips.insert(
                append.stream_id.clone(),
                log::load_guard(store, &key).await?,
            );
        }
    }
    Ok(chain_onto(steps, tips))
}

/// Rebases every guard append whose expected version is not the tip `tips` holds for its stream,
/// and moves the tip past it.
fn chain_onto(
    steps: &mut [Work],
    mut tips: HashMap<String, DebitGuard>,
) -> Vec<Option<GuardStates>> {
    let mut rebased = Vec::with_capacity(steps.len());
    for step in steps.iter_mut() {
        let (mut was_rebased, mut states) = (false, GuardStates::new());
        let facts = step.facts;
        for at in 0..step.appends.len() {
            let Some((key, start, events)) = guard_append(&step.appends[at]) else {
                continue;
            };
            let events = match tips.get(&step.appends[at].stream_id) {
                // A command's guard events are decided against the state it read: never rebased.
                Some(tip) if start != tip.version && !facts => continue,
                Some(tip) if start != tip.version => {
                    // The step's own copy: the batch keeps the appends as decided.
                    let append = &mut Arc::make_mut(&mut step.appends)[at];
                    match rebase(append, &key, *tip, &events) {
                        Some(rebased_events) => {
                            was_rebased = true;
                            rebased_events
                        }
                        None => continue,
                    }
                }
                _ => events,
            };
            let append = &step.appends[at];
            let version = start_of(append) + events.len() as u64;
            if let Some(last) = events.last() {
                let after = DebitGuard::from_last(version, last);
                tips.insert(append.stream_id.clone(), after);
                states.push((key, after));
            }
        }
        rebased.push(was_rebased.then_some(states));
    }
    rebased
}

/// Whether two steps append to one stream (after [`chain`], a step may then expect the version
/// an earlier one leaves).
pub(crate) fn shares_a_stream(steps: &[Work]) -> bool {
    let mut owner: HashMap<&str, usize> = HashMap::new();
    steps.iter().enumerate().any(|(i, step)| {
        step.appends
            .iter()
            .any(|append| *owner.entry(append.stream_id.as_str()).or_insert(i) != i)
    })
}

/// A guard stream's append: its key, the version it expects and its events decoded.
fn guard_append(append: &StreamAppend) -> Option<(GuardKey, u64, Vec<GuardEvent>)> {
    let Some(StreamKind::Guard {
        tenant,
        account,
        currency,
    }) = StreamKind::parse(&append.stream_id)
    else {
        return None;
    };
    let events = append
        .events
        .iter()
        .map(|event| GuardEvent::decode(&event.event_type, event.schema, &event.data).ok())
        .collect::<Option<Vec<_>>>()?;
    let key = GuardKey {
        tenant,
        account,
        currency,
    };
    Some((key, start_of(append), events))
}

/// The version an append expects its stream at (0: none yet).
fn start_of(append: &StreamAppend) -> u64 {
    match append.expected {
        ExpectedVersion::Exact(version) => version,
        _ => 0,
    }
}

/// `append` rebased onto `tip`, in place; its new events, or None (left as it was) when they
/// are not a provider fact's or do not encode.
fn rebase(
    append: &mut StreamAppend,
    key: &GuardKey,
    tip: DebitGuard,
    events: &[GuardEvent],
) -> Option<Vec<GuardEvent>> {
    let rebased = guard::rebase_fact(key, tip, events)?;
    let metadata = append.events.first()?.metadata.clone();
    let encoded = log::encode(&rebased, &metadata, log::guard_codec).ok()?;
    append.expected = log::expected(tip.version);
    append.events = encoded;
    metrics::counter!("asiento_group_commit_guard_rebased_total").increment(1);
    Some(rebased)
}

#[cfg(test)]
mod tests {
    use asiento_domain::guard::{decide_entry, Origin};
    use asiento_domain::{AccountName, Amount, Currency, EntryId, JournalEntry, Leg, TenantId};
    use asiento_eventstore::Metadata;
    use chrono::DateTime;

    use super::*;

    fn key() -> GuardKey {
        GuardKey {
            tenant: TenantId::parse("acme").expect("tenant"),
            account: AccountName::parse("customer:1:available").expect("account"),
            currency: Currency::parse("USD").expect("currency"),
        }
    }

    /// A provider fact of `delta` on the customer, decided against `read`, as a payment step.
    fn fact_step(n: u128, delta: i64, read: DebitGuard) -> Work {
        let legs = vec![
            Leg::new(key().account, key().currency, Amount::new(delta)),
            Leg::new(
                AccountName::parse("psp:sim:clearing").expect("account"),
                key().currency,
                Amount::new(-delta),
            ),
        ];
        let entry = JournalEntry::new(
            EntryId::from_uuid(uuid::Uuid::from_u128(n)),
            key().tenant,
            legs,
            None,
        )
        .expect("entry");
        let at = DateTime::from_timestamp(1_764_000_000, 0).expect("time");
        let guards = [(key(), read)].into_iter().collect();
        let appends = decide_entry(&entry, Origin::ProviderFact, &guards, at).expect("a fact");
        Work {
            appends: log::guard_appends(&appends, &Metadata::default())
                .expect("encoded")
                .into(),
            facts: true,
            ..Work::default()
        }
    }

    fn state_after(step: &Work) -> (ExpectedVersion, DebitGuard) {
        let (_, start, events) = guard_append(&step.appends[0]).expect("a guard append");
        let last = events.last().expect("events");
        (
            step.appends[0].expected,
            DebitGuard::from_last(start + events.len() as u64, last),
        )
    }

    #[test]
    fn facts_on_one_guard_are_chained_in_batch_order() {
        let read = DebitGuard {
            version: 3,
            balance: Amount::new(100),
            ..DebitGuard::default()
        };
        // Three facts decided against the same state: +50, -400 (an overdraft only once it
        // follows the first: 150 - 400), +25.
        let mut steps = vec![
            fact_step(1, 50, read),
            fact_step(2, -400, read),
            fact_step(3, 25, read),
        ];
        let rebased: Vec<bool> = chain(&mut steps).iter().map(Option::is_some).collect();
        assert_eq!(rebased, [false, true, true]);
        let states: Vec<_> = steps.iter().map(state_after).collect();
        assert_eq!(states[0].0, ExpectedVersion::Exact(3));
        assert_eq!(states[0].1.balance, Amount::new(150));
        assert_eq!(states[1].0, ExpectedVersion::Exact(4));
        assert_eq!(states[1].1.balance, Amount::new(-250));
        assert!(states[1].1.flagged, "the refund overdraws once chained");
        assert_eq!(states[2].0, ExpectedVersion::Exact(6));
        assert_eq!(
            (states[2].1.balance, states[2].1.version),
            (Amount::new(-225), 7)
        );
    }

    #[test]
    fn a_batch_decided_before_another_wrote_its_guard_is_rebased_onto_the_log() {
        let read = DebitGuard {
            version: 3,
            balance: Amount::new(100),
            ..DebitGuard::default()
        };
        let stream = key().stream();
        let in_log = DebitGuard {
            version: 9,
            balance: Amount::new(40),
            ..DebitGuard::default()
        };
        let mut steps = vec![fact_step(1, 50, read), fact_step(2, -100, read)];
        let tips = [(stream, in_log)].into_iter().collect();
        let rebased = chain_onto(&mut steps, tips);
        let states: Vec<_> = steps.iter().map(state_after).collect();
        assert_eq!(
            rebased,
            [
                Some(vec![(key(), states[0].1)]),
                Some(vec![(key(), states[1].1)])
            ],
            "each rebased step tells the state it leaves"
        );
        assert_eq!(states[0].0, ExpectedVersion::Exact(9));
        assert_eq!(states[0].1.balance, Amount::new(90));
        assert_eq!(states[1].0, ExpectedVersion::Exact(10));
        assert_eq!(
            (states[1].1.balance, states[1].1.flagged),
            (Amount::new(-10), true)
        );
    }

    #[test]
    fn a_command_is_never_rebased() {
        let read = DebitGuard {
            version: 3,
            balance: Amount::new(100),
            ..DebitGuard::default()
        };
        // The second debits 100 from a balance the first already took to 50: as a command it
        // must be decided again (and refused), not carried onto the first.
        let mut command = fact_step(2, -100, read);
        command.facts = false;
        let before = command.appends.to_vec();
        let mut steps = vec![fact_step(1, -50, read), command];
        assert_eq!(chain(&mut steps), [None, None]);
        assert_eq!(*steps[1].appends, before);
    }

    #[test]
    fn steps_already_in_order_are_left_alone() {
        let read = DebitGuard {
            version: 3,
            balance: Amount::new(100),
            ..DebitGuard::default()
        };
        let first = fact_step(1, 50, read);
        let (_, after_first) = state_after(&first);
        let mut steps = vec![first, fact_step(2, 10, after_first)];
        let before: Vec<_> = steps
            .iter()
            .map(|s| s.appends[0].events[0].data.clone())
            .collect();
        assert_eq!(chain(&mut steps), [None, None]);
        let after: Vec<_> = steps
            .iter()
            .map(|s| s.appends[0].events[0].data.clone())
            .collect();
        assert_eq!(before, after);
    }
}
