//! `POST /v1/transfers/batch`: up to 100 transfers (holds included) written all or none under
//! one key. The batch is decided in order against the debit guards all its entries touch, each
//! transfer on what the ones before it leave (`asiento_domain::transfer_batch`), and committed
//! as one ledger step through the same writer as a single transfer: every transfer's stream and
//! one append per guard, each at its exact expected version, in one transaction. A refused
//! transfer refuses the batch (the index and reason of the first are the key's answer, stored
//! like any rejection); a lost guard race decides the whole batch again.

use asiento_domain::transfer::evolve;
use asiento_domain::transfer_batch::{decide_batch, BatchDecision};
use asiento_domain::{RequestTransfer, Transfer, TransferEvent, TransferId};
use asiento_eventstore::{Metadata, StreamAppend};
use uuid::Uuid;

use super::transfers::NewTransfer;
use super::{back_off, Decided, LedgerFlow, LEDGER_CONFLICT_RETRIES_MAX};
use crate::commit::guard_memory::Loaded;
use crate::commit::{GuardWrite, Turn};
use crate::log;
use crate::payments::{FlowError, Idempotent};
use crate::reply::{Answer, Rejected, Render, Reply};

impl LedgerFlow {
    /// Writes `transfers` (one tenant's, 1 to [`asiento_domain::transfer_batch::BATCH_TRANSFERS_MAX`],
    /// checked at the edge) all or none.
    #[tracing::instrument(skip_all, fields(key = request.key.as_str(), transfers = transfers.len()))]
    pub async fn transfer_batch(
        &self,
        request: &Idempotent,
        transfers: Vec<NewTransfer>,
    ) -> Result<Answer, FlowError> {
        let ids: Vec<TransferId> = transfers
            .iter()
            .map(|_| TransferId::from_uuid(Uuid::now_v7()))
            .collect();
        // What the key names: the batch's first transfer stands for it.
        let resource = format!(
            "batch:{}",
            ids.first().map(ToString::to_string).unwrap_or_default()
        );
        let tenant = transfers
            .first()
            .map(|t| t.tenant.to_string())
            .unwrap_or_default();
        let metadata = Metadata {
            tenant: Some(tenant),
            correlation_id: request.correlation_id,
            causation_id: None,
            idempotency_key: Some(request.key.as_str().to_owned()),
        };
        let mut refused_on_memory = false;
        let mut turn = Turn::default();
        for attempt in 0..LEDGER_CONFLICT_RETRIES_MAX {
            let at = self.clock.now();
            let requests: Vec<RequestTransfer> = transfers
                .iter()
                .zip(&ids)
                .map(|(transfer, id)| transfer.request(*id, at))
                .collect();
            // Rejections of a request itself are answered before the key is claimed, as for a
            // single transfer; the guards to load are those of every entry the batch would post.
            let mut entries = Vec::with_capacity(requests.len());
            for (index, request) in requests.iter().enumerate() {
                match asiento_domain::transfer::decide(&Transfer::default(), request.clone()) {
                    Ok(events) => entries.push(events),
                    Err(rejection) => {
                        return Ok(Answer::Done(self.render.render(&Reply::Rejected(
                            Rejected::Batch {
                                index,
                                rejection: Box::new(Rejected::Transfer(rejection)),
                            },
                        ))))
                    }
                }
            }
            let posted: Vec<_> = entries
                .iter()
                .flat_map(|events| log::transfer_entries(events))
                .collect();
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
            let decided = match decide_batch(requests, &loaded.states) {
                // Only the log refuses a command: decided again against it.
                Err(_) if loaded.remembered => {
                    refused_on_memory = true;
                    continue;
                }
                Err(refused) => {
                    let rejection = match refused.rejection {
                        asiento_domain::TransferRejection::Guard(guard) => Rejected::Guard(guard),
                        other => Rejected::Transfer(other),
                    };
                    Decided::Refused(Rejected::Batch {
                        index: refused.index,
                        rejection: Box::new(rejection),
                    })
                }
                Ok(BatchDecision { transfers, guards }) => {
                    let mut appends: Vec<StreamAppend> =
                        Vec::with_capacity(transfers.len() + guards.len());
                    for (id, events) in ids.iter().zip(&transfers) {
                        appends.extend(log::decision_appends(
                            asiento_domain::transfer_stream(*id),
                            0,
                            log::encode(events, &metadata, log::transfer_codec)?,
                            &[],
                            &metadata,
                        )?);
                    }
                    appends.extend(log::guard_appends(&guards, &metadata)?);
                    let records = transfers
                        .iter()
                        .map(|events| record_of(events))
                        .collect::<Result<Vec<_>, _>>()?;
                    let touched = GuardWrite {
                        read: loaded.states,
                        appends: guards,
                    };
                    Decided::Append(appends, touched, move |render: &dyn Render, position| {
                        render.render(&Reply::TransferBatch {
                            transfers: &records,
                            position,
                        })
                    })
                }
            };
            if let Some(answer) = self.commit(request, &resource, decided).await? {
                return Ok(answer);
            }
            back_off(attempt).await;
        }
        Err(FlowError::Contended(format!("transfer batch {resource}")))
    }
}

/// The transfer its events make.
fn record_of(
    events: &[TransferEvent],
) -> Result<asiento_domain::transfer::TransferRecord, FlowError> {
    events
        .iter()
        .fold(Transfer::default(), evolve)
        .record
        .ok_or_else(|| FlowError::Inconsistent("transfer without a record".to_owned()))
}
