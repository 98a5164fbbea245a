//! A report line's movements of money (the provider's balance transactions in the window)
//! compared one by one, by kind, with what we posted: a capture's gross with our captured amount,
//! a refund and a refund failure with the refund operation they stem from, a dispute's withdrawal
//! and reinstatement with our dispute, and every net with its amount less its fee. Pure, tested
//! through [`super::report::classify`]. The line's aggregate amounts are compared before this,
//! so what reaches here is the detail behind totals that agree.

use asiento_domain::payment::DisputeOutcome;
use asiento_domain::{ExceptionKind, OperationKind, OperationState, PaymentRecord};
use asiento_psp::{Movement, MovementKind, ReportLine};

use super::report::Verdict;

/// What in `movement` disagrees with ours, if anything (stable: part of the exception's id).
fn disagreement(record: &PaymentRecord, movement: &Movement) -> Option<&'static str> {
    if movement.amount_minor.checked_sub(movement.fee_minor) != Some(movement.net_minor) {
        return Some("net");
    }
    let refund = || {
        record.operations.iter().find(|op| {
            op.kind == OperationKind::Refund
                && op.provider_id.as_deref() == Some(movement.source.as_str())
        })
    };
    match movement.kind {
        MovementKind::Charge => {
            (movement.amount_minor != record.captured.minor()).then_some("captured")
        }
        // A refund made outside our API has no operation; the line's refunded total covers it.
        MovementKind::Refund => match refund() {
            Some(op) if op.amount.minor().checked_neg() != Some(movement.amount_minor) => {
                Some("refund_amount")
            }
            Some(op)
                if !matches!(
                    op.state,
                    OperationState::Succeeded | OperationState::Reversed
                ) =>
            {
                Some("refund_state")
            }
            _ => None,
        },
        MovementKind::RefundFailure => match refund() {
            Some(op) if op.amount.minor() != movement.amount_minor => Some("refund_amount"),
            Some(op) if op.state != OperationState::Reversed => Some("refund_state"),
            _ => None,
        },
        MovementKind::DisputeWithdrawal => match &record.dispute {
            Some(dispute)
                if dispute.amount.minor().checked_neg() == Some(movement.amount_minor) =>
            {
                None
            }
            _ => Some("dispute_withdrawal"),
        },
        MovementKind::DisputeReinstatement => match &record.dispute {
            Some(dispute)
                if dispute.amount.minor() == movement.amount_minor
                    && dispute.outcome == Some(DisputeOutcome::Won) =>
            {
                None
            }
            _ => Some("dispute_reinstatement"),
        },
        MovementKind::Other => None,
    }
}

/// Each of the line's movements against ours; the first that disagrees is for a person.
pub(super) fn movement_verdict(record: &PaymentRecord, line: &ReportLine) -> Verdict {
    for movement in &line.movements {
        if let Some(what) = disagreement(record, movement) {
            return Verdict::Manual {
                kind: ExceptionKind::BalanceTransactionMismatch,
                fingerprint: format!("{}:{what}", movement.id),
            };
        }
    }
    Verdict::Agree
}
