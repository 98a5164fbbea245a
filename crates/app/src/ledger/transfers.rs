//! `POST /v1/transfers`: a two-leg journal entry between two client accounts of one tenant, or a
//! hold (`pending`) reserving the amount on their pending accounts, committed with the debit
//! guards of both (see [`super`]). Of two transfers racing for the same money, the second is
//! decided again against the new balance, where it may be refused with `insufficient_funds`.

use asiento_domain::{
    transfer::{decide_with_guards, TransferDecision},
    AccountName, Amount, Currency, RequestTransfer, TenantId, Transfer, TransferId,
    TransferRejection,
};
use asiento_eventstore::Metadata;
use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::{back_off, Decided, LedgerFlow, LEDGER_CONFLICT_RETRIES_MAX};
use crate::commit::guard_memory::Loaded;
use crate::commit::{GuardWrite, Turn};
use crate::log;
use crate::payments::{FlowError, Idempotent};
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
    /// A hold, posted or voided later ([`super::holds`]).
    pub pending: bool,
    pub expires_at: Option<DateTime<Utc>>,
}

impl NewTransfer {
    /// The domain's request for this transfer, as transfer `id`, asked `at`.
    pub(crate) fn request(&self, id: TransferId, at: DateTime<Utc>) -> RequestTransfer {
        RequestTransfer {
            id,
            tenant: self.tenant.clone(),
            from: self.from.clone(),
            to: self.to.clone(),
            amount: self.amount,
            currency: self.currency,
            description: self.description.clone(),
            pending: self.pending,
            expires_at: self.expires_at,
            at,
        }
    }
}

impl LedgerFlow {
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
        let mut refused_on_memory = false;
        // Kept through the retries: a transfer that loses a race stays first in line.
        let mut turn = Turn::default();
        for attempt in 0..LEDGER_CONFLICT_RETRIES_MAX {
            let command = transfer.request(id, self.clock.now());
            // Rejections of the request itself (same accounts, a system account, a long
            // description) are answered before the key is claimed, so they are not stored; the
            // guards to load are those of the entry the transfer would post.
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
            let posted = log::transfer_entries(&entries);
            self.writer
                .guards()
                .take_turn(posted.iter().copied(), &mut turn)
                .await;
            let loaded = if refused_on_memory {
                Loaded {
                    states: log::load_guards(self.store.as_ref(), posted).await?,
                    remembered: false,
                }
            } else {
                self.writer
                    .guards()
                    .load_after_writes(self.store.as_ref(), posted)
                    .await?
            };
            let decided = match decide_with_guards(&Transfer::default(), command, &loaded.states) {
                // Only the log refuses a command: decided again against it.
                Err(_) if loaded.remembered => {
                    refused_on_memory = true;
                    continue;
                }
                Err(TransferRejection::Guard(guard)) => Decided::Refused(Rejected::Guard(guard)),
                Err(other) => Decided::Refused(Rejected::Transfer(other)),
                Ok(TransferDecision { events, guards }) => {
                    let appends = log::decision_appends(
                        asiento_domain::transfer_stream(id),
                        0,
                        log::encode(&events, &metadata, log::transfer_codec)?,
                        &guards,
                        &metadata,
                    )?;
                    let touched = GuardWrite {
                        read: loaded.states,
                        appends: guards,
                    };
                    let record = events
                        .iter()
                        .fold(Transfer::default(), asiento_domain::transfer::evolve)
                        .record
                        .ok_or_else(|| {
                            FlowError::Inconsistent("transfer without a record".to_owned())
                        })?;
                    Decided::Append(appends, touched, move |render: &dyn Render, position| {
                        render.render(&Reply::Transfer {
                            transfer: &record,
                            created: true,
                            position,
                        })
                    })
                }
            };
            if let Some(answer) = self.commit(request, &id.to_string(), decided).await? {
                return Ok(answer);
            }
            back_off(attempt).await;
        }
        Err(FlowError::Contended(format!("transfer {id}")))
    }
}
