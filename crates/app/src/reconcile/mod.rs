//! The reconciler: converges the ledger to the providers' truth when the synchronous answer and
//! the webhooks did not (a timeout, a dropped webhook, a crash, a refund made in the provider's
//! dashboard). One sweep ([`Reconciler::sweep_once`]) does four things, in this order:
//!
//! 1. **Stale payments.** Payments still `pending` or `requires_action` after `pending_timeout`
//!    are looked up at their provider (by charge id, or by the PSP key derived from the payment
//!    id). Found: the charge's state goes through [`PaymentFlow::finalize`], the one path of
//!    every provider fact. Not found by key: the provider never got the charge, and the payment
//!    expires (`PaymentExpired`). A charge that fits no expected state (another amount, currency
//!    or reference; a known charge id the provider no longer has) is never guessed at: the payment
//!    is flagged for review, a manual exception is recorded, an error is logged and
//!    `asiento_reconciliation_flagged_total` counts it.
//! 2. **Stuck idempotency keys.** A request that died mid-flight leaves its key in flight past its
//!    lease. The sweep settles the key's payment as above and then resumes the request through
//!    the flow's own resume path with the stored key and body hash (so the key completes with the
//!    response the request would have given, in the transaction of its last event). A create whose
//!    payment the provider has not seen and that has not expired yet is left to the client's
//!    retry, which knows the payment method.
//! 3. **Settlement reports.** Each provider's report for `[last end - overlap, now - settle)` is
//!    compared line by line with our payments ([`classify`]). Differences the flow can apply
//!    (captured, authorized, failed or refunded at the provider while we are behind) are applied
//!    through `finalize` and recorded as `auto` exceptions, already resolved, *in the same
//!    transaction as the fix*; anything else is a `manual` exception and a review flag, and
//!    changes no balance. The comparison is idempotent (exception ids derive from the finding),
//!    so the overlap between windows is harmless and a re-run changes nothing.
//! 4. **Dead letters.** Webhooks for payments we do not know (`unknown_payment`) become manual
//!    exceptions.
//!
//! Concurrency: a sweep holds the `reconciler` job lease (one sweep at a time across processes),
//! and each payment's lease ([`crate::leases`]) while it works on it, so the webhook worker and
//! the reconciler never apply facts to one payment at once; the stream version check stays
//! underneath both. Every read through the pool happens before a transaction begins.
//!
//! The list of payments to look at is kept by the reconciler itself from the log
//! (`reconciliation_watch`, with its own cursor): the sweep depends on no read model's lag or
//! rebuild.

mod operations;

pub use operations::{
    OPERATIONS_PER_SWEEP_MAX, OPERATION_PENDING_DEADLINE_MS_DEFAULT, OPERATION_TIMEOUT_MS_DEFAULT,
};

use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::time::Duration;

use asiento_domain::exception::{ExceptionRecorded, Resolution};
use asiento_domain::{
    psp_cancel_key, Amount, ExceptionId, ExceptionKind, PaymentCommand, PaymentEvent, PaymentId,
    PaymentRecord, PaymentStatus, ProviderFact, ProviderName, TenantId,
};
use asiento_eventstore::{Database, Tx};
use asiento_psp::{Charge, ChargeStatus, ProviderError, ReportLine};
use chrono::{DateTime, TimeZone as _, Utc};
use serde_json::{json, Value};
use uuid::Uuid;

use crate::exceptions::{self, ExceptionError};
use crate::facts;
use crate::idempotency::{BodyHash, IdempotencyKey, Scope};
use crate::leases::{self, LeaseError, PAYMENT_LEASE_MS_DEFAULT};
use crate::log::{self, LogError};
use crate::payments::{FlowError, Idempotent, InTransaction, NewPayment, PaymentFlow};
use crate::reply::Answer;
use crate::watch::{self, WatchError};
use crate::webhooks::{self, DeadReason};

/// The job lease a sweep holds.
pub const RECONCILER_JOB: &str = "reconciler";
/// API.md: payments pending longer than this are reconciled.
pub const PENDING_TIMEOUT_MS_DEFAULT: i64 = 15 * 60_000;
/// API.md: how often `serve` sweeps.
pub const RECONCILE_INTERVAL_MS_DEFAULT: u64 = 60_000;
/// How far each report window reaches back over the previous one: covers clock skew between us
/// and the provider and charges touched while the previous report was being made.
pub const REPORT_OVERLAP_MS_DEFAULT: i64 = 10 * 60_000;
/// The first window of a provider (no cursor yet) starts this long ago.
pub const REPORT_LOOKBACK_MS_DEFAULT: i64 = 24 * 3_600_000;
/// A window ends this long before now, so a charge whose synchronous answer or webhook is still on
/// its way is not reported as a difference (the overlap brings it into the next window).
pub const REPORT_SETTLE_MS_DEFAULT: i64 = 60_000;
/// How long a sweep holds the job lease: above the longest sweep we expect, so a live sweep is not
/// overtaken; a crashed one delays the next by at most this.
pub const SWEEP_LEASE_MS_DEFAULT: i64 = 10 * 60_000;
/// Stale payments looked up in one sweep; the rest wait for the next.
pub const STALE_PAYMENTS_PER_SWEEP_MAX: i64 = 1_000;
/// API.md: an abandoned redirect expires after this (and is cancelled at the provider).
pub const REQUIRES_ACTION_TIMEOUT_MS_DEFAULT: i64 = 24 * 3_600_000;
/// How long a payment flagged as a misfit waits before the stale sweep looks it up again: a
/// person is on it, and every lookup would find the same misfit.
pub const MISFIT_RECHECK_MS: i64 = 3_600_000;
/// Stuck idempotency keys resumed in one sweep.
pub const STUCK_KEYS_PER_SWEEP_MAX: i64 = 500;
/// Dead letters turned into exceptions per page.
pub const DEAD_LETTERS_PER_PAGE_MAX: i64 = 500;

const DEAD_LETTERS_CURSOR: &str = "dead_letters";

#[derive(Debug, Clone)]
pub struct ReconcilerConfig {
    pub pending_timeout_ms: i64,
    pub interval_ms: u64,
    pub report_overlap_ms: i64,
    pub report_lookback_ms: i64,
    pub report_settle_ms: i64,
    pub sweep_lease_ms: i64,
    pub payment_lease_ms: i64,
    /// How long after its request a capture or refund is first driven by the sweep.
    pub operation_timeout_ms: i64,
    /// How long a received (pending) operation may wait for its decision.
    pub operation_pending_deadline_ms: i64,
    /// How long a customer may take to finish a redirect (3-D Secure) before the payment is
    /// cancelled at the provider and expires.
    pub requires_action_timeout_ms: i64,
}

impl Default for ReconcilerConfig {
    fn default() -> Self {
        ReconcilerConfig {
            pending_timeout_ms: PENDING_TIMEOUT_MS_DEFAULT,
            interval_ms: RECONCILE_INTERVAL_MS_DEFAULT,
            report_overlap_ms: REPORT_OVERLAP_MS_DEFAULT,
            report_lookback_ms: REPORT_LOOKBACK_MS_DEFAULT,
            report_settle_ms: REPORT_SETTLE_MS_DEFAULT,
            sweep_lease_ms: SWEEP_LEASE_MS_DEFAULT,
            payment_lease_ms: PAYMENT_LEASE_MS_DEFAULT,
            operation_timeout_ms: OPERATION_TIMEOUT_MS_DEFAULT,
            operation_pending_deadline_ms: OPERATION_PENDING_DEADLINE_MS_DEFAULT,
            requires_action_timeout_ms: REQUIRES_ACTION_TIMEOUT_MS_DEFAULT,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    #[error("reconciliation query failed: {0}")]
    Database(#[from] sqlx::Error),
    #[error(transparent)]
    Log(#[from] LogError),
    #[error(transparent)]
    Flow(#[from] FlowError),
    #[error(transparent)]
    Exception(#[from] ExceptionError),
    #[error(transparent)]
    Lease(#[from] LeaseError),
    #[error(transparent)]
    Watch(#[from] WatchError),
    #[error("provider {0} is not configured")]
    UnknownProvider(ProviderName),
}

impl From<asiento_eventstore::StoreError> for ReconcileError {
    fn from(error: asiento_eventstore::StoreError) -> Self {
        ReconcileError::Log(LogError::Store(error))
    }
}

/// What one sweep did. Printed by `asiento reconcile`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SweepSummary {
    /// Another process held the sweep lease: this sweep did nothing.
    pub lease_busy: bool,
    pub stale_checked: usize,
    /// Stale payments whose provider state was applied and moved them.
    pub settled: usize,
    pub expired: usize,
    /// Payments flagged for review (an answer that fits no expected state).
    pub flagged: usize,
    /// Lookups whose answer fits no expected state, flagged now or before.
    pub misfits: usize,
    /// Captures and refunds the sweep drove (looked up or sent again).
    pub operations_checked: usize,
    /// Of those, the ones that reached their outcome.
    pub operations_settled: usize,
    /// Payments skipped because another worker held their lease (next sweep).
    pub busy: usize,
    pub keys_finished: usize,
    pub keys_left: usize,
    pub report_lines: usize,
    /// New exceptions by kind and resolution.
    pub exceptions: BTreeMap<(ExceptionKind, &'static str), usize>,
    /// Provider calls that gave no answer (the next sweep asks again).
    pub provider_errors: usize,
    /// Our own failures (logged; the next sweep retries).
    pub errors: usize,
}

impl SweepSummary {
    fn exception(&mut self, kind: ExceptionKind, resolution: Resolution) {
        *self
            .exceptions
            .entry((kind, resolution.as_str()))
            .or_default() += 1;
    }

    pub fn exceptions_total(&self) -> usize {
        self.exceptions.values().sum()
    }
}

impl fmt::Display for SweepSummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.lease_busy {
            return writeln!(f, "another sweep is running (lease busy): nothing done");
        }
        writeln!(
            f,
            "stale payments: {} checked, {} settled, {} expired, {} flagged, {} busy",
            self.stale_checked, self.settled, self.expired, self.flagged, self.busy
        )?;
        writeln!(
            f,
            "provider operations: {} driven, {} settled",
            self.operations_checked, self.operations_settled
        )?;
        writeln!(
            f,
            "stuck idempotency keys: {} finished, {} left to the client's retry",
            self.keys_finished, self.keys_left
        )?;
        writeln!(f, "settlement report lines compared: {}", self.report_lines)?;
        writeln!(f, "new exceptions: {}", self.exceptions_total())?;
        for ((kind, resolution), count) in &self.exceptions {
            writeln!(f, "  {kind} ({resolution}): {count}")?;
        }
        write!(
            f,
            "provider errors: {}, errors: {}",
            self.provider_errors, self.errors
        )
    }
}

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
            S::Failed | S::Expired => Verdict::Agree,
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
                        });
                    }
                    facts.extend(
                        line.dispute
                            .as_ref()
                            .map(|dispute| facts::dispute_of(&charge_id, dispute)),
                    );
                    Verdict::Auto {
                        kind: ExceptionKind::CapturedAtProvider,
                        facts,
                        fingerprint: String::new(),
                    }
                }
                S::Failed | S::Expired => {
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
                            }],
                            fingerprint: line.amount_refunded.to_string(),
                        }
                    } else if refunded < record.refunded {
                        manual(
                            ExceptionKind::Ambiguous,
                            format!("refunded:{}", line.amount_refunded),
                        )
                    } else {
                        dispute_verdict(record, line)
                    }
                }
            }
        }
    }
}

/// Compares the report's dispute with ours: a dispute (or its close) that we never heard of is
/// applied, so a lost dispute whose webhooks were all dropped is still posted.
fn dispute_verdict(record: &PaymentRecord, line: &ReportLine) -> Verdict {
    let Some(dispute) = &line.dispute else {
        return Verdict::Agree;
    };
    let fact = facts::dispute_of(&line.charge_id, dispute);
    let (dispute_id, outcome) = match &fact {
        ProviderFact::DisputeOpened { dispute_id, .. } => (dispute_id, None),
        ProviderFact::DisputeClosed {
            dispute_id,
            outcome,
            ..
        } => (dispute_id, Some(*outcome)),
        _ => return Verdict::Agree,
    };
    let known = record.dispute.as_ref().filter(|d| &d.id == dispute_id);
    let behind = match known {
        None => true,
        Some(ours) => ours.outcome.is_none() && outcome.is_some(),
    };
    if !behind {
        return Verdict::Agree;
    }
    let status = match outcome {
        None => "open".to_owned(),
        Some(outcome) => format!("{outcome:?}").to_lowercase(),
    };
    let fingerprint = format!("{dispute_id}:{status}");
    Verdict::Auto {
        kind: ExceptionKind::DisputedAtProvider,
        facts: vec![fact],
        fingerprint,
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

fn millis(ms: i64) -> DateTime<Utc> {
    Utc.timestamp_millis_opt(ms)
        .single()
        .unwrap_or(DateTime::<Utc>::MIN_UTC)
}

fn sqlite(sql: &str) -> String {
    sql.replace('$', "?")
}

// ------------------------------------------------------------------------------- job leases

/// A held job lease (one holder per job across processes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JobLease {
    pub owner: Uuid,
    pub expires_ms: i64,
}

/// Takes `job`'s lease for `owner` if it is free, expired, or already `owner`'s (a renewal).
/// Application clock, like the payment and idempotency leases: tests move it by hand, and the
/// lease is long against any skew between hosts.
pub async fn acquire_job(
    database: &Database,
    job: &str,
    owner: Uuid,
    now_ms: i64,
    lease_ms: i64,
) -> Result<Option<JobLease>, sqlx::Error> {
    let lease = JobLease {
        owner,
        expires_ms: now_ms.saturating_add(lease_ms),
    };
    let sql = "insert into job_leases (job, owner, expires_ms) values ($1, $2, $3) \
               on conflict (job) do update set owner = excluded.owner, \
               expires_ms = excluded.expires_ms \
               where job_leases.expires_ms <= $4 or job_leases.owner = excluded.owner";
    let taken = match database {
        Database::Postgres(pool) => sqlx::query(sql)
            .bind(job)
            .bind(owner)
            .bind(lease.expires_ms)
            .bind(now_ms)
            .execute(pool)
            .await?
            .rows_affected(),
        Database::Sqlite(pool) => sqlx::query(&sqlite(sql))
            .bind(job)
            .bind(owner.to_string())
            .bind(lease.expires_ms)
            .bind(now_ms)
            .execute(pool)
            .await?
            .rows_affected(),
    };
    Ok((taken == 1).then_some(lease))
}

pub async fn release_job(database: &Database, job: &str, owner: Uuid) -> Result<(), sqlx::Error> {
    let sql = "delete from job_leases where job = $1 and owner = $2";
    match database {
        Database::Postgres(pool) => {
            sqlx::query(sql).bind(job).bind(owner).execute(pool).await?;
        }
        Database::Sqlite(pool) => {
            sqlx::query(&sqlite(sql))
                .bind(job)
                .bind(owner.to_string())
                .execute(pool)
                .await?;
        }
    }
    Ok(())
}

// ----------------------------------------------------------------------------- the reconciler

#[derive(Clone)]
pub struct Reconciler {
    pub flow: PaymentFlow,
    pub config: ReconcilerConfig,
    /// Fresh per reconciler: the job lease it holds carries it.
    pub owner: Uuid,
}

/// Records an auto exception in the transaction of the fix it describes (see
/// [`PaymentFlow::finalize_and`]); if the fact turned out to contradict the payment (the flow
/// flagged it instead of applying it), the exception is recorded as manual and open.
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
    let (payment, sequence) = match resource.split_once("/refunds/") {
        None => (resource, None),
        Some((payment, sequence)) => (payment, Some(sequence.parse::<u32>().ok()?)),
    };
    let payment = PaymentId::parse(payment).ok()?;
    match (route, sequence) {
        ("/v1/payments", None) => Some(StuckRequest::Create(payment)),
        (route, None) if route.ends_with("/capture") => Some(StuckRequest::Capture(payment)),
        (route, Some(sequence)) if route.ends_with("/refunds") => {
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
    pub fn new(flow: PaymentFlow, config: ReconcilerConfig) -> Self {
        Reconciler {
            flow,
            config,
            owner: Uuid::new_v4(),
        }
    }

    fn database(&self) -> &Database {
        &self.flow.database
    }

    /// Sweeps every `interval_ms` until `shutdown` resolves; a sweep in progress is finished
    /// first. Errors are logged and the next sweep tries again.
    pub async fn run(&self, shutdown: impl Future<Output = ()>) {
        tokio::pin!(shutdown);
        let interval = Duration::from_millis(self.config.interval_ms.max(1));
        tracing::info!(owner = %self.owner, "reconciler started");
        loop {
            match self.sweep_once().await {
                Ok(summary) if !summary.lease_busy => {
                    tracing::info!(
                        settled = summary.settled,
                        expired = summary.expired,
                        flagged = summary.flagged,
                        exceptions = summary.exceptions_total(),
                        "reconciliation sweep done"
                    );
                }
                Ok(_) => {}
                Err(error) => tracing::error!(%error, "reconciliation sweep failed"),
            }
            tokio::select! {
                () = &mut shutdown => break,
                () = tokio::time::sleep(interval) => {}
            }
        }
        tracing::info!(owner = %self.owner, "reconciler stopped");
    }

    /// One sweep of every kind, now, under the job lease.
    pub async fn sweep_once(&self) -> Result<SweepSummary, ReconcileError> {
        let now_ms = self.flow.clock.now_ms();
        let Some(_lease) = acquire_job(
            self.database(),
            RECONCILER_JOB,
            self.owner,
            now_ms,
            self.config.sweep_lease_ms,
        )
        .await?
        else {
            return Ok(SweepSummary {
                lease_busy: true,
                ..SweepSummary::default()
            });
        };
        let result = self.sweep_leased().await;
        if let Err(error) = release_job(self.database(), RECONCILER_JOB, self.owner).await {
            tracing::warn!(%error, "reconciler lease not released; it runs out by itself");
        }
        metrics::counter!("asiento_reconciliation_sweeps_total").increment(1);
        let summary = result?;
        Ok(summary)
    }

    async fn sweep_leased(&self) -> Result<SweepSummary, ReconcileError> {
        let mut summary = SweepSummary::default();
        watch::catch_up(self.database(), self.flow.store.as_ref()).await?;
        self.sweep_stale(&mut summary).await?;
        self.sweep_operations(&mut summary).await?;
        self.sweep_stuck_keys(&mut summary).await?;
        let providers: Vec<ProviderName> = self.flow.providers.names().cloned().collect();
        for provider in providers {
            if let Err(error) = self.compare_report(&provider, &mut summary).await {
                summary.errors += 1;
                tracing::error!(%provider, %error, "settlement report comparison failed");
            }
        }
        self.sweep_dead_letters(&mut summary).await?;
        Ok(summary)
    }

    // ------------------------------------------------------------------- stale payments

    /// Looks up the most overdue watched payments past the pending timeout. Each one visited
    /// is due again one sweep later (a flagged misfit only after [`MISFIT_RECHECK_MS`]), so the
    /// list rotates: rows that never resolve cannot hold back the others.
    async fn sweep_stale(&self, summary: &mut SweepSummary) -> Result<(), ReconcileError> {
        let now_ms = self.flow.clock.now_ms();
        let before = now_ms.saturating_sub(self.config.pending_timeout_ms);
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
            if let Err(error) = self.settle_with_lease(id, summary).await {
                summary.errors += 1;
                tracing::error!(payment = %id, %error, "stale payment not settled");
            }
            let next = if summary.misfits > misfits_before {
                now_ms.saturating_add(MISFIT_RECHECK_MS)
            } else {
                next_ms
            };
            // A payment that left the list meanwhile is simply not updated.
            watch::postpone_payment(self.database(), id, next).await?;
        }
        Ok(())
    }

    /// Settles one payment under its lease: looks it up at the provider and applies what it
    /// finds. `Ok(false)` when another holder has the lease.
    async fn settle_with_lease(
        &self,
        id: PaymentId,
        summary: &mut SweepSummary,
    ) -> Result<bool, ReconcileError> {
        let now_ms = self.flow.clock.now_ms();
        let Some(lease) =
            leases::acquire(self.database(), id, now_ms, self.config.payment_lease_ms).await?
        else {
            summary.busy += 1;
            return Ok(false);
        };
        let result = self.settle_stale(id, summary).await;
        if let Err(error) = leases::release(self.database(), &lease).await {
            tracing::warn!(payment = %id, %error, "payment lease not released; it runs out");
        }
        result.map(|()| true)
    }

    async fn settle_stale(
        &self,
        id: PaymentId,
        summary: &mut SweepSummary,
    ) -> Result<(), ReconcileError> {
        let loaded = log::load_payment(self.flow.store.as_ref(), id).await?;
        let Some(record) = loaded.aggregate.record else {
            return Ok(watch::unwatch_payment(self.database(), id).await?);
        };
        if !matches!(
            record.status,
            PaymentStatus::Pending | PaymentStatus::RequiresAction
        ) {
            return Ok(watch::unwatch_payment(self.database(), id).await?);
        }
        let provider = self
            .flow
            .providers
            .get(&record.provider)
            .ok_or_else(|| ReconcileError::UnknownProvider(record.provider.clone()))?;
        let lookup = match &record.provider_charge_id {
            Some(charge_id) => provider.adapter.get_charge(charge_id).await,
            None => provider.adapter.find_charge_by_key(&record.psp_key).await,
        };
        let charge = match lookup {
            // The provider has no lookup by our key: its webhooks and its report settle the
            // payment (the report compares every charge it lists).
            Err(ProviderError::Unsupported { what }) => {
                tracing::debug!(payment = %id, %what, "no lookup by key; left to the webhooks and the report");
                return Ok(());
            }
            Err(error) => {
                summary.provider_errors += 1;
                tracing::warn!(payment = %id, %error, "provider lookup gave no answer");
                return Ok(());
            }
            Ok(charge) => charge,
        };
        let expired_ms = record
            .created_at
            .timestamp_millis()
            .saturating_add(self.config.pending_timeout_ms);
        match (charge, &record.provider_charge_id) {
            (None, None) if expired_ms <= self.flow.clock.now_ms() => {
                // The provider never got the charge, and the payment is past its expiry.
                match self
                    .flow
                    .apply(
                        id,
                        PaymentCommand::Expire {
                            at: self.flow.clock.now(),
                        },
                    )
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
                    for fact in facts::charge_facts(&charge) {
                        status = self.flow.finalize(id, Some(fact)).await?.payment.status;
                    }
                    if status != record.status {
                        summary.settled += 1;
                    }
                }
            }
        }
        Ok(())
    }

    /// The customer never finished the redirect: still waiting for them at the provider, past
    /// the timeout for customer action.
    fn abandoned(&self, record: &PaymentRecord, charge: &Charge) -> bool {
        let deadline_ms = record
            .created_at
            .timestamp_millis()
            .saturating_add(self.config.requires_action_timeout_ms);
        charge.status == ChargeStatus::RequiresAction && deadline_ms <= self.flow.clock.now_ms()
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
        let provider = self
            .flow
            .providers
            .get(&record.provider)
            .ok_or_else(|| ReconcileError::UnknownProvider(record.provider.clone()))?;
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
                    .apply(
                        record.id,
                        PaymentCommand::Expire {
                            at: self.flow.clock.now(),
                        },
                    )
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
                for fact in facts::charge_facts(&after) {
                    self.flow.finalize(record.id, Some(fact)).await?;
                }
                summary.settled += 1;
            }
            _ => {}
        }
        Ok(())
    }

    /// Never guess: a manual exception, a review flag on the payment (once, when the exception
    /// is new), an error log and a metric.
    async fn flag(
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
            .apply(
                record.id,
                PaymentCommand::FlagForReview {
                    note: format!("reconciliation exception {exception_id}: {kind}"),
                    at: self.flow.clock.now(),
                },
            )
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

    // ------------------------------------------------------------------- stuck keys

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

    async fn sweep_stuck_keys(&self, summary: &mut SweepSummary) -> Result<(), ReconcileError> {
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
                ) && !self.settle_with_lease(id, summary).await?
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

    // ------------------------------------------------------------------- reports

    async fn cursor_mark(&self, name: &str) -> Result<Option<i64>, ReconcileError> {
        let sql = "select mark from reconciliation_cursors where name = $1";
        let mark: Option<i64> = match self.database() {
            Database::Postgres(pool) => {
                sqlx::query_scalar(sql)
                    .bind(name)
                    .fetch_optional(pool)
                    .await?
            }
            Database::Sqlite(pool) => {
                sqlx::query_scalar(&sqlite(sql))
                    .bind(name)
                    .fetch_optional(pool)
                    .await?
            }
        };
        Ok(mark)
    }

    async fn set_cursor_mark(&self, name: &str, mark: i64) -> Result<(), ReconcileError> {
        let sql = "insert into reconciliation_cursors (name, mark) values ($1, $2) \
                   on conflict (name) do update set mark = excluded.mark";
        match self.database() {
            Database::Postgres(pool) => {
                sqlx::query(sql).bind(name).bind(mark).execute(pool).await?;
            }
            Database::Sqlite(pool) => {
                sqlx::query(&sqlite(sql))
                    .bind(name)
                    .bind(mark)
                    .execute(pool)
                    .await?;
            }
        }
        Ok(())
    }

    async fn compare_report(
        &self,
        provider: &ProviderName,
        summary: &mut SweepSummary,
    ) -> Result<(), ReconcileError> {
        let configured = self
            .flow
            .providers
            .get(provider)
            .ok_or_else(|| ReconcileError::UnknownProvider(provider.clone()))?
            .clone();
        let cursor = format!("report:{provider}");
        let now_ms = self.flow.clock.now_ms();
        let to_ms = now_ms.saturating_sub(self.config.report_settle_ms);
        let from_ms = match self.cursor_mark(&cursor).await? {
            Some(end) => end.saturating_sub(self.config.report_overlap_ms),
            None => to_ms.saturating_sub(self.config.report_lookback_ms),
        };
        if from_ms >= to_ms {
            return Ok(());
        }
        let lines = match configured
            .adapter
            .settlement_report(millis(from_ms), millis(to_ms))
            .await
        {
            Ok(lines) => lines,
            Err(error) => {
                summary.provider_errors += 1;
                tracing::warn!(%provider, %error, "settlement report unavailable; next sweep asks again");
                return Ok(());
            }
        };
        // The window is done only when every line was handled; otherwise the next sweep asks for
        // it again (comparing a line twice is harmless).
        let mut complete = true;
        for line in &lines {
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
        if complete {
            self.set_cursor_mark(&cursor, to_ms).await?;
        }
        Ok(())
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
        let record = loaded
            .and_then(|loaded| loaded.aggregate.record)
            .filter(|record| &record.provider == provider);
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

    async fn apply_line(
        &self,
        stale: &PaymentRecord,
        line: &ReportLine,
        summary: &mut SweepSummary,
    ) -> Result<(), ReconcileError> {
        // Under the lease now: decide on the payment as it is, not as it was before the lease.
        let loaded = log::load_payment(self.flow.store.as_ref(), stale.id).await?;
        let Some(record) = loaded.aggregate.record else {
            return Ok(());
        };
        let finding = |kind, fingerprint| Finding {
            kind,
            fingerprint,
            charge_id: line.charge_id.clone(),
            local: local_state(&record),
            provider: line_state(line),
        };
        match classify(&record, line) {
            Verdict::Agree => Ok(()),
            Verdict::Manual { kind, fingerprint } => {
                self.flag(&record, finding(kind, fingerprint), summary)
                    .await
            }
            Verdict::Auto {
                kind,
                facts,
                fingerprint,
            } => {
                let recorded = finding(kind, fingerprint).recorded(
                    &record,
                    Resolution::Auto,
                    self.flow.clock.now(),
                );
                let mut facts = facts.into_iter();
                let Some(first) = facts.next() else {
                    return Ok(());
                };
                if exceptions::exists(self.flow.store.as_ref(), recorded.exception_id).await? {
                    // Recorded by an earlier sweep together with its fix; apply what is left
                    // (nothing, unless a later fact raced it) without a second exception.
                    self.flow.finalize(record.id, Some(first)).await?;
                } else {
                    let also = RecordWithFix {
                        store: self.flow.store.clone(),
                        recorded,
                        flags_before: record.flags.len(),
                        outcome: std::sync::Mutex::new(None),
                    };
                    self.flow
                        .finalize_and(record.id, Some(first), &also)
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
                    self.flow.finalize(record.id, Some(fact)).await?;
                }
                Ok(())
            }
        }
    }

    // ------------------------------------------------------------------- dead letters

    async fn sweep_dead_letters(&self, summary: &mut SweepSummary) -> Result<(), ReconcileError> {
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

/// A difference found, before it is recorded.
struct Finding {
    kind: ExceptionKind,
    fingerprint: String,
    charge_id: String,
    local: Value,
    provider: Value,
}

impl Finding {
    fn recorded(
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

/// The payment a PSP charge key (`psp_<uuid simple>`) was derived from.
fn payment_of_key(key: &str) -> Option<PaymentId> {
    let hex = key.strip_prefix("psp_")?;
    if hex.len() != 32 {
        return None;
    }
    PaymentId::parse(hex).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use asiento_domain::{CaptureMode, Currency, CustomerId, TenantId};

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
            provider_charge_id: Some("ch_1".into()),
            status,
            authorized: Amount::new(10_000),
            captured: Amount::new(captured),
            fee: Amount::ZERO,
            fee_schedule: None,
            operations: Vec::new(),
            refunded: Amount::new(refunded),
            refund_reversed: Amount::ZERO,
            fee_reversed: Amount::ZERO,
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
            fee_minor: 0,
            currency: "USD".into(),
            reference: None,
            idempotency_key: "psp_00000000000000000000000000000001".into(),
            dispute_status: None,
            dispute: None,
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
                &format!("/v1/payments/{pay}/refunds"),
                &format!("{pay}/refunds/2")
            ),
            Some(StuckRequest::Refund(pay, 2))
        );
        assert_eq!(parse_stuck("POST", "/v1/transfers", "tr_1"), None);
        assert_eq!(
            payment_of_key(&asiento_domain::psp_charge_key(pay)),
            Some(pay)
        );
        assert_eq!(payment_of_key("psp_x"), None);
    }
}
