//! Ledger commands: transfers between client accounts ([`transfers`]), the endings of holds
//! ([`holds`]) and declarations of an account's policy ([`accounts`]).
//!
//! Each is decided against the debit guards it touches and then committed by [`LedgerFlow::commit`]
//! in one transaction: the idempotency claim, the events with each guard at its exact expected
//! version, and the stored response. Two commands racing on one guard cannot both pass: the
//! second append conflicts, the whole transaction (claim included) rolls back, and the command is
//! decided again against the new state, after a short pause that grows with each lost race.

pub mod accounts;
pub mod holds;
pub mod transfers;

use std::sync::Arc;

use asiento_eventstore::{Database, StreamAppend};

use crate::clock::Clock;
use crate::idempotency::{self, Claim, StoredResponse};
use crate::log::{self, Store};
pub(crate) use crate::payments::conflict_backoff;
use crate::payments::{FlowError, Idempotent};
use crate::reply::{Answer, Rejected, Render, Reply};

pub use accounts::AccountDeclaration;
pub use transfers::NewTransfer;

#[derive(Clone)]
pub struct LedgerFlow {
    pub database: Database,
    pub store: Store,
    pub clock: Arc<dyn Clock>,
    pub render: Arc<dyn Render>,
    pub idempotency_lease_ms: i64,
}

/// What a ledger command decided, to be committed with its idempotency record.
enum Decided<F> {
    /// A business rejection: stored as the key's answer, nothing appended.
    Refused(Rejected),
    /// Appends, and how to render the answer once they are in (given the last position
    /// written).
    Append(Vec<StreamAppend>, F),
}

/// How many guard races a ledger command may lose before it gives up (an internal error). A hot
/// account's contenders each lose at most one race per command that wins, so this is sized for
/// dozens of concurrent commands on one account, spread by [`conflict_backoff`].
pub const LEDGER_CONFLICT_RETRIES_MAX: u32 = 64;

impl LedgerFlow {
    /// Claims the key, then stores the rejection or appends and renders. `Ok(None)`: a guard
    /// race was lost (nothing was written); decide again.
    async fn commit<F>(
        &self,
        request: &Idempotent,
        resource_id: &str,
        decided: Decided<F>,
    ) -> Result<Option<Answer>, FlowError>
    where
        F: FnOnce(&dyn Render, i64) -> StoredResponse,
    {
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
        let response = match decided {
            Decided::Refused(rejected) => self.render.render(&Reply::Rejected(rejected)),
            Decided::Append(appends, reply) => {
                let appended = match self.store.append_in(&mut tx, &appends).await {
                    Ok(appended) => appended,
                    Err(error) if log::is_conflict(&error) => {
                        metrics::counter!("asiento_ledger_conflicts_total").increment(1);
                        tx.rollback().await?;
                        return Ok(None);
                    }
                    Err(error) => return Err(FlowError::Append(error)),
                };
                reply(self.render.as_ref(), appended.last_position)
            }
        };
        idempotency::complete(&mut tx, &request.scope, &request.key, lease, &response, now).await?;
        tx.commit().await?;
        Ok(Some(Answer::Done(response)))
    }
}
