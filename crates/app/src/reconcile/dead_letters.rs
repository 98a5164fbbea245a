//! Dead letters: webhooks the worker dead-lettered because they name no payment of ours
//! (`unknown_payment`) become manual exceptions, page by page behind a cursor.

use asiento_domain::exception::{ExceptionRecorded, Resolution};
use asiento_domain::{ExceptionId, ExceptionKind, ProviderName};
use serde_json::{json, Value};

use super::{ReconcileError, Reconciler, SweepSummary};
use crate::exceptions;
use crate::webhooks::{self, DeadReason};

/// Dead letters turned into exceptions per page.
pub const DEAD_LETTERS_PER_PAGE_MAX: i64 = 500;

const DEAD_LETTERS_CURSOR: &str = "dead_letters";

impl Reconciler {
    pub(super) async fn sweep_dead_letters(
        &self,
        summary: &mut SweepSummary,
    ) -> Result<(), ReconcileError> {
        let mut after = self.cursor_mark(DEAD_LETTERS_CURSOR).await?.unwrap_or(0);
        loop {
            let page = webhooks::dead_letters(
                self.database(),
                Some(DeadReason::UnknownPayment),
                after,
                DEAD_LETTERS_PER_PAGE_MAX,
            )
            .await?;
            let Some(last) = page.last().map(|letter| letter.id) else {
                return Ok(());
            };
            for letter in &page {
                let Ok(provider) = ProviderName::parse(&letter.provider) else {
                    tracing::warn!(row = letter.id, "dead letter of an unnamed provider");
                    continue;
                };
                let recorded = ExceptionRecorded {
                    exception_id: ExceptionId::derived(
                        &provider,
                        &letter.event_id,
                        ExceptionKind::UnknownPaymentEvent,
                        "",
                    ),
                    tenant: None,
                    payment_id: None,
                    provider,
                    charge_id: None,
                    kind: ExceptionKind::UnknownPaymentEvent,
                    local: Value::Null,
                    provider_state: json!({
                        "event_id": letter.event_id,
                        "event_type": letter.event_type,
                        "payment_ref": letter.payment_ref,
                        "inbox_id": letter.id,
                    }),
                    difference: json!({"local": "no such payment"}),
                    resolution: Resolution::Manual,
                    at: self.flow.clock.now(),
                };
                if exceptions::record(&self.flow.database, self.flow.store.as_ref(), recorded)
                    .await?
                {
                    summary.exception(ExceptionKind::UnknownPaymentEvent, Resolution::Manual);
                }
            }
            self.set_cursor_mark(DEAD_LETTERS_CURSOR, last).await?;
            after = last;
            if (page.len() as i64) < DEAD_LETTERS_PER_PAGE_MAX {
                return Ok(());
            }
        }
    }
}
