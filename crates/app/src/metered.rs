//! Every call to a provider, counted and timed: `asiento_provider_calls_total{provider,
//! operation, outcome}` and `asiento_provider_call_duration_seconds{provider, operation}`.
//!
//! A decorator around the port rather than counters in each adapter: every adapter, present and
//! future, is measured the same way, and the outcome is named in the port's terms (what the
//! ledger makes of the answer), which is what an on-call engineer alerts on: a provider whose
//! answers turn `unknown` is a provider whose money the reconciler has to chase.

use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

use asiento_psp::{
    Capabilities, Charge, ChargeOutcome, CreateCharge, Operation, OperationAnswer, Payout,
    Provider, ProviderError, SettlementReport, WebhookEvent,
};
use async_trait::async_trait;
use chrono::{DateTime, Utc};

/// A provider whose every call is measured.
pub struct Metered {
    inner: Arc<dyn Provider>,
}

impl Metered {
    #[must_use]
    pub fn new(inner: Arc<dyn Provider>) -> Metered {
        Metered { inner }
    }

    async fn measure<T>(
        &self,
        operation: &'static str,
        call: impl Future<Output = T>,
        outcome: impl Fn(&T) -> &'static str,
    ) -> T {
        let started = Instant::now();
        let answer = call.await;
        let provider = self.inner.name().to_owned();
        metrics::counter!(
            "asiento_provider_calls_total",
            "provider" => provider.clone(),
            "operation" => operation,
            "outcome" => outcome(&answer),
        )
        .increment(1);
        metrics::histogram!(
            "asiento_provider_call_duration_seconds",
            "provider" => provider,
            "operation" => operation,
        )
        .record(started.elapsed().as_secs_f64());
        answer
    }
}

/// What became of a call, in the port's terms.
fn outcome<T>(answer: &Result<T, ProviderError>) -> &'static str {
    match answer {
        Ok(_) => "ok",
        Err(ProviderError::Rejected(_)) => "rejected",
        Err(ProviderError::Unknown { .. }) => "unknown",
        Err(ProviderError::Protocol { .. }) => "protocol_error",
        Err(ProviderError::Unsupported { .. }) => "unsupported",
    }
}

fn charge_outcome(answer: &ChargeOutcome) -> &'static str {
    match answer {
        ChargeOutcome::Succeeded(_)
        | ChargeOutcome::Authorized(_)
        | ChargeOutcome::RequiresAction(_) => "ok",
        ChargeOutcome::Declined(_) => "declined",
        ChargeOutcome::Rejected(_) => "rejected",
        ChargeOutcome::Unknown { .. } => "unknown",
    }
}

#[async_trait]
impl Provider for Metered {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }

    async fn create_charge(&self, req: &CreateCharge) -> ChargeOutcome {
        self.measure(
            "create_charge",
            self.inner.create_charge(req),
            charge_outcome,
        )
        .await
    }

    async fn capture(
        &self,
        charge_id: &str,
        amount_minor: Option<i64>,
        currency: &str,
        idempotency_key: &str,
    ) -> Result<OperationAnswer, ProviderError> {
        let call = self
            .inner
            .capture(charge_id, amount_minor, currency, idempotency_key);
        self.measure("capture", call, outcome).await
    }

    async fn refund(
        &self,
        charge_id: &str,
        amount_minor: i64,
        currency: &str,
        idempotency_key: &str,
    ) -> Result<OperationAnswer, ProviderError> {
        let call = self
            .inner
            .refund(charge_id, amount_minor, currency, idempotency_key);
        self.measure("refund", call, outcome).await
    }

    async fn cancel(
        &self,
        charge_id: &str,
        idempotency_key: &str,
    ) -> Result<OperationAnswer, ProviderError> {
        let call = self.inner.cancel(charge_id, idempotency_key);
        self.measure("cancel", call, outcome).await
    }

    async fn cancel_by_reference(
        &self,
        reference: &str,
        idempotency_key: &str,
    ) -> Result<String, ProviderError> {
        let call = self.inner.cancel_by_reference(reference, idempotency_key);
        self.measure("cancel_by_reference", call, outcome).await
    }

    async fn get_charge(&self, charge_id: &str) -> Result<Option<Charge>, ProviderError> {
        self.measure("get_charge", self.inner.get_charge(charge_id), outcome)
            .await
    }

    async fn find_charge_by_key(
        &self,
        idempotency_key: &str,
    ) -> Result<Option<Charge>, ProviderError> {
        let call = self.inner.find_charge_by_key(idempotency_key);
        self.measure("find_charge_by_key", call, outcome).await
    }

    async fn find_charge_in_events(
        &self,
        idempotency_key: &str,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
    ) -> Result<Option<Charge>, ProviderError> {
        let call = self.inner.find_charge_in_events(idempotency_key, from, to);
        self.measure("find_charge_in_events", call, outcome).await
    }

    async fn find_operation_by_key(
        &self,
        idempotency_key: &str,
    ) -> Result<Option<Operation>, ProviderError> {
        let call = self.inner.find_operation_by_key(idempotency_key);
        self.measure("find_operation_by_key", call, outcome).await
    }

    async fn get_operation(&self, id: &str) -> Result<Option<Operation>, ProviderError> {
        self.measure("get_operation", self.inner.get_operation(id), outcome)
            .await
    }

    async fn settlement_report(
        &self,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
    ) -> Result<SettlementReport, ProviderError> {
        let call = self.inner.settlement_report(from, to);
        self.measure("settlement_report", call, outcome).await
    }

    async fn read_event(&self, body: &[u8]) -> Result<Option<WebhookEvent>, ProviderError> {
        self.measure("read_event", self.inner.read_event(body), outcome)
            .await
    }

    fn payout_of_event(&self, body: &[u8]) -> Option<String> {
        self.inner.payout_of_event(body)
    }

    async fn get_payout(&self, id: &str) -> Result<Option<Payout>, ProviderError> {
        self.measure("get_payout", self.inner.get_payout(id), outcome)
            .await
    }

    async fn payouts_created(
        &self,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
    ) -> Result<Vec<String>, ProviderError> {
        let call = self.inner.payouts_created(from, to);
        self.measure("payouts_created", call, outcome).await
    }
}
