//! Ledger commands: transfers between client accounts ([`transfers`]) and their atomic batches
//! ([`batches`]), the endings of holds ([`holds`]), declarations of an account's policy ([`accounts`]) and balance monitors
//! ([`monitors`]).
//!
//! Each is decided against the debit guards it touches and then committed by [`LedgerFlow::commit`]
//! as one group-commit step (`crate::commit`), with other requests' steps: the idempotency
//! key claimed and completed at once, and the events with each guard at its exact expected
//! version. A command's guard events are never rebased onto another step's (a guard may refuse a
//! command). Two commands racing on one guard cannot both pass: the second's step conflicts and
//! nothing of it (its key included) is written, and the command is decided again against the new
//! state, after a short pause that grows with each lost race. A key that exists is claimed the
//! interactive way, in a transaction of its own, which tells a replay, a key in flight and a
//! reused key apart.

pub mod accounts;
pub mod batches;
pub mod holds;
pub mod monitors;
pub mod transfers;

use std::sync::Arc;

use asiento_eventstore::{Database, StreamAppend};

use crate::clock::Clock;
use crate::commit::{Command, Committed, GuardWrite, Respond, Settle, Step, Writer};
use crate::idempotency::{self, Claim, FreshClaim, Lease, StoredResponse};
use crate::log::{self, Store};
pub(crate) use crate::payments::back_off;
use crate::payments::{FlowError, Idempotent};
use crate::reply::{Answer, Rejected, Render, Reply};

pub use accounts::AccountDeclaration;
pub use monitors::{MonitorState, NewMonitor};
pub use transfers::NewTransfer;

/// The ledger commands' use cases. Made with [`LedgerFlow::new`]; cheap to clone.
#[derive(Clone)]
pub struct LedgerFlow {
    pub(crate) database: Database,
    pub(crate) store: Store,
    /// The database's one writer, shared with the payment flow; its guard memory lets a transfer
    /// read from the log only the guards it holds no state of.
    pub(crate) writer: Arc<Writer>,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) render: Arc<dyn Render>,
    pub(crate) idempotency_lease_ms: i64,
}

impl LedgerFlow {
    /// The ledger flow on `database`, writing through the process's `writer` (made on the same
    /// database's store); keys held for [`crate::payments::IDEMPOTENCY_LEASE_MS_DEFAULT`]
    /// ([`LedgerFlow::with_idempotency_lease`]).
    pub fn new(
        database: Database,
        writer: Arc<Writer>,
        clock: Arc<dyn Clock>,
        render: Arc<dyn Render>,
    ) -> LedgerFlow {
        LedgerFlow {
            store: writer.store().clone(),
            database,
            writer,
            clock,
            render,
            idempotency_lease_ms: crate::payments::IDEMPOTENCY_LEASE_MS_DEFAULT,
        }
    }

    /// With requests holding their idempotency key this long.
    pub fn with_idempotency_lease(self, idempotency_lease_ms: i64) -> LedgerFlow {
        LedgerFlow {
            idempotency_lease_ms,
            ..self
        }
    }

    /// The store it reads and writes.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// The process's writer it commits through.
    pub fn writer(&self) -> &Arc<Writer> {
        &self.writer
    }
}

/// What a ledger command decided, to be committed with its idempotency record.
enum Decided<F> {
    /// A business rejection: stored as the key's answer, nothing appended.
    Refused(Rejected),
    /// Appends, what they do to the guards, and how to render the answer once they are in
    /// (given the last position written).
    Append(Vec<StreamAppend>, GuardWrite, F),
}

/// How many guard races a ledger command may lose before it gives up (an internal error). A hot
/// account's contenders each lose at most one race per command that wins, so this is sized for
/// dozens of concurrent commands on one account, spread by [`back_off`].
pub const LEDGER_CONFLICT_RETRIES_MAX: u32 = 64;

impl LedgerFlow {
    /// Commits the decision with its key claimed and completed at once. `Ok(None)`: a guard race
    /// was lost (nothing was written); decide again.
    async fn commit<F>(
        &self,
        request: &Idempotent,
        resource_id: &str,
        decided: Decided<F>,
    ) -> Result<Option<Answer>, FlowError>
    where
        F: Fn(&dyn Render, i64) -> StoredResponse + Send + Sync + 'static,
    {
        let now = self.clock.now().timestamp_millis();
        let (appends, guards, respond): (Vec<StreamAppend>, GuardWrite, Arc<Respond>) =
            match decided {
                Decided::Refused(rejected) => {
                    let response = self.render.render(&Reply::Rejected(rejected));
                    let respond = Respond::new(move |_| response.clone());
                    (Vec::new(), GuardWrite::default(), respond)
                }
                Decided::Append(appends, guards, reply) => {
                    let render = Arc::clone(&self.render);
                    let respond = Respond::new(move |position: Option<i64>| {
                        reply(render.as_ref(), position.unwrap_or_default())
                    });
                    respond.prepare_for(self.database.backend());
                    (appends, guards, respond)
                }
            };
        let appends: Arc<[StreamAppend]> = appends.into();
        let step = Step::Command(Command {
            appends: Arc::clone(&appends),
            guards,
            key: Some(Settle {
                claim: FreshClaim {
                    scope: request.scope.clone(),
                    key: request.key.clone(),
                    body: request.body,
                    resource_id: resource_id.to_owned(),
                    lease: Lease::new(now, self.idempotency_lease_ms),
                    now_ms: now,
                },
                respond: Arc::clone(&respond),
            }),
        });
        let outcome = self.writer.commit(step).await?;
        match outcome {
            Committed::Written(appended) => Ok(Some(Answer::Done(
                respond.at(appended.map(|appended| appended.last_position)),
            ))),
            Committed::Conflict => {
                metrics::counter!("asiento_ledger_conflicts_total").increment(1);
                Ok(None)
            }
            Committed::NotFresh => {
                self.commit_claimed(request, resource_id, &appends, &respond)
                    .await
            }
            other => Err(FlowError::Inconsistent(format!(
                "a ledger command's step ended {other:?}"
            ))),
        }
    }

    /// [`LedgerFlow::commit`] for a key that exists: claimed in a transaction of its own, which
    /// answers a replay, a key in flight or a reused key, and resumes a key whose holder's lease
    /// ran out.
    async fn commit_claimed(
        &self,
        request: &Idempotent,
        resource_id: &str,
        appends: &[StreamAppend],
        respond: &Respond,
    ) -> Result<Option<Answer>, FlowError> {
        let now = self.clock.now().timestamp_millis();
        let mut tx = self.store.begin().await?;
        let claim = idempotency::claim(
            &mut tx,
            &request.scope,
            &request.key,
            request.body,
            resource_id,
            now,
            self.idempotency_lease_ms,
        )
        .await?;
        let lease = match claim {
            Claim::Fresh { lease } => lease,
            // Claim, events and response commit together, so a ledger key is never left in
            // flight by a crash; an expired one can only come from a failed commit. Deciding
            // again under the taken-over lease is then safe.
            Claim::Resumed { lease, .. } => lease,
            other => {
                // The claim wrote nothing: ended rather than dropped, so that the store keeps
                // the connection.
                tx.rollback().await?;
                return Ok(Some(crate::payments::answer_without_work(other)));
            }
        };
        let (appended, uncommitted) = match self
            .writer
            // The writer forgot the guards the step was decided against when it came back
            // `NotFresh`: nothing for the memory to learn here.
            .append_in(&mut tx, appends, GuardWrite::default(), None)
            .await
        {
            Ok(written) => written,
            Err(error) if log::is_conflict(&error) => {
                metrics::counter!("asiento_ledger_conflicts_total").increment(1);
                tx.rollback().await?;
                return Ok(None);
            }
            Err(error) => return Err(FlowError::Append(error)),
        };
        let position = appended.map(|appended| appended.last_position);
        let response = respond.at(position);
        idempotency::complete(&mut tx, &request.scope, &request.key, lease, &response, now).await?;
        tx.commit().await?;
        uncommitted.committed();
        Ok(Some(Answer::Done(response)))
    }
}
