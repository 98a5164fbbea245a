//! The Stripe dialect's balance transactions: every movement of money on the simulated account,
//! derived from the charge model as it stands, so that they can never disagree with it.
//!
//! - A captured charge: `charge`, the gross captured with Stripe's fee (`--fee-bps`) taken.
//! - A refund that succeeded: `refund`, the amount out, no fee (Stripe keeps its fee).
//! - A refund that failed after it succeeded: also `refund_failure`, the amount back.
//! - A dispute: `adjustment` (category `dispute`) withdrawing the amount and a dispute fee when
//!   it opens; a second `adjustment` (category `dispute_reversal`) reinstating the amount when it
//!   is won. The fee stays with Stripe.
//!
//! - A payout: `payout`, the amount out to the bank; a payout that failed after it was paid:
//!   also `payout_failure`, the amount back (paid out again by the next payout).
//!
//! Each one's id names its source (`txn_<charge>`, `txn_<refund>`, `txn_f<refund>`,
//! `txn_dw_<charge>`, `txn_dr_<charge>`, `txn_<payout>`, `txn_f<payout>`), so every read says the
//! same.

use serde_json::{json, Value};

use super::book::{intent_id_of, PayoutRecord};
use crate::fee::provider_fee_minor;
use crate::state::{SimState, REVERSAL_REASON};
use asiento_psp::provider::{Charge, DisputeStatus, Operation, OperationKind, OperationStatus};

/// Stripe's fee on a dispute, withdrawn with the disputed amount (US pricing: $15).
pub(crate) const DISPUTE_FEE_MINOR: i64 = 1_500;

/// Days from a movement until its money is available for a payout.
const AVAILABLE_AFTER_S: i64 = 2 * 24 * 60 * 60;

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct BalanceTransaction {
    pub id: String,
    /// Signed gross, minor units.
    pub amount: i64,
    pub fee: i64,
    pub kind: &'static str,
    pub reporting_category: &'static str,
    /// The charge, refund or dispute it stems from.
    pub source: String,
    pub currency: String,
    pub created: i64,
    pub description: Option<String>,
}

impl BalanceTransaction {
    pub fn net(&self) -> i64 {
        self.amount - self.fee
    }

    /// Stripe's `balance_transaction` object.
    pub fn render(&self) -> Value {
        let fee_details = match (self.fee, self.kind) {
            (0, _) => json!([]),
            (fee, "adjustment") => {
                json!([{"amount": fee, "application": null, "currency": self.currency, "description": "Dispute fee", "type": "stripe_fee"}])
            }
            (fee, _) => {
                json!([{"amount": fee, "application": null, "currency": self.currency, "description": "Stripe processing fees", "type": "stripe_fee"}])
            }
        };
        json!({
            "id": self.id,
            "object": "balance_transaction",
            "amount": self.amount,
            "available_on": self.created + AVAILABLE_AFTER_S,
            "balance_type": "payments",
            "created": self.created,
            "currency": self.currency,
            "description": self.description,
            "exchange_rate": null,
            "fee": self.fee,
            "fee_details": fee_details,
            "net": self.net(),
            "reporting_category": self.reporting_category,
            "source": self.source,
            "status": "pending",
            "type": self.kind,
        })
    }
}

fn suffix(id: &str) -> &str {
    id.split_once('_').map_or(id, |(_, rest)| rest)
}

/// The balance transaction of a charge's capture, `None` while nothing is captured.
pub(crate) fn of_capture(charge: &Charge, fee_bps: u32) -> Option<BalanceTransaction> {
    let amount = charge.amount_captured;
    (amount > 0).then(|| BalanceTransaction {
        id: format!("txn_{}", suffix(&charge.id)),
        amount,
        fee: provider_fee_minor(amount, fee_bps),
        kind: "charge",
        reporting_category: "charge",
        source: charge.id.clone(),
        currency: charge.currency.to_ascii_lowercase(),
        created: charge.created.timestamp(),
        description: None,
    })
}

/// A refund's balance transactions: the refund once it succeeded, and its failure when it failed
/// after that. A refund refused before it succeeded moved nothing.
pub(crate) fn of_refund(refund: &Operation) -> Vec<BalanceTransaction> {
    debug_assert_eq!(
        refund.kind,
        OperationKind::Refund,
        "a refund's transactions"
    );
    let reversed = refund.status == OperationStatus::Failed
        && refund.failure_reason.as_deref() == Some(REVERSAL_REASON);
    if refund.status != OperationStatus::Succeeded && !reversed {
        return Vec::new();
    }
    let currency = refund.currency.to_ascii_lowercase();
    let mut moved = vec![BalanceTransaction {
        id: format!("txn_{}", suffix(&refund.id)),
        amount: -refund.amount_minor,
        fee: 0,
        kind: "refund",
        reporting_category: "refund",
        source: refund.id.clone(),
        currency: currency.clone(),
        created: refund.created.timestamp(),
        description: None,
    }];
    if reversed {
        moved.push(BalanceTransaction {
            id: format!("txn_f{}", suffix(&refund.id)),
            amount: refund.amount_minor,
            fee: 0,
            kind: "refund_failure",
            reporting_category: "refund_failure",
            source: refund.id.clone(),
            currency,
            created: refund.updated.timestamp(),
            description: Some(format!("REFUND FOR FAILED REFUND ({})", refund.id)),
        });
    }
    moved
}

/// A dispute's balance transactions ("zero, one, or two … that show funds withdrawn and
/// reinstated"): the withdrawal with the dispute fee, and the reinstatement of a won one.
pub(crate) fn of_dispute(charge: &Charge) -> Vec<BalanceTransaction> {
    let Some(dispute) = &charge.dispute else {
        return Vec::new();
    };
    let id = suffix(&charge.id);
    let currency = charge.currency.to_ascii_lowercase();
    let mut moved = vec![BalanceTransaction {
        id: format!("txn_dw_{id}"),
        amount: -dispute.amount_minor,
        fee: DISPUTE_FEE_MINOR,
        kind: "adjustment",
        reporting_category: "dispute",
        source: format!("dp_{id}"),
        currency: currency.clone(),
        created: dispute.created.timestamp(),
        description: Some(format!("Chargeback withdrawal for {}", charge.id)),
    }];
    if dispute.status == DisputeStatus::Won {
        moved.push(BalanceTransaction {
            id: format!("txn_dr_{id}"),
            amount: dispute.amount_minor,
            fee: 0,
            kind: "adjustment",
            reporting_category: "dispute_reversal",
            source: format!("dp_{id}"),
            currency,
            created: dispute
                .closed
                .unwrap_or(charge.updated)
                .timestamp()
                .max(dispute.created.timestamp()),
            description: Some(format!("Chargeback reversal for {}", charge.id)),
        });
    }
    moved
}

/// A payout's balance transactions: the payout, and its failure when it failed.
pub(crate) fn of_payout(payout: &PayoutRecord) -> Vec<BalanceTransaction> {
    let id = suffix(&payout.id);
    let mut moved = vec![BalanceTransaction {
        id: format!("txn_{id}"),
        amount: -payout.amount,
        fee: 0,
        kind: "payout",
        reporting_category: "payout",
        source: payout.id.clone(),
        currency: payout.currency.clone(),
        created: payout.created,
        description: Some("STRIPE PAYOUT".to_owned()),
    }];
    if let Some(failed) = payout.failed {
        moved.push(BalanceTransaction {
            id: format!("txn_f{id}"),
            amount: payout.amount,
            fee: 0,
            kind: "payout_failure",
            reporting_category: "payout_reversal",
            source: payout.id.clone(),
            currency: payout.currency.clone(),
            created: failed,
            description: Some(format!("Payout failure ({})", payout.id)),
        });
    }
    moved
}

/// Every balance transaction on the account (of the PaymentIntents made through the dialect,
/// and of its payouts), newest first (ties by id, descending, so that a listing's order is
/// total).
pub(crate) fn all(state: &SimState) -> Vec<BalanceTransaction> {
    let fee_bps = state.fee_bps();
    let mut moved: Vec<BalanceTransaction> = state
        .charges()
        .iter()
        .filter(|charge| state.stripe.get(&intent_id_of(&charge.id)).is_some())
        .flat_map(|charge| {
            let refunds = super::refunds_of(state, &charge.id);
            of_capture(charge, fee_bps)
                .into_iter()
                .chain(refunds.iter().flat_map(of_refund))
                .chain(of_dispute(charge))
                .collect::<Vec<_>>()
        })
        .collect();
    moved.extend(state.stripe.payouts().iter().flat_map(of_payout));
    moved.sort_by(|a, b| b.created.cmp(&a.created).then_with(|| b.id.cmp(&a.id)));
    moved
}

#[cfg(test)]
mod tests {
    use chrono::{TimeZone as _, Utc};

    use super::*;
    use asiento_psp::provider::{ChargeStatus, Dispute};

    fn captured(amount: i64) -> Charge {
        let at = Utc.timestamp_opt(1_700_000_000, 0).unwrap();
        Charge {
            id: "ch_1".into(),
            status: ChargeStatus::Succeeded,
            amount_minor: amount,
            currency: "USD".into(),
            amount_captured: amount,
            amount_refunded: 0,
            reference: None,
            idempotency_key: "k".into(),
            payment_method: "pm_card_visa".into(),
            capture: true,
            failure_code: None,
            next_action: None,
            dispute: None,
            metadata: Default::default(),
            provider_fees: Vec::new(),
            created: at,
            updated: at,
        }
    }

    #[test]
    fn a_capture_nets_stripe_s_fee_and_a_dispute_withdraws_its_fee_too() {
        let mut charge = captured(10_000);
        let capture = of_capture(&charge, 290).unwrap();
        assert_eq!(
            (
                capture.id.as_str(),
                capture.amount,
                capture.fee,
                capture.net()
            ),
            ("txn_1", 10_000, 290, 9_710)
        );
        charge.dispute = Some(Dispute {
            status: DisputeStatus::Won,
            amount_minor: 10_000,
            created: charge.created,
            closed: None,
            id: None,
            reinstated: false,
        });
        let dispute = of_dispute(&charge);
        let nets: Vec<(&str, i64)> = dispute
            .iter()
            .map(|t| (t.reporting_category, t.net()))
            .collect();
        assert_eq!(nets, [("dispute", -11_500), ("dispute_reversal", 10_000)]);
        charge.amount_captured = 0;
        assert_eq!(of_capture(&charge, 290), None);
    }
}
