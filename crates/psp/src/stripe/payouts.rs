//! Stripe's payouts in the port's terms: a payout (`GET /v1/payouts/{id}`) and, once it is paid,
//! the balance transactions it covered (`GET /v1/balance_transactions?payout=…`, their sources
//! expanded so that each names its PaymentIntent), with each PaymentIntent read as it stands.
//!
//! A failed payout's money comes back as a `payout_failure` transaction that the next payout
//! covers; that one is read as the transactions the failed payout covered, so that every covered
//! transaction names the charge whose money it moved.

use std::collections::BTreeSet;

use chrono::{DateTime, Utc};

use super::adapter::{created_in, StripeProvider};
use super::reading::{charge_of, time};
use super::wire::{self, BalanceTransaction};
use crate::payout::{Payout, PayoutStatus, PayoutTransaction};
use crate::provider::ProviderError;

/// Payouts paying out a failed payout that paid out a failed payout…: deeper than this is not
/// a schedule Stripe runs, and the read is refused rather than followed forever.
const REPAID_DEPTH_MAX: usize = 8;

/// Stripe's `payout.status`.
fn status_of(status: &str) -> PayoutStatus {
    match status {
        "pending" => PayoutStatus::Pending,
        "in_transit" => PayoutStatus::InTransit,
        "paid" => PayoutStatus::Paid,
        "failed" => PayoutStatus::Failed,
        "canceled" => PayoutStatus::Canceled,
        _ => PayoutStatus::Other,
    }
}

/// The payout id a Stripe event is about, for the event types that change a payout.
pub(super) fn payout_of_event(body: &[u8]) -> Option<String> {
    let event: wire::Event = serde_json::from_slice(body).ok()?;
    let announces = matches!(
        event.kind.as_str(),
        "payout.paid" | "payout.failed" | "payout.canceled" | "payout.updated"
    );
    let object = &event.data.object;
    (announces && object["object"] == "payout")
        .then(|| object["id"].as_str().map(str::to_owned))
        .flatten()
}

impl StripeProvider {
    pub(super) async fn read_payout(&self, id: &str) -> Result<Option<Payout>, ProviderError> {
        let url = self.transport.url(&["v1", "payouts", id]);
        let Some(payout) = self.transport.lookup::<wire::Payout>(url).await? else {
            return Ok(None);
        };
        let status = status_of(&payout.status);
        let mut read = Payout {
            id: payout.id,
            status,
            amount_minor: payout.amount,
            currency: payout.currency.to_ascii_uppercase(),
            created: time(payout.created),
            failure_code: payout.failure_code,
            transactions: Vec::new(),
            charges: Vec::new(),
        };
        if status != PayoutStatus::Paid {
            return Ok(Some(read));
        }
        read.transactions = self.covered(&read.id).await?;
        let intents: BTreeSet<&str> = read
            .transactions
            .iter()
            .filter_map(|txn| txn.charge_id.as_deref())
            .collect();
        for id in intents {
            let Some(intent) = self.intent(id).await? else {
                return Err(ProviderError::Unknown {
                    reason: format!(
                        "payout {} names PaymentIntent {id}, which Stripe does not have",
                        read.id
                    ),
                });
            };
            // A PaymentIntent with a balance transaction has a charge.
            if charge_of(&intent).is_ok() {
                read.charges.push(self.charge_now(&intent).await?);
            }
        }
        Ok(Some(read))
    }

    /// The transactions `payout` covered, a failed payout's return read as what it covered.
    async fn covered(&self, payout: &str) -> Result<Vec<PayoutTransaction>, ProviderError> {
        let mut covered = Vec::new();
        let mut payouts = vec![(payout.to_owned(), 0)];
        while let Some((payout, depth)) = payouts.pop() {
            let listed: Vec<BalanceTransaction> = self
                .listed(
                    &["v1", "balance_transactions"],
                    &[("payout", payout.clone())],
                    Some("data.source"),
                )
                .await?;
            for txn in listed {
                let source = txn.source.as_ref().map(|source| source.id().to_owned());
                match txn.kind.as_str() {
                    // The payout's own withdrawal.
                    "payout" if source.as_deref() == Some(payout.as_str()) => {}
                    "payout_failure" | "payout_cancel" => {
                        let Some(failed) = source.filter(|_| depth < REPAID_DEPTH_MAX) else {
                            return Err(ProviderError::Protocol {
                                reason: format!(
                                    "payout {payout} pays out {} without a payout it returns, or past {REPAID_DEPTH_MAX} returns",
                                    txn.id
                                ),
                            });
                        };
                        payouts.push((failed, depth + 1));
                    }
                    _ => covered.push(PayoutTransaction {
                        charge_id: txn
                            .source
                            .as_ref()
                            .and_then(|source| source.object()?.payment_intent.as_ref())
                            .map(|intent| intent.id().to_owned()),
                        net_minor: txn.net,
                        kind: txn.kind,
                        id: txn.id,
                    }),
                }
            }
        }
        Ok(covered)
    }

    pub(super) async fn payout_ids_created(
        &self,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
    ) -> Result<Vec<String>, ProviderError> {
        let payouts: Vec<wire::Payout> = self
            .listed(&["v1", "payouts"], &created_in(from, to), None)
            .await?;
        Ok(payouts.into_iter().map(|payout| payout.id).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payout_events_name_their_payout_and_no_other_event_does() {
        let event = |kind: &str, object: serde_json::Value| {
            serde_json::to_vec(&serde_json::json!({
                "id": "evt_1", "object": "event", "type": kind, "created": 1,
                "api_version": wire::API_VERSION, "livemode": false, "pending_webhooks": 1,
                "request": {"id": null, "idempotency_key": null},
                "data": {"object": object},
            }))
            .unwrap()
        };
        let payout = serde_json::json!({"id": "po_1", "object": "payout"});
        for kind in [
            "payout.paid",
            "payout.failed",
            "payout.canceled",
            "payout.updated",
        ] {
            assert_eq!(
                payout_of_event(&event(kind, payout.clone())).as_deref(),
                Some("po_1")
            );
        }
        assert_eq!(payout_of_event(&event("payout.created", payout)), None);
        let intent = serde_json::json!({"id": "pi_1", "object": "payment_intent"});
        assert_eq!(payout_of_event(&event("payout.paid", intent)), None);
        assert_eq!(payout_of_event(b"not json"), None);
    }

    #[test]
    fn payout_statuses_are_stripe_s() {
        assert_eq!(status_of("paid"), PayoutStatus::Paid);
        assert_eq!(status_of("in_transit"), PayoutStatus::InTransit);
        assert_eq!(status_of("failed"), PayoutStatus::Failed);
        assert_eq!(status_of("something_new"), PayoutStatus::Other);
    }
}
