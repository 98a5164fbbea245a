//! The stale-payment sweep: payments still `pending` or `requires_action` past the pending
//! timeout are looked up at their provider and settled from what it answers, expired when it
//! never got the charge, or cancelled and expired when the customer abandoned the redirect. The
//! watch list is visited in rotation, so payments that never resolve cannot starve the others.
//!
//! A provider without a lookup by our key (docs/adyen-wire.md §3) is asked in the ways it
//! allows: while the payment is still wanted and its key surely lives, the charge request is
//! sent again, identical, under the same key (the provider answers the first outcome, or makes
//! the one charge now); once it is no longer wanted, whatever the request made is cancelled by
//! our reference; it is concluded absent only after the settlement report has been compared
//! past its expiry by the provider's [`asiento_psp::Capabilities::absence_confirmed_after`].

use asiento_domain::{
    psp_cancel_key, ExceptionKind, PaymentCommand, PaymentId, PaymentRecord, PaymentStatus,
};
use asiento_psp::{Charge, ChargeStatus, ProviderError};
use serde_json::{json, Value};

use super::findings::Finding;
use super::{duration_ms, local_state, report_cursor, ReconcileError, Reconciler, SweepSummary};
use crate::facts;
use crate::idempotency;
use crate::leases;
use crate::log;
use crate::payments::{Finalize, FlowError};

use crate::watch;

/// How far around a payment's life its provider's events are searched: the provider's clock may
/// run behind or ahead of ours.
const EVENTS_LEEWAY_MINUTES: i64 = 10;

/// Stale payments looked up in one sweep; the rest wait for the next.
pub const STALE_PAYMENTS_PER_SWEEP_MAX: i64 = 1_000;
/// How long a payment flagged as a misfit waits before the stale sweep looks it up again: a
/// person is on it, and every lookup would find the same misfit.
pub const MISFIT_RECHECK_MS: i64 = 3_600_000;
/// How long a payment that only a notification or the settlement report can decide waits before
/// the stale sweep visits it again (and asks again for the cancel it sent).
pub const UNREAD_RECHECK_MS: i64 = 3_600_000;

/// When a visited payment is due again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Revisit {
    /// At the next sweep.
    NextSweep,
    /// Not before `ms` after now: nothing can be learned sooner.
    After(i64),
}

fn charge_state(charge: &Charge) -> Value {
    json!({
        "charge_id": charge.id,
        "status": charge.status,
        "amount_minor": charge.amount_minor,
        "currency": charge.currency,
        "captured_minor": charge.amount_captured,
        "refunded_minor": charge.amount_refunded,
        "reference": charge.reference,
        "idempotency_key": charge.idempotency_key,
    })
}

impl Reconciler {
    /// Looks up the most overdue watched payments older than the operation timeout (or the
    /// pending timeout, their expiry, when that is shorter). Each one visited is due again one
    /// sweep later (a flagged misfit only after [`MISFIT_RECHECK_MS`]), so the list rotates:
    /// rows that never resolve cannot hold back the others.
    pub(super) async fn sweep_stale(
        &self,
        summary: &mut SweepSummary,
    ) -> Result<(), ReconcileError> {
        let now_ms = self.flow.clock.now_ms();
        let first_visit_ms = self
            .config
            .operation_timeout_ms
            .min(self.config.pending_timeout_ms);
        let before = now_ms.saturating_sub(first_visit_ms);
        let due = watch::due_payments(
            self.database(),
            before,
            now_ms,
            STALE_PAYMENTS_PER_SWEEP_MAX,
        )
        .await?;
        let next_ms =
            now_ms.saturating_add(i64::try_from(self.config.interval_ms).unwrap_or(i64::MAX));
        for raw in due {
            let Ok(id) = PaymentId::parse(&raw) else {
                tracing::error!(payment = %raw, "watch list holds a malformed payment id");
                summary.errors += 1;
                continue;
            };
            summary.stale_checked += 1;
            let misfits_before = summary.misfits;
            let revisit = match self.settle_with_lease(id, summary).await {
                Ok(revisit) => revisit.unwrap_or(Revisit::NextSweep),
                Err(error) => {
                    summary.errors += 1;
                    tracing::error!(payment = %id, %error, "stale payment not settled");
                    Revisit::NextSweep
                }
            };
            let next = match revisit {
                _ if summary.misfits > misfits_before => now_ms.saturating_add(MISFIT_RECHECK_MS),
                Revisit::After(ms) => now_ms.saturating_add(ms),
                Revisit::NextSweep => next_ms,
            };
            // A payment that left the list meanwhile is simply not updated.
            watch::postpone_payment(self.database(), id, next).await?;
        }
        Ok(())
    }

    /// Settles one payment under its lease: looks it up at the provider and applies what it
    /// finds. `Ok(None)` when another holder has the lease.
    pub(super) async fn settle_with_lease(
        &self,
        id: PaymentId,
        summary: &mut SweepSummary,
    ) -> Result<Option<Revisit>, ReconcileError> {
        let now_ms = self.flow.clock.now_ms();
        let Some(lease) =
            leases::acquire(self.database(), id, now_ms, self.config.payment_lease_ms).await?
        else {
            summary.busy += 1;
            return Ok(None);
        };
        let result = self.settle_stale(id, summary).await;
        if let Err(error) = leases::release(self.database(), &lease).await {
            tracing::warn!(payment = %id, %error, "payment lease not released; it runs out");
        }
        result.map(Some)
    }

    async fn settle_stale(
        &self,
        id: PaymentId,
        summary: &mut SweepSummary,
    ) -> Result<Revisit, ReconcileError> {
        let loaded = log::load_payment(self.flow.store.as_ref(), id).await?;
        let Some(record) = loaded.aggregate.record else {
            watch::unwatch_payment(self.database(), id).await?;
            return Ok(Revisit::NextSweep);
        };
        if !matches!(
            record.status,
            PaymentStatus::Pending | PaymentStatus::RequiresAction
        ) {
            watch::unwatch_payment(self.database(), id).await?;
            return Ok(Revisit::NextSweep);
        }
        if self.flow.paused().contains(&record.tenant) {
            // Its tenant is moving to another cell: settled after the pause, where it is then.
            return Ok(Revisit::NextSweep);
        }
        let provider = self.provider(&record.provider)?;
        let lookup = match &record.provider_charge_id {
            Some(charge_id) => provider.adapter.get_charge(charge_id).await,
            None => provider.adapter.find_charge_by_key(&record.psp_key).await,
        };
        let expired_ms = record
            .created_at
            .timestamp_millis()
            .saturating_add(self.config.pending_timeout_ms);
        let capabilities = provider.adapter.capabilities();
        let absence_ms = duration_ms(capabilities.absence_confirmed_after);
        // Without a lookup by key, a charge the provider never got is known absent once the
        // settlement report has been compared past the payment's expiry (and past the time the
        // provider may take to list it): a charge created for it would have been touched inside
        // one of those windows, and its line would have settled the payment.
        // Before that conclusion, the provider's own record of the requests it acted on (its
        // events list, where it keeps one) is asked for a charge made under our key.
        let lookup = match lookup {
            Err(ProviderError::Unsupported { .. })
                if record.provider_charge_id.is_none()
                    && expired_ms <= self.flow.clock.now_ms()
                    && self
                        .cursor_mark(&report_cursor(&record.provider))
                        .await?
                        .is_some_and(|mark| mark >= expired_ms.saturating_add(absence_ms)) =>
            {
                // The requests that could have made it ran from its creation until its
                // expiry (one still running past it keeps it from expiring, below).
                let leeway = chrono::Duration::minutes(EVENTS_LEEWAY_MINUTES);
                let from = record.created_at - leeway;
                let to = record.created_at
                    + chrono::Duration::milliseconds(self.config.pending_timeout_ms)
                    + leeway;
                match provider
                    .adapter
                    .find_charge_in_events(&record.psp_key, from, to.min(self.flow.clock.now()))
                    .await
                {
                    Err(ProviderError::Unsupported { .. }) => Ok(None),
                    found => found,
                }
            }
            other => other,
        };
        let charge = match lookup {
            // The provider has no lookup by our key: the request is sent again while the payment
            // is wanted, its effect cancelled once it is not; its webhooks and its report settle
            // the payment (the report compares every charge it lists), or expire it above.
            Err(ProviderError::Unsupported { what }) => {
                tracing::debug!(payment = %id, %what, "no lookup");
                if let Some(charge_id) = &record.provider_charge_id {
                    return self.cancel_unread(&record, charge_id, summary).await;
                }
                return if self.flow.clock.now_ms() < expired_ms {
                    self.send_again(&record, summary).await
                } else {
                    self.cancel_by_reference(
                        &record,
                        expired_ms.saturating_add(absence_ms),
                        summary,
                    )
                    .await
                };
            }
            Err(error) => {
                summary.provider_errors += 1;
                tracing::warn!(payment = %id, %error, "provider lookup gave no answer");
                return Ok(Revisit::NextSweep);
            }
            Ok(charge) => charge,
        };
        match (charge, &record.provider_charge_id) {
            (None, None) if expired_ms <= self.flow.clock.now_ms() => {
                // The provider has not got the charge, and the payment is past its expiry. A
                // request creating it that still runs (a pending timeout shorter than the
                // provider calls it makes) may yet reach the provider: it is left to finish.
                let now_ms = self.flow.clock.now_ms();
                if idempotency::resource_in_flight(self.database(), &id.to_string(), now_ms).await?
                {
                    tracing::info!(payment = %id, "past its expiry, its creation still runs; not expired");
                    return Ok(Revisit::NextSweep);
                }
                match self
                    .flow
                    .finalize(Finalize::command(
                        id,
                        PaymentCommand::Expire {
                            at: self.flow.clock.now(),
                        },
                    ))
                    .await
                {
                    Ok(finalized) if finalized.events_appended > 0 => summary.expired += 1,
                    Ok(_) => {}
                    // A fact won the race and the payment is no longer expirable: fine.
                    Err(FlowError::Rejected(rejection)) => {
                        tracing::info!(payment = %id, %rejection, "expiry refused")
                    }
                    Err(error) => return Err(error.into()),
                }
            }
            (None, None) => {}
            (None, Some(charge_id)) => {
                let finding = Finding {
                    kind: ExceptionKind::Ambiguous,
                    fingerprint: "charge_vanished".into(),
                    charge_id: charge_id.clone(),
                    local: local_state(&record),
                    provider: json!({"charge_id": charge_id, "found": false}),
                };
                self.flag(&record, finding, summary).await?;
            }
            (Some(charge), _) => {
                if let Some(misfit) = facts::charge_misfit(&record, &charge) {
                    let finding = Finding {
                        kind: misfit.kind,
                        fingerprint: misfit.fingerprint,
                        charge_id: charge.id.clone(),
                        local: local_state(&record),
                        provider: charge_state(&charge),
                    };
                    self.flag(&record, finding, summary).await?;
                } else if self.abandoned(&record, &charge) {
                    self.cancel_abandoned(&record, &charge, summary).await?;
                } else {
                    let mut status = record.status;
                    for fact in facts::charge_facts(&charge, facts::Read::Now) {
                        status = self
                            .flow
                            .finalize(Finalize::facts(id, Some(fact)))
                            .await?
                            .payment
                            .status;
                    }
                    if status != record.status {
                        summary.settled += 1;
                    }
                }
            }
        }
        Ok(Revisit::NextSweep)
    }

    /// Sends the charge request of a payment whose creation was never answered again, identical,
    /// under its key, and applies the answer: the provider answers the first outcome (or makes
    /// the one charge now). Only while the key surely lives, never while the first request
    /// still runs, and only for an intent that recorded its payment method.
    async fn send_again(
        &self,
        record: &PaymentRecord,
        summary: &mut SweepSummary,
    ) -> Result<Revisit, ReconcileError> {
        let now_ms = self.flow.clock.now_ms();
        let provider = self.provider(&record.provider)?;
        let key_dies_ms = record
            .created_at
            .timestamp_millis()
            .saturating_add(duration_ms(provider.adapter.capabilities().key_lifetime));
        let Some(payment_method) = record.payment_method.as_deref() else {
            tracing::debug!(payment = %record.id, "no payment method recorded; left to the webhooks and the report");
            return Ok(Revisit::NextSweep);
        };
        if now_ms >= key_dies_ms
            || idempotency::resource_in_flight(self.database(), &record.id.to_string(), now_ms)
                .await?
        {
            return Ok(Revisit::NextSweep);
        }
        tracing::info!(payment = %record.id, key = %record.psp_key, "charge outcome unknown; sending it again under its key");
        summary.charges_resent += 1;
        let facts = self.flow.request_charge(record, payment_method).await?;
        if facts.is_empty() {
            return Ok(Revisit::NextSweep);
        }
        let finalized = self
            .flow
            .finalize(Finalize::facts(record.id, facts))
            .await?;
        if finalized.payment.status != record.status {
            summary.settled += 1;
        }
        Ok(Revisit::NextSweep)
    }

    /// Asks the provider to cancel whatever the never-answered request of a payment past its
    /// expiry made (under the payment's cancel key, so asking again repeats nothing): the
    /// payment is no longer wanted. Its webhook tells the outcome; the report concludes the
    /// charge absent once compared past `absent_from_ms` (above). A cancel sent is sent again
    /// an hour later at the most, and the payment is visited again as soon as the report can
    /// conclude.
    async fn cancel_by_reference(
        &self,
        record: &PaymentRecord,
        absent_from_ms: i64,
        summary: &mut SweepSummary,
    ) -> Result<Revisit, ReconcileError> {
        let provider = self.provider(&record.provider)?;
        let key = psp_cancel_key(record.id);
        match provider
            .adapter
            .cancel_by_reference(&record.id.to_string(), &key)
            .await
        {
            Ok(cancel) => {
                summary.cancelled_by_reference += 1;
                tracing::info!(payment = %record.id, %cancel, "past its expiry without an answer; its request's effect cancelled by reference");
            }
            // Nothing sent: only the report can tell, and it moves on every sweep.
            Err(ProviderError::Unsupported { .. }) => return Ok(Revisit::NextSweep),
            Err(error) => {
                summary.provider_errors += 1;
                tracing::warn!(payment = %record.id, %error, "cancel by reference gave no answer");
                return Ok(Revisit::NextSweep);
            }
        }
        let concludable_in_ms = absent_from_ms
            .saturating_add(self.config.report_settle_ms)
            .saturating_sub(self.flow.clock.now_ms());
        Ok(if concludable_in_ms > 0 {
            Revisit::After(concludable_in_ms.min(UNREAD_RECHECK_MS))
        } else {
            Revisit::NextSweep
        })
    }

    /// A redirect the provider cannot be asked about (no lookup by id), past the timeout for
    /// customer action: cancelled at the provider under the payment's cancel key (asking again
    /// repeats nothing). The provider's notification of the cancel fails the payment; if the
    /// customer paid meanwhile, its notification of the payment settles it instead.
    async fn cancel_unread(
        &self,
        record: &PaymentRecord,
        charge_id: &str,
        summary: &mut SweepSummary,
    ) -> Result<Revisit, ReconcileError> {
        if record.status != PaymentStatus::RequiresAction || !self.past_action_deadline(record) {
            return Ok(Revisit::NextSweep);
        }
        let provider = self.provider(&record.provider)?;
        match provider
            .adapter
            .cancel(charge_id, &psp_cancel_key(record.id))
            .await
        {
            Ok(_) => {
                summary.redirects_cancelled += 1;
                tracing::info!(payment = %record.id, "abandoned redirect cancelled; its notification decides the payment");
            }
            Err(ProviderError::Rejected(rejection)) => {
                tracing::info!(payment = %record.id, code = %rejection.code, "abandoned redirect not cancelled; its notifications decide the payment");
            }
            Err(error) => {
                summary.provider_errors += 1;
                tracing::warn!(payment = %record.id, %error, "cancel of an abandoned redirect gave no answer");
                return Ok(Revisit::NextSweep);
            }
        }
        Ok(Revisit::After(UNREAD_RECHECK_MS))
    }

    /// The customer never finished the redirect: still waiting for them at the provider, past
    /// the timeout for customer action.
    fn abandoned(&self, record: &PaymentRecord, charge: &Charge) -> bool {
        charge.status == ChargeStatus::RequiresAction && self.past_action_deadline(record)
    }

    /// The timeout for customer action has run out for `record`.
    fn past_action_deadline(&self, record: &PaymentRecord) -> bool {
        record
            .created_at
            .timestamp_millis()
            .saturating_add(self.config.requires_action_timeout_ms)
            <= self.flow.clock.now_ms()
    }

    /// Cancels an abandoned redirect at the provider (under the payment's cancel key, so a
    /// repeated sweep asks once) and expires the payment once the provider says the charge can
    /// no longer be paid. If the customer paid meanwhile, the cancel is refused and the charge's
    /// own facts settle the payment.
    async fn cancel_abandoned(
        &self,
        record: &PaymentRecord,
        charge: &Charge,
        summary: &mut SweepSummary,
    ) -> Result<(), ReconcileError> {
        let provider = self.provider(&record.provider)?;
        let key = psp_cancel_key(record.id);
        let after = match provider.adapter.cancel(&charge.id, &key).await {
            Ok(answer) => answer.charge,
            Err(ProviderError::Rejected(rejection)) => {
                tracing::info!(payment = %record.id, code = %rejection.code, "abandoned redirect not cancelled; reading the charge again");
                provider.adapter.get_charge(&charge.id).await.ok().flatten()
            }
            Err(error) => {
                summary.provider_errors += 1;
                tracing::warn!(payment = %record.id, %error, "cancel of an abandoned redirect gave no answer");
                return Ok(());
            }
        };
        match after {
            Some(after) if after.status == ChargeStatus::Failed => {
                let expired = self
                    .flow
                    .finalize(Finalize::command(
                        record.id,
                        PaymentCommand::Expire {
                            at: self.flow.clock.now(),
                        },
                    ))
                    .await;
                match expired {
                    Ok(finalized) if finalized.events_appended > 0 => summary.expired += 1,
                    Ok(_) => {}
                    Err(FlowError::Rejected(rejection)) => {
                        tracing::info!(payment = %record.id, %rejection, "expiry refused")
                    }
                    Err(error) => return Err(error.into()),
                }
            }
            // Paid (or authorized) meanwhile: the charge's facts settle the payment.
            Some(after) if after.status != ChargeStatus::RequiresAction => {
                for fact in facts::charge_facts(&after, facts::Read::Now) {
                    self.flow
                        .finalize(Finalize::facts(record.id, Some(fact)))
                        .await?;
                }
                summary.settled += 1;
            }
            _ => {}
        }
        Ok(())
    }
}
