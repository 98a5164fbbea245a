//! The simulated provider as the app sees it: the `Provider` trait, call by call. A write (charge,
//! capture, refund) runs its effect under the armed fault (`SimProvider::write`); a lookup the
//! seed's profile lacks answers `Unsupported`; the settlement report lists every charge touched in
//! its window. The effects follow the provider's rules: a charge per key, a capture only of an
//! authorisation and never two pending, a refund within what is left and never of disputed money,
//! synchronous or pending as the profile says.

use asiento_app::clock::Clock;
use asiento_psp::{
    Capabilities, Charge, ChargeOutcome, ChargeStatus, CreateCharge, DisputeStatus, NextAction,
    Operation, OperationAnswer, OperationKind, OperationStatus, Provider, ProviderError,
    ReportLine, SettlementReport,
};
use async_trait::async_trait;
use chrono::{DateTime, Utc};

use super::knobs::PROVIDER;
use super::provider::{charge_fee, rejected, unknown, unsupported, ProviderState, SimProvider};

fn create_effect(state: &mut ProviderState, now: DateTime<Utc>, req: &CreateCharge) -> Charge {
    if let Some(&index) = state.by_key.get(&req.idempotency_key) {
        return state.charges[index].clone();
    }
    let index = state.charges.len();
    let id = format!("ch_{index:06}");
    let (status, captured, failure_code, next_action) = match req.payment_method.as_str() {
        "pm_card_declined" => (
            ChargeStatus::Failed,
            0,
            Some("card_declined".to_owned()),
            None,
        ),
        "pm_card_3ds" => (
            ChargeStatus::RequiresAction,
            0,
            None,
            Some(NextAction {
                kind: "redirect".into(),
                redirect_url: format!("https://sim.example/3ds/{id}"),
            }),
        ),
        _ if req.capture => (ChargeStatus::Succeeded, req.amount_minor, None, None),
        _ => (ChargeStatus::RequiresCapture, 0, None, None),
    };
    let mut charge = Charge {
        id: id.clone(),
        status,
        amount_minor: req.amount_minor,
        currency: req.currency.clone(),
        amount_captured: captured,
        amount_refunded: 0,
        reference: req.reference.clone(),
        idempotency_key: req.idempotency_key.clone(),
        payment_method: req.payment_method.clone(),
        capture: req.capture,
        failure_code,
        next_action,
        dispute: None,
        metadata: req.metadata.clone(),
        provider_fees: Vec::new(),
        created: now,
        updated: now,
    };
    charge_fee(&mut charge);
    state.charges.push(charge.clone());
    state.by_key.insert(req.idempotency_key.clone(), index);
    state.by_id.insert(id, index);
    state.history.push(charge.clone());
    charge
}

fn capture_effect(
    state: &mut ProviderState,
    now: DateTime<Utc>,
    charge_id: &str,
    amount_minor: Option<i64>,
    key: &str,
) -> Result<OperationAnswer, ProviderError> {
    state.keyed(key, now, |state| {
        let index = state
            .charge_index(charge_id)
            .ok_or_else(|| rejected("no_such_charge"))?;
        let charge = &state.charges[index];
        let amount = amount_minor.unwrap_or(charge.amount_minor);
        if charge.status != ChargeStatus::RequiresCapture {
            return Err(rejected("charge_not_capturable"));
        }
        if state.capture_pending(charge_id) {
            return Err(rejected("capture_pending"));
        }
        if amount <= 0 || amount > charge.amount_minor {
            return Err(rejected("amount_too_large"));
        }
        if state.profile.async_modifications {
            return Ok(state.new_operation(
                OperationKind::Capture,
                index,
                key,
                amount,
                OperationStatus::Pending,
                now,
            ));
        }
        let charge = &mut state.charges[index];
        charge.status = ChargeStatus::Succeeded;
        charge.amount_captured = amount;
        state.touched(index, now);
        Ok(state.new_operation(
            OperationKind::Capture,
            index,
            key,
            amount,
            OperationStatus::Succeeded,
            now,
        ))
    })
}

fn refund_effect(
    state: &mut ProviderState,
    now: DateTime<Utc>,
    charge_id: &str,
    amount_minor: i64,
    key: &str,
) -> Result<OperationAnswer, ProviderError> {
    state.keyed(key, now, |state| {
        let index = state
            .charge_index(charge_id)
            .ok_or_else(|| rejected("no_such_charge"))?;
        let pending = state.pending_refunds(charge_id);
        let charge = &state.charges[index];
        // Disputed money is frozen while the dispute is open, and gone once it is lost.
        if charge
            .dispute
            .as_ref()
            .is_some_and(|d| d.status != DisputeStatus::Won)
        {
            return Err(rejected("charge_disputed"));
        }
        let left = charge.amount_captured - charge.amount_refunded - pending;
        if charge.status != ChargeStatus::Succeeded || amount_minor <= 0 || amount_minor > left {
            return Err(rejected("refund_exceeds_captured"));
        }
        if state.profile.async_modifications {
            return Ok(state.new_operation(
                OperationKind::Refund,
                index,
                key,
                amount_minor,
                OperationStatus::Pending,
                now,
            ));
        }
        state.charges[index].amount_refunded += amount_minor;
        state.touched(index, now);
        Ok(state.new_operation(
            OperationKind::Refund,
            index,
            key,
            amount_minor,
            OperationStatus::Succeeded,
            now,
        ))
    })
}

#[async_trait]
impl Provider for SimProvider {
    fn name(&self) -> &str {
        PROVIDER
    }

    fn capabilities(&self) -> Capabilities {
        self.profile().capabilities()
    }

    async fn create_charge(&self, req: &CreateCharge) -> ChargeOutcome {
        self.write(
            |state, now| ChargeOutcome::from_charge(create_effect(state, now, req)),
            |reason| ChargeOutcome::Unknown {
                reason: reason.to_owned(),
            },
        )
        .await
    }

    async fn capture(
        &self,
        charge_id: &str,
        amount_minor: Option<i64>,
        _currency: &str,
        idempotency_key: &str,
    ) -> Result<OperationAnswer, ProviderError> {
        self.write(
            |state, now| capture_effect(state, now, charge_id, amount_minor, idempotency_key),
            |reason| Err(unknown(reason)),
        )
        .await
    }

    async fn refund(
        &self,
        charge_id: &str,
        amount_minor: i64,
        _currency: &str,
        idempotency_key: &str,
    ) -> Result<OperationAnswer, ProviderError> {
        self.write(
            |state, now| refund_effect(state, now, charge_id, amount_minor, idempotency_key),
            |reason| Err(unknown(reason)),
        )
        .await
    }

    async fn cancel_by_reference(
        &self,
        reference: &str,
        _idempotency_key: &str,
    ) -> Result<String, ProviderError> {
        let now = self.clock.now();
        let mut state = self.state.lock().unwrap();
        if !state.profile.cancel_by_reference {
            return Err(unsupported("cancel by reference"));
        }
        state.tick(now);
        // Only an authorisation can be cancelled: a captured charge stays as it is.
        let authorised = state.charges.iter().rposition(|charge| {
            charge.reference.as_deref() == Some(reference)
                && charge.status == ChargeStatus::RequiresCapture
        });
        if let Some(index) = authorised {
            let charge = &mut state.charges[index];
            charge.status = ChargeStatus::Failed;
            charge.failure_code = Some("canceled".into());
            state.touched(index, now);
        }
        Ok(format!("tc_{reference}"))
    }

    async fn cancel(
        &self,
        charge_id: &str,
        _idempotency_key: &str,
    ) -> Result<OperationAnswer, ProviderError> {
        // Abandoned redirects are cancelled after a day; a seed never runs that long.
        Err(rejected(&format!("cancel_not_simulated_{charge_id}")))
    }

    async fn find_operation_by_key(
        &self,
        idempotency_key: &str,
    ) -> Result<Option<Operation>, ProviderError> {
        let allowed = self.profile().lookup_by_key;
        self.lookup(allowed, "find an operation by key", |state| {
            state.operation_where(|op| op.idempotency_key == idempotency_key)
        })
    }

    async fn get_operation(&self, id: &str) -> Result<Option<Operation>, ProviderError> {
        let allowed = self.profile().lookup_by_id;
        self.lookup(allowed, "read an operation", |state| {
            state.operation_where(|op| op.id == id)
        })
    }

    async fn get_charge(&self, charge_id: &str) -> Result<Option<Charge>, ProviderError> {
        let allowed = self.profile().lookup_by_id;
        self.lookup(allowed, "read a charge", |state| {
            state
                .charge_index(charge_id)
                .map(|index| state.charges[index].clone())
        })
    }

    async fn find_charge_by_key(
        &self,
        idempotency_key: &str,
    ) -> Result<Option<Charge>, ProviderError> {
        let allowed = self.profile().lookup_by_key;
        self.lookup(allowed, "find a charge by key", |state| {
            state
                .by_key
                .get(idempotency_key)
                .map(|&index| state.charges[index].clone())
        })
    }

    async fn settlement_report(
        &self,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
    ) -> Result<SettlementReport, ProviderError> {
        self.lookup(true, "report", |state| {
            state
                .charges
                .iter()
                .filter(|charge| charge.updated >= from && charge.updated < to)
                .map(|charge| ReportLine {
                    charge_id: charge.id.clone(),
                    status: charge.status,
                    amount_minor: charge.amount_minor,
                    amount_captured: charge.amount_captured,
                    amount_refunded: charge.amount_refunded,
                    provider_fees: charge.provider_fees.clone(),
                    currency: charge.currency.clone(),
                    reference: charge.reference.clone(),
                    idempotency_key: charge.idempotency_key.clone(),
                    dispute_status: charge.dispute.as_ref().map(|d| d.status),
                    dispute: charge.dispute.clone(),
                    movements: Vec::new(),
                    last_touched: charge.updated,
                })
                .collect()
        })
        .map(|data| SettlementReport { from, to, data })
    }
}
