//! Ledger commands: transfers between client accounts ([`transfers`]), the endings of holds
//! ([`holds`]) and declarations of an account's policy ([`accounts`]).
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
pub mod holds;
pub mod transfers;

use std::collections::BTreeMap;
use std::sync::Arc;

use asiento_domain::guard::{DebitGuard, GuardAppend, GuardKey};
use asiento_eventstore::{Database, StreamAppend};

use crate::clock::Clock;
use crate::commit::{Committed, Completion, Respond, Work, Writer};
use crate::idempotency::{self, Claim, Completing, FreshClaim, Lease, StoredResponse};
use crate::log::{self, Store};
pub(crate) use crate::payments::back_off;
use crate::payments::{FlowError, Idempotent};
use crate::reply::{Answer, Rejected, Render, Reply};

pub use accounts::AccountDeclaration;
pub use transfers::NewTransfer;

#[derive(Clone)]
pub struct LedgerFlow {
    pub database: Database,
    pub store: Store,
    /// The process's one writer, shared with the payment flow; its guard memory lets a transfer
    /// read from the log only the guards it holds no state of.
    pub writer: Arc<Writer>,
    pub clock: Arc<dyn Clock>,
    pub render: Arc<dyn Render>,
    pub idempotency_lease_ms: i64,
}

/// What a ledger command decided, to be committed with its idempotency record.
enum Decided<F> {
    /// A business rejection: stored as the key's answer, nothing appended.
    Refused(Rejected),
    /// Appends, what they do to the guards, and how to render the answer once they are in
    /// (given the last position written).
    Append(Vec<StreamAppend>, Touched, F),
}

/// A decision's guards: the states it was decided against and what it appends to them, from
/// which the guard memory learns once the decision commits.
struct Touched {
    read: BTreeMap<GuardKey, DebitGuard>,
    appends: Vec<GuardAppend>,
}

/// How many guard races a ledger command may lose before it gives up (an internal error). A hot
/// account's contenders each lose at most one race per command that wins, so this is sized for
/// dozens of concurrent commands on one account, spread by [`back_off`].
pub const LEDGER_CONFLICT_RETRIES_MAX: u32 = 64;

impl LedgerFlow {
    /// Writes a command's `step` through the process's writer and tells the guard memory its
    /// outcome (`touched`: the guards it was decided against and what it appends to them). Until
    /// the outcome is in memory, this process's transfers on those guards wait for it.
    async fn write(&self, step: Work, touched: Option<&Touched>) -> Result<Committed, FlowError> {
        let _writing = touched.map(|touched| {
            let keys = touched.appends.iter().map(|append| append.key.clone());
            self.writer.guards().writing(keys)
        });
        let outcome = self.writer.commit(step).await?;
        if let Some(Touched { read, appends }) = touched {
            match outcome {
                Committed::Written(_) => self.writer.guards().wrote(read, appends),
                Committed::Conflict => self.writer.guards().lost_race(read),
                // The interactive claim writes it, and that path does not tell the memory what
                // it wrote.
                _ => self.writer.guards().forget(read.keys()),
            }
        }
        Ok(outcome)
    }

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
        let (appends, touched, respond): (Vec<StreamAppend>, Option<Touched>, Arc<Respond>) =
            match decided {
                Decided::Refused(rejected) => {
                    let response = self.render.render(&Reply::Rejected(rejected));
                    (Vec::new(), None, Respond::new(move |_| response.clone()))
                }
                Decided::Append(appends, touched, reply) => {
                    let render = Arc::clone(&self.render);
                    let respond = Respond::new(move |position: Option<i64>| {
                        reply(render.as_ref(), position.unwrap_or_default())
                    });
                    respond.prepare_for(self.database.backend());
                    (appends, Some(touched), respond)
                }
            };
        let lease = Lease::new(now, self.idempotency_lease_ms);
        let appends: Arc<[StreamAppend]> = appends.into();
        let step = Work {
            claim: Some(FreshClaim {
                scope: request.scope.clone(),
                key: request.key.clone(),
                body: request.body,
                resource_id: resource_id.to_owned(),
                lease,
                now_ms: now,
            }),
            appends: Arc::clone(&appends),
            completion: Some(Completion {
                completing: Completing {
                    scope: request.scope.clone(),
                    key: request.key.clone(),
                    lease,
                    response: StoredResponse::default(),
                    now_ms: now,
                },
                respond: Arc::clone(&respond),
            }),
            inbox: None,
            facts: false,
        };
        let outcome = self.write(step, touched.as_ref()).await?;
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
        let position = if appends.is_empty() {
            None
        } else {
            match self.store.append_in(&mut tx, appends).await {
                Ok(appended) => Some(appended.last_position),
                Err(error) if log::is_conflict(&error) => {
                    metrics::counter!("asiento_ledger_conflicts_total").increment(1);
                    tx.rollback().await?;
                    return Ok(None);
                }
                Err(error) => return Err(FlowError::Append(error)),
            }
        };
        let response = respond.at(position);
        idempotency::complete(&mut tx, &request.scope, &request.key, lease, &response, now).await?;
        tx.commit().await?;
        Ok(Some(Answer::Done(response)))
    }
}
