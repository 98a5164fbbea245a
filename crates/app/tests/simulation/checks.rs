//! What must hold. After every step: the real invariant checker (`Checker::check_once`) and the
//! provider's truths (at most one charge per payment, one capture or refund per key). At the end
//! of a seed: every capture and refund is closed, unless the profile makes it unresolvable and it
//! has its `operation_unresolved` exception; and the ledger agrees with the provider about every
//! charge no person has to look at (status, captured, refunded net of reversals, the provider's
//! fees, the dispute and its outcome) and about every operation.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use asiento_app::clock::Clock;
use asiento_app::exceptions::{self, Scope as ExceptionScope};
use asiento_app::invariants::Checker;
use asiento_app::log;
use asiento_domain::payment::DisputeOutcome;
use asiento_domain::{OperationState, PaymentId, PaymentRecord, PaymentStatus};
use asiento_psp::{
    Charge, ChargeStatus, DisputeStatus, Operation, OperationKind, OperationStatus, ProviderError,
};

use super::knobs::OPERATION_PENDING_DEADLINE_MS;
use super::world::Sim;

impl Sim {
    pub async fn check(&mut self) {
        let checker = Checker::new(self.process.database.clone(), self.clock.clone());
        let report = match checker.check_once().await {
            Ok(report) => report,
            Err(error) => self.fail(format!("the checker could not run: {error}")),
        };
        if !report.is_ok() {
            let listed: Vec<String> = report.violations.iter().map(|v| v.to_string()).collect();
            self.fail(format!("invariant violated:\n  {}", listed.join("\n  ")));
        }
        self.check_provider();
    }

    /// The provider holds at most one charge per payment, and one capture or refund per key.
    pub fn check_provider(&self) {
        let mut per_payment: BTreeMap<String, usize> = BTreeMap::new();
        for charge in self.provider.charges() {
            *per_payment
                .entry(charge.reference.clone().unwrap_or_default())
                .or_default() += 1;
        }
        if let Some((payment, count)) = per_payment.iter().find(|(_, &count)| count > 1) {
            self.fail(format!(
                "the provider holds {count} charges for payment {payment}"
            ));
        }
        let state = self.provider.state.lock().unwrap();
        let mut per_key: BTreeMap<(&str, &str), usize> = BTreeMap::new();
        for record in &state.operations {
            let op = &record.operation;
            let kind = if op.kind == OperationKind::Capture {
                "captures"
            } else {
                "refunds"
            };
            *per_key.entry((kind, &op.idempotency_key)).or_default() += 1;
        }
        if let Some(((kind, key), count)) = per_key.iter().find(|(_, &count)| count > 1) {
            self.fail(format!("the provider holds {count} {kind} under key {key}"));
        }
    }

    /// Every payment the ledger has: the ones the client learnt of and the ones the provider
    /// charged (a create whose answer never came).
    pub async fn all_payments(&self) -> Vec<PaymentRecord> {
        let mut ids: BTreeSet<PaymentId> = self.payments.iter().copied().collect();
        for charge in self.provider.charges() {
            ids.insert(PaymentId::parse(charge.reference.as_deref().unwrap()).unwrap());
        }
        let mut records = Vec::new();
        for id in ids {
            let loaded = log::load_payment(self.process.flow.store().as_ref(), id)
                .await
                .unwrap();
            records.extend(loaded.aggregate.record);
        }
        records
    }

    /// The PSP keys of the operations that have an `operation_unresolved` exception.
    async fn unresolved_keys(&self) -> HashSet<String> {
        let listed = exceptions::list(&self.process.database, &ExceptionScope::All, None, i64::MAX)
            .await
            .unwrap();
        listed
            .iter()
            .filter(|exception| exception.kind == "operation_unresolved")
            .filter_map(|exception| exception.local["operation"]["psp_key"].as_str())
            .map(str::to_owned)
            .collect()
    }

    /// Every operation of every payment is closed, unless the profile makes it unresolvable:
    /// a pending one of a provider that tells only by webhook, past its deadline; a requested
    /// one past its key's lifetime. Those must have their `operation_unresolved` exception.
    pub async fn check_operations_closed(&mut self, when: &str) -> usize {
        let profile = self.provider.profile();
        let unresolved = self.unresolved_keys().await;
        let now_ms = self.clock.now_ms();
        let mut open = 0;
        for record in self.all_payments().await {
            for op in record.operations.iter().filter(|op| op.state.is_open()) {
                open += 1;
                let age_ms = now_ms - op.requested_at.timestamp_millis();
                let legitimate = match op.state {
                    OperationState::Pending => {
                        profile.webhooks_only() && age_ms >= OPERATION_PENDING_DEADLINE_MS
                    }
                    _ => age_ms >= profile.key_lifetime_ms,
                };
                let excepted = unresolved.contains(&op.psp_key);
                if !legitimate || !excepted {
                    self.fail(format!(
                        "{when}: {} {} of payment {} is still {} (age {}s, profile {profile:?}, exception: {excepted})",
                        op.kind.as_str(),
                        op.psp_key,
                        record.id,
                        op.state.as_str(),
                        age_ms / 1_000
                    ));
                }
            }
        }
        open
    }

    /// The ledger agrees with the provider about every charge that no person has to look at:
    /// status, captured, refunded net of reversals, the dispute and its outcome, and every
    /// capture and refund operation's outcome.
    pub async fn check_agreement(&mut self) {
        let (ops_by_key, rejected_keys, out_of_band) = {
            let state = self.provider.state.lock().unwrap();
            let ops: HashMap<String, Operation> = state
                .operations
                .iter()
                .map(|record| {
                    (
                        record.operation.idempotency_key.clone(),
                        record.operation.clone(),
                    )
                })
                .collect();
            let rejected: HashSet<String> = state
                .keys
                .iter()
                .filter(|(_, record)| matches!(record.answer, Err(ProviderError::Rejected(_))))
                .map(|(key, _)| key.clone())
                .collect();
            (ops, rejected, state.out_of_band.clone())
        };
        for charge in self.provider.charges() {
            let payment = PaymentId::parse(charge.reference.as_deref().unwrap()).unwrap();
            let record = log::load_payment(self.process.flow.store().as_ref(), payment)
                .await
                .unwrap()
                .aggregate
                .record
                .unwrap();
            // A flagged payment waits for a person: its books are not expected to agree.
            if !record.flags.is_empty() {
                continue;
            }
            let dispute_agrees = match (&charge.dispute, &record.dispute) {
                (None, None) => true,
                (Some(theirs), Some(ours)) => {
                    ours.amount.minor() == theirs.amount_minor
                        && match theirs.status {
                            DisputeStatus::Open => ours.outcome.is_none(),
                            DisputeStatus::Won => ours.outcome == Some(DisputeOutcome::Won),
                            DisputeStatus::Lost => ours.outcome == Some(DisputeOutcome::Lost),
                        }
                }
                _ => false,
            };
            let agrees = dispute_agrees
                && match charge.status {
                    ChargeStatus::Succeeded => {
                        record.captured.minor() == charge.amount_captured
                            && record.refunded.minor() == charge.amount_refunded
                            && provider_fees_agree(&record, &charge)
                    }
                    ChargeStatus::RequiresCapture => record.status == PaymentStatus::Authorized,
                    ChargeStatus::RequiresAction => matches!(
                        record.status,
                        PaymentStatus::RequiresAction | PaymentStatus::Expired
                    ),
                    ChargeStatus::Failed => matches!(
                        record.status,
                        PaymentStatus::Failed | PaymentStatus::Expired
                    ),
                };
            if !agrees {
                self.fail(format!(
                    "payment {payment} disagrees with its charge: ledger {:?} captured {} refunded {} dispute {:?}, provider {:?} captured {} refunded {} dispute {:?}",
                    record.status,
                    record.captured.minor(),
                    record.refunded.minor(),
                    record.dispute,
                    charge.status,
                    charge.amount_captured,
                    charge.amount_refunded,
                    charge.dispute,
                ));
            }
            for op in &record.operations {
                let theirs = ops_by_key.get(&op.psp_key);
                let agrees = match (op.state, theirs.map(|theirs| theirs.status)) {
                    (OperationState::Succeeded, Some(OperationStatus::Succeeded)) => true,
                    (OperationState::Reversed, Some(OperationStatus::Failed)) => true,
                    (OperationState::Refused, Some(OperationStatus::Failed)) => true,
                    (OperationState::Refused, None) => rejected_keys.contains(&op.psp_key),
                    // A cumulative total goes to open refunds oldest first: a dashboard refund
                    // covers one of ours that never reached the provider (the books agree).
                    (OperationState::Succeeded, None) => out_of_band.contains(&charge.id),
                    _ => false,
                };
                if !agrees {
                    self.fail(format!(
                        "{} {} of payment {payment} is {} here, at the provider {:?}",
                        op.kind.as_str(),
                        op.psp_key,
                        op.state.as_str(),
                        theirs
                    ));
                }
            }
        }
    }
}

/// Our posted provider fees are the provider's, one per balance transaction.
fn provider_fees_agree(record: &PaymentRecord, charge: &Charge) -> bool {
    let ours: Vec<(&str, i64)> = record
        .provider_fees
        .iter()
        .map(|fee| (fee.transaction_id.as_str(), fee.fee.minor()))
        .collect();
    let theirs: Vec<(&str, i64)> = charge
        .provider_fees
        .iter()
        .filter(|fee| fee.fee_minor != 0)
        .map(|fee| (fee.transaction_id.as_str(), fee.fee_minor))
        .collect();
    ours == theirs
}
