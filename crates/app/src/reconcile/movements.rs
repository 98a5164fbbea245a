//! A report line's movements of money (the provider's balance transactions in the window)
//! compared one by one, by kind, with what we posted: a capture's gross with our captured amount,
//! a refund and a refund failure with the refund operation they stem from, a dispute's withdrawal
//! and reinstatement with our dispute, and every net with its amount less its fee. Pure, tested
//! through [`super::report::classify`]. The line's aggregate amounts are compared before this,
//! so what reaches here is the detail behind totals that agree. Where the provider can look
//! nothing up, the movements that name one of our refunds also decide it
//! ([`refund_outcomes`]), before any comparison.

use asiento_domain::{
    ExceptionKind, OperationKind, OperationOutcome, OperationState, PaymentRecord, ProviderFact,
};
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
        // Won once, lost again since or not.
        MovementKind::DisputeReinstatement => match &record.dispute {
            Some(dispute)
                if dispute.amount.minor() == movement.amount_minor && dispute.reinstated =>
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

/// Why a refund the report shows reversed failed, as the reversal's fact says it.
const REPORTED_REVERSAL_REASON: &str = "refund reversed (settlement report)";

/// Where nothing can be looked up (Adyen, whose accounting report names each refund row and
/// each refund reversal row by the refund's pspReference), what the line's movements decide of
/// our refunds, as their lost notifications would have: a refund we hold open that the report
/// shows refunded succeeded, and one it shows reversed failed after it succeeded. A movement
/// whose amount is not its refund's decides nothing (the comparison leaves it to a person).
pub(super) fn refund_outcomes(record: &PaymentRecord, line: &ReportLine) -> Vec<ProviderFact> {
    let mut facts = Vec::new();
    for op in &record.operations {
        let Some(provider_id) = op.provider_id.as_deref() else {
            continue;
        };
        if op.kind != OperationKind::Refund {
            continue;
        }
        let moved = |kind: MovementKind, amount_minor: Option<i64>| {
            line.movements.iter().any(|movement| {
                movement.kind == kind
                    && movement.source == provider_id
                    && Some(movement.amount_minor) == amount_minor
            })
        };
        let refunded = moved(MovementKind::Refund, op.amount.minor().checked_neg());
        let reversed = moved(MovementKind::RefundFailure, Some(op.amount.minor()));
        let fact = |outcome| ProviderFact::Operation {
            kind: OperationKind::Refund,
            charge_id: line.charge_id.clone(),
            psp_key: op.psp_key.clone(),
            provider_id: Some(provider_id.to_owned()),
            amount: op.amount,
            outcome,
            request: None,
        };
        let open = matches!(
            op.state,
            OperationState::Requested | OperationState::Pending
        );
        if open && refunded {
            facts.push(fact(OperationOutcome::Succeeded));
        }
        if (op.state == OperationState::Succeeded || open && refunded) && reversed {
            facts.push(fact(OperationOutcome::Failed {
                reason: REPORTED_REVERSAL_REASON.to_owned(),
            }));
        }
    }
    facts
}
