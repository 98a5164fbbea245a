//! A step: what one request hands the writer to write, and how it ended.

use std::sync::Arc;

use asiento_eventstore::{AppendError, Appended, StoreError, StreamAppend};
use tokio::sync::oneshot;

use super::respond::Respond;
use crate::idempotency::{Completing, FreshClaim, IdempotencyError};
use crate::webhooks::InboxRow;
use asiento_domain::guard::{DebitGuard, GuardKey};

/// What a rebased step leaves its guards in, once written: its request remembers these instead
/// of the states it computed itself.
pub type GuardStates = Vec<(GuardKey, DebitGuard)>;

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
    /// onto the state an earlier step leaves (`plan`). A command's guard appends
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
    /// or onto the log (`plan`): the guard states its request computed are not the
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
pub enum CommitError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Append(#[from] AppendError),
    #[error(transparent)]
    Idempotency(#[from] IdempotencyError),
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
    #[error("the writer stopped")]
    Stopped,
    #[error("a step ended in a way its kind cannot: {0}")]
    Unexpected(String),
}

pub(crate) type Reply = oneshot::Sender<Result<Committed, CommitError>>;
