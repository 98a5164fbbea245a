//! A step: what one request hands the writer to write, as what it is, and how it ended.

use std::collections::BTreeMap;
use std::sync::Arc;

use asiento_domain::guard::{DebitGuard, GuardAppend, GuardKey};
use asiento_domain::{Payment, PaymentId};
use asiento_eventstore::{AppendError, Appended, StoreError, StreamAppend};
use tokio::sync::oneshot;

use super::respond::Respond;
use crate::idempotency::{Completing, FreshClaim, IdempotencyError, StoredResponse};
use crate::webhooks::InboxRow;

/// What a rebased step leaves its guards in, once written: its request remembers these instead
/// of the states it computed itself.
pub type GuardStates = Vec<(GuardKey, DebitGuard)>;

/// Requests written in one transaction, at most. (The queue itself is unbounded: what waits in
/// it is bounded by the requests in flight.)
pub const BATCH_MAX: usize = 64;

/// One request's step, as what it is: what the writer writes, and what its memories learn from
/// how it ended (`super::writer`).
// A step lives from its request's decision to `Writer::commit`, which splits it at once: what
// waits in the queue is its `Work`, without the payment's state.
#[allow(clippy::large_enum_variant)]
pub enum Step {
    /// A new key claimed with the first events of the work it names: a payment's intent, a
    /// merchant's capture or refund recorded on its payment. It touches no guard.
    Claim {
        claim: FreshClaim,
        appends: Arc<[StreamAppend]>,
    },
    /// A payment's provider facts (a request's finalisation).
    Facts(Facts),
    /// A ledger command: a transfer, a hold's ending, a declaration of an account's policy.
    Command(Command),
    /// A verified provider event for the webhook inbox.
    Inbox(InboxRow),
}

/// A payment's provider facts: its stream's append and its guards'. A guard never refuses a
/// fact, so its guard appends may be rebased onto the state an earlier step leaves (`plan`).
pub struct Facts {
    /// The events of the decision, one append per stream. Shared, so that a batch keeps them as
    /// decided while it chains them, without a copy of every event.
    pub appends: Arc<[StreamAppend]>,
    pub guards: GuardWrite,
    /// The payment and the state the facts leave it in, for the payment memory (none: facts on
    /// a stream that is not a payment's).
    pub payment: Option<(PaymentId, Payment)>,
    /// The request's key, completed with the answer rendered from what the append wrote (none:
    /// facts that answer no request).
    pub completion: Option<Completion>,
}

/// A ledger command. Its guard appends are never rebased (a guard may refuse a command): it
/// conflicts if another step moved one of its guards first.
pub struct Command {
    pub appends: Arc<[StreamAppend]>,
    pub guards: GuardWrite,
    /// The request's key, claimed and completed at once (none: the hold-expiry worker's step).
    pub key: Option<Settle>,
}

/// A key claimed and completed by one step: the claim, and its answer rendered from what the
/// step wrote (its position is in the answer).
pub struct Settle {
    pub claim: FreshClaim,
    pub respond: Arc<Respond>,
}

/// The guard states a decision read and what it appends to them: what the guard memory learns
/// from the step's outcome.
#[derive(Debug, Clone, Default)]
pub struct GuardWrite {
    pub read: BTreeMap<GuardKey, DebitGuard>,
    pub appends: Vec<GuardAppend>,
}

/// A completion whose response depends on the append (its position is in the answer).
pub struct Completion {
    /// The key, its lease and the time; the response is rendered by `respond`.
    pub completing: Completing,
    pub respond: Arc<Respond>,
}

/// The rows one step writes, as a batch writes them (`batch`, `statement`). Made from a
/// [`Step`], whose kinds are the only shapes it takes.
#[derive(Default)]
pub struct Work {
    /// A key to claim as new.
    pub(crate) claim: Option<FreshClaim>,
    /// The events (one decision: its aggregate's stream and its guards' streams).
    pub(crate) appends: Arc<[StreamAppend]>,
    /// A held key to complete, with the answer rendered from what the append wrote.
    pub(crate) completion: Option<Completion>,
    /// A provider event to store in the webhook inbox (alone: a webhook's step).
    pub(crate) inbox: Option<InboxRow>,
    /// Its guard appends are provider facts, which `plan` may rebase.
    pub(crate) facts: bool,
}

/// What a step's outcome teaches the writer's memories (`super::writer`).
#[derive(Debug, Default)]
pub(crate) struct Lesson {
    pub(crate) guards: GuardWrite,
    pub(crate) payment: Option<(PaymentId, Payment)>,
}

impl Step {
    /// The rows the step writes, and what its outcome teaches the memories.
    pub(crate) fn into_parts(self) -> (Work, Lesson) {
        match self {
            Step::Claim { claim, appends } => (
                Work {
                    claim: Some(claim),
                    appends,
                    ..Work::default()
                },
                Lesson::default(),
            ),
            Step::Facts(Facts {
                appends,
                guards,
                payment,
                completion,
            }) => (
                Work {
                    appends,
                    completion,
                    facts: true,
                    ..Work::default()
                },
                Lesson { guards, payment },
            ),
            Step::Command(Command {
                appends,
                guards,
                key,
            }) => {
                let (claim, completion) = match key {
                    Some(Settle { claim, respond }) => {
                        let completing = Completing {
                            scope: claim.scope.clone(),
                            key: claim.key.clone(),
                            lease: claim.lease,
                            response: StoredResponse::default(),
                            now_ms: claim.now_ms,
                        };
                        let completion = Completion {
                            completing,
                            respond,
                        };
                        (Some(claim), Some(completion))
                    }
                    None => (None, None),
                };
                let work = Work {
                    claim,
                    appends,
                    completion,
                    ..Work::default()
                };
                let lesson = Lesson {
                    guards,
                    payment: None,
                };
                (work, lesson)
            }
            Step::Inbox(row) => (
                Work {
                    inbox: Some(row),
                    ..Work::default()
                },
                Lesson::default(),
            ),
        }
    }
}

impl Work {
    /// Its events, one append per stream.
    pub fn appends(&self) -> &[StreamAppend] {
        &self.appends
    }
}

impl From<Step> for Work {
    fn from(step: Step) -> Work {
        step.into_parts().0
    }
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
