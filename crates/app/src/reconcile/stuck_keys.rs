//! Stuck idempotency keys: a request that died mid-flight leaves its key in flight past its
//! lease. The sweep settles the key's payment and resumes the request through the flow's own
//! resume path, so the key completes with the answer the request would have given.

use asiento_domain::{PaymentEvent, PaymentId, PaymentStatus, TenantId};
use asiento_eventstore::Database;

use super::{sqlite, ReconcileError, Reconciler, SweepSummary};
use crate::idempotency::{BodyHash, IdempotencyKey, Scope};
use crate::log;
use crate::payments::{Idempotent, NewPayment};
use crate::reply::Answer;

/// Stuck idempotency keys resumed in one sweep.
pub const STUCK_KEYS_PER_SWEEP_MAX: i64 = 500;

/// A stuck key's request, as its route names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StuckRequest {
    Create(PaymentId),
    Capture(PaymentId),
    Refund(PaymentId, u32),
}

fn parse_stuck(method: &str, route: &str, resource: &str) -> Option<StuckRequest> {
    if method != "POST" {
        return None;
    }
    // The resource names the payment and the request's operation (`pay_…/refunds/2`,
    // `pay_…/captures/1`); a capture recorded by an earlier version names the payment alone.
    let (payment, operation) = match resource.split_once('/') {
        None => (resource, None),
        Some((payment, operation)) => {
            let (kind, sequence) = operation.split_once('/')?;
            (payment, Some((kind, sequence.parse::<u32>().ok()?)))
        }
    };
    let payment = PaymentId::parse(payment).ok()?;
    match (route, operation) {
        ("/v1/payments", None) => Some(StuckRequest::Create(payment)),
        (route, None | Some(("captures", _))) if route.ends_with("/capture") => {
            Some(StuckRequest::Capture(payment))
        }
        (route, Some(("refunds", sequence))) if route.ends_with("/refunds") => {
            Some(StuckRequest::Refund(payment, sequence))
        }
        _ => None,
    }
}

struct StuckKey {
    scope: Scope,
    key: String,
    body: Vec<u8>,
    resource: String,
}

impl Reconciler {
    async fn stuck_keys(&self, now_ms: i64) -> Result<Vec<StuckKey>, ReconcileError> {
        // The idempotency module owns the table; this read names only what resuming needs.
        let sql = "select tenant, method, route, key, body_sha256, resource_id \
                   from idempotency_keys where state = 'in_flight' and lease_expires_ms <= $1 \
                   order by lease_expires_ms limit $2";
        type Row = (String, String, String, String, Vec<u8>, String);
        let rows: Vec<Row> = match self.database() {
            Database::Postgres(pool) => {
                sqlx::query_as(sql)
                    .bind(now_ms)
                    .bind(STUCK_KEYS_PER_SWEEP_MAX)
                    .fetch_all(pool)
                    .await?
            }
            Database::Sqlite(pool) => {
                sqlx::query_as(&sqlite(sql))
                    .bind(now_ms)
                    .bind(STUCK_KEYS_PER_SWEEP_MAX)
                    .fetch_all(pool)
                    .await?
            }
        };
        Ok(rows
            .into_iter()
            .map(|(tenant, method, route, key, body, resource)| StuckKey {
                scope: Scope {
                    tenant,
                    method,
                    route,
                },
                key,
                body,
                resource,
            })
            .collect())
    }

    pub(super) async fn sweep_stuck_keys(
        &self,
        summary: &mut SweepSummary,
    ) -> Result<(), ReconcileError> {
        let now_ms = self.flow.clock.now_ms();
        for stuck in self.stuck_keys(now_ms).await? {
            match self.resume_stuck(&stuck, summary).await {
                Ok(true) => summary.keys_finished += 1,
                Ok(false) => summary.keys_left += 1,
                Err(error) => {
                    summary.errors += 1;
                    tracing::error!(route = %stuck.scope.route, %error, "stuck idempotency key not resumed");
                }
            }
        }
        Ok(())
    }

    /// Settles the key's payment, then resumes the request through the flow's own resume path.
    /// `Ok(false)`: left for the client's retry.
    async fn resume_stuck(
        &self,
        stuck: &StuckKey,
        summary: &mut SweepSummary,
    ) -> Result<bool, ReconcileError> {
        let Some(request) = parse_stuck(&stuck.scope.method, &stuck.scope.route, &stuck.resource)
        else {
            tracing::warn!(route = %stuck.scope.route, resource = %stuck.resource, "stuck key of an unknown request");
            return Ok(false);
        };
        let (Ok(key), Ok(body), Ok(tenant)) = (
            IdempotencyKey::parse(&stuck.key),
            <[u8; 32]>::try_from(stuck.body.as_slice()),
            TenantId::parse(&stuck.scope.tenant),
        ) else {
            return Ok(false);
        };
        let idempotent = Idempotent {
            scope: stuck.scope.clone(),
            key,
            body: BodyHash(body),
            correlation_id: None,
        };
        let payment = match request {
            StuckRequest::Create(id) | StuckRequest::Capture(id) | StuckRequest::Refund(id, _) => {
                id
            }
        };
        let loaded = log::load_payment(self.flow.store.as_ref(), payment).await?;
        let Some(record) = loaded.aggregate.record.clone() else {
            return Ok(false);
        };
        let answer = match request {
            StuckRequest::Create(id) => {
                if matches!(
                    record.status,
                    PaymentStatus::Pending | PaymentStatus::RequiresAction
                ) && self.settle_with_lease(id, summary).await?.is_none()
                {
                    return Ok(false);
                }
                let after = log::load_payment(self.flow.store.as_ref(), id).await?;
                let Some(after) = after.aggregate.record else {
                    return Ok(false);
                };
                // Still pending: the provider has not seen the charge and it has not expired.
                // Only the client's retry knows the payment method to send it with.
                if after.status == PaymentStatus::Pending {
                    return Ok(false);
                }
                let new_payment = NewPayment {
                    tenant: after.tenant.clone(),
                    amount: after.amount,
                    currency: after.currency,
                    customer: after.customer.clone(),
                    provider: after.provider.clone(),
                    // Not sent: a payment that is no longer pending is never charged again.
                    payment_method: String::new(),
                    capture_mode: after.capture_mode,
                    description: after.description.clone(),
                    metadata: after.metadata.clone(),
                };
                self.flow.create(&idempotent, new_payment).await?
            }
            StuckRequest::Capture(id) => self.flow.capture(&idempotent, &tenant, id, None).await?,
            StuckRequest::Refund(id, sequence) => {
                // The amount matters only to a fresh request; a resumed one refunds what its
                // sequence recorded. Passing that same amount keeps even a fresh claim honest.
                let amount = loaded.events.iter().find_map(|(_, event)| match event {
                    PaymentEvent::RefundRequested(e) if e.sequence == sequence => {
                        Some(e.amount_minor)
                    }
                    _ => None,
                });
                let Some(amount) = amount else {
                    return Ok(false);
                };
                self.flow.refund(&idempotent, &tenant, id, amount).await?
            }
        };
        Ok(matches!(answer, Answer::Done(_) | Answer::Replayed(_)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use uuid::Uuid;

    #[test]
    fn stuck_requests_are_read_from_their_route() {
        let pay = PaymentId::from_uuid(Uuid::from_u128(9));
        assert_eq!(
            parse_stuck("POST", "/v1/payments", &pay.to_string()),
            Some(StuckRequest::Create(pay))
        );
        assert_eq!(
            parse_stuck(
                "POST",
                &format!("/v1/payments/{pay}/capture"),
                &pay.to_string()
            ),
            Some(StuckRequest::Capture(pay))
        );
        assert_eq!(
            parse_stuck(
                "POST",
                &format!("/v1/payments/{pay}/capture"),
                &format!("{pay}/captures/2")
            ),
            Some(StuckRequest::Capture(pay)),
            "a numbered capture"
        );
        assert_eq!(
            parse_stuck(
                "POST",
                &format!("/v1/payments/{pay}/capture"),
                &format!("{pay}/refunds/2")
            ),
            None
        );
        assert_eq!(
            parse_stuck(
                "POST",
                &format!("/v1/payments/{pay}/refunds"),
                &format!("{pay}/refunds/2")
            ),
            Some(StuckRequest::Refund(pay, 2))
        );
        assert_eq!(parse_stuck("POST", "/v1/transfers", "tr_1"), None);
    }
}
