//! `POST /v1/transfers/{id}/post` and `/void`: ending a hold, and the worker's expiry of one
//! whose `expires_at` has passed ([`crate::hold_expiry`]).
//!
//! An ending is appended to the transfer's stream at the version it was decided against, with the
//! guards of both accounts: of a post and a void racing on one hold, the loser conflicts, is
//! decided again, and is refused because the hold has ended (`hold_posted`, `hold_voided`).

use asiento_domain::hold::{self, HoldAction, HoldRejection, SettleHold};
use asiento_domain::transfer::{evolve, TransferRecord};
use asiento_domain::{transfer_stream, TenantId, TransferId};
use asiento_eventstore::{Metadata, StreamAppend};

use super::{back_off, Decided, LedgerFlow, LEDGER_CONFLICT_RETRIES_MAX};
use crate::commit::{Command, Committed, GuardWrite, Step, Turn};
use crate::log;
use crate::payments::{FlowError, Idempotent};
use crate::reply::{Answer, Rejected, Render, Reply};

/// What the worker's expiry of one hold found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HoldExpiry {
    /// Voided now, as expired.
    Expired,
    /// Posted or voided before: nothing to do.
    AlreadyEnded,
    /// Its `expires_at` has not passed (by this process's clock).
    NotDue,
    /// Refused for another reason: the row that named it does not name an open hold (a bug).
    Refused(HoldRejection),
    /// Every try this round lost its race on the hold's accounts: left for the next round.
    Contended,
}

/// An ending decided: the appends, what they do to the guards, and the transfer as they leave it.
type Ending = Result<(Vec<StreamAppend>, GuardWrite, TransferRecord), HoldRejection>;

impl LedgerFlow {
    #[tracing::instrument(skip_all, fields(tenant = %tenant, transfer = %id))]
    pub async fn settle_hold(
        &self,
        request: &Idempotent,
        tenant: &TenantId,
        id: TransferId,
        action: HoldAction,
    ) -> Result<Answer, FlowError> {
        let metadata = Metadata {
            tenant: Some(tenant.to_string()),
            correlation_id: request.correlation_id,
            causation_id: None,
            idempotency_key: Some(request.key.as_str().to_owned()),
        };
        // Kept through the retries: an ending that loses a race stays first in line.
        let mut turn = Turn::default();
        for attempt in 0..LEDGER_CONFLICT_RETRIES_MAX {
            let decided = match self
                .decide_ending(tenant, id, action, &metadata, &mut turn)
                .await?
            {
                Err(rejection) => Decided::Refused(Rejected::Hold(rejection)),
                Ok((appends, touched, record)) => {
                    Decided::Append(appends, touched, move |render: &dyn Render, position| {
                        render.render(&Reply::Transfer {
                            transfer: &record,
                            created: false,
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
        Err(FlowError::Contended(format!("hold {id}")))
    }

    /// Voids hold `id` of `tenant` as expired, if its `expires_at` has passed and nobody ended it.
    #[tracing::instrument(skip_all, fields(tenant = %tenant, transfer = %id))]
    pub async fn expire_hold(
        &self,
        tenant: &TenantId,
        id: TransferId,
    ) -> Result<HoldExpiry, FlowError> {
        let metadata = Metadata {
            tenant: Some(tenant.to_string()),
            correlation_id: None,
            causation_id: None,
            idempotency_key: None,
        };
        let mut turn = Turn::default();
        for attempt in 0..LEDGER_CONFLICT_RETRIES_MAX {
            let (appends, touched) = match self
                .decide_ending(tenant, id, HoldAction::Expire, &metadata, &mut turn)
                .await?
            {
                Ok((appends, touched, _)) => (appends, touched),
                Err(HoldRejection::Ended { .. }) => return Ok(HoldExpiry::AlreadyEnded),
                Err(HoldRejection::NotDue(_)) => return Ok(HoldExpiry::NotDue),
                Err(other) => return Ok(HoldExpiry::Refused(other)),
            };
            // Through the process's writer, like every other step: batched with the requests'
            // steps, and its guards' outcome in memory.
            let step = Step::Command(Command {
                appends: appends.into(),
                guards: touched,
                key: None,
            });
            match self.writer.commit(step).await? {
                Committed::Written(_) => {
                    metrics::counter!("asiento_holds_expired_total").increment(1);
                    return Ok(HoldExpiry::Expired);
                }
                Committed::Conflict => {
                    metrics::counter!("asiento_ledger_conflicts_total").increment(1);
                    back_off(attempt).await;
                }
                other => {
                    return Err(FlowError::Inconsistent(format!(
                        "a hold's expiry ended {other:?}"
                    )))
                }
            }
        }
        metrics::counter!("asiento_hold_expiries_contended_total").increment(1);
        Ok(HoldExpiry::Contended)
    }

    /// Loads the transfer and the guards its ending touches, and decides the ending. The guards
    /// are read as a transfer reads them: in its turn on them (`turn`, kept for the caller's
    /// retries), once no step of this process is writing one, from what its commits left in
    /// memory (read from the log, an ending would be decided against the state a step in flight
    /// is changing and lose its race to it, on a busy account every time). Only the log refuses:
    /// an ending refused on a remembered state is decided again against the log.
    async fn decide_ending(
        &self,
        tenant: &TenantId,
        id: TransferId,
        action: HoldAction,
        metadata: &Metadata,
        turn: &mut Turn,
    ) -> Result<Ending, FlowError> {
        let transfer = log::load_transfer(self.store.as_ref(), id).await?.aggregate;
        let command = SettleHold {
            id,
            tenant: tenant.clone(),
            action,
            at: self.clock.now(),
        };
        let events = match hold::decide(&transfer, &command) {
            Ok(events) => events,
            Err(rejection) => return Ok(Err(rejection)),
        };
        let entries = log::transfer_entries(&events);
        let memory = self.writer.guards();
        memory.take_turn(entries.iter().copied(), turn).await;
        let loaded = memory
            .load_after_writes(self.store.as_ref(), entries.iter().copied())
            .await?;
        let (guards, decided) = match hold::decide_with_guards(&transfer, &command, &loaded.states)
        {
            Err(_) if loaded.remembered => {
                let guards = log::load_guards(self.store.as_ref(), entries).await?;
                let decided = hold::decide_with_guards(&transfer, &command, &guards);
                (guards, decided)
            }
            decided => (loaded.states, decided),
        };
        let decision = match decided {
            Ok(decision) => decision,
            Err(rejection) => return Ok(Err(rejection)),
        };
        let appends = log::decision_appends(
            transfer_stream(id),
            transfer.version,
            log::encode(&decision.events, metadata, log::transfer_codec)?,
            &decision.guards,
            metadata,
        )?;
        let record = decision
            .events
            .iter()
            .fold(transfer, evolve)
            .record
            .ok_or_else(|| FlowError::Inconsistent(format!("hold {id} without a record")))?;
        let touched = GuardWrite {
            read: guards,
            appends: decision.guards,
        };
        Ok(Ok((appends, touched, record)))
    }
}
