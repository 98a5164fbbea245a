//! The operations sweep: every capture and refund we sent ends in a recorded outcome, without a
//! client retry. A watched operation that is still open when it comes due is driven in the way
//! its provider allows ([`asiento_psp::Capabilities`]), never by the simulator's conveniences:
//!
//! - **requested** (the answer was lost, or the provider was unreachable): looked up by our key
//!   where the provider has such a lookup; otherwise, or when the lookup finds nothing, sent
//!   again under the same PSP key while the provider surely still remembers it (within its key
//!   lifetime, measured from the request), which returns the first outcome instead of a second
//!   effect. Past the key's lifetime a re-send could repeat the effect: a manual exception.
//! - **pending** (received, decided later): read again by the provider's id or our key where
//!   possible, else left to the webhook and the report; past the pending deadline a manual
//!   exception.
//!
//! Whatever comes back goes through [`crate::facts`] and the flow's one `finalize`, under the
//! payment's lease, so the webhook worker never works on the same payment at once.

use asiento_domain::{ExceptionKind, Operation, OperationState, PaymentRecord, ProviderFact};
use asiento_psp::ProviderError;
use serde_json::json;

use super::findings::Finding;
use super::{duration_ms, local_state, ReconcileError, Reconciler, SweepSummary};
use crate::facts;
use crate::leases;
use crate::log;
use crate::payments::Finalize;
use crate::watch::{self, WatchedOperation};

/// Operations driven in one sweep.
pub const OPERATIONS_PER_SWEEP_MAX: i64 = 500;
/// How long after its request an operation is first driven by the sweep: the synchronous answer
/// (or its webhook) normally settles it long before.
pub const OPERATION_TIMEOUT_MS_DEFAULT: i64 = 60_000;
/// How long a received (pending) operation may wait for its decision before a person is asked.
pub const OPERATION_PENDING_DEADLINE_MS_DEFAULT: i64 = 3 * 24 * 3_600_000;

/// What driving one operation did.
enum Driven {
    /// The operation's outcome (or some news of it), to apply, with what else the answer said
    /// (the provider's fee on a capture).
    Applied(Vec<ProviderFact>),
    /// Nothing can be learned now; look again later.
    Wait,
    /// The provider said something that is not our operation, or it is past what can be safely
    /// done: a person must look.
    Exception {
        fingerprint: String,
        provider: serde_json::Value,
    },
}

impl Reconciler {
    /// Drives every due watched operation towards its outcome.
    pub(super) async fn sweep_operations(
        &self,
        summary: &mut SweepSummary,
    ) -> Result<(), ReconcileError> {
        let now_ms = self.flow.clock.now_ms();
        let requested_before = now_ms.saturating_sub(self.config.operation_timeout_ms);
        let due = watch::due_operations(
            self.database(),
            requested_before,
            now_ms,
            OPERATIONS_PER_SWEEP_MAX,
        )
        .await?;
        for op in due {
            summary.operations_checked += 1;
            if let Err(error) = self.drive_with_lease(&op, summary).await {
                summary.errors += 1;
                tracing::error!(payment = %op.payment, kind = op.kind.as_str(), sequence = op.sequence, %error, "operation not driven");
            }
            // Due again one sweep later (if it is still watched at all).
            let next_ms = now_ms.saturating_add(self.recheck_ms());
            watch::postpone_operation(self.database(), &op, next_ms).await?;
        }
        Ok(())
    }

    fn recheck_ms(&self) -> i64 {
        i64::try_from(self.config.interval_ms)
            .unwrap_or(i64::MAX)
            .max(self.config.operation_timeout_ms)
    }

    async fn drive_with_lease(
        &self,
        watched: &WatchedOperation,
        summary: &mut SweepSummary,
    ) -> Result<(), ReconcileError> {
        let now_ms = self.flow.clock.now_ms();
        let Some(lease) = leases::acquire(
            self.database(),
            watched.payment,
            now_ms,
            self.config.payment_lease_ms,
        )
        .await?
        else {
            summary.busy += 1;
            return Ok(());
        };
        let result = self.drive(watched, summary).await;
        if let Err(error) = leases::release(self.database(), &lease).await {
            tracing::warn!(payment = %watched.payment, %error, "payment lease not released; it runs out");
        }
        result
    }

    async fn drive(
        &self,
        watched: &WatchedOperation,
        summary: &mut SweepSummary,
    ) -> Result<(), ReconcileError> {
        let loaded = log::load_payment(self.flow.store.as_ref(), watched.payment).await?;
        let open = loaded.aggregate.record.as_ref().and_then(|record| {
            record
                .operation(watched.kind, watched.sequence)
                .filter(|op| op.state.is_open())
                .map(|op| (record.clone(), op.clone()))
        });
        let Some((record, op)) = open else {
            return Ok(watch::unwatch_operation(self.database(), watched).await?);
        };
        if self.flow.paused().contains(&record.tenant) {
            // Its tenant is moving to another cell: driven after the pause, where it is then.
            return Ok(());
        }
        match self.learn(&record, &op).await? {
            Driven::Wait => {}
            Driven::Applied(facts) if facts.is_empty() => {}
            Driven::Applied(facts) => {
                let finalized = self
                    .flow
                    .finalize(Finalize::facts(record.id, facts))
                    .await?;
                let closed = finalized
                    .payment
                    .operation(op.kind, op.sequence)
                    .is_none_or(|after| !after.state.is_open());
                if closed {
                    summary.operations_settled += 1;
                    watch::unwatch_operation(self.database(), watched).await?;
                }
            }
            Driven::Exception {
                fingerprint,
                provider,
            } => {
                let finding = Finding {
                    kind: ExceptionKind::OperationUnresolved,
                    fingerprint: format!("{}:{}:{fingerprint}", op.kind.as_str(), op.sequence),
                    charge_id: record.provider_charge_id.clone().unwrap_or_default(),
                    local: operation_state(&record, &op),
                    provider,
                };
                self.flag(&record, finding, summary).await?;
            }
        }
        Ok(())
    }

    /// What the provider can tell of `op` now, asked the way it allows.
    async fn learn(
        &self,
        record: &PaymentRecord,
        op: &Operation,
    ) -> Result<Driven, ReconcileError> {
        let provider = self.provider(&record.provider)?;
        let capabilities = provider.adapter.capabilities();
        let now_ms = self.flow.clock.now_ms();
        let age_ms = now_ms.saturating_sub(op.requested_at.timestamp_millis());

        if op.state == OperationState::Pending {
            if age_ms >= self.config.operation_pending_deadline_ms {
                return Ok(Driven::Exception {
                    fingerprint: "pending_past_deadline".into(),
                    provider: json!({"state": "pending", "age_ms": age_ms}),
                });
            }
            let found = match (&op.provider_id, capabilities) {
                (Some(id), c) if c.lookup_by_id => provider.adapter.get_operation(id).await,
                (_, c) if c.lookup_by_key => {
                    provider.adapter.find_operation_by_key(&op.psp_key).await
                }
                // Neither lookup exists: the webhook or the report decides it.
                _ => return Ok(Driven::Wait),
            };
            return Ok(self.read_found(record, op, found));
        }

        // Requested: the answer was lost (or never came).
        if capabilities.lookup_by_key {
            let found = provider.adapter.find_operation_by_key(&op.psp_key).await;
            match found {
                Ok(Some(_)) | Err(ProviderError::Rejected(_) | ProviderError::Protocol { .. }) => {
                    return Ok(self.read_found(record, op, found));
                }
                // Not found: the provider never acted on the key, and sending it again is safe.
                // Unknown or unsupported: a re-send under the key is safe too, and decides it.
                Ok(None)
                | Err(ProviderError::Unknown { .. } | ProviderError::Unsupported { .. }) => {}
            }
        }
        let key_lifetime_ms = duration_ms(capabilities.key_lifetime);
        if age_ms >= key_lifetime_ms {
            return Ok(Driven::Exception {
                fingerprint: "unknown_past_key_lifetime".into(),
                provider: json!({"state": "unknown", "age_ms": age_ms, "key_lifetime_ms": key_lifetime_ms}),
            });
        }
        tracing::info!(payment = %record.id, key = %op.psp_key, "operation outcome unknown; sending it again under its key");
        Ok(Driven::Applied(self.flow.send_operation(record, op).await?))
    }

    /// Reads what a lookup found about `op`.
    fn read_found(
        &self,
        record: &PaymentRecord,
        op: &Operation,
        found: Result<Option<asiento_psp::Operation>, ProviderError>,
    ) -> Driven {
        match found {
            Ok(Some(found)) => match facts::operation_misfit(record, &op.psp_key, &found) {
                Some(misfit) => Driven::Exception {
                    fingerprint: misfit.fingerprint,
                    provider: json!({
                        "operation_id": found.id,
                        "idempotency_key": found.idempotency_key,
                        "currency": found.currency,
                        "charge": found.charge,
                    }),
                },
                None => Driven::Applied(vec![facts::operation_fact(&found, None)]),
            },
            Ok(None) => Driven::Wait,
            Err(error) => {
                tracing::warn!(payment = %record.id, key = %op.psp_key, %error, "operation lookup gave no answer");
                Driven::Wait
            }
        }
    }
}

/// Our side of an unresolved operation, as recorded in its exception.
fn operation_state(record: &PaymentRecord, op: &Operation) -> serde_json::Value {
    let mut local = local_state(record);
    if let Some(object) = local.as_object_mut() {
        object.insert(
            "operation".into(),
            json!({
                "kind": op.kind.as_str(),
                "sequence": op.sequence,
                "amount_minor": op.amount.minor(),
                "state": op.state.as_str(),
                "psp_key": op.psp_key,
                "requested_at": op.requested_at,
            }),
        );
    }
    local
}
