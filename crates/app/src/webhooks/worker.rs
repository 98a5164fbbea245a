//! The inbox worker: claims stored events under a row lease, takes the payment's lease, applies
//! the event's facts through the flow's one finalisation, and finishes the row in the same
//! transaction; failures retry with a persisted backoff until the row is dead-lettered.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::time::{Duration, Instant};

use asiento_domain::{PaymentCommand, PaymentId, PaymentRecord, ProviderFact, ProviderName};
use asiento_eventstore::{Database, StoreError, Tx};
use asiento_psp::{EventType, ProviderError, WebhookEvent};
use uuid::Uuid;

use super::{pending_count, sqlite, truncate};
use crate::clock::Clock;
use crate::facts;
use crate::leases;
use crate::log::{self, LogError};
use crate::payments::{Finalize, Finalized, FlowError, InTransaction, LoadedPayment, PaymentFlow};
use crate::payouts;

/// Error texts kept on a row or put into a review note are cut to this many characters.
pub const ERROR_TEXT_CHARS_MAX: usize = 1_000;
/// How often the worker samples the inbox depth for the gauge.
const DEPTH_SAMPLE_MS: u64 = 1_000;
/// Exponents above this cannot change a delay capped at any sane maximum; bounds the shift.
const BACKOFF_DOUBLINGS_MAX: u32 = 30;

/// The facts an event stands for, in the order to apply them: the ones it implies first (a refund
/// or a dispute implies the capture of `amount_captured`), the event's own fact last. Empty for an
/// event type we do not know (acknowledged and ignored) or a dispute event without its dispute.
/// An event without a charge (an asynchronous provider's notice of one operation, one dispute or
/// the end of an authorization) stands for that alone. A dispute notice that names no charge
/// (Adyen's later dispute items carry no `originalReference`) is about the charge of `payment`,
/// the payment the event names; without that payment's charge it stands for nothing yet.
pub fn facts_from_event(
    event: &WebhookEvent,
    payment: Option<&PaymentRecord>,
) -> Vec<ProviderFact> {
    if event.kind == EventType::Unknown {
        return Vec::new();
    }
    let mut facts = Vec::with_capacity(4);
    // An operation's update is that operation's outcome, then what its charge now stands for.
    if event.kind == EventType::OperationUpdated {
        if let Some(op) = &event.data.operation {
            facts.push(facts::operation_fact(op, None));
        }
    }
    // The charge as it stands after the change is the fact; the type only says which change.
    if let Some(charge) = &event.data.charge {
        facts.extend(facts::charge_facts(charge, facts::Read::Snapshot));
    } else if let Some(disputed) = &event.data.dispute {
        let charge = disputed
            .charge
            .as_deref()
            .or_else(|| payment.and_then(|record| record.provider_charge_id.as_deref()));
        facts.extend(charge.map(|charge| facts::dispute_of(charge, &disputed.dispute)));
    } else if let Some(end) = &event.data.authorization_end {
        facts.push(facts::authorization_end_fact(end));
    }
    facts
}

/// A dispute notice that names no charge: its facts wait for its payment's charge.
fn names_its_charge_by_payment(event: &WebhookEvent) -> bool {
    event.kind != EventType::Unknown
        && event.data.charge.is_none()
        && event
            .data
            .dispute
            .as_ref()
            .is_some_and(|disputed| disputed.charge.is_none())
}

/// The payment an event names: by our payment id, or by the PSP key of one of its operations
/// (an asynchronous provider names a modification by the reference we sent with it).
fn payment_named(event: &WebhookEvent) -> Option<PaymentId> {
    let reference = event.data.payment_ref()?;
    PaymentId::parse(reference)
        .ok()
        .or_else(|| asiento_domain::payment_of_psp_key(reference))
}

/// Limits and timings of a [`Worker`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerConfig {
    /// Rows claimed at once; they are processed one after the other.
    pub batch_size_max: usize,
    /// How long a claimed row stays this worker's: above the time a whole batch takes, or another
    /// worker takes rows over while they are processed (harmless, but wasted work).
    pub row_lease_ms: i64,
    /// How long the payment lease is held while one event is applied.
    pub payment_lease_ms: i64,
    /// Failed attempts before a row is dead-lettered and its payment flagged.
    pub attempts_max: u32,
    /// The first retry waits this long; each further one twice as long, up to `backoff_max_ms`.
    pub backoff_base_ms: i64,
    pub backoff_max_ms: i64,
    /// How long after its arrival an event for a payment we do not know is still retried (our own
    /// commit may be late) before it becomes an `unknown_payment` dead letter.
    pub unknown_payment_retry_ms: i64,
    /// When another holder has the payment's lease, the row is tried again after this long
    /// (not counted as an attempt).
    pub lease_busy_retry_ms: i64,
    /// Sleep between polls when the inbox has nothing due.
    pub idle_poll_ms: u64,
}

/// A payout event that waits for a tenant's move between cells is tried again after this long.
const PAUSED_RETRY_MS: i64 = 5_000;

impl Default for WorkerConfig {
    fn default() -> Self {
        WorkerConfig {
            batch_size_max: 64,
            row_lease_ms: 60_000,
            payment_lease_ms: leases::PAYMENT_LEASE_MS_DEFAULT,
            attempts_max: 8,
            backoff_base_ms: 500,
            backoff_max_ms: 60_000,
            unknown_payment_retry_ms: 300_000,
            lease_busy_retry_ms: 250,
            idle_poll_ms: 200,
        }
    }
}

/// Why a row was dead-lettered; stored as `dead_reason`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DeadReason {
    /// Every attempt failed; the payment is flagged for review.
    AttemptsExhausted,
    /// No payment with the charge's reference appeared in time: a reconciliation exception.
    UnknownPayment,
    /// The charge names a payment of another provider than the one that signed the event.
    ProviderMismatch,
    /// The charge carries no reference that is one of our payment ids.
    NoPaymentReference,
    /// The stored payload no longer parses (it did when it was received): a bug.
    InvalidPayload,
    /// The charge is not the payment's (another currency, amount, reference or key): never
    /// applied, and the payment is flagged for review.
    ChargeMismatch,
}

impl DeadReason {
    pub const ALL: [DeadReason; 6] = [
        DeadReason::AttemptsExhausted,
        DeadReason::UnknownPayment,
        DeadReason::ProviderMismatch,
        DeadReason::NoPaymentReference,
        DeadReason::InvalidPayload,
        DeadReason::ChargeMismatch,
    ];

    pub const fn as_str(self) -> &'static str {
        match self {
            DeadReason::AttemptsExhausted => "attempts_exhausted",
            DeadReason::UnknownPayment => "unknown_payment",
            DeadReason::ProviderMismatch => "provider_mismatch",
            DeadReason::NoPaymentReference => "no_payment_reference",
            DeadReason::InvalidPayload => "invalid_payload",
            DeadReason::ChargeMismatch => "charge_mismatch",
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    #[error("webhook inbox query failed: {0}")]
    Database(#[from] sqlx::Error),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Lease(#[from] leases::LeaseError),
    #[error(transparent)]
    Log(#[from] LogError),
    #[error("flagging the payment failed: {0}")]
    Flow(Box<FlowError>),
}

/// What one [`Worker::drain_once`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DrainReport {
    pub claimed: usize,
    /// Applied through `finalize` (including facts that changed nothing).
    pub applied: usize,
    /// Unknown event types, acknowledged.
    pub ignored: usize,
    /// Failed and scheduled again.
    pub retried: usize,
    /// Put back without counting an attempt (payment lease busy, payment not known yet).
    pub deferred: usize,
    pub dead: usize,
    /// Rows whose lease ran out and another worker took over before this one finished.
    pub lost: usize,
}

/// A claimed inbox row.
#[derive(Debug, Clone, sqlx::FromRow)]
struct Row {
    id: i64,
    provider: String,
    event_id: String,
    payload: Vec<u8>,
    /// Including the current one.
    attempts: i32,
    received_ms: i64,
}

/// How a row ends (or does not) after an attempt.
enum Finish<'a> {
    Processed {
        outcome: &'static str,
    },
    Retry {
        next_attempt_ms: i64,
        error: &'a str,
        counted: bool,
    },
    Dead {
        reason: DeadReason,
        error: &'a str,
    },
}

/// Applies the inbox's events. Cheap to clone; clones share nothing but the database.
#[derive(Clone)]
pub struct Worker {
    pub flow: PaymentFlow,
    /// Fresh per worker: the row leases it holds carry it.
    pub owner: Uuid,
    pub config: WorkerConfig,
}

impl Worker {
    pub fn new(flow: PaymentFlow, config: WorkerConfig) -> Self {
        Worker {
            flow,
            owner: Uuid::new_v4(),
            config,
        }
    }

    /// Drains the inbox until `shutdown` resolves; a batch in progress is finished first. Errors
    /// are logged and the loop goes on: a row that could not be finished is retried once its
    /// lease runs out.
    pub async fn run(&self, shutdown: impl Future<Output = ()>) {
        tokio::pin!(shutdown);
        let idle = Duration::from_millis(self.config.idle_poll_ms);
        let mut depth_sampled: Option<Instant> = None;
        tracing::info!(owner = %self.owner, "webhook worker started");
        loop {
            let due = depth_sampled
                .is_none_or(|at| at.elapsed() >= Duration::from_millis(DEPTH_SAMPLE_MS));
            if due {
                depth_sampled = Some(Instant::now());
                match pending_count(&self.flow.database).await {
                    Ok(pending) => {
                        metrics::gauge!("asiento_webhook_inbox_depth").set(pending as f64)
                    }
                    Err(error) => tracing::warn!(%error, "cannot sample the webhook inbox depth"),
                }
            }
            let busy = match self.drain_once().await {
                Ok(report) => report.claimed > 0,
                Err(error) => {
                    tracing::error!(%error, "webhook worker: claiming rows failed");
                    false
                }
            };
            if busy {
                // Keep draining, but let a shutdown in between batches through.
                tokio::select! {
                    biased;
                    () = &mut shutdown => break,
                    () = std::future::ready(()) => {}
                }
            } else {
                tokio::select! {
                    () = &mut shutdown => break,
                    () = tokio::time::sleep(idle) => {}
                }
            }
        }
        tracing::info!(owner = %self.owner, "webhook worker stopped");
    }

    /// Claims one batch of due rows and processes each. A row whose processing fails on the
    /// database is left to its lease and counted nowhere.
    pub async fn drain_once(&self) -> Result<DrainReport, WorkerError> {
        let rows = self.claim().await?;
        let mut report = DrainReport {
            claimed: rows.len(),
            ..DrainReport::default()
        };
        // Rows whose event a state this process committed already reflects need no read at all
        // (`PaymentMemory`); the others are read together and processed one by one.
        let mut reflected: Vec<&Row> = Vec::new();
        let mut rest: Vec<(&Row, Result<Option<WebhookEvent>, ProviderError>)> = Vec::new();
        for row in &rows {
            let event = self.read_event(row).await;
            match &event {
                Ok(Some(event)) if self.remembered_reflects(row, event) => reflected.push(row),
                _ => rest.push((row, event)),
            }
        }
        let events: Vec<&Result<Option<WebhookEvent>, ProviderError>> =
            rest.iter().map(|(_, event)| event).collect();
        let mut payments = self.load_payments(&events).await;
        for (row, event) in rest {
            match self.process(row, event, &mut payments).await {
                Ok(Done::Reflected) => reflected.push(row),
                Ok(Done::Applied) => report.applied += 1,
                Ok(Done::Ignored) => report.ignored += 1,
                Ok(Done::Retried) => report.retried += 1,
                Ok(Done::Deferred) => report.deferred += 1,
                Ok(Done::Dead) => report.dead += 1,
                Ok(Done::Lost) => report.lost += 1,
                Err(error) => {
                    tracing::error!(row = row.id, event_id = %row.event_id, %error, "webhook row left to its lease");
                }
            }
        }
        match self.finish_reflected(&reflected).await {
            Ok(kept) => {
                for row in &reflected {
                    if kept.contains(&row.id) {
                        report.applied += 1;
                        self.record_lag(row);
                        metrics::counter!(
                            "asiento_webhook_events_processed_total",
                            "outcome" => "applied"
                        )
                        .increment(1);
                    } else {
                        report.lost += 1;
                    }
                }
            }
            Err(error) => {
                tracing::error!(rows = reflected.len(), %error, "webhook rows left to their lease");
            }
        }
        Ok(report)
    }

    /// What the row's stored body stands for, read by its provider's adapter (an event that is a
    /// hint names objects the adapter reads); a row of a provider no longer configured is read
    /// as the simulator's protocol, whose body is the event.
    async fn read_event(&self, row: &Row) -> Result<Option<WebhookEvent>, ProviderError> {
        let provider = ProviderName::parse(&row.provider)
            .ok()
            .and_then(|name| self.flow.providers.get(&name));
        match provider {
            Some(provider) => provider.adapter.read_event(&row.payload).await,
            None => asiento_psp::event::read(&row.payload).map(Some),
        }
    }

    /// Whether a payment state this process committed already reflects `event` (then the row is
    /// only marked, as when a read shows it reflected). `false` tells nothing: the log decides.
    fn remembered_reflects(&self, row: &Row, event: &WebhookEvent) -> bool {
        let Some(id) = payment_named(event) else {
            return false;
        };
        let Some(payment) = self.flow.writer.payments().recall(id) else {
            return false;
        };
        let provider_matches = payment
            .record
            .as_ref()
            .is_some_and(|record| record.provider.as_str() == row.provider);
        let facts = facts_from_event(event, payment.record.as_ref());
        provider_matches
            && !facts.is_empty()
            && matches!(self.flow.reflects(&payment, &facts), Ok(true))
    }

    /// The payments the batch's events name, read together before any row is processed. If
    /// that fails, each row reads its payment itself.
    async fn load_payments(
        &self,
        events: &[&Result<Option<WebhookEvent>, ProviderError>],
    ) -> HashMap<PaymentId, LoadedPayment> {
        let ids: Vec<PaymentId> = events
            .iter()
            .filter_map(|event| event.as_ref().ok()?.as_ref())
            .filter_map(payment_named)
            .collect();
        if ids.is_empty() {
            return HashMap::new();
        }
        match log::load_payments(self.flow.store.as_ref(), &ids).await {
            Ok(loaded) => loaded,
            Err(error) => {
                tracing::warn!(%error, "reading the batch's payments failed; reading them one by one");
                HashMap::new()
            }
        }
    }

    /// Marks the rows whose payment already reflected their event processed, with one statement
    /// on PostgreSQL; the ids of those this worker still held.
    async fn finish_reflected(&self, rows: &[&Row]) -> Result<HashSet<i64>, WorkerError> {
        if rows.is_empty() {
            return Ok(HashSet::new());
        }
        let now_ms = self.flow.clock.now_ms();
        match &self.flow.database {
            Database::Postgres(pool) => {
                let ids: Vec<i64> = rows.iter().map(|row| row.id).collect();
                let kept: Vec<i64> = sqlx::query_scalar(
                    "update webhook_inbox set status = 'processed', outcome = 'applied', \
                     finished_ms = $3, lease_owner = null, lease_expires_ms = null \
                     where id = any($1) and lease_owner = $2 and status = 'pending' returning id",
                )
                .bind(ids)
                .bind(self.owner)
                .bind(now_ms)
                .fetch_all(pool)
                .await?;
                Ok(kept.into_iter().collect())
            }
            Database::Sqlite(_) => {
                // In process: a statement per row costs no round trip.
                let mut kept = HashSet::new();
                for row in rows {
                    let how = Finish::Processed { outcome: "applied" };
                    let on = On::Database(&self.flow.database);
                    if finish(on, row.id, self.owner, &how, now_ms).await? {
                        kept.insert(row.id);
                    }
                }
                Ok(kept)
            }
        }
    }

    /// Calls [`Worker::drain_once`] until a batch claims nothing: every row due now is finished
    /// (or scheduled later). For tests and one-shot tools.
    pub async fn drain(&self) -> Result<DrainReport, WorkerError> {
        let mut total = DrainReport::default();
        loop {
            let report = self.drain_once().await?;
            if report.claimed == 0 {
                return Ok(total);
            }
            total.claimed += report.claimed;
            total.applied += report.applied;
            total.ignored += report.ignored;
            total.retried += report.retried;
            total.deferred += report.deferred;
            total.dead += report.dead;
            total.lost += report.lost;
        }
    }

    async fn claim(&self) -> Result<Vec<Row>, WorkerError> {
        let now_ms = self.flow.clock.now_ms();
        let expires_ms = now_ms.saturating_add(self.config.row_lease_ms);
        let limit = i64::try_from(self.config.batch_size_max).unwrap_or(i64::MAX);
        // In the pending index's order, so that a plain index scan of it stops after `limit` rows.
        let pick =
            "select id from webhook_inbox where status = 'pending' and next_attempt_ms <= $3 \
                    and (lease_expires_ms is null or lease_expires_ms < $3) \
                    order by next_attempt_ms, id limit $4";
        let returning = "returning id, provider, event_id, payload, attempts, received_ms";
        let mut rows = match &self.flow.database {
            Database::Postgres(pool) => {
                let sql = format!(
                    "update webhook_inbox set lease_owner = $1, lease_expires_ms = $2, \
                     attempts = attempts + 1 where id in ({pick} for update skip locked) {returning}"
                );
                // A finished row leaves its entry in the pending index until a vacuum. A plain
                // index scan marks such entries dead as it passes them, and later scans skip
                // them; a bitmap scan, which the planner picks for a few due rows, never does, so
                // then every claim visits every row finished since the last vacuum (measured
                // after 6,000 webhooks: 2,500 entries and 500 heap pages for 40 due rows, 0.8 ms;
                // 0.05 ms once marked). The rows are leased to us when the transaction commits.
                let mut tx = pool
                    .begin_with("BEGIN; SET LOCAL enable_bitmapscan = off")
                    .await?;
                let found: Vec<Row> = sqlx::query_as(&sql)
                    .bind(self.owner)
                    .bind(expires_ms)
                    .bind(now_ms)
                    .bind(limit)
                    .fetch_all(&mut *tx)
                    .await?;
                tx.commit().await?;
                found
            }
            Database::Sqlite(pool) => {
                // No `skip locked`: the statement takes the one write lock, which serialises
                // claimers as well.
                let sql = sqlite(&format!(
                    "update webhook_inbox set lease_owner = $1, lease_expires_ms = $2, \
                     attempts = attempts + 1 where id in ({pick}) {returning}"
                ));
                let found: Vec<Row> = sqlx::query_as(&sql)
                    .bind(self.owner.to_string())
                    .bind(expires_ms)
                    .bind(now_ms)
                    .bind(limit)
                    .fetch_all(pool)
                    .await?;
                found
            }
        };
        // Arrival order, so that a provider's order is kept where it can be.
        rows.sort_by_key(|row| row.id);
        Ok(rows)
    }

    #[tracing::instrument(skip_all, fields(row = row.id, provider = %row.provider, event_id = %row.event_id, attempt = row.attempts))]
    async fn process(
        &self,
        row: &Row,
        event: Result<Option<WebhookEvent>, ProviderError>,
        payments: &mut HashMap<PaymentId, LoadedPayment>,
    ) -> Result<Done, WorkerError> {
        let now_ms = self.flow.clock.now_ms();
        let event = match event {
            Ok(event) => event,
            Err(ProviderError::Protocol { reason }) => {
                return self.bury(row, DeadReason::InvalidPayload, &reason).await
            }
            // The provider could not say what the event names (an outage): asked again later.
            Err(error) => return self.failed(row, None, &error.to_string()).await,
        };
        if event.is_none() {
            if let Some((provider, payout)) = self.payout_of(row) {
                return self.post_payout(row, &provider, &payout).await;
            }
        }
        let facts = event
            .as_ref()
            .map(|event| facts_from_event(event, None))
            .unwrap_or_default();
        let Some(event) =
            event.filter(|event| !facts.is_empty() || names_its_charge_by_payment(event))
        else {
            tracing::info!("webhook event acknowledged and ignored");
            return self
                .finish_alone(row, Finish::Processed { outcome: "ignored" })
                .await
                .map(|kept| if kept { Done::Ignored } else { Done::Lost });
        };
        let Some(payment) = payment_named(&event) else {
            let error = format!("event {} names no payment of ours", row.event_id);
            return self.bury(row, DeadReason::NoPaymentReference, &error).await;
        };
        // Read with the batch; a second row for the same payment reads it again (the first may
        // have changed it).
        let loaded = match payments.remove(&payment) {
            Some(loaded) => loaded,
            None => match log::load_payment(self.flow.store.as_ref(), payment).await {
                Ok(loaded) => loaded,
                Err(error) => return self.failed(row, None, &error.to_string()).await,
            },
        };
        let Some(record) = loaded.aggregate.record.as_ref() else {
            if now_ms.saturating_sub(row.received_ms) < self.config.unknown_payment_retry_ms {
                tracing::info!(%payment, "webhook for a payment not known yet; retrying later");
                let next_attempt_ms = now_ms.saturating_add(self.backoff_ms(row.attempts));
                let error = format!("payment {payment} not found");
                return self
                    .finish_alone(
                        row,
                        Finish::Retry {
                            next_attempt_ms,
                            error: &error,
                            counted: true,
                        },
                    )
                    .await
                    .map(|kept| if kept { Done::Deferred } else { Done::Lost });
            }
            let error = format!(
                "payment {payment} still unknown {} ms after the event arrived",
                self.config.unknown_payment_retry_ms
            );
            return self.bury(row, DeadReason::UnknownPayment, &error).await;
        };
        if record.provider.as_str() != row.provider {
            let error = format!(
                "payment {payment} belongs to provider {}, the event was signed by {}",
                record.provider, row.provider
            );
            return self.bury(row, DeadReason::ProviderMismatch, &error).await;
        }
        // A dispute notice that names no charge is about the payment's.
        let facts = if facts.is_empty() {
            facts_from_event(&event, Some(record))
        } else {
            facts
        };
        if facts.is_empty() {
            let error = format!(
                "event {} names no charge and payment {payment} has none yet",
                row.event_id
            );
            return self.failed(row, Some(payment), &error).await;
        }
        let misfit = event.data.charge.as_ref().and_then(|charge| {
            facts::charge_misfit(record, charge).map(|misfit| (charge.id.as_str(), misfit))
        });
        if let Some((charge, misfit)) = misfit {
            let error = format!(
                "charge {charge} does not fit payment {payment}: {} ({})",
                misfit.kind, misfit.fingerprint
            );
            let note = format!("webhook {}/{}: {error}", row.provider, row.event_id);
            return self
                .bury_and_flag(row, payment, DeadReason::ChargeMismatch, note, &error)
                .await;
        }
        // The common case: the synchronous answer (or an earlier copy of this event) already
        // recorded what the event says. Only the row is left to mark, with the batch's others:
        // no payment lease, no transaction around nothing.
        match self.flow.reflects(&loaded.aggregate, &facts) {
            Ok(true) => return Ok(Done::Reflected),
            Ok(false) => {}
            Err(error) => return self.failed(row, Some(payment), &error.to_string()).await,
        }
        let lease = match leases::acquire(
            &self.flow.database,
            payment,
            now_ms,
            self.config.payment_lease_ms,
        )
        .await
        {
            Ok(Some(lease)) => lease,
            Ok(None) => {
                return self
                    .deferred(
                        row,
                        self.config.lease_busy_retry_ms,
                        "payment lease held by another worker",
                    )
                    .await;
            }
            Err(error) => return self.failed(row, Some(payment), &error.to_string()).await,
        };
        let applied = self.apply(row, payment, loaded, facts).await;
        if let Err(error) = leases::release(&self.flow.database, &lease).await {
            tracing::warn!(%payment, %error, "payment lease not released; it will run out");
        }
        match applied {
            Ok(()) => {
                self.record_lag(row);
                metrics::counter!("asiento_webhook_events_processed_total", "outcome" => "applied")
                    .increment(1);
                Ok(Done::Applied)
            }
            Err(FlowError::LeaseLost(_)) => {
                tracing::warn!("inbox row taken over by another worker; its work rolled back");
                Ok(Done::Lost)
            }
            Err(error) => self.failed(row, Some(payment), &error.to_string()).await,
        }
    }

    /// Tries the row again after `after_ms`, not counted as a failed attempt: it waits for
    /// something else (another holder's lease, a tenant's move), not on a fault of its own.
    async fn deferred(
        &self,
        row: &Row,
        after_ms: i64,
        error: &'static str,
    ) -> Result<Done, WorkerError> {
        let next_attempt_ms = self.flow.clock.now_ms().saturating_add(after_ms);
        let kept = self
            .finish_alone(
                row,
                Finish::Retry {
                    next_attempt_ms,
                    error,
                    counted: false,
                },
            )
            .await?;
        Ok(if kept { Done::Deferred } else { Done::Lost })
    }

    /// The payout the row's event announces, by its provider's adapter, with that provider.
    fn payout_of(&self, row: &Row) -> Option<(ProviderName, String)> {
        let name = ProviderName::parse(&row.provider).ok()?;
        let payout = self
            .flow
            .providers
            .get(&name)?
            .adapter
            .payout_of_event(&row.payload)?;
        Some((name, payout))
    }

    /// A payout's event is a hint: the payout is read as it stands and posted
    /// (`crate::payouts`), then the row is marked. Posting is idempotent, so a crash between the
    /// two posts nothing twice.
    async fn post_payout(
        &self,
        row: &Row,
        name: &ProviderName,
        payout: &str,
    ) -> Result<Done, WorkerError> {
        let Some(configured) = self.flow.providers.get(name) else {
            return self.failed(row, None, "provider not configured").await;
        };
        let posted = match configured.adapter.get_payout(payout).await {
            Ok(Some(read)) => match payouts::post(&self.flow, name, &read).await {
                // A tenant moves between cells: posted after the pause, not counted as a failure
                // (a pause may outlast every counted retry).
                Err(payouts::PayoutError::TenantPaused(_)) => {
                    return self
                        .deferred(
                            row,
                            PAUSED_RETRY_MS,
                            "a tenant is paused for a move; payouts wait",
                        )
                        .await;
                }
                posted => posted.map_err(|error| error.to_string()),
            },
            Ok(None) => Err(format!(
                "the event names payout {payout}, which the provider does not have"
            )),
            Err(error) => Err(error.to_string()),
        };
        match posted {
            Ok(_) => {
                let kept = self
                    .finish_alone(row, Finish::Processed { outcome: "applied" })
                    .await?;
                if !kept {
                    return Ok(Done::Lost);
                }
                self.record_lag(row);
                metrics::counter!("asiento_webhook_events_processed_total", "outcome" => "applied")
                    .increment(1);
                Ok(Done::Applied)
            }
            Err(error) => self.failed(row, None, &error).await,
        }
    }

    fn record_lag(&self, row: &Row) {
        let lag_ms = self.flow.clock.now_ms().saturating_sub(row.received_ms);
        metrics::histogram!("asiento_webhook_processing_lag_seconds")
            .record(lag_ms as f64 / 1000.0);
    }

    /// The implied facts each in their own finalisation (they are idempotent, so a crash between
    /// them only repeats one), the event's own fact together with marking the row processed.
    /// The first finalisation starts from the payment `process` loaded; the later ones read it
    /// again (the earlier ones may have changed it).
    async fn apply(
        &self,
        row: &Row,
        payment: PaymentId,
        loaded: LoadedPayment,
        facts: Vec<ProviderFact>,
    ) -> Result<(), FlowError> {
        let mut facts = facts;
        let Some(last) = facts.pop() else {
            return Ok(());
        };
        let mut loaded = Some(loaded);
        for fact in facts {
            self.flow
                .finalize(Finalize::facts(payment, Some(fact)).loaded(loaded.take()))
                .await?;
        }
        let mark = FinishRow {
            row: row.id,
            owner: self.owner,
            clock: self.flow.clock.as_ref(),
            how: Finish::Processed { outcome: "applied" },
        };
        self.flow
            .finalize(
                Finalize::facts(payment, Some(last))
                    .loaded(loaded)
                    .also(&mark),
            )
            .await?;
        Ok(())
    }

    /// A failed attempt: retried with backoff, or after `attempts_max` dead-lettered with the
    /// payment flagged for review.
    async fn failed(
        &self,
        row: &Row,
        payment: Option<PaymentId>,
        error: &str,
    ) -> Result<Done, WorkerError> {
        let attempts = u32::try_from(row.attempts).unwrap_or(0);
        if attempts < self.config.attempts_max {
            metrics::counter!("asiento_webhook_retries_total").increment(1);
            tracing::warn!(%error, "webhook processing failed; retrying later");
            let next_attempt_ms = self
                .flow
                .clock
                .now_ms()
                .saturating_add(self.backoff_ms(row.attempts));
            return self
                .finish_alone(
                    row,
                    Finish::Retry {
                        next_attempt_ms,
                        error,
                        counted: true,
                    },
                )
                .await
                .map(|kept| if kept { Done::Retried } else { Done::Lost });
        }
        match payment {
            Some(payment) => {
                let note = format!(
                    "webhook {}/{} dead-lettered after {} attempts: {}",
                    row.provider,
                    row.event_id,
                    row.attempts,
                    truncate(error, ERROR_TEXT_CHARS_MAX)
                );
                self.bury_and_flag(row, payment, DeadReason::AttemptsExhausted, note, error)
                    .await
            }
            None => self.bury(row, DeadReason::AttemptsExhausted, error).await,
        }
    }

    fn backoff_ms(&self, attempts: i32) -> i64 {
        backoff_ms(&self.config, attempts)
    }

    /// Dead-letters a row without touching any payment.
    async fn bury(&self, row: &Row, reason: DeadReason, error: &str) -> Result<Done, WorkerError> {
        let kept = self
            .finish_alone(row, Finish::Dead { reason, error })
            .await?;
        if kept {
            dead_lettered(row, reason, error);
            Ok(Done::Dead)
        } else {
            Ok(Done::Lost)
        }
    }

    /// Dead-letters a row and appends `FlaggedForReview` to its payment, in one transaction.
    async fn bury_and_flag(
        &self,
        row: &Row,
        payment: PaymentId,
        reason: DeadReason,
        note: String,
        error: &str,
    ) -> Result<Done, WorkerError> {
        // The flag goes through the flow like any command (exact version, re-decided on a lost
        // race); the row is dead-lettered in the same transaction.
        let bury = FinishRow {
            row: row.id,
            owner: self.owner,
            clock: self.flow.clock.as_ref(),
            how: Finish::Dead { reason, error },
        };
        let command = PaymentCommand::FlagForReview {
            note,
            at: self.flow.clock.now(),
        };
        match self
            .flow
            .finalize(Finalize::command(payment, command).also(&bury))
            .await
        {
            Ok(_) => {
                dead_lettered(row, reason, error);
                tracing::error!(%payment, "payment flagged for review: its webhook was dead-lettered");
                Ok(Done::Dead)
            }
            Err(FlowError::LeaseLost(_)) => Ok(Done::Lost),
            // The payment kept changing under us: leave the row to its lease, the next claim
            // retries.
            Err(FlowError::TooManyConflicts(_)) => {
                tracing::warn!(%payment, "flagging kept losing version races; the row will be retried");
                Ok(Done::Lost)
            }
            Err(cannot @ (FlowError::Rejected(_) | FlowError::Inconsistent(_))) => {
                tracing::error!(%payment, error = %cannot, "cannot flag the payment; dead-lettering the row alone");
                self.bury(row, reason, error).await
            }
            Err(other) => Err(WorkerError::Flow(Box::new(other))),
        }
    }

    /// Finishes a row with one autocommit statement; `false` when the row is no longer ours.
    async fn finish_alone(&self, row: &Row, how: Finish<'_>) -> Result<bool, WorkerError> {
        let on = On::Database(&self.flow.database);
        let kept = finish(on, row.id, self.owner, &how, self.flow.clock.now_ms()).await?;
        if kept {
            if let Finish::Processed { outcome } = how {
                metrics::counter!("asiento_webhook_events_processed_total", "outcome" => outcome)
                    .increment(1);
            }
        }
        Ok(kept)
    }
}

/// The delay before the attempt after `attempts`: `base · 2^(attempts − 1)`, capped at
/// `backoff_max_ms`.
fn backoff_ms(config: &WorkerConfig, attempts: i32) -> i64 {
    let doublings = u32::try_from(attempts.saturating_sub(1))
        .unwrap_or(0)
        .min(BACKOFF_DOUBLINGS_MAX);
    config
        .backoff_base_ms
        .saturating_mul(1_i64 << doublings)
        .min(config.backoff_max_ms)
}

enum Done {
    /// The payment already reflects the event: the row is to be marked processed.
    Reflected,
    Applied,
    Ignored,
    Retried,
    Deferred,
    Dead,
    Lost,
}

fn dead_lettered(row: &Row, reason: DeadReason, error: &str) {
    metrics::counter!("asiento_webhook_dead_letters_total", "reason" => reason.as_str())
        .increment(1);
    if reason == DeadReason::UnknownPayment {
        tracing::error!(row = row.id, provider = %row.provider, event_id = %row.event_id, %error,
            "webhook dead-lettered as unknown_payment: a reconciliation exception");
    } else {
        tracing::error!(row = row.id, provider = %row.provider, event_id = %row.event_id,
            reason = reason.as_str(), %error, "webhook dead-lettered");
    }
}

/// Finishes the row (processed, or dead-lettered) inside the finalisation's transaction, only if
/// this worker still holds it: a row taken over by another worker rolls the whole finalisation
/// back, so a row is finished exactly when its effect is recorded.
struct FinishRow<'a> {
    row: i64,
    owner: Uuid,
    clock: &'a dyn Clock,
    how: Finish<'a>,
}

#[async_trait::async_trait]
impl InTransaction for FinishRow<'_> {
    async fn run(&self, tx: &mut Tx, _finalized: &Finalized) -> Result<(), FlowError> {
        let kept = finish(
            On::Tx(tx),
            self.row,
            self.owner,
            &self.how,
            self.clock.now_ms(),
        )
        .await
        .map_err(|error| FlowError::from(StoreError::Database(error)))?;
        if kept {
            Ok(())
        } else {
            Err(FlowError::LeaseLost(format!(
                "webhook inbox row {} was taken over by another worker",
                self.row
            )))
        }
    }
}

/// Where a row is finished: inside a finalisation's transaction, or alone in one statement.
enum On<'a> {
    Tx(&'a mut Tx),
    Database(&'a Database),
}

/// Ends (or reschedules) a row this worker holds; `false` when it no longer holds it.
async fn finish(
    on: On<'_>,
    row: i64,
    owner: Uuid,
    how: &Finish<'_>,
    now_ms: i64,
) -> Result<bool, sqlx::Error> {
    let (status, outcome, dead_reason, error, next_attempt_ms, uncount, finished_ms) = match how {
        Finish::Processed { outcome } => (
            "processed",
            Some(*outcome),
            None,
            None,
            None,
            0,
            Some(now_ms),
        ),
        Finish::Retry {
            next_attempt_ms,
            error,
            counted,
        } => (
            "pending",
            None,
            None,
            Some(truncate(error, ERROR_TEXT_CHARS_MAX)),
            Some(*next_attempt_ms),
            if *counted { 0 } else { 1 },
            None,
        ),
        Finish::Dead { reason, error } => (
            "dead",
            None,
            Some(reason.as_str()),
            Some(truncate(error, ERROR_TEXT_CHARS_MAX)),
            None,
            0,
            Some(now_ms),
        ),
    };
    let sql = "update webhook_inbox set status = $3, outcome = $4, dead_reason = $5, \
               last_error = coalesce($6, last_error), \
               next_attempt_ms = coalesce($7, next_attempt_ms), attempts = attempts - $8, \
               finished_ms = $9, lease_owner = null, lease_expires_ms = null \
               where id = $1 and lease_owner = $2 and status = 'pending'";
    // The same binds on every backend and executor; only the owner's type differs.
    macro_rules! bound {
        ($sql:expr, $owner:expr) => {
            sqlx::query($sql)
                .bind(row)
                .bind($owner)
                .bind(status)
                .bind(outcome)
                .bind(dead_reason)
                .bind(error)
                .bind(next_attempt_ms)
                .bind(uncount)
                .bind(finished_ms)
        };
    }
    let sqlite_sql = sqlite(sql);
    let updated = match on {
        On::Tx(Tx::Postgres(tx)) => bound!(sql, owner).execute(&mut **tx).await?.rows_affected(),
        On::Tx(Tx::Sqlite(tx)) => bound!(&sqlite_sql, owner.to_string())
            .execute(&mut **tx)
            .await?
            .rows_affected(),
        On::Database(Database::Postgres(pool)) => {
            bound!(sql, owner).execute(pool).await?.rows_affected()
        }
        On::Database(Database::Sqlite(pool)) => bound!(&sqlite_sql, owner.to_string())
            .execute(pool)
            .await?
            .rows_affected(),
    };
    Ok(updated == 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn worker_config(base: i64, max: i64) -> WorkerConfig {
        WorkerConfig {
            backoff_base_ms: base,
            backoff_max_ms: max,
            ..WorkerConfig::default()
        }
    }

    #[test]
    fn backoff_doubles_and_is_capped() {
        let config = worker_config(500, 3_000);
        let delays: Vec<i64> = (1..=6).map(|a| backoff_ms(&config, a)).collect();
        assert_eq!(delays, [500, 1_000, 2_000, 3_000, 3_000, 3_000]);
        assert_eq!(backoff_ms(&config, i32::MAX), 3_000);
        assert_eq!(backoff_ms(&config, 0), 500);
        let huge = worker_config(i64::MAX / 2, i64::MAX);
        assert_eq!(backoff_ms(&huge, 40), i64::MAX);
    }
}
