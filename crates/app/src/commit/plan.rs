//! Several provider facts on one account in one group-commit batch, chained instead of refused.
//!
//! Each request decides its guard events against the guard state it read, and expects that
//! version. Two facts on one account (a marketplace seller paid twice at once) read the same
//! version: in one batch the second would conflict, and the whole batch, other tenants' requests
//! included, would fall back to one transaction per request. A provider fact is never refused
//! by its guard, so its events depend on the state only through the balances they carry and the
//! overdraft flags: [`chain`] plans the batch in batch order, judging each step against what the
//! steps before it that will be written leave, and rebases each fact's guard append that expects
//! an older version onto the state those steps leave (`asiento_domain::guard::rebase_fact`),
//! expecting that version. Which steps are written is decided for each step before anything is
//! chained onto it: a step one of whose other appends is behind is [`Plan::Overtaken`] (answered
//! `Conflict` unwritten) and leaves nothing to chain onto, so a fact never carries the change of a
//! step that is not written (`app/tests/group_commit.rs`
//! `a_fact_is_never_chained_onto_a_step_the_batch_overtakes_*`). A batch that still cannot commit
//! (a fact decided before an earlier batch wrote its guard) is planned once more onto the guards'
//! states read from the log ([`rebase_onto_log`]) and tried again. A batch that commits neither
//! way is written step by step as each request decided it, never rebased: a step chained onto one
//! that is not written would carry the balances that one would have left, under a version some
//! other write can take (`no_step_carries_the_balances_of_a_step_not_written_*`).
//!
//! Only a step that says its guard appends are provider facts (`Work::facts`: a payment
//! decision) is rebased; a command's (a transfer, a hold's ending, a declaration), which its guard
//! may refuse, is left as it is, and conflicts if another step moved its guard first.

use std::collections::HashMap;
use std::sync::Arc;

use asiento_domain::guard::{self, DebitGuard, GuardEvent, GuardKey};
use asiento_domain::StreamKind;
use asiento_eventstore::{EventStore, ExpectedVersion, NewEvent, StreamAppend};

use super::step::{GuardStates, Work};
use crate::log::{self, LogError};

/// How one step of a batch is to be written.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Plan {
    /// A step planned before it leaves one of its streams at another version than this one
    /// expects, and this one's append there is not a fact that could be rebased: it can only
    /// conflict, and in the batch it would refuse the others. It is answered `Conflict`
    /// unwritten, and its request decides again against what the batch wrote.
    Overtaken,
    /// Written; with the states its guards are left in when its facts were rebased.
    Write(Option<GuardStates>),
}

impl Plan {
    /// Whether the plan changes the step or its fate (the batch is not written as decided).
    pub(crate) fn changes(&self) -> bool {
        !matches!(self, Plan::Write(None))
    }
}

/// Plans a batch in batch order: which steps are overtaken by the steps before them that are
/// written, and which facts are rebased onto the guard states those steps leave. A fact is only
/// ever chained onto a step that the plan writes: which steps are written is decided for each
/// step before anything is chained onto it.
pub(crate) fn chain(steps: &mut [Work]) -> Vec<Plan> {
    // The common batch names each stream once: nothing to chain, nothing to decode.
    if !shares_a_stream(steps) {
        return vec![Plan::Write(None); steps.len()];
    }
    plan_onto(steps, HashMap::new())
}

/// [`chain`], starting from each guard's state in the log: for a batch that could not commit
/// because a fact was decided before another batch wrote its guard.
pub(crate) async fn rebase_onto_log(
    store: &dyn EventStore,
    steps: &mut [Work],
) -> Result<Vec<Plan>, LogError> {
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
    Ok(plan_onto(steps, tips))
}

/// Plans `steps` onto `tips`, the guards' states before the batch where known. Each step is
/// judged against what the steps planned before it leave: an append that expects another version
/// of its stream than they leave is rebased when it is a fact's guard append (onto the state they
/// leave), and otherwise makes its step [`Plan::Overtaken`]. Only a step planned to be written
/// moves a stream on; a step that expects no exact version (`Any`) leaves its streams unknown.
fn plan_onto(steps: &mut [Work], mut tips: HashMap<String, DebitGuard>) -> Vec<Plan> {
    let mut leaves: HashMap<String, u64> = tips
        .iter()
        .map(|(stream, tip)| (stream.clone(), tip.version))
        .collect();
    steps
        .iter_mut()
        .map(|step| {
            let Some(rebases) = rebases(step, &leaves, &tips) else {
                return Plan::Overtaken;
            };
            let was_rebased = !rebases.is_empty();
            if was_rebased {
                // The step's own copy: the batch keeps the appends as decided.
                let appends = Arc::make_mut(&mut step.appends);
                for (at, expected, events) in rebases {
                    appends[at].expected = expected;
                    appends[at].events = events;
                    metrics::counter!("asiento_group_commit_guard_rebased_total").increment(1);
                }
            }
            let mut states = GuardStates::new();
            for append in step.appends.iter() {
                let Some(start) = expected_start(append) else {
                    leaves.remove(&append.stream_id);
                    tips.remove(&append.stream_id);
                    continue;
                };
                let version = start + append.events.len() as u64;
                leaves.insert(append.stream_id.clone(), version);
                match guard_append(append) {
                    Some((key, _, events)) => {
                        if let Some(last) = events.last() {
                            let after = DebitGuard::from_last(version, last);
                            tips.insert(append.stream_id.clone(), after);
                            states.push((key, after));
                        }
                    }
                    None => {
                        tips.remove(&append.stream_id);
                    }
                }
            }
            Plan::Write(was_rebased.then_some(states))
        })
        .collect()
}

/// The rebased guard appends `step` needs to continue what `leaves` says its streams are left at
/// (the append's index, expectation and events), or None when it cannot: one of its appends
/// expects another version and is not a fact's guard append that `tips` holds the state for.
fn rebases(
    step: &Work,
    leaves: &HashMap<String, u64>,
    tips: &HashMap<String, DebitGuard>,
) -> Option<Vec<(usize, ExpectedVersion, Vec<NewEvent>)>> {
    let mut rebases = Vec::new();
    for (at, append) in step.appends.iter().enumerate() {
        let (Some(start), Some(&left)) = (expected_start(append), leaves.get(&append.stream_id))
        else {
            continue;
        };
        if start == left {
            continue;
        }
        let tip = tips
            .get(&append.stream_id)
            .filter(|tip| tip.version == left);
        let (Some(tip), true) = (tip, step.facts) else {
            return None;
        };
        let (key, _, events) = guard_append(append)?;
        let rebased = guard::rebase_fact(&key, *tip, &events)?;
        let metadata = append.events.first()?.metadata.clone();
        let encoded = log::encode(&rebased, &metadata, log::guard_codec).ok()?;
        rebases.push((at, log::expected(tip.version), encoded));
    }
    Some(rebases)
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

/// Whether `stream` is a debit guard's.
pub(crate) fn is_guard_stream(stream: &str) -> bool {
    matches!(StreamKind::parse(stream), Some(StreamKind::Guard { .. }))
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
    Some((key, expected_start(append).unwrap_or(0), events))
}

/// The version an append expects its stream at, when it names one.
pub(crate) fn expected_start(append: &StreamAppend) -> Option<u64> {
    match append.expected {
        ExpectedVersion::NoStream => Some(0),
        ExpectedVersion::Exact(version) => Some(version),
        ExpectedVersion::Any | ExpectedVersion::StreamExists => None,
    }
}

#[cfg(test)]
mod tests {
    use asiento_domain::guard::{decide_entry, Origin};
    use asiento_domain::{AccountName, Amount, Currency, EntryId, JournalEntry, Leg, TenantId};
    use asiento_eventstore::Metadata;
    use asiento_eventstore::NewEvent;
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
        let rebased: Vec<bool> = chain(&mut steps)
            .iter()
            .map(|plan| matches!(plan, Plan::Write(Some(_))))
            .collect();
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
        let rebased = plan_onto(&mut steps, tips);
        let states: Vec<_> = steps.iter().map(state_after).collect();
        assert_eq!(
            rebased,
            [
                Plan::Write(Some(vec![(key(), states[0].1)])),
                Plan::Write(Some(vec![(key(), states[1].1)]))
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
        // must be decided again (and refused), not carried onto the first. So it is overtaken,
        // unchanged.
        let mut command = fact_step(2, -100, read);
        command.facts = false;
        let before = command.appends.to_vec();
        let mut steps = vec![fact_step(1, -50, read), command];
        assert_eq!(chain(&mut steps), [Plan::Write(None), Plan::Overtaken]);
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
        assert_eq!(chain(&mut steps), [Plan::Write(None), Plan::Write(None)]);
        let after: Vec<_> = steps
            .iter()
            .map(|s| s.appends[0].events[0].data.clone())
            .collect();
        assert_eq!(before, after);
    }

    fn plain_step(appends: &[(&str, ExpectedVersion, usize)]) -> Work {
        Work {
            appends: appends
                .iter()
                .map(|&(stream, expected, n)| StreamAppend {
                    stream_id: stream.to_owned(),
                    expected,
                    events: (0..n)
                        .map(|_| NewEvent {
                            event_id: uuid::Uuid::now_v7(),
                            event_type: "Tested".into(),
                            schema: 1,
                            data: serde_json::Value::Null,
                            metadata: Metadata::default(),
                        })
                        .collect(),
                })
                .collect(),
            ..Work::default()
        }
    }

    #[test]
    fn a_step_expecting_a_version_an_earlier_written_step_moves_past_is_overtaken() {
        use ExpectedVersion::{Any, Exact, NoStream};
        use Plan::{Overtaken, Write};
        let mut steps = [
            plain_step(&[("transfer-1", NoStream, 1), ("payment-a", Exact(4), 1)]),
            // Read payment-a at 4 too: overtaken.
            plain_step(&[
                ("transfer-2", NoStream, 1),
                ("payment-a", Exact(4), 1),
                ("payment-b", Exact(1), 1),
            ]),
            // Continues where the first leaves payment-a: not.
            plain_step(&[("transfer-3", NoStream, 1), ("payment-a", Exact(5), 2)]),
            // The overtaken step moves nothing: payment-b is still where this one expects it.
            plain_step(&[("payment-b", Exact(1), 1)]),
            // Any version: never overtaken, and what it leaves is not known here.
            plain_step(&[("payment-a", Any, 1)]),
            plain_step(&[("payment-a", Exact(6), 1)]),
        ];
        assert_eq!(
            chain(&mut steps),
            [
                Write(None),
                Overtaken,
                Write(None),
                Write(None),
                Write(None),
                Write(None)
            ]
        );
    }

    #[test]
    fn a_fact_is_chained_only_onto_steps_that_are_written() {
        let read = DebitGuard {
            version: 1,
            balance: Amount::new(1_000),
            ..DebitGuard::default()
        };
        // W moves payment-p on; X, a fact on the guard, expects payment-p where W found it and
        // is overtaken; C, a fact decided against the same read as X, is not chained onto X.
        let w = plain_step(&[("payment-p", ExpectedVersion::Exact(1), 1)]);
        let mut x = fact_step(1, 100, read);
        let mut appends = plain_step(&[("payment-p", ExpectedVersion::Exact(1), 1)])
            .appends
            .to_vec();
        appends.extend(x.appends.iter().cloned());
        x.appends = appends.into();
        let c = fact_step(2, 300, read);
        let decided = c.appends.to_vec();
        let mut steps = vec![w, x, c];
        assert_eq!(
            chain(&mut steps),
            [Plan::Write(None), Plan::Overtaken, Plan::Write(None)]
        );
        assert_eq!(
            *steps[2].appends, decided,
            "C stays as its request decided it"
        );
    }
}
