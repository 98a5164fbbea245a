//! What a difference found by the reconciler records: a [`Finding`] becomes an exception, and a
//! misfit the sweep must not guess at also flags its payment for review. Every job that compares
//! our payments with the provider's records them the same way.

use asiento_domain::exception::{ExceptionRecorded, Resolution};
use asiento_domain::{ExceptionId, ExceptionKind, PaymentCommand, PaymentRecord};
use chrono::{DateTime, Utc};
use serde_json::{json, Value};

use super::{ReconcileError, Reconciler, SweepSummary};
use crate::exceptions;
use crate::payments::{Finalize, FlowError};

/// A difference found, before it is recorded.
pub(super) struct Finding {
    pub(super) kind: ExceptionKind,
    pub(super) fingerprint: String,
    pub(super) charge_id: String,
    pub(super) local: Value,
    pub(super) provider: Value,
}

impl Finding {
    pub(super) fn recorded(
        self,
        record: &PaymentRecord,
        resolution: Resolution,
        at: DateTime<Utc>,
    ) -> ExceptionRecorded {
        ExceptionRecorded {
            exception_id: ExceptionId::derived(
                &record.provider,
                &self.charge_id,
                self.kind,
                &self.fingerprint,
            ),
            tenant: Some(record.tenant.clone()),
            payment_id: Some(record.id),
            provider: record.provider.clone(),
            charge_id: Some(self.charge_id),
            kind: self.kind,
            difference: difference(&self.local, &self.provider),
            local: self.local,
            provider_state: self.provider,
            resolution,
            at,
        }
    }
}

/// Our side of a difference, as recorded in an exception.
pub fn local_state(record: &PaymentRecord) -> Value {
    json!({
        "status": record.status.as_str(),
        "amount_minor": record.amount.minor(),
        "currency": record.currency.code(),
        "captured_minor": record.captured.minor(),
        "refunded_minor": record.refunded.minor(),
        "charge_id": record.provider_charge_id,
    })
}

/// Field by field: for amounts, the provider's minus ours; for the rest, both values.
fn difference(local: &Value, provider: &Value) -> Value {
    let mut out = serde_json::Map::new();
    for field in ["amount_minor", "captured_minor", "refunded_minor"] {
        if let (Some(ours), Some(theirs)) = (
            local.get(field).and_then(Value::as_i64),
            provider.get(field).and_then(Value::as_i64),
        ) {
            if ours != theirs {
                out.insert(field.to_owned(), json!(theirs.saturating_sub(ours)));
            }
        }
    }
    for field in ["status", "currency"] {
        if let (Some(ours), Some(theirs)) = (local.get(field), provider.get(field)) {
            if ours != theirs {
                out.insert(field.to_owned(), json!({"local": ours, "provider": theirs}));
            }
        }
    }
    Value::Object(out)
}

impl Reconciler {
    /// Never guess: a manual exception, a review flag on the payment (once, when the exception
    /// is new), an error log and a metric.
    pub(super) async fn flag(
        &self,
        record: &PaymentRecord,
        finding: Finding,
        summary: &mut SweepSummary,
    ) -> Result<(), ReconcileError> {
        summary.misfits += 1;
        let kind = finding.kind;
        let recorded = finding.recorded(record, Resolution::Manual, self.flow.clock.now());
        let exception_id = recorded.exception_id;
        let new =
            exceptions::record(&self.flow.database, self.flow.store.as_ref(), recorded).await?;
        if !new {
            return Ok(());
        }
        summary.exception(kind, Resolution::Manual);
        tracing::error!(payment = %record.id, %exception_id, %kind, "provider state fits no expected state; flagged for review");
        metrics::counter!("asiento_reconciliation_flagged_total", "kind" => kind.as_str())
            .increment(1);
        match self
            .flow
            .finalize(Finalize::command(
                record.id,
                PaymentCommand::FlagForReview {
                    note: format!("reconciliation exception {exception_id}: {kind}"),
                    at: self.flow.clock.now(),
                },
            ))
            .await
        {
            Ok(_) => summary.flagged += 1,
            Err(FlowError::Rejected(rejection)) => {
                tracing::warn!(payment = %record.id, %rejection, "review flag refused")
            }
            Err(error) => return Err(error.into()),
        }
        Ok(())
    }
}
