//! The reconciler: converges the ledger to the providers' truth when the synchronous answer and
//! the webhooks did not (a timeout, a dropped webhook, a crash, a refund made in the provider's
//! dashboard). One sweep ([`Reconciler::sweep_once`]) runs its jobs in this order: stale
//! payments, provider operations (`operations.rs`: every capture and refund still open past the
//! operation timeout, driven as its provider's capabilities allow), stuck keys, settlement reports
//! (with the window's payouts), dead letters. Four of them:
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
//!    so the overlap between windows is harmless and a re-run changes nothing. The payouts the
//!    provider created in the window are read and posted too (`crate::payouts`), so that a
//!    payout whose webhooks were lost still reaches the bank account.
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
//!
//! One file per job: `stale.rs` (stale payments, abandoned redirects), `operations.rs` (captures
//! and refunds still open), `stuck_keys.rs` (stuck idempotency keys), `report.rs` (settlement
//! reports), `movements.rs` (a report line's balance transactions), `payouts.rs` (the report window's payouts), `dead_letters.rs` (dead-lettered webhooks), `findings.rs` (what a difference records:
//! the exception and the review flag) and `jobs.rs` (the job lease a sweep holds). This file holds
//! the reconciler itself: its settings, its summary and the sweep that calls each job in turn.

mod dead_letters;
mod findings;
mod jobs;
mod movements;
mod operations;
mod payouts;
mod report;
mod stale;
mod stuck_keys;

pub use dead_letters::DEAD_LETTERS_PER_PAGE_MAX;
pub use findings::local_state;
pub use jobs::{acquire_job, release_job, JobLease};
pub use operations::{
    OPERATIONS_PER_SWEEP_MAX, OPERATION_PENDING_DEADLINE_MS_DEFAULT, OPERATION_TIMEOUT_MS_DEFAULT,
};
pub use report::{classify, Verdict};
pub use stale::{MISFIT_RECHECK_MS, STALE_PAYMENTS_PER_SWEEP_MAX, UNREAD_RECHECK_MS};
pub use stuck_keys::STUCK_KEYS_PER_SWEEP_MAX;

use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::time::Duration;

use asiento_domain::exception::Resolution;
use asiento_domain::{ExceptionKind, ProviderName};
use asiento_eventstore::Database;
use uuid::Uuid;

use crate::exceptions::ExceptionError;
use crate::leases::{LeaseError, PAYMENT_LEASE_MS_DEFAULT};
use crate::log::LogError;
use crate::payments::{FlowError, PaymentFlow};
use crate::watch::{self, WatchError};

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
/// [`ReconcilerConfig::report_slice_lines`]: a few megabytes of lines at once.
pub const REPORT_SLICE_LINES_DEFAULT: usize = 2_000;
/// How long a sweep holds the job lease: above the longest sweep we expect, so a live sweep is not
/// overtaken; a crashed one delays the next by at most this.
pub const SWEEP_LEASE_MS_DEFAULT: i64 = 10 * 60_000;
/// The shortest sweep lease a process takes: a sweep killed mid-run holds the lease until it runs
/// out, so a one-shot sweep (`asiento reconcile`) and a frequent one (`serve`'s) take a short lease
/// rather than the default. A sweep that outlasts it may overlap the next one, which is safe:
/// payments are leased and versioned.
pub const SWEEP_LEASE_MS_MIN: i64 = 30_000;
/// API.md: an abandoned redirect expires after this (and is cancelled at the provider).
pub const REQUIRES_ACTION_TIMEOUT_MS_DEFAULT: i64 = 24 * 3_600_000;

#[derive(Debug, Clone)]
pub struct ReconcilerConfig {
    pub pending_timeout_ms: i64,
    pub interval_ms: u64,
    pub report_overlap_ms: i64,
    pub report_lookback_ms: i64,
    pub report_settle_ms: i64,
    /// About how many lines one request of a report window brings (its slices grow and shrink
    /// toward it, where the provider's reports are sliced: `Capabilities::report_slice`).
    pub report_slice_lines: usize,
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
            report_slice_lines: REPORT_SLICE_LINES_DEFAULT,
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
    #[error(transparent)]
    Idempotency(#[from] crate::idempotency::IdempotencyError),
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
    /// Charge requests sent again under their key (a provider without a lookup by key).
    pub charges_resent: usize,
    /// Never-answered charge requests of expired payments cancelled by our reference.
    pub cancelled_by_reference: usize,
    /// Abandoned redirects cancelled at a provider that cannot be asked about them (its
    /// notification decides the payment).
    pub redirects_cancelled: usize,
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
    /// Payouts of the report windows posted by the sweep (their webhooks had not).
    pub payouts_posted: usize,
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
            "unanswered charges: {} sent again, {} cancelled by reference; {} abandoned redirects cancelled unread",
            self.charges_resent, self.cancelled_by_reference, self.redirects_cancelled
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
        writeln!(f, "payouts posted: {}", self.payouts_posted)?;
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

/// `duration` in milliseconds, saturating.
fn duration_ms(duration: std::time::Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

fn sqlite(sql: &str) -> String {
    sql.replace('$', "?")
}

#[derive(Clone)]
pub struct Reconciler {
    pub flow: PaymentFlow,
    pub config: ReconcilerConfig,
    /// Fresh per reconciler: the job lease it holds carries it.
    pub owner: Uuid,
}

/// The cursor of a provider's settlement report: the end of the last window compared whole.
fn report_cursor(provider: &ProviderName) -> String {
    format!("report:{provider}")
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

    /// The configured provider of that name.
    fn provider(
        &self,
        name: &ProviderName,
    ) -> Result<&crate::providers::ConfiguredProvider, ReconcileError> {
        self.flow
            .providers
            .get(name)
            .ok_or_else(|| ReconcileError::UnknownProvider(name.clone()))
    }

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
}
