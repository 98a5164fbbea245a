//! A batch: the request path's writes of many concurrent requests in one transaction.
//!
//! A request's durable steps are small: a create claims its key and appends the intent; a
//! finalisation appends the provider's fact and completes the key with the rendered answer. Each
//! alone is a transaction of a few single-row statements and a commit flush; measured, a
//! row costs several times more in a single-row statement than in a batch (docs/benchmarks.md).
//! So requests hand their step to the process's dispatcher ([`Writer::commit`],
//! `dispatch`), which takes every step waiting at that moment and writes them in one
//! transaction with one statement per kind of row, one batch at a time:
//! the fresh claims (`idempotency::claim_fresh_each`), the webhook events received
//! (`webhooks::insert_inbox_each`), the events
//! (`EventStore::append_each_in`), the completions (`idempotency::complete_each`). Each request
//! is answered only after the commit.
//!
//! Every request's outcome is its own, and each step is written whole or not at all: a step
//! whose key exists comes back [`Committed::NotFresh`] (its request then claims the usual way), a
//! step one of whose streams is not at the version it expects [`Committed::Conflict`], a step
//! whose key's lease was taken over [`Committed::LeaseLost`]; nothing of such a step is written,
//! and the rest of the batch commits. Before writing, the batch is planned in batch order
//! (`plan`): a step that an earlier step which is written moves past is answered
//! `Conflict` unwritten, and provider facts on one account are chained onto the steps before them
//! that are written, so that they do not conflict with each other. Facts that conflict with the
//! log are planned again onto the guards' states read from it and written after the rest; a batch
//! the one statement refuses whole (`statement`) is tried again the same way, then
//! step by step alone.
//!
//! A batch's outcomes equal its steps applied one at a time, in batch order, to the log as it
//! stood: `tests/write_model` judges every generated batch against that sequential model.

use std::collections::HashSet;
use std::sync::Arc;

use asiento_eventstore::{StreamAppend, Tx};

use super::statement::{self, Written};
use super::step::{CommitError, Committed, GuardStates, Work};
use crate::idempotency;
use crate::log::Store;
use crate::webhooks;

/// Plans the batch (`super::plan::chain`): the steps an earlier step that is written
/// overtakes are answered `Conflict` unwritten, and provider facts on one guard are chained onto
/// the steps before them that are written. Then writes the rest as one batch. Steps that could
/// not be written (all of them when the batch was refused whole; those whose streams had moved
/// on when the statement commits the others) are planned once more, as their requests decided
/// them, onto the guards' states in the log (a fact decided before another batch wrote its guard
/// is not a conflict), and tried again. If a batch refused whole still cannot commit, each step
/// is written alone, as its request decided it: a step chained onto one that is then not written
/// would carry the balances that step would have left, and another write could take the version
/// it expects.
pub(crate) async fn write(
    store: &Store,
    mut steps: Vec<Work>,
) -> Vec<Result<Committed, CommitError>> {
    let decided: Option<Vec<Arc<[StreamAppend]>>> = super::plan::shares_a_stream(&steps)
        .then(|| steps.iter().map(|step| Arc::clone(&step.appends)).collect());
    let mut outcomes: Vec<Option<Result<Committed, CommitError>>> =
        steps.iter().map(|_| None).collect();
    let mut rebased: Vec<Option<GuardStates>> = vec![None; steps.len()];
    let every: Vec<usize> = (0..steps.len()).collect();
    let plans = super::plan::chain(&mut steps);
    let first = follow(plans, &every, &mut outcomes, &mut rebased);
    let (refused, again) = match write_some(store, &mut steps, &first).await {
        None => (true, first),
        Some(written) => {
            debug_assert_rebased_follow_written(&steps, &first, &written, &rebased);
            let mut conflicted = Vec::new();
            for (i, outcome) in first.into_iter().zip(written) {
                if matches!(outcome, Ok(Committed::Conflict)) && steps[i].facts {
                    conflicted.push(i);
                } else {
                    outcomes[i] = Some(outcome);
                }
            }
            // A fact tried again is written after the rest of the batch. So that the batch
            // still reads as its steps in batch order, it is only where no later step that was
            // written appends to one of its streams; otherwise it is answered `Conflict`.
            let again = conflicted
                .into_iter()
                .filter(|&i| {
                    let overtaken_later = (i + 1..steps.len()).any(|later| {
                        matches!(
                            outcomes[later],
                            Some(Ok(Committed::Written(_) | Committed::Rebased(..)))
                        ) && shares_a_stream_with(&steps[i], &steps[later])
                    });
                    if overtaken_later {
                        outcomes[i] = Some(Ok(Committed::Conflict));
                    }
                    !overtaken_later
                })
                .collect();
            (false, again)
        }
    };
    if again.is_empty() {
        return answers(outcomes, rebased);
    }
    // Planned again from the log as each request decided it: what the first plan chained a
    // step onto may not be written.
    as_decided(&mut steps, &again, decided.as_deref(), &mut rebased);
    let mut retried = take(&mut steps, &again);
    let plans = super::plan::rebase_onto_log(store.as_ref(), &mut retried).await;
    put_back(&mut steps, &again, retried);
    let second = match plans {
        Ok(plans) if plans.iter().any(super::plan::Plan::changes) => {
            let kept = follow(plans, &again, &mut outcomes, &mut rebased);
            write_some(store, &mut steps, &kept)
                .await
                .map(|written| (kept, written))
        }
        Ok(_) => None,
        Err(error) => {
            tracing::warn!(%error, "reading guards to rebase a batch failed");
            None
        }
    };
    let open: Vec<usize> = again
        .into_iter()
        .filter(|&i| outcomes[i].is_none())
        .collect();
    match second {
        Some((kept, written)) => {
            for (i, outcome) in kept.into_iter().zip(written) {
                outcomes[i] = Some(outcome);
            }
        }
        None if refused => {
            as_decided(&mut steps, &open, decided.as_deref(), &mut rebased);
            let alone = take(&mut steps, &open);
            for (&i, outcome) in open.iter().zip(write_alone(store, &alone).await) {
                outcomes[i] = Some(outcome);
            }
        }
        // The statement answered these `Conflict` and wrote nothing of them.
        None => {
            for &i in &open {
                outcomes[i] = Some(Ok(Committed::Conflict));
            }
        }
    }
    answers(outcomes, rebased)
}

/// Follows `plans` (one per step at `indices`): an overtaken step is answered `Conflict`, a
/// rebased one keeps the guard states it leaves. The steps to write.
fn follow(
    plans: Vec<super::plan::Plan>,
    indices: &[usize],
    outcomes: &mut [Option<Result<Committed, CommitError>>],
    rebased: &mut [Option<GuardStates>],
) -> Vec<usize> {
    use super::plan::Plan;
    debug_assert_eq!(plans.len(), indices.len(), "one plan per step");
    let mut kept = Vec::with_capacity(indices.len());
    for (&i, plan) in indices.iter().zip(plans) {
        match plan {
            Plan::Overtaken => outcomes[i] = Some(Ok(Committed::Conflict)),
            Plan::Write(states) => {
                rebased[i] = states;
                kept.push(i);
            }
        }
    }
    kept
}

/// Puts the steps at `indices` back as their requests decided them (`decided`: the batch's
/// appends before any plan changed them, when one could).
fn as_decided(
    steps: &mut [Work],
    indices: &[usize],
    decided: Option<&[Arc<[StreamAppend]>]>,
    rebased: &mut [Option<GuardStates>],
) {
    let Some(decided) = decided else {
        return;
    };
    for &i in indices {
        steps[i].appends = Arc::clone(&decided[i]);
        rebased[i] = None;
    }
}

/// Asserts what the first plan rests on: a step written with guard appends rebased onto the
/// steps before it (`kept`: the steps the plan writes, in batch order) follows steps that were
/// written. On each of its guard streams, the last step before it that appends there was written
/// too; otherwise it would carry that step's change, which no entry holds (the defect
/// `tests/group_commit.rs` `a_fact_is_never_chained_onto_a_step_the_batch_overtakes_*` shows).
/// The statement and the transaction refuse such a step themselves; this says that they must.
fn debug_assert_rebased_follow_written(
    steps: &[Work],
    kept: &[usize],
    written: &[Result<Committed, CommitError>],
    rebased: &[Option<GuardStates>],
) {
    if !cfg!(debug_assertions) {
        return;
    }
    let is_written = |at: usize| matches!(written[at], Ok(Committed::Written(_)));
    for (at, &i) in kept.iter().enumerate() {
        if rebased[i].is_none() || !is_written(at) {
            continue;
        }
        for append in steps[i].appends.iter() {
            if !super::plan::is_guard_stream(&append.stream_id) {
                continue;
            }
            let before = kept[..at].iter().rposition(|&j| {
                steps[j]
                    .appends
                    .iter()
                    .any(|other| other.stream_id == append.stream_id)
            });
            if let Some(before) = before {
                assert!(
                    is_written(before),
                    "step {i} was written rebased onto step {} on {}, which was not written",
                    kept[before],
                    append.stream_id
                );
            }
        }
    }
}

/// Each step's answer: a step written with rebased guard appends is told the states written.
fn answers(
    outcomes: Vec<Option<Result<Committed, CommitError>>>,
    rebased: Vec<Option<GuardStates>>,
) -> Vec<Result<Committed, CommitError>> {
    outcomes
        .into_iter()
        .zip(rebased)
        .map(|(outcome, rebased)| {
            let outcome = outcome.expect("every step of a batch is given an outcome above");
            match (outcome, rebased) {
                (Ok(Committed::Written(appended)), Some(states)) => {
                    Ok(Committed::Rebased(appended, states))
                }
                (other, _) => other,
            }
        })
        .collect()
}

/// Whether two steps append to one stream.
fn shares_a_stream_with(one: &Work, other: &Work) -> bool {
    one.appends
        .iter()
        .any(|a| other.appends.iter().any(|b| a.stream_id == b.stream_id))
}

/// [`write_whole`] for the steps at `indices` of `steps`.
async fn write_some(
    store: &Store,
    steps: &mut [Work],
    indices: &[usize],
) -> Option<Vec<Result<Committed, CommitError>>> {
    if indices.is_empty() {
        return Some(Vec::new());
    }
    let some = take(steps, indices);
    let written = write_whole(store, &some).await;
    put_back(steps, indices, some);
    written
}

/// The steps at `indices`, moved out of `steps` (left empty there until [`put_back`]).
fn take(steps: &mut [Work], indices: &[usize]) -> Vec<Work> {
    indices
        .iter()
        .map(|&i| std::mem::take(&mut steps[i]))
        .collect()
}

fn put_back(steps: &mut [Work], indices: &[usize], taken: Vec<Work>) {
    for (&i, step) in indices.iter().zip(taken) {
        steps[i] = step;
    }
}

/// The steps as one batch: one statement on PostgreSQL, else one transaction
/// ([`write_steps`]). None when the statement refused the batch (nothing was written).
async fn write_whole(store: &Store, steps: &[Work]) -> Option<Vec<Result<Committed, CommitError>>> {
    match statement::write(store, steps).await {
        Ok(Written::Done(outcomes)) => Some(outcomes.into_iter().map(Ok).collect()),
        Ok(Written::Unreadable(error)) => Some(
            steps
                .iter()
                .map(|_| Err(CommitError::Unexpected(error.clone())))
                .collect(),
        ),
        Ok(Written::Unfit) => match write_steps(store, steps).await {
            Ok(outcomes) => Some(outcomes.into_iter().map(Ok).collect()),
            Err(error) => {
                tracing::warn!(%error, steps = steps.len(), "group commit transaction failed");
                None
            }
        },
        Ok(Written::Refused) => None,
        Err(error) => {
            tracing::warn!(%error, steps = steps.len(), "group commit statement failed");
            None
        }
    }
}

/// Each step in a transaction of its own, where each gets its own outcome.
async fn write_alone(store: &Store, steps: &[Work]) -> Vec<Result<Committed, CommitError>> {
    if steps.len() > 1 {
        metrics::counter!("asiento_group_commit_retried_alone_total").increment(steps.len() as u64);
    }
    let mut outcomes = Vec::with_capacity(steps.len());
    for step in steps {
        outcomes.push(
            write_steps(store, std::slice::from_ref(step))
                .await
                .and_then(|mut one| one.pop().ok_or(CommitError::Stopped)),
        );
    }
    outcomes
}

/// One transaction, each step of several under a savepoint of its own: a step that cannot be
/// written whole (its key exists, a stream moved on, its lease was taken over) is undone alone
/// and told why, and the rest commits. A step that appends to a stream some step before it in the
/// batch failed to append to is not tried (`Conflict`): it may rest on that step (a chained
/// fact), and written without it would carry what that step would have left. Steps are written
/// in batch order, so a step may expect the version an earlier one leaves.
async fn write_steps(store: &Store, steps: &[Work]) -> Result<Vec<Committed>, CommitError> {
    let mut tx = store.begin().await?;
    let alone = steps.len() == 1;
    let mut failed: HashSet<&str> = HashSet::new();
    let mut outcomes = Vec::with_capacity(steps.len());
    for step in steps {
        let streams = step.appends.iter().map(|append| append.stream_id.as_str());
        if streams.clone().any(|stream| failed.contains(stream)) {
            failed.extend(streams);
            outcomes.push(Committed::Conflict);
            continue;
        }
        if !alone {
            tx.savepoint().await?;
        }
        let outcome = write_step(store, &mut tx, step).await?;
        match (&outcome, alone) {
            (Committed::Written(_), false) => tx.release_savepoint().await?,
            (Committed::Written(_), true) => {}
            (_, false) => {
                tx.rollback_to_savepoint().await?;
                failed.extend(streams);
            }
            (_, true) => {
                tx.rollback().await?;
                return Ok(vec![outcome]);
            }
        }
        outcomes.push(outcome);
    }
    tx.commit().await?;
    Ok(outcomes)
}

/// One step inside `tx`: its claim, its inbox row, its events, its completion. Anything but
/// `Written` leaves part of it in `tx`, for the caller to undo.
async fn write_step(store: &Store, tx: &mut Tx, step: &Work) -> Result<Committed, CommitError> {
    if let Some(claim) = &step.claim {
        if idempotency::claim_fresh_each(tx, std::slice::from_ref(claim)).await? != [true] {
            return Ok(Committed::NotFresh);
        }
    }
    if let Some(row) = &step.inbox {
        if webhooks::insert_inbox_each(tx, &[row]).await? != [true] {
            return Ok(Committed::NotFresh);
        }
    }
    let appended = if step.appends.is_empty() {
        None
    } else {
        match store.append_in(tx, &step.appends).await {
            Ok(appended) => Some(appended),
            Err(error) if crate::log::is_conflict(&error) => return Ok(Committed::Conflict),
            Err(error) => return Err(error.into()),
        }
    };
    if let Some(completion) = &step.completion {
        let mut row = completion.completing.clone();
        row.response = completion
            .respond
            .at(appended.as_ref().map(|a| a.last_position));
        if idempotency::complete_each(tx, &[row]).await? != [true] {
            return Ok(Committed::LeaseLost);
        }
    }
    Ok(Committed::Written(appended))
}
