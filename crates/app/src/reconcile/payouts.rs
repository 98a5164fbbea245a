//! The payouts of a report window: every payout the provider created in it, read and posted
//! (`crate::payouts`), so that a payout whose webhooks were all lost still reaches the bank
//! account in the ledger. Posting one the webhook already posted finds nothing to do.

use asiento_domain::ProviderName;
use chrono::{DateTime, Utc};

use super::{Reconciler, SweepSummary};
use crate::payouts::{self, PayoutError, Posted};

impl Reconciler {
    /// Whether every payout of the window was handled (otherwise the window is asked again).
    pub(super) async fn post_payouts(
        &self,
        provider: &ProviderName,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
        summary: &mut SweepSummary,
    ) -> bool {
        let Ok(configured) = self.provider(provider) else {
            return false;
        };
        let adapter = configured.adapter.clone();
        let ids = match adapter.payouts_created(from, to).await {
            Ok(ids) => ids,
            Err(error) => {
                summary.provider_errors += 1;
                tracing::warn!(%provider, %error, "payouts unavailable; next sweep asks again");
                return false;
            }
        };
        let mut complete = true;
        for id in ids {
            let payout = match adapter.get_payout(&id).await {
                Ok(Some(payout)) => payout,
                Ok(None) => continue,
                Err(error) => {
                    summary.provider_errors += 1;
                    complete = false;
                    tracing::warn!(%provider, payout = %id, %error, "payout not read; next sweep asks again");
                    continue;
                }
            };
            match payouts::post(&self.flow, provider, &payout).await {
                Ok(Posted::Recorded) => summary.payouts_posted += 1,
                // Not final yet: its `paid` or `failed` event posts it.
                Ok(Posted::Already | Posted::NotFinal) => {}
                Err(PayoutError::PaymentBusy(_) | PayoutError::TenantPaused(_)) => {
                    summary.busy += 1;
                    complete = false;
                }
                Err(error) => {
                    summary.errors += 1;
                    complete = false;
                    tracing::error!(%provider, payout = %id, %error, "payout not posted");
                }
            }
        }
        complete
    }
}
