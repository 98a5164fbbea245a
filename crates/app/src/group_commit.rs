//! Group commit: the request path's writes of many concurrent requests in one transaction.
//!
//! A request's durable steps are small: a create claims its key and appends the intent; a
//! finalisation appends the provider's fact and completes the key with the rendered answer. Each
//! alone is a transaction of a few single-row statements and a commit flush; measured, a
//! row costs several times more in a single-row statement than in a batch (docs/benchmarks.md).
//! So requests hand their step to the process's dispatcher ([`GroupCommit::commit`],
//! `crate::group_dispatch`), which takes every step waiting at that moment and writes them in one
//! transaction with one statement per kind of row, one batch at a time:
//! the fresh claims (`idempotency::claim_fresh_each`), the webhook events received
//! (`webhooks::insert_inbox_each`), the events
//! (`EventStore::append_each_in`), the completions (`idempotency::complete_each`). Each request
//! is answered only after the commit.
//!
//! Every request's outcome is its own: a key that is not new comes back [`Committed::NotFresh`]
//! (its request then claims the usual way), and nothing else of it is written. If any request's
//! events or completion cannot be written (a lost version race, a lost lease), the transaction is
//! rolled back and every request of the batch is written again alone, in a transaction of its
//! own, where that one request gets its [`Committed::Conflict`] or [`Committed::LeaseLost`].
//! Nothing of a batch is ever committed in part. Provider facts on one account within a batch
//! are chained first (`crate::guard_chain`), so that they do not conflict with each other.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, OnceLock};

use asiento_eventstore::{AppendError, Appended, ExpectedVersion, StoreError, StreamAppend, Tx};
use tokio::sync::{mpsc, oneshot};

use crate::group_statement::{self, Written};
use crate::guard_chain::GuardStates;
use crate::idempotency::{self, Completing, FreshClaim, IdempotencyError};
use crate::log::Store;
pub use crate::respond::Respond;
use crate::webhooks::{self, InboxRow};

/// Requests written in one transaction, at most. (The queue itself is unbounded: what waits in
/// it is bounded by the requests in flight.)
pub const BATCH_MAX: usize = 64;
/// One request's step: what it writes.
#[derive(Default)]
pub struct Work {
    /// A key to claim as new, with the step.
    pub claim: Option<FreshClaim>,
    /// The events of the step (one decision: its aggregate's stream and its guards' streams).
    /// Shared, so that the request keeps them for the claim it makes itself when its key exists
    /// (`Committed::NotFresh`) and a batch keeps them as decided while it chains them, without a
    /// copy of every event.
    pub appends: Arc<[StreamAppend]>,
    /// A held key to complete, with the answer rendered from what the append wrote.
    pub completion: Option<Completion>,
    /// A verified provider event to store in the webhook inbox (alone: a webhook's step).
    pub inbox: Option<InboxRow>,
    /// Its guard appends are provider facts, which a guard never refuses: they may be rebased
    /// onto the state an earlier step leaves (`crate::guard_chain`). A command's guard appends
    /// (a transfer, which a guard may refuse) never are.
    pub facts: bool,
}

/// A completion whose response depends on the append (its position is in the answer). With a
/// claim in the same step, the key is claimed and completed at once (a ledger command).
pub struct Completion {
    /// The key, its lease and the time; the response is rendered by `respond`.
    pub completing: Completing,
    pub respond: Arc<Respond>,
}

/// How one request's step ended.
#[derive(Debug)]
pub enum Committed {
    /// Written and committed (`None`: the step had no events).
    Written(Option<Appended>),
    /// Written and committed, with its guard appends rebased onto an earlier step of the batch
    /// or onto the log (`crate::guard_chain`): the guard states its request computed are not the
    /// ones written; these are.
    Rebased(Option<Appended>, GuardStates),
    /// The key (or the inbox event) exists: nothing was written.
    NotFresh,
    /// A stream was not at the expected version: nothing was written.
    Conflict,
    /// The key's lease was taken over: nothing was written.
    LeaseLost,
}

#[derive(Debug, thiserror::Error)]
pub enum GroupCommitError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Append(#[from] AppendError),
    #[error(transparent)]
    Idempotency(#[from] IdempotencyError),
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
    #[error("the group commit writer stopped")]
    Stopped,
    #[error("a step ended in a way its kind cannot: {0}")]
    Unexpected(String),
}

pub(crate) type Reply = oneshot::Sender<Result<Committed, GroupCommitError>>;

/// The dispatcher of one store, which writes its batches, started on first use. Cheap to share
/// (`Arc`).
pub struct GroupCommit {
    store: Store,
    queue: OnceLock<mpsc::UnboundedSender<(Work, Reply)>>,
}

impl std::fmt::Debug for GroupCommit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GroupCommit").finish_non_exhaustive()
    }
}

impl GroupCommit {
    pub fn new(store: Store) -> Arc<GroupCommit> {
        Arc::new(GroupCommit {
            store,
            queue: OnceLock::new(),
        })
    }

    /// Writes `step` with whatever other steps are waiting, and answers once that committed.
    pub async fn commit(&self, step: Work) -> Result<Committed, GroupCommitError> {
        let (reply, answer) = oneshot::channel();
        self.queue()
            .send((step, reply))
            .map_err(|_| GroupCommitError::Stopped)?;
        answer.await.map_err(|_| GroupCommitError::Stopped)?
    }

    fn queue(&self) -> &mpsc::UnboundedSender<(Work, Reply)> {
        self.queue.get_or_init(|| {
            let (sender, receiver) = mpsc::unbounded_channel();
            tokio::spawn(crate::group_dispatch::dispatch(
                self.store.clone(),
                receiver,
            ));
            sender
        })
    }
}

/// Chains the provider facts of one guard (`crate::guard_chain`), answers `Conflict` to the
/// steps an earlier step of the batch overtakes ([`overtaken`]), then writes the rest as one
/// batch. Steps that could not be written (all of them when the batch was refused whole; those
/// whose streams had moved on when the statement commits the others) are tried once more, as
/// their requests decided them, after their provider facts are rebased onto the guards' states in
/// the log (a fact decided before another batch wrote its guard is not a conflict). If a batch
/// refused whole still cannot commit, each step is written alone, as its request decided it: a
/// step chained onto one that is then not written would carry the balances that step would have
/// left, and another write could take the version it expects.
pub(crate) async fn write(
    store: &Store,
    mut steps: Vec<Work>,
) -> Vec<Result<Committed, GroupCommitError>> {
    let decided: Option<Vec<Arc<[StreamAppend]>>> = crate::guard_chain::shares_a_stream(&steps)
        .then(|| steps.iter().map(|step| Arc::clone(&step.appends)).collect());
    let mut rebased = crate::guard_chain::chain(&mut steps);
    let mut outcomes: Vec<Option<Result<Committed, GroupCommitError>>> = overtaken(&steps)
        .into_iter()
        .map(|overtaken| overtaken.then_some(Ok(Committed::Conflict)))
        .collect();
    let first: Vec<usize> = (0..steps.len())
        .filter(|&i| outcomes[i].is_none())
        .collect();
    let (refused, again) = match write_some(store, &mut steps, &first).await {
        None => (true, first),
        Some(written) => {
            let mut again = Vec::new();
            for (i, outcome) in first.into_iter().zip(written) {
                if matches!(outcome, Ok(Committed::Conflict)) && steps[i].facts {
                    again.push(i);
                } else {
                    outcomes[i] = Some(outcome);
                }
            }
            (false, again)
        }
    };
    if !again.is_empty() {
        let mut retried = take(&mut steps, &again);
        // Chained again from the log as each request decided it: what the first try chained a
        // step onto may not be written (a command answered `Conflict`), and a step chained onto
        // it can expect the very version the log is at while carrying that step's change.
        if let Some(decided) = &decided {
            for (step, &i) in retried.iter_mut().zip(&again) {
                step.appends = Arc::clone(&decided[i]);
                rebased[i] = None;
            }
        }
        let second = match crate::guard_chain::rebase_onto_log(store.as_ref(), &mut retried).await {
            Ok(states) if states.iter().any(Option::is_some) => {
                for (&i, states) in again.iter().zip(states) {
                    rebased[i] = states;
                }
                write_whole(store, &retried).await
            }
            Ok(_) => None,
            Err(error) => {
                tracing::warn!(%error, "reading guards to rebase a batch failed");
                None
            }
        };
        put_back(&mut steps, &again, retried);
        match second {
            Some(written) => {
                for (&i, outcome) in again.iter().zip(written) {
                    outcomes[i] = Some(outcome);
                }
            }
            None if refused => {
                let mut alone = take(&mut steps, &again);
                if let Some(decided) = &decided {
                    for (step, &i) in alone.iter_mut().zip(&again) {
                        step.appends = Arc::clone(&decided[i]);
                        rebased[i] = None;
                    }
                }
                for (&i, outcome) in again.iter().zip(write_alone(store, &alone).await) {
                    outcomes[i] = Some(outcome);
                }
            }
            // The statement answered these `Conflict` and wrote nothing of them.
            None => {
                for &i in &again {
                    outcomes[i] = Some(Ok(Committed::Conflict));
                }
            }
        }
    }
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

/// [`write_whole`] for the steps at `indices` of `steps`.
async fn write_some(
    store: &Store,
    steps: &mut [Work],
    indices: &[usize],
) -> Option<Vec<Result<Committed, GroupCommitError>>> {
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

/// Per step, whether an earlier step of the batch (not itself overtaken) appends to one of its
/// streams and leaves it at another version than the step expects. Such a step can only
/// conflict, and in the batch it would refuse the others; so it is answered `Conflict` unwritten
/// and its request decides again against what the batch wrote. (Facts on one guard are chained
/// before this, so they continue each other.)
fn overtaken(steps: &[Work]) -> Vec<bool> {
    let mut leaves: HashMap<&str, u64> = HashMap::new();
    steps
        .iter()
        .map(|step| {
            let behind = step.appends.iter().any(|append| {
                let left = leaves.get(append.stream_id.as_str());
                expected_start(append).is_some_and(|start| left.is_some_and(|&left| left != start))
            });
            if !behind {
                for append in step.appends.iter() {
                    if let Some(start) = expected_start(append) {
                        let left = start + append.events.len() as u64;
                        leaves.insert(append.stream_id.as_str(), left);
                    }
                }
            }
            behind
        })
        .collect()
}

/// The version an append expects its stream at, when it names one.
fn expected_start(append: &StreamAppend) -> Option<u64> {
    match append.expected {
        ExpectedVersion::NoStream => Some(0),
        ExpectedVersion::Exact(version) => Some(version),
        ExpectedVersion::Any | ExpectedVersion::StreamExists => None,
    }
}

/// The steps as one batch: one statement on PostgreSQL, else one transaction
/// ([`write_steps`]). None when the statement refused the batch (nothing was written).
async fn write_whole(
    store: &Store,
    steps: &[Work],
) -> Option<Vec<Result<Committed, GroupCommitError>>> {
    match group_statement::write(store, steps).await {
        Ok(Written::Done(outcomes)) => Some(outcomes.into_iter().map(Ok).collect()),
        Ok(Written::Unreadable(error)) => Some(
            steps
                .iter()
                .map(|_| Err(GroupCommitError::Unexpected(error.clone())))
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
async fn write_alone(store: &Store, steps: &[Work]) -> Vec<Result<Committed, GroupCommitError>> {
    if steps.len() > 1 {
        metrics::counter!("asiento_group_commit_retried_alone_total").increment(steps.len() as u64);
    }
    let mut outcomes = Vec::with_capacity(steps.len());
    for step in steps {
        outcomes.push(
            write_steps(store, std::slice::from_ref(step))
                .await
                .and_then(|mut one| one.pop().ok_or(GroupCommitError::Stopped)),
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
async fn write_steps(store: &Store, steps: &[Work]) -> Result<Vec<Committed>, GroupCommitError> {
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
async fn write_step(
    store: &Store,
    tx: &mut Tx,
    step: &Work,
) -> Result<Committed, GroupCommitError> {
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

#[cfg(test)]
mod tests {
    use asiento_eventstore::{Metadata, NewEvent};

    use super::*;

    fn step(appends: &[(&str, ExpectedVersion, usize)]) -> Work {
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
    fn a_step_expecting_a_version_an_earlier_step_moves_past_is_overtaken() {
        use ExpectedVersion::{Any, Exact, NoStream};
        let steps = [
            step(&[("transfer-1", NoStream, 1), ("guard-a", Exact(4), 1)]),
            // Read guard-a at 4 too: overtaken.
            step(&[
                ("transfer-2", NoStream, 1),
                ("guard-a", Exact(4), 1),
                ("guard-b", Exact(1), 1),
            ]),
            // Continues where the first leaves guard-a: not.
            step(&[("transfer-3", NoStream, 1), ("guard-a", Exact(5), 2)]),
            // The overtaken step moves nothing: guard-b is still where this one expects it.
            step(&[("guard-b", Exact(1), 1)]),
            // Any version: never overtaken.
            step(&[("guard-a", Any, 1)]),
            step(&[("guard-a", Exact(6), 1)]),
        ];
        assert_eq!(overtaken(&steps), [false, true, false, false, false, true]);
    }
}
