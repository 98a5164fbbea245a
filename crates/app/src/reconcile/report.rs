//! Settlement reports: each provider's report for a window is compared line by line with our
//! payments ([`classify`], pure and tested as a table). What the flow can apply is applied with an
//! auto exception in the same transaction; anything else is a manual exception and a review flag.

use asiento_domain::exception::{ExceptionRecorded, Resolution};
use asiento_domain::{
    Amount, ExceptionId, ExceptionKind, PaymentId, PaymentRecord, PaymentStatus, ProviderFact,
    ProviderName,
};
use asiento_eventstore::Tx;
use asiento_psp::{ChargeStatus, ReportLine};
use chrono::{DateTime, TimeZone as _, Utc};
use serde_json::{json, Value};

use super::findings::Finding;
use super::movements;
use super::{local_state, report_cursor, ReconcileError, Reconciler, SweepSummary};
use crate::exceptions::{self, ExceptionError};
use crate::facts;
use crate::leases;
use crate::log;
use crate::payments::{Finalize, FlowError, InTransaction};

/// What a settlement-report line means against our payment. Pure, so it is tested as a table.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// Both sides agree (or the difference is work in progress the stale sweep owns).
    Agree,
    /// The provider is ahead in a way the flow can apply: `facts` in order.
    Auto {
        kind: ExceptionKind,
        facts: Vec<ProviderFact>,
        fingerprint: String,
    },
    /// A person must look.
    Manual {
        kind: ExceptionKind,
        fingerprint: String,
    },
}

/// Compares one report line with our payment.
pub fn classify(record: &PaymentRecord, line: &ReportLine) -> Verdict {
    use PaymentStatus as S;
    let manual = |kind, fingerprint: String| Verdict::Manual { kind, fingerprint };
    if line.currency != record.currency.code() {
        return manual(ExceptionKind::CurrencyMismatch, line.currency.clone());
    }
    if line.amount_minor != record.amount.minor() {
        return manual(ExceptionKind::AmountMismatch, line.amount_minor.to_string());
    }
    let charge_id = line.charge_id.clone();
    let local = record.status;
    match line.status {
        ChargeStatus::Failed => match local {
            S::Pending | S::RequiresAction => Verdict::Auto {
                kind: ExceptionKind::FailedAtProvider,
                facts: vec![ProviderFact::Failed {
                    charge_id: Some(charge_id),
                    reason: "failed at the provider (settlement report)".into(),
                }],
                fingerprint: String::new(),
            },
            // The merchant's cancel ended it: its answer was lost.
            S::Authorized if record.cancel_asked() => Verdict::Auto {
                kind: ExceptionKind::FailedAtProvider,
                facts: vec![ProviderFact::Failed {
                    charge_id: Some(charge_id),
                    reason: "canceled at the provider (settlement report)".into(),
                }],
                fingerprint: String::new(),
            },
            S::Failed | S::Expired | S::Canceled => Verdict::Agree,
            S::Captured | S::PartiallyRefunded | S::Refunded | S::Disputed => {
                manual(ExceptionKind::CapturedHereFailedAtProvider, String::new())
            }
            S::Authorized => manual(ExceptionKind::Ambiguous, "failed:authorized".into()),
        },
        // The customer still has to act: the stale sweep owns this.
        ChargeStatus::RequiresAction => match local {
            S::Pending | S::RequiresAction => Verdict::Agree,
            other => manual(ExceptionKind::Ambiguous, format!("requires_action:{other}")),
        },
        ChargeStatus::RequiresCapture => match local {
            S::Pending | S::RequiresAction => Verdict::Auto {
                kind: ExceptionKind::AuthorizedAtProvider,
                facts: vec![ProviderFact::Authorized {
                    charge_id,
                    amount: Amount::new(line.amount_minor),
                }],
                fingerprint: String::new(),
            },
            S::Authorized => Verdict::Agree,
            other => manual(
                ExceptionKind::Ambiguous,
                format!("requires_capture:{other}"),
            ),
        },
        ChargeStatus::Succeeded => {
            let captured = Amount::new(line.amount_captured);
            let refunded = Amount::new(line.amount_refunded);
            match local {
                S::Pending | S::RequiresAction | S::Authorized => {
                    let mut facts = vec![ProviderFact::Captured {
                        charge_id: charge_id.clone(),
                        amount: captured,
                    }];
                    if line.amount_refunded > 0 {
                        facts.push(ProviderFact::Refunded {
                            charge_id: charge_id.clone(),
                            amount_refunded: refunded,
                            current: true,
                        });
                    }
                    facts.extend(
                        line.dispute
                            .as_ref()
                            .map(|dispute| facts::dispute_of(&charge_id, dispute)),
                    );
                    facts.extend(facts::provider_fee_facts(&charge_id, &line.provider_fees));
                    Verdict::Auto {
                        kind: ExceptionKind::CapturedAtProvider,
                        facts,
                        fingerprint: String::new(),
                    }
                }
                S::Failed | S::Expired | S::Canceled => {
                    manual(ExceptionKind::Ambiguous, format!("succeeded:{local}"))
                }
                S::Captured | S::PartiallyRefunded | S::Refunded | S::Disputed => {
                    if captured != record.captured {
                        manual(
                            ExceptionKind::AmountMismatch,
                            format!("captured:{}", line.amount_captured),
                        )
                    } else if refunded > record.refunded {
                        Verdict::Auto {
                            kind: ExceptionKind::RefundedOutOfBand,
                            facts: vec![ProviderFact::Refunded {
                                charge_id,
                                amount_refunded: refunded,
                                current: true,
                            }],
                            fingerprint: line.amount_refunded.to_string(),
                        }
                    } else if refunded < record.refunded {
                        manual(
                            ExceptionKind::Ambiguous,
                            format!("refunded:{}", line.amount_refunded),
                        )
                    } else {
                        match dispute_verdict(record, line) {
                            Verdict::Agree => match fee_verdict(record, line) {
                                Verdict::Agree => movements::movement_verdict(record, line),
                                behind => behind,
                            },
                            behind => behind,
                        }
                    }
                }
            }
        }
    }
}

/// Compares the report's dispute with ours by how far each went (`DisputeStage`: open, lost,
/// won, lost again), not only by whether it exists: a dispute we never heard of, or a stage past
/// ours (its close, its reversal, a second chargeback whose notifications were all lost), is
/// applied, so that clearing never says the provider owes money it took back. A report behind
/// us (a stage we heard of after the window it covers) agrees: a later window shows it.
fn dispute_verdict(record: &PaymentRecord, line: &ReportLine) -> Verdict {
    let Some(dispute) = &line.dispute else {
        return Verdict::Agree;
    };
    let fact = facts::dispute_of(&line.charge_id, dispute);
    let Some((dispute_id, told)) = fact.dispute_stage() else {
        return Verdict::Agree;
    };
    let behind = record
        .dispute
        .as_ref()
        .filter(|ours| ours.id == dispute_id)
        .is_none_or(|ours| ours.stage() < told);
    if !behind {
        return Verdict::Agree;
    }
    let fingerprint = format!("{dispute_id}:{}", told.as_str());
    Verdict::Auto {
        kind: ExceptionKind::DisputedAtProvider,
        facts: vec![fact],
        fingerprint,
    }
}

/// Compares the provider's fees with the ones we posted, by balance transaction: a fee we never
/// heard of is posted (the read that carried it was lost); another fee for a transaction we
/// posted is for a person.
fn fee_verdict(record: &PaymentRecord, line: &ReportLine) -> Verdict {
    let mut unposted = Vec::new();
    for fee in &line.provider_fees {
        match record.provider_fee(&fee.transaction_id) {
            Some(posted) if posted.minor() == fee.fee_minor => {}
            Some(_) => {
                return Verdict::Manual {
                    kind: ExceptionKind::ProviderFeeMismatch,
                    fingerprint: format!("{}:{}", fee.transaction_id, fee.fee_minor),
                }
            }
            None if fee.fee_minor == 0 => {}
            None => unposted.push(fee.clone()),
        }
    }
    if unposted.is_empty() {
        return Verdict::Agree;
    }
    let fingerprint = unposted
        .iter()
        .map(|fee| fee.transaction_id.as_str())
        .collect::<Vec<_>>()
        .join(",");
    Verdict::Auto {
        kind: ExceptionKind::ProviderFeeUnposted,
        facts: facts::provider_fee_facts(&line.charge_id, &unposted).collect(),
        fingerprint,
    }
}

fn line_state(line: &ReportLine) -> Value {
    json!({
        "charge_id": line.charge_id,
        "status": line.status,
        "amount_minor": line.amount_minor,
        "currency": line.currency,
        "captured_minor": line.amount_captured,
        "refunded_minor": line.amount_refunded,
        "reference": line.reference,
        "last_touched": line.last_touched,
    })
}

fn millis(ms: i64) -> DateTime<Utc> {
    Utc.timestamp_millis_opt(ms)
        .single()
        .unwrap_or(DateTime::<Utc>::MIN_UTC)
}

/// The payment a PSP charge key (`psp_<uuid simple>`) was derived from.
fn payment_of_key(key: &str) -> Option<PaymentId> {
    let hex = key.strip_prefix("psp_")?;
    if hex.len() != 32 {
        return None;
    }
    PaymentId::parse(hex).ok()
}

/// Records an auto exception in the transaction of the fix it describes (see
/// [`Finalize::also`](crate::payments::Finalize::also)); if the fact turned
/// out to contradict the payment (the flow flagged it instead of applying it), the exception is
/// recorded as manual and open.
struct RecordWithFix {
    store: crate::log::Store,
    recorded: ExceptionRecorded,
    flags_before: usize,
    /// What was recorded, if anything: (kind, resolution).
    outcome: std::sync::Mutex<Option<Resolution>>,
}

#[async_trait::async_trait]
impl InTransaction for RecordWithFix {
    async fn run(
        &self,
        tx: &mut Tx,
        finalized: &crate::payments::Finalized,
    ) -> Result<(), FlowError> {
        if finalized.events_appended == 0 {
            // A webhook or another path applied the fact first: there was nothing for us to fix.
            return Ok(());
        }
        let mut recorded = self.recorded.clone();
        if finalized.payment.flags.len() > self.flags_before {
            recorded.resolution = Resolution::Manual;
        }
        let resolution = recorded.resolution;
        exceptions::record_in(self.store.as_ref(), tx, recorded)
            .await
            .map_err(|error| match error {
                ExceptionError::Append(error) => FlowError::Append(error),
                other => FlowError::Inconsistent(other.to_string()),
            })?;
        if let Ok(mut outcome) = self.outcome.lock() {
            *outcome = Some(resolution);
        }
        Ok(())
    }
}

impl Reconciler {
    /// Compares the provider's report of the window since the last one compared (reaching back
    /// by the overlap) with our payments, a slice of it at a time where the provider's
    /// capabilities say so (`report_slice`: one slice's lines in memory at once), and moves the
    /// provider's cursor past the slices compared whole. From the first slice that is not (a
    /// line to look at again, a payout not posted) the cursor stays, and the next sweep asks for
    /// that slice again. A report that ends before its slice (a provider that tells so many lines
    /// at most, or has made its report only that far) is asked for again from its end, until one
    /// moves nothing.
    pub(super) async fn compare_report(
        &self,
        provider: &ProviderName,
        summary: &mut SweepSummary,
    ) -> Result<(), ReconcileError> {
        let configured = self.provider(provider)?.clone();
        let cursor = report_cursor(provider);
        let now_ms = self.flow.clock.now_ms();
        let to_ms = now_ms.saturating_sub(self.config.report_settle_ms);
        let mut mark = self.cursor_mark(&cursor).await?;
        let mut from_ms = match mark {
            Some(end) => end.saturating_sub(self.config.report_overlap_ms),
            None => to_ms.saturating_sub(self.config.report_lookback_ms),
        };
        let first_slice_ms = configured
            .adapter
            .capabilities()
            .report_slice
            .map(|slice| i64::try_from(slice.as_millis()).unwrap_or(i64::MAX).max(1));
        let mut slice_ms = first_slice_ms.unwrap_or(i64::MAX);
        let mut advancing = true;
        let mut ended_early = false;
        while from_ms < to_ms {
            let until_ms = to_ms.min(from_ms.saturating_add(slice_ms));
            let Some(compared) = self
                .compare_slice(
                    &configured,
                    provider,
                    (from_ms, until_ms),
                    ended_early,
                    summary,
                )
                .await?
            else {
                return Ok(());
            };
            let (covered_ms, whole) = (compared.covered_ms, compared.whole);
            if let Some(first) = first_slice_ms {
                slice_ms = next_slice_ms(
                    until_ms - from_ms,
                    compared.lines,
                    self.config.report_slice_lines,
                    first,
                );
            }
            advancing &= whole;
            // Never back: a report covering less than compared before moves nothing.
            if advancing && mark.is_none_or(|mark| covered_ms > mark) {
                self.set_cursor_mark(&cursor, covered_ms).await?;
                mark = Some(covered_ms);
            }
            // A report that ended early (more lines than one request brings, or a day not made
            // yet) is asked for again from where it ended; one that moved nothing ends the sweep's
            // comparison.
            if covered_ms <= from_ms {
                return Ok(());
            }
            ended_early = covered_ms < until_ms;
            from_ms = covered_ms;
        }
        Ok(())
    }

    /// Compares the report of `[from_ms, until_ms)` as far as the provider made it; `None` when
    /// the provider gave no report. Asked `after_early_end` (the rest of a report that ended
    /// early), a provider that has none is not an error: it has made its report only that far.
    async fn compare_slice(
        &self,
        configured: &crate::providers::ConfiguredProvider,
        provider: &ProviderName,
        (from_ms, until_ms): (i64, i64),
        after_early_end: bool,
        summary: &mut SweepSummary,
    ) -> Result<Option<Compared>, ReconcileError> {
        let report = match configured
            .adapter
            .settlement_report(millis(from_ms), millis(until_ms))
            .await
        {
            Ok(report) => report,
            Err(error) if after_early_end => {
                tracing::debug!(%provider, %error, "no more of the settlement report yet");
                return Ok(None);
            }
            Err(error) => {
                summary.provider_errors += 1;
                tracing::warn!(%provider, %error, "settlement report unavailable; next sweep asks again");
                return Ok(None);
            }
        };
        // The provider may have made the report only part of the way (a daily file not there
        // yet): the window is compared as far as it covers.
        let covered_ms = report.to.timestamp_millis().clamp(from_ms, until_ms);
        // The slice is done only when every line was handled; otherwise the next sweep asks for
        // it again (comparing a line twice is harmless).
        let mut complete = true;
        for line in &report.data {
            summary.report_lines += 1;
            match self.compare_line(provider, line, summary).await {
                Ok(true) => {}
                Ok(false) => complete = false,
                Err(error) => {
                    complete = false;
                    summary.errors += 1;
                    tracing::error!(%provider, charge = %line.charge_id, %error, "report line not compared");
                }
            }
        }
        let lines = report.data.len();
        drop(report);
        let payouts = self
            .post_payouts(provider, millis(from_ms), millis(covered_ms), summary)
            .await;
        Ok(Some(Compared {
            covered_ms,
            whole: complete && payouts,
            lines,
        }))
    }

    /// `Ok(false)` when the line must be looked at again (payment lease busy).
    async fn compare_line(
        &self,
        provider: &ProviderName,
        line: &ReportLine,
        summary: &mut SweepSummary,
    ) -> Result<bool, ReconcileError> {
        let payment = line
            .reference
            .as_deref()
            .and_then(|reference| PaymentId::parse(reference).ok())
            .or_else(|| payment_of_key(&line.idempotency_key));
        let loaded = match payment {
            Some(id) => Some(log::load_payment(self.flow.store.as_ref(), id).await?),
            None => None,
        };
        let record = loaded.and_then(|loaded| loaded.aggregate.record);
        if !self
            .flow
            .answers_for(payment, record.as_ref().map(|record| &record.tenant))
        {
            // Another tenant cell's payment: that cell's reconciler compares the line.
            return Ok(true);
        }
        if record
            .as_ref()
            .is_some_and(|record| self.flow.paused().contains(&record.tenant))
        {
            // Its tenant is moving to another cell: compared once it is not paused, there.
            return Ok(false);
        }
        let record = record.filter(|record| &record.provider == provider);
        let Some(record) = record else {
            let recorded = ExceptionRecorded {
                exception_id: ExceptionId::derived(
                    provider,
                    &line.charge_id,
                    ExceptionKind::UnknownCharge,
                    "",
                ),
                tenant: None,
                payment_id: None,
                provider: provider.clone(),
                charge_id: Some(line.charge_id.clone()),
                kind: ExceptionKind::UnknownCharge,
                local: Value::Null,
                provider_state: line_state(line),
                difference: json!({"local": "no such payment"}),
                resolution: Resolution::Manual,
                at: self.flow.clock.now(),
            };
            if exceptions::record(&self.flow.database, self.flow.store.as_ref(), recorded).await? {
                summary.exception(ExceptionKind::UnknownCharge, Resolution::Manual);
                tracing::error!(%provider, charge = %line.charge_id, "a charge at the provider names no payment of ours");
            }
            return Ok(true);
        };
        let id = record.id;
        let now_ms = self.flow.clock.now_ms();
        let Some(lease) =
            leases::acquire(self.database(), id, now_ms, self.config.payment_lease_ms).await?
        else {
            summary.busy += 1;
            return Ok(false);
        };
        let result = self.apply_line(&record, line, summary).await;
        if let Err(error) = leases::release(self.database(), &lease).await {
            tracing::warn!(payment = %id, %error, "payment lease not released; it runs out");
        }
        result.map(|()| true)
    }

    /// Brings the payment to what the line says. A line can differ from it in several ways at
    /// once (a refund made in the provider's dashboard and a dispute, say), and a verdict
    /// applies one of them: the payment is compared with the line again after each, until it
    /// agrees or is left to a person, at most [`LINE_VERDICTS_MAX`] times, never applying the
    /// same verdict twice.
    async fn apply_line(
        &self,
        stale: &PaymentRecord,
        line: &ReportLine,
        summary: &mut SweepSummary,
    ) -> Result<(), ReconcileError> {
        let mut applied = Vec::new();
        for _ in 0..LINE_VERDICTS_MAX {
            match self.apply_verdict(stale.id, line, summary).await? {
                Some(verdict) if !applied.contains(&verdict) => applied.push(verdict),
                _ => return Ok(()),
            }
        }
        Ok(())
    }

    /// Applies the verdict on the payment as it is now: `Some((kind, fingerprint))` when it
    /// applied facts, `None` when the payment agrees with the line or is flagged for a person.
    async fn apply_verdict(
        &self,
        id: PaymentId,
        line: &ReportLine,
        summary: &mut SweepSummary,
    ) -> Result<Option<(ExceptionKind, String)>, ReconcileError> {
        // Under the lease now: decide on the payment as it is, not as it was before the lease.
        let loaded = log::load_payment(self.flow.store.as_ref(), id).await?;
        let Some(record) = loaded.aggregate.record else {
            return Ok(None);
        };
        let finding = |kind, fingerprint| Finding {
            kind,
            fingerprint,
            charge_id: line.charge_id.clone(),
            local: local_state(&record),
            provider: line_state(line),
        };
        // What the report decides of our refunds comes first: the totals may agree only once
        // they are applied, or disagree until then.
        let decided = self.refunds_decided_by_report(&record, line);
        let verdict = if decided.is_empty() {
            match classify(&record, line) {
                Verdict::Manual { kind, fingerprint } if fingerprint.starts_with("refunded:") => {
                    self.reversed_refunds(&record, kind, fingerprint).await
                }
                verdict => verdict,
            }
        } else {
            decided_refunds(decided)
        };
        match verdict {
            Verdict::Agree => Ok(None),
            Verdict::Manual { kind, fingerprint } => self
                .flag(&record, finding(kind, fingerprint), summary)
                .await
                .map(|()| None),
            Verdict::Auto {
                kind,
                facts,
                fingerprint,
            } => {
                let applied = (kind, fingerprint.clone());
                let recorded = finding(kind, fingerprint).recorded(
                    &record,
                    Resolution::Auto,
                    self.flow.clock.now(),
                );
                let mut facts = facts.into_iter();
                let Some(first) = facts.next() else {
                    return Ok(None);
                };
                if exceptions::exists(self.flow.store.as_ref(), recorded.exception_id).await? {
                    // Recorded by an earlier sweep together with its fix; apply what is left
                    // (nothing, unless a later fact raced it) without a second exception.
                    self.flow
                        .finalize(Finalize::facts(record.id, Some(first)))
                        .await?;
                } else {
                    let also = RecordWithFix {
                        store: self.flow.store.clone(),
                        recorded,
                        flags_before: record.flags.len(),
                        outcome: std::sync::Mutex::new(None),
                    };
                    self.flow
                        .finalize(Finalize::facts(record.id, Some(first)).also(&also))
                        .await?;
                    let outcome = also.outcome.lock().ok().and_then(|outcome| *outcome);
                    if let Some(resolution) = outcome {
                        summary.exception(kind, resolution);
                        if resolution == Resolution::Manual {
                            summary.flagged += 1;
                            tracing::error!(payment = %record.id, %kind, "report fact contradicted the payment; flagged for review");
                            metrics::counter!("asiento_reconciliation_flagged_total", "kind" => kind.as_str()).increment(1);
                        }
                    }
                }
                for fact in facts {
                    self.flow
                        .finalize(Finalize::facts(record.id, Some(fact)))
                        .await?;
                }
                Ok(Some(applied))
            }
        }
    }
}

/// A slice of a report window, compared.
struct Compared {
    /// Where the provider's report of it ended (before the slice's end where it made the report
    /// only that far).
    covered_ms: i64,
    /// Every line and payout of it was handled.
    whole: bool,
    lines: usize,
}

/// The next slice of a report window after one of `slice_ms` that held `lines` lines: half as
/// long past `target` lines, twice as long under half of them (a quiet window, or a first one a
/// day long, takes few requests), else the same; never shorter than a second nor than `first`
/// divided by 1,024.
fn next_slice_ms(slice_ms: i64, lines: usize, target: usize, first: i64) -> i64 {
    let shortest = (first / 1_024).max(1_000).min(first);
    if lines > target {
        (slice_ms / 2).max(shortest)
    } else if lines.saturating_mul(2) < target {
        slice_ms.saturating_mul(2)
    } else {
        slice_ms
    }
}

/// How many verdicts one report line may apply to its payment in a sweep: each brings one kind
/// of difference (refunds, a dispute, fees, movements) in line.
const LINE_VERDICTS_MAX: usize = 4;

/// The refunds a report decided, as one auto exception: a reversal among them is
/// `refund_reversed_at_provider`; else they are refunds of ours whose notification was lost,
/// found refunded by the report (`refunded_out_of_band`: the kind of a refund the report shows
/// and we did not know of, here its outcome).
fn decided_refunds(facts: Vec<ProviderFact>) -> Verdict {
    use asiento_domain::OperationOutcome;
    let mut fingerprint = Vec::new();
    let mut reversal = false;
    for fact in &facts {
        if let ProviderFact::Operation {
            psp_key, outcome, ..
        } = fact
        {
            let failed = matches!(
                outcome,
                OperationOutcome::Failed { .. } | OperationOutcome::Reversed { .. }
            );
            reversal |= failed;
            fingerprint.push(format!(
                "{psp_key}:{}",
                if failed { "reversed" } else { "refunded" }
            ));
        }
    }
    let kind = if reversal {
        ExceptionKind::RefundReversedAtProvider
    } else {
        ExceptionKind::RefundedOutOfBand
    };
    Verdict::Auto {
        kind,
        facts,
        fingerprint: fingerprint.join(","),
    }
}

impl Reconciler {
    /// Where the provider can look nothing up, what the report line's movements decide of our
    /// refunds ([`movements::refund_outcomes`]); nothing elsewhere, where a read decides.
    fn refunds_decided_by_report(
        &self,
        record: &PaymentRecord,
        line: &ReportLine,
    ) -> Vec<ProviderFact> {
        let Some(provider) = self.flow.providers.get(&record.provider) else {
            return Vec::new();
        };
        let capabilities = provider.adapter.capabilities();
        let same_charge =
            line.currency == record.currency.code() && line.amount_minor == record.amount.minor();
        if capabilities.lookup_by_id || capabilities.lookup_by_key || !same_charge {
            return Vec::new();
        }
        movements::refund_outcomes(record, line)
    }

    /// The report shows less refunded than we do: a refund of ours that settled may have failed
    /// at the provider since, its webhook lost. Where the provider can look operations up, each
    /// of our settled refunds is read again; those it now reports failed are reversed (an auto
    /// exception). Otherwise, or when none did, the difference stays for a person.
    async fn reversed_refunds(
        &self,
        record: &PaymentRecord,
        kind: ExceptionKind,
        fingerprint: String,
    ) -> Verdict {
        let manual = Verdict::Manual { kind, fingerprint };
        let Some(provider) = self.flow.providers.get(&record.provider) else {
            return manual;
        };
        let capabilities = provider.adapter.capabilities();
        let mut reversed = Vec::new();
        let settled = record.operations.iter().filter(|op| {
            op.kind == asiento_domain::OperationKind::Refund
                && op.state == asiento_domain::OperationState::Succeeded
        });
        for op in settled {
            let found = match &op.provider_id {
                Some(id) if capabilities.lookup_by_id => provider.adapter.get_operation(id).await,
                _ if capabilities.lookup_by_key => {
                    provider.adapter.find_operation_by_key(&op.psp_key).await
                }
                _ => continue,
            };
            let Ok(Some(found)) = found else {
                continue;
            };
            if found.status == asiento_psp::OperationStatus::Failed
                && facts::operation_misfit(record, &op.psp_key, &found).is_none()
            {
                reversed.push(facts::operation_fact(&found, None));
            }
        }
        if reversed.is_empty() {
            return manual;
        }
        let keys: Vec<String> = reversed
            .iter()
            .filter_map(|fact| match fact {
                ProviderFact::Operation { psp_key, .. } => Some(psp_key.clone()),
                _ => None,
            })
            .collect();
        Verdict::Auto {
            kind: ExceptionKind::RefundReversedAtProvider,
            facts: reversed,
            fingerprint: keys.join(","),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_report_slice_shrinks_past_its_target_and_grows_under_half_of_it() {
        let first = 10_000;
        // (slice, lines) -> next slice, for a target of 2,000 lines.
        let cases = [
            (10_000, 0, 20_000),
            (10_000, 999, 20_000),
            (10_000, 1_000, 10_000),
            (10_000, 2_000, 10_000),
            (10_000, 2_001, 5_000),
            (1_000, 50_000, 1_000),
            (i64::MAX, 0, i64::MAX),
        ];
        for (slice, lines, next) in cases {
            assert_eq!(
                next_slice_ms(slice, lines, 2_000, first),
                next,
                "{slice} ms, {lines} lines"
            );
        }
        // A first slice under a second is the shortest.
        assert_eq!(next_slice_ms(500, 9_999, 2_000, 500), 500);
    }
    use asiento_domain::{CaptureMode, Currency, CustomerId, TenantId};
    use uuid::Uuid;

    fn record(status: PaymentStatus, captured: i64, refunded: i64) -> PaymentRecord {
        let at = Utc::now();
        PaymentRecord {
            id: PaymentId::from_uuid(Uuid::from_u128(1)),
            tenant: TenantId::parse("acme").unwrap(),
            amount: Amount::new(10_000),
            currency: Currency::parse("USD").unwrap(),
            customer: CustomerId::parse("42").unwrap(),
            provider: ProviderName::parse("sim").unwrap(),
            capture_mode: CaptureMode::Automatic,
            description: None,
            metadata: serde_json::Map::new(),
            psp_key: "psp_00000000000000000000000000000001".into(),
            payment_method: None,
            provider_charge_id: Some("ch_1".into()),
            status,
            authorized: Amount::new(10_000),
            authorization_ended: None,
            authorization_held: Amount::ZERO,
            captured: Amount::new(captured),
            fee: Amount::ZERO,
            fee_schedule: None,
            operations: Vec::new(),
            operations_refunded: Amount::ZERO,
            refunded: Amount::new(refunded),
            refund_reversed: Amount::ZERO,
            fee_reversed: Amount::ZERO,
            provider_fees: Vec::new(),
            next_action: None,
            failure_reason: None,
            dispute: None,
            flags: Vec::new(),
            created_at: at,
            updated_at: at,
        }
    }

    fn line(status: ChargeStatus, amount: i64, captured: i64, refunded: i64) -> ReportLine {
        ReportLine {
            charge_id: "ch_1".into(),
            status,
            amount_minor: amount,
            amount_captured: captured,
            amount_refunded: refunded,
            provider_fees: Vec::new(),
            currency: "USD".into(),
            reference: None,
            idempotency_key: "psp_00000000000000000000000000000001".into(),
            dispute_status: None,
            dispute: None,
            movements: Vec::new(),
            last_touched: Utc::now(),
        }
    }

    /// (local status, captured, refunded), (provider status, amount, captured, refunded) →
    /// expected kind (None: agree) and whether the sweep may fix it.
    #[test]
    fn report_lines_are_classified_as_the_docs_table_says() {
        use ChargeStatus as P;
        use ExceptionKind as K;
        use PaymentStatus as L;
        type Local = (L, i64, i64);
        type Provider = (P, i64, i64, i64);
        type Expected = Option<(K, bool)>;
        let table: &[(Local, Provider, Expected)] = &[
            (
                (L::Captured, 10_000, 0),
                (P::Succeeded, 10_000, 10_000, 0),
                None,
            ),
            (
                (L::Pending, 0, 0),
                (P::Succeeded, 10_000, 10_000, 0),
                Some((K::CapturedAtProvider, true)),
            ),
            (
                (L::Authorized, 0, 0),
                (P::Succeeded, 10_000, 10_000, 0),
                Some((K::CapturedAtProvider, true)),
            ),
            (
                (L::Pending, 0, 0),
                (P::RequiresCapture, 10_000, 0, 0),
                Some((K::AuthorizedAtProvider, true)),
            ),
            (
                (L::Captured, 10_000, 0),
                (P::Succeeded, 10_000, 10_000, 2_500),
                Some((K::RefundedOutOfBand, true)),
            ),
            (
                (L::PartiallyRefunded, 10_000, 2_500),
                (P::Succeeded, 10_000, 10_000, 2_500),
                None,
            ),
            (
                (L::Pending, 0, 0),
                (P::Failed, 10_000, 0, 0),
                Some((K::FailedAtProvider, true)),
            ),
            (
                (L::RequiresAction, 0, 0),
                (P::Failed, 10_000, 0, 0),
                Some((K::FailedAtProvider, true)),
            ),
            ((L::Expired, 0, 0), (P::Failed, 10_000, 0, 0), None),
            ((L::Pending, 0, 0), (P::RequiresAction, 10_000, 0, 0), None),
            (
                (L::Captured, 10_000, 0),
                (P::Succeeded, 9_999, 9_999, 0),
                Some((K::AmountMismatch, false)),
            ),
            (
                (L::Captured, 10_000, 0),
                (P::Succeeded, 10_000, 9_000, 0),
                Some((K::AmountMismatch, false)),
            ),
            (
                (L::Captured, 10_000, 0),
                (P::Failed, 10_000, 0, 0),
                Some((K::CapturedHereFailedAtProvider, false)),
            ),
            (
                (L::Failed, 0, 0),
                (P::Succeeded, 10_000, 10_000, 0),
                Some((K::Ambiguous, false)),
            ),
            (
                (L::Refunded, 10_000, 10_000),
                (P::Succeeded, 10_000, 10_000, 5_000),
                Some((K::Ambiguous, false)),
            ),
            (
                (L::Captured, 10_000, 0),
                (P::RequiresCapture, 10_000, 0, 0),
                Some((K::Ambiguous, false)),
            ),
        ];
        for ((status, captured, refunded), (p, amount, p_captured, p_refunded), expected) in table {
            let verdict = classify(
                &record(*status, *captured, *refunded),
                &line(*p, *amount, *p_captured, *p_refunded),
            );
            let got = match &verdict {
                Verdict::Agree => None,
                Verdict::Auto { kind, .. } => Some((*kind, true)),
                Verdict::Manual { kind, .. } => Some((*kind, false)),
            };
            assert_eq!(&got, expected, "{status:?} vs {p:?}: {verdict:?}");
            if let Some((kind, auto)) = got {
                assert_eq!(kind.is_auto_fixable(), auto, "{kind}");
            }
        }
        let mut other = line(P::Succeeded, 10_000, 10_000, 0);
        other.currency = "EUR".into();
        assert!(matches!(
            classify(&record(L::Captured, 10_000, 0), &other),
            Verdict::Manual {
                kind: K::CurrencyMismatch,
                ..
            }
        ));
    }

    /// A dispute in the report that we never heard of (or its close) is applied; one we know,
    /// with the same outcome, agrees.
    #[test]
    fn disputes_in_the_report_are_compared_with_ours() {
        use asiento_domain::payment::{Dispute as OurDispute, DisputeOutcome};
        use asiento_psp::{Dispute, DisputeStatus};
        let created = Utc::now();
        let with_dispute = |status: DisputeStatus| ReportLine {
            dispute_status: Some(status),
            dispute: Some(Dispute {
                status,
                amount_minor: 10_000,
                created,
                closed: None,
                id: None,
                reinstated: false,
            }),
            ..line(ChargeStatus::Succeeded, 10_000, 10_000, 0)
        };
        let dispute_id = format!("dp_ch_1_{}", created.timestamp_millis());
        let fixed = |verdict: Verdict| match verdict {
            Verdict::Auto { kind, facts, .. } => Some((kind, facts.len())),
            _ => None,
        };
        let ours = record(PaymentStatus::Captured, 10_000, 0);
        assert_eq!(
            fixed(classify(&ours, &with_dispute(DisputeStatus::Lost))),
            Some((ExceptionKind::DisputedAtProvider, 1)),
            "a lost dispute we never heard of"
        );
        assert_eq!(
            fixed(classify(&ours, &with_dispute(DisputeStatus::Open))),
            Some((ExceptionKind::DisputedAtProvider, 1))
        );
        let mut open_here = record(PaymentStatus::Disputed, 10_000, 0);
        open_here.dispute = Some(OurDispute {
            id: dispute_id.clone(),
            amount: Amount::new(10_000),
            outcome: None,
            status_before: PaymentStatus::Captured,
            withdrawn: true,
            reinstated: false,
        });
        assert_eq!(
            classify(&open_here, &with_dispute(DisputeStatus::Open)),
            Verdict::Agree
        );
        assert_eq!(
            fixed(classify(&open_here, &with_dispute(DisputeStatus::Won))),
            Some((ExceptionKind::DisputedAtProvider, 1)),
            "closed there, open here"
        );
        let mut lost_here = open_here.clone();
        if let Some(dispute) = lost_here.dispute.as_mut() {
            dispute.outcome = Some(DisputeOutcome::Lost);
        }
        assert_eq!(
            classify(&lost_here, &with_dispute(DisputeStatus::Lost)),
            Verdict::Agree
        );
        assert_eq!(
            classify(&ours, &line(ChargeStatus::Succeeded, 10_000, 10_000, 0)),
            Verdict::Agree
        );
    }

    /// A dispute whose outcome we know is compared by that outcome: one won here and lost again
    /// there (a second chargeback whose notifications were lost), or lost here and won there, is
    /// not agreeing, and the report's stage is applied; a report behind ours agrees.
    #[test]
    fn a_known_outcome_that_differs_from_the_report_s_is_not_agreeing() {
        use asiento_domain::payment::{Dispute as OurDispute, DisputeOutcome, DisputeStage};
        use asiento_psp::{Dispute, DisputeStatus};
        let created = Utc::now();
        let reported = |status: DisputeStatus, reinstated: bool| ReportLine {
            dispute_status: Some(status),
            dispute: Some(Dispute {
                status,
                amount_minor: 10_000,
                created,
                closed: Some(created),
                id: Some("DISPUTE000000001".into()),
                reinstated,
            }),
            ..line(ChargeStatus::Succeeded, 10_000, 10_000, 0)
        };
        let ours = |outcome: DisputeOutcome, reinstated: bool| {
            let mut record = record(PaymentStatus::Captured, 10_000, 0);
            if outcome == DisputeOutcome::Lost {
                record.status = PaymentStatus::Disputed;
            }
            record.dispute = Some(OurDispute {
                id: "dp_ch_1_DISPUTE000000001".into(),
                amount: Amount::new(10_000),
                outcome: Some(outcome),
                status_before: PaymentStatus::Captured,
                withdrawn: true,
                reinstated,
            });
            record
        };
        let told = |verdict: Verdict| match verdict {
            Verdict::Auto {
                kind,
                facts,
                fingerprint,
            } => {
                assert_eq!(kind, ExceptionKind::DisputedAtProvider);
                let [fact] = facts.as_slice() else {
                    panic!("one fact: {facts:?}")
                };
                let (_, stage) = fact.dispute_stage().expect("a dispute fact");
                Some((stage, fingerprint))
            }
            Verdict::Agree => None,
            other => panic!("{other:?}"),
        };
        let won_here = ours(DisputeOutcome::Won, true);
        assert_eq!(
            told(classify(&won_here, &reported(DisputeStatus::Lost, true))),
            Some((
                DisputeStage::LostAgain,
                "dp_ch_1_DISPUTE000000001:lost_again".to_owned()
            )),
            "won here, lost again there"
        );
        let lost_here = ours(DisputeOutcome::Lost, false);
        assert_eq!(
            told(classify(&lost_here, &reported(DisputeStatus::Won, false))),
            Some((DisputeStage::Won, "dp_ch_1_DISPUTE000000001:won".to_owned())),
            "lost here, reversed there"
        );
        // The same stage on both sides agrees; a report behind ours waits for a later window.
        for (here, there) in [
            (won_here.clone(), reported(DisputeStatus::Won, false)),
            (lost_here.clone(), reported(DisputeStatus::Lost, false)),
            (won_here, reported(DisputeStatus::Lost, false)),
            (
                ours(DisputeOutcome::Lost, true),
                reported(DisputeStatus::Won, false),
            ),
            (
                ours(DisputeOutcome::Lost, true),
                reported(DisputeStatus::Lost, true),
            ),
        ] {
            assert_eq!(told(classify(&here, &there)), None, "{:?}", here.dispute);
        }
    }

    #[test]
    fn provider_fees_in_the_report_are_compared_with_ours() {
        use asiento_domain::payment::ProviderFee as OurFee;
        use asiento_psp::ProviderFee;
        let with_fees = |fees: &[(&str, i64)]| ReportLine {
            provider_fees: fees
                .iter()
                .map(|(txn, fee)| ProviderFee {
                    transaction_id: (*txn).to_owned(),
                    fee_minor: *fee,
                })
                .collect(),
            ..line(ChargeStatus::Succeeded, 10_000, 10_000, 0)
        };
        let mut ours = record(PaymentStatus::Captured, 10_000, 0);
        assert_eq!(
            classify(&ours, &with_fees(&[("txn_1", 0)])),
            Verdict::Agree,
            "a zero fee posts nothing"
        );
        assert_eq!(
            classify(&ours, &with_fees(&[("txn_1", 320)])),
            Verdict::Auto {
                kind: ExceptionKind::ProviderFeeUnposted,
                facts: vec![ProviderFact::ProviderFeeCharged {
                    charge_id: "ch_1".into(),
                    transaction_id: "txn_1".into(),
                    fee: Amount::new(320),
                }],
                fingerprint: "txn_1".into(),
            },
            "a fee we never heard of is posted"
        );
        ours.provider_fees.push(OurFee {
            transaction_id: "txn_1".into(),
            fee: Amount::new(320),
        });
        assert_eq!(
            classify(&ours, &with_fees(&[("txn_1", 320)])),
            Verdict::Agree
        );
        assert!(matches!(
            classify(&ours, &with_fees(&[("txn_1", 320), ("txn_2", 1_500)])),
            Verdict::Auto { kind: ExceptionKind::ProviderFeeUnposted, facts, .. } if facts.len() == 1
        ));
        assert_eq!(
            classify(&ours, &with_fees(&[("txn_1", 300)])),
            Verdict::Manual {
                kind: ExceptionKind::ProviderFeeMismatch,
                fingerprint: "txn_1:300".into(),
            }
        );
        // Captured there, pending here: the capture and its fee are applied together.
        let pending = record(PaymentStatus::Pending, 0, 0);
        assert!(matches!(
            classify(&pending, &with_fees(&[("txn_1", 320)])),
            Verdict::Auto { kind: ExceptionKind::CapturedAtProvider, facts, .. }
                if matches!(facts.last(), Some(ProviderFact::ProviderFeeCharged { .. }))
        ));
    }

    /// Where nothing can be looked up, the report's refund rows, named by the refund, decide our
    /// refunds: one held open that the report shows refunded succeeded, and one it shows
    /// reversed failed after it succeeded; a row of another amount or another refund decides
    /// nothing.
    #[test]
    fn refund_rows_decide_the_refunds_they_name() {
        use asiento_domain::{Operation, OperationKind, OperationOutcome, OperationState};
        use asiento_psp::{Movement, MovementKind};
        let moved = |kind, amount: i64, source: &str| Movement {
            id: format!("{source}:{kind:?}"),
            kind,
            amount_minor: amount,
            fee_minor: 0,
            net_minor: amount,
            source: source.to_owned(),
        };
        let with = |movements: Vec<Movement>| ReportLine {
            movements,
            ..line(ChargeStatus::Succeeded, 10_000, 10_000, 0)
        };
        let ours = |state| {
            let mut ours = record(PaymentStatus::Captured, 10_000, 0);
            let mut refund = Operation::requested(
                OperationKind::Refund,
                1,
                Amount::new(2_500),
                "psp_refund_1",
                Utc::now(),
            );
            refund.state = state;
            refund.provider_id = Some("REFUND1".into());
            ours.operations.push(refund);
            ours
        };
        let outcomes = |record: &PaymentRecord, line: &ReportLine| -> Vec<String> {
            movements::refund_outcomes(record, line)
                .into_iter()
                .map(|fact| match fact {
                    ProviderFact::Operation {
                        psp_key, outcome, ..
                    } => match outcome {
                        OperationOutcome::Succeeded => format!("{psp_key}:succeeded"),
                        OperationOutcome::Failed { .. } => format!("{psp_key}:failed"),
                        OperationOutcome::Reversed { .. } => format!("{psp_key}:reversed"),
                        OperationOutcome::Pending => format!("{psp_key}:pending"),
                    },
                    other => panic!("{other:?}"),
                })
                .collect()
        };
        let refunded = moved(MovementKind::Refund, -2_500, "REFUND1");
        let reversed = moved(MovementKind::RefundFailure, 2_500, "REFUND1");
        let both = with(vec![refunded.clone(), reversed.clone()]);
        let pending = ours(OperationState::Pending);
        assert_eq!(
            outcomes(&pending, &with(vec![refunded.clone()])),
            ["psp_refund_1:succeeded"]
        );
        assert_eq!(
            outcomes(&pending, &both),
            ["psp_refund_1:succeeded", "psp_refund_1:failed"]
        );
        assert_eq!(
            outcomes(&ours(OperationState::Succeeded), &both),
            ["psp_refund_1:failed"]
        );
        assert!(outcomes(&ours(OperationState::Reversed), &both).is_empty());
        assert!(outcomes(&ours(OperationState::Succeeded), &with(vec![refunded])).is_empty());
        let other_amount = with(vec![moved(MovementKind::Refund, -2_000, "REFUND1")]);
        assert!(outcomes(&pending, &other_amount).is_empty());
        let other_refund = with(vec![moved(MovementKind::Refund, -2_500, "REFUND2")]);
        assert!(outcomes(&pending, &other_refund).is_empty());
        assert_eq!(
            decided_refunds(movements::refund_outcomes(&pending, &both)),
            Verdict::Auto {
                kind: ExceptionKind::RefundReversedAtProvider,
                facts: movements::refund_outcomes(&pending, &both),
                fingerprint: "psp_refund_1:refunded,psp_refund_1:reversed".into(),
            }
        );
    }

    /// Each balance transaction of the window against what we posted for it, once the totals
    /// agree: a capture's gross, a refund and its failure by the refund they stem from, a
    /// dispute's withdrawal and reinstatement, every net.
    #[test]
    fn balance_transactions_in_the_report_are_compared_one_by_one() {
        use asiento_domain::payment::{Dispute as OurDispute, DisputeOutcome};
        use asiento_domain::{Operation, OperationKind, OperationState};
        use asiento_psp::{Movement, MovementKind};
        let moved = |kind, amount: i64, fee: i64, net: i64, source: &str| Movement {
            id: format!("txn_{source}"),
            kind,
            amount_minor: amount,
            fee_minor: fee,
            net_minor: net,
            source: source.to_owned(),
        };
        let with = |captured: i64, refunded: i64, movements: Vec<Movement>| ReportLine {
            movements,
            ..line(ChargeStatus::Succeeded, 10_000, captured, refunded)
        };
        let mismatch = |fingerprint: &str| Verdict::Manual {
            kind: ExceptionKind::BalanceTransactionMismatch,
            fingerprint: fingerprint.to_owned(),
        };
        let charge = moved(MovementKind::Charge, 10_000, 320, 9_680, "ch_1");
        let mut ours = record(PaymentStatus::PartiallyRefunded, 10_000, 2_500);
        let mut refund = Operation::requested(
            OperationKind::Refund,
            1,
            Amount::new(2_500),
            "psp_refund_1",
            Utc::now(),
        );
        refund.state = OperationState::Succeeded;
        refund.provider_id = Some("re_1".into());
        ours.operations.push(refund);
        let refunded = moved(MovementKind::Refund, -2_500, 0, -2_500, "re_1");
        assert_eq!(
            classify(
                &ours,
                &with(10_000, 2_500, vec![charge.clone(), refunded.clone()])
            ),
            Verdict::Agree
        );
        // A refund made in the dashboard has no operation of ours: the total covers it.
        let dashboard = moved(MovementKind::Refund, -100, 0, -100, "re_dash");
        assert_eq!(
            classify(&ours, &with(10_000, 2_500, vec![dashboard])),
            Verdict::Agree
        );
        let wrong_net = moved(MovementKind::Charge, 10_000, 320, 9_700, "ch_1");
        assert_eq!(
            classify(&ours, &with(10_000, 2_500, vec![wrong_net])),
            mismatch("txn_ch_1:net")
        );
        let other_gross = moved(MovementKind::Charge, 9_000, 290, 8_710, "ch_1");
        assert_eq!(
            classify(&ours, &with(10_000, 2_500, vec![other_gross])),
            mismatch("txn_ch_1:captured")
        );
        let other_refund = moved(MovementKind::Refund, -2_000, 0, -2_000, "re_1");
        assert_eq!(
            classify(&ours, &with(10_000, 2_500, vec![other_refund])),
            mismatch("txn_re_1:refund_amount")
        );
        let failure = moved(MovementKind::RefundFailure, 2_500, 0, 2_500, "re_1");
        assert_eq!(
            classify(&ours, &with(10_000, 2_500, vec![refunded, failure])),
            mismatch("txn_re_1:refund_state"),
            "a failure of a refund that stands here"
        );

        let mut disputed = record(PaymentStatus::Disputed, 10_000, 0);
        disputed.dispute = Some(OurDispute {
            id: "dp_1".into(),
            amount: Amount::new(10_000),
            outcome: None,
            status_before: PaymentStatus::Captured,
            withdrawn: true,
            reinstated: false,
        });
        let withdrawal = moved(
            MovementKind::DisputeWithdrawal,
            -10_000,
            1_500,
            -11_500,
            "dp_1",
        );
        assert_eq!(
            classify(&disputed, &with(10_000, 0, vec![withdrawal.clone()])),
            Verdict::Agree
        );
        let reinstated = moved(
            MovementKind::DisputeReinstatement,
            10_000,
            0,
            10_000,
            "dp_1",
        );
        assert_eq!(
            classify(
                &disputed,
                &with(10_000, 0, vec![withdrawal.clone(), reinstated.clone()])
            ),
            mismatch("txn_dp_1:dispute_reinstatement"),
            "reinstated there, still open here"
        );
        if let Some(dispute) = disputed.dispute.as_mut() {
            dispute.outcome = Some(DisputeOutcome::Won);
            dispute.reinstated = true;
        }
        disputed.status = PaymentStatus::Captured;
        assert_eq!(
            classify(&disputed, &with(10_000, 0, vec![withdrawal, reinstated])),
            Verdict::Agree
        );
        let half = moved(
            MovementKind::DisputeWithdrawal,
            -5_000,
            1_500,
            -6_500,
            "dp_1",
        );
        assert_eq!(
            classify(&disputed, &with(10_000, 0, vec![half])),
            mismatch("txn_dp_1:dispute_withdrawal")
        );
    }

    #[test]
    fn psp_keys_name_their_payment() {
        let pay = PaymentId::from_uuid(Uuid::from_u128(9));
        assert_eq!(
            payment_of_key(&asiento_domain::psp_charge_key(pay)),
            Some(pay)
        );
        assert_eq!(payment_of_key("psp_x"), None);
    }
}
