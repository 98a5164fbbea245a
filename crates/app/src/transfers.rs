//! `POST /v1/transfers`: a two-leg journal entry between two accounts of one tenant.
//!
//! Everything happens in one transaction: the idempotency claim, the transfer's events, the debit
//! guards of its `customer:…` accounts (each with its exact expected version) and the stored
//! response. Two transfers racing for the same money cannot both pass: the second append conflicts
//! on the guard's version, the whole transaction (claim included) rolls back, and the transfer is
//! decided again against the new balance, where it may be refused with `insufficient_funds`.

use std::sync::Arc;

use asiento_domain::{
    transfer::{decide_with_guards, TransferDecision},
    AccountName, Amount, Currency, RequestTransfer, TenantId, Transfer, TransferId,
    TransferRejection,
};
use asiento_eventstore::{Database, Metadata};
use uuid::Uuid;

use crate::clock::Clock;
use crate::idempotency::{self, Claim};
use crate::log::{self, Store};
use crate::payments::{FlowError, Idempotent, CONFLICT_RETRIES_MAX};
use crate::reply::{Answer, Rejected, Render, Reply};

/// A transfer request, validated at the edge.
#[derive(Debug, Clone)]
pub struct NewTransfer {
    pub tenant: TenantId,
    pub from: AccountName,
    pub to: AccountName,
    pub amount: Amount,
    pub currency: Currency,
    pub description: Option<String>,
}

#[derive(Clone)]
pub struct TransferFlow {
    pub database: Database,
    pub store: Store,
    pub clock: Arc<dyn Clock>,
    pub render: Arc<dyn Render>,
    pub idempotency_lease_ms: i64,
}

impl TransferFlow {
    #[tracing::instrument(skip_all, fields(tenant = %transfer.tenant, key = request.key.as_str()))]
    pub async fn transfer(
        &self,
        request: &Idempotent,
        transfer: NewTransfer,
    ) -> Result<Answer, FlowError> {
        let id = TransferId::from_uuid(Uuid::now_v7());
        let metadata = Metadata {
            tenant: Some(transfer.tenant.to_string()),
            correlation_id: request.correlation_id,
            causation_id: None,
            idempotency_key: Some(request.key.as_str().to_owned()),
        };
        for _ in 0..CONFLICT_RETRIES_MAX {
            let now = self.clock.now();
            let command = RequestTransfer {
                id,
                tenant: transfer.tenant.clone(),
                from: transfer.from.clone(),
                to: transfer.to.clone(),
                amount: transfer.amount,
                currency: transfer.currency,
                description: transfer.description.clone(),
                at: now,
            };
            // Rejections of the request itself (same accounts, a long description) are answered
            // before the key is claimed, so they are not stored; the guards to load are those of
            // the entry the transfer would post.
            let entries =
                match asiento_domain::transfer::decide(&Transfer::default(), command.clone()) {
                    Ok(entries) => entries,
                    Err(rejection) => {
                        return Ok(Answer::Done(
                            self.render
                                .render(&Reply::Rejected(Rejected::Transfer(rejection))),
                        ))
                    }
                };
            let guards =
                log::load_guards(self.store.as_ref(), log::transfer_entries(&entries)).await?;
            let decided = decide_with_guards(&Transfer::default(), command, &guards);

            let mut tx = self.store.begin().await?;
            let claim = idempotency::claim(
                &mut tx,
                &request.scope,
                &request.key,
                request.body,
                &id.to_string(),
                now.timestamp_millis(),
                self.idempotency_lease_ms,
            )
            .await?;
            let lease = match claim {
                Claim::Fresh { lease } => lease,
                // Claim, events and response commit together, so a transfer key is never left in
                // flight by a crash; an expired one can only come from a failed commit. Deciding
                // again under the taken-over lease is then safe.
                Claim::Resumed { lease, .. } => lease,
                other => {
                    // The claim wrote nothing: ended rather than dropped, so that the store keeps
                    // the connection.
                    tx.rollback().await?;
                    return Ok(crate::payments::answer_without_work(other));
                }
            };
            let TransferDecision { events, guards } = match decided {
                Ok(decision) => decision,
                Err(rejection) => {
                    let rejected = match rejection {
                        TransferRejection::Guard(guard) => Rejected::Guard(guard),
                        other => Rejected::Transfer(other),
                    };
                    let response = self.render.render(&Reply::Rejected(rejected));
                    idempotency::complete(
                        &mut tx,
                        &request.scope,
                        &request.key,
                        lease,
                        &response,
                        now.timestamp_millis(),
                    )
                    .await?;
                    tx.commit().await?;
                    return Ok(Answer::Done(response));
                }
            };
            let appends = log::decision_appends(
                asiento_domain::transfer_stream(id),
                0,
                log::encode(&events, &metadata, log::transfer_codec)?,
                &guards,
                &metadata,
            )?;
            let appended = match self.store.append_in(&mut tx, &appends).await {
                Ok(appended) => appended,
                Err(error) if log::is_conflict(&error) => {
                    metrics::counter!("asiento_transfer_conflicts_total").increment(1);
                    tx.rollback().await?;
                    continue;
                }
                Err(error) => return Err(FlowError::Append(error)),
            };
            let record = events
                .iter()
                .fold(Transfer::default(), asiento_domain::transfer::evolve)
                .record
                .ok_or_else(|| FlowError::Inconsistent("transfer without a record".to_owned()))?;
            let response = self.render.render(&Reply::Transfer {
                transfer: &record,
                position: appended.last_position,
            });
            idempotency::complete(
                &mut tx,
                &request.scope,
                &request.key,
                lease,
                &response,
                now.timestamp_millis(),
            )
            .await?;
            tx.commit().await?;
            return Ok(Answer::Done(response));
        }
        Err(FlowError::Inconsistent(format!(
            "transfer {id} kept losing guard races"
        )))
    }
}
