//! The Adyen dialect's own later changes, run on the simulator's timers (`Scheduled`): a
//! refused modification told, a cancel decided, a `PENDING` payment authorised, and the steps
//! of a dispute a test trigger asked for.

use chrono::{DateTime, Utc};

use super::book::{Aftermath, DisputePlan};
use super::modifications::refusal_reason;
use super::notifications::modification_item;
use crate::state::{LaterAction, SimError, SimState};

/// What happens to the record `Scheduled::operation_id` names (a modification's pspReference
/// for `Refuse` and `Cancel`, a payment's for the others).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Later {
    /// A capture or refund the charge model refused: its notification says so.
    Refuse,
    /// A cancel is decided and told.
    Cancel,
    /// A `Received` (`PENDING`) payment is authorised.
    Authorise,
    /// A dispute opens (a `Chargeback…` trigger, once the payment is captured).
    OpenDispute,
    CloseDispute {
        won: bool,
    },
    /// A won dispute is lost after all.
    SecondChargeback,
}

pub(crate) fn run_later(
    state: &mut SimState,
    later: Later,
    target: &str,
    now: DateTime<Utc>,
) -> Result<(), SimError> {
    let delay = state.modification_delay_ms();
    match later {
        Later::Refuse => {
            let record = state
                .adyen
                .modification(target)
                .cloned()
                .ok_or(SimError::OperationNotFound)?;
            let item = modification_item(state, &record, false, record.refusal.clone(), now);
            state.send(vec![item]);
        }
        Later::Cancel => {
            let record = state
                .adyen
                .modification(target)
                .cloned()
                .ok_or(SimError::OperationNotFound)?;
            let outcome = match &record.payment {
                None => Err("Original payment not found".to_owned()),
                Some(payment) => {
                    let key = format!("adyen-cancel:{}", record.psp_reference);
                    state
                        .cancel(&key, payment, now)
                        .map(|_| ())
                        .map_err(|error| refusal_reason(&error))
                }
            };
            let item = match outcome {
                Ok(()) => modification_item(state, &record, true, None, now),
                Err(reason) => modification_item(state, &record, false, Some(reason), now),
            };
            state.send(vec![item]);
        }
        Later::Authorise => {
            state.complete(target, true, now)?;
        }
        Later::OpenDispute => {
            state.open_dispute(target, None, now)?;
            let won = !matches!(plan_of(state, target), Some(DisputePlan::Lost));
            state.schedule(
                delay,
                target,
                LaterAction::Adyen(Later::CloseDispute { won }),
            );
        }
        Later::CloseDispute { won } => {
            state.close_dispute(target, won, now)?;
            if won && plan_of(state, target) == Some(DisputePlan::Second) {
                state.schedule(delay, target, LaterAction::Adyen(Later::SecondChargeback));
            }
        }
        Later::SecondChargeback => {
            state.second_chargeback(target, now)?;
        }
    }
    Ok(())
}

fn plan_of(state: &SimState, payment: &str) -> Option<DisputePlan> {
    match state.adyen.payment(payment)?.aftermath {
        Aftermath::Dispute(plan) => Some(plan),
        _ => None,
    }
}
