//! Webhooks from providers: an inbox written by the HTTP handler and drained by a worker.
//!
//! Why the split: a provider waits a few seconds for our answer and redelivers (or gives up) on
//! anything but a 2xx, so the handler only does what must happen before the 200: verify the
//! signature over the raw bytes, parse the body, and store it, deduplicated by (provider, event
//! id), in one statement. All processing happens later in [`Worker`], which may fail and retry
//! without the provider noticing.
//!
//! The worker claims pending rows under a row lease (`for update skip locked` on PostgreSQL; on
//! SQLite the single write lock serialises claimers), takes the payment's lease
//! ([`crate::leases`]) so that no other worker, recovery or reconciler works on the same payment at
//! once, and applies the event through [`PaymentFlow::finalize_and`], the one path every provider
//! fact takes. The row is marked processed in the same transaction as the events it appends, and
//! only if this worker still holds the row: a row is processed exactly when its effect is recorded.
//!
//! Failures retry with exponential backoff (persisted as the row's `next_attempt_ms`, so a retry
//! survives a restart: that is why this is not a `backon` loop); after `attempts_max` the row is
//! dead-lettered and the payment flagged for review. An event for a payment we do not know is
//! retried for `unknown_payment_retry_ms` (the webhook may beat our own commit) and then
//! dead-lettered with reason `unknown_payment`: the reconciliation issue turns those rows
//! ([`dead_letters`]) into exceptions.
//!
//! **The payload is trusted as the fact, not fetched again.** Each event carries the charge as it
//! stood right after the change, and the domain already takes facts in any order: a capture before
//! its authorization, a cumulative refund total that posts only the difference, a dispute close
//! that stands for its open. Fetching the charge would add a provider round trip (and a provider
//! outage) to every event for no gain in correctness; the reconciler compares against the
//! provider's report anyway. Where one event implies an earlier one (a refund or a dispute implies
//! a capture of `amount_captured`), the implied facts are applied first, so a partial capture is
//! never guessed from the authorization.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::future::Future;
use std::str::FromStr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use asiento_domain::{PaymentCommand, PaymentId, ProviderFact, ProviderName};
use asiento_eventstore::{Database, StoreError, Tx};
use asiento_psp::{EventType, SignatureError, WebhookEvent};
/// The header carrying a webhook's signature, re-exported for the HTTP layer.
pub use asiento_psp::{SIGNATURE_HEADER, TOLERANCE_S_DEFAULT};
use sqlx::error::BoxDynError;
use sqlx::postgres::PgArguments;
use sqlx::Arguments;
use uuid::Uuid;

use crate::clock::Clock;
use crate::facts;
use crate::group_commit::{Committed, GroupCommit, GroupCommitError, Work};
use crate::leases;
use crate::log::{self, LogError};
use crate::payments::{Finalized, FlowError, InTransaction, LoadedPayment, PaymentFlow};

/// Provider event ids longer than this are refused as malformed (Stripe's are ~30 characters).
pub const EVENT_ID_LEN_MAX: usize = 255;
/// A charge reference longer than this cannot be one of our payment ids; it is not indexed.
pub const PAYMENT_REF_LEN_MAX: usize = 255;
/// Error texts kept on a row or put into a review note are cut to this many characters.
pub const ERROR_TEXT_CHARS_MAX: usize = 1_000;
/// A provider name from the URL is cut to this many characters before it appears in an error.
const PROVIDER_ECHO_CHARS_MAX: usize = 64;
/// How often the worker samples the inbox depth for the gauge.
const DEPTH_SAMPLE_MS: u64 = 1_000;
/// Exponents above this cannot change a delay capped at any sane maximum; bounds the shift.
const BACKOFF_DOUBLINGS_MAX: u32 = 30;

// ------------------------------------------------------------------------------------- secrets

/// Each provider's webhook signing secret. `Debug` never shows a secret.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct WebhookSecrets(BTreeMap<String, String>);

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SecretsError {
    #[error("webhook secret entry {index} is not `provider:secret`")]
    EntryMalformed { index: usize },
    #[error("webhook secret entry {index}: {name:?} is not a provider name")]
    ProviderNameInvalid { index: usize, name: String },
    #[error("webhook secret of provider {provider} is empty")]
    SecretEmpty { provider: String },
    #[error("provider {provider} has more than one webhook secret")]
    ProviderRepeated { provider: String },
}

impl WebhookSecrets {
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets (or replaces) one provider's secret, e.g. `--webhook-secret` for `sim`.
    pub fn set(&mut self, provider: &ProviderName, secret: &str) -> Result<(), SecretsError> {
        if secret.is_empty() {
            return Err(SecretsError::SecretEmpty {
                provider: provider.to_string(),
            });
        }
        self.0.insert(provider.to_string(), secret.to_owned());
        Ok(())
    }

    pub fn get(&self, provider: &str) -> Option<&str> {
        self.0.get(provider).map(String::as_str)
    }

    pub fn providers(&self) -> impl Iterator<Item = &str> {
        self.0.keys().map(String::as_str)
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// `name:secret,name:secret` (`ASIENTO_WEBHOOK_SECRETS`). The secret is everything after the
/// first `:`, so it may itself contain colons; it may not contain commas.
impl FromStr for WebhookSecrets {
    type Err = SecretsError;

    fn from_str(text: &str) -> Result<Self, SecretsError> {
        let mut secrets = WebhookSecrets::new();
        for (index, entry) in text.split(',').enumerate() {
            let entry = entry.trim();
            if entry.is_empty() {
                continue;
            }
            let (name, secret) = entry
                .split_once(':')
                .ok_or(SecretsError::EntryMalformed { index })?;
            let provider = ProviderName::parse(name.trim()).map_err(|_| {
                SecretsError::ProviderNameInvalid {
                    index,
                    name: name.trim().to_owned(),
                }
            })?;
            if secrets.get(provider.as_str()).is_some() {
                return Err(SecretsError::ProviderRepeated {
                    provider: provider.to_string(),
                });
            }
            secrets.set(&provider, secret.trim())?;
        }
        Ok(secrets)
    }
}

impl std::fmt::Debug for WebhookSecrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map()
            .entries(self.0.keys().map(|provider| (provider, "***")))
            .finish()
    }
}

// ------------------------------------------------------------------------------------- receive

/// What the HTTP handler needs: where to store, which secrets, which clock.
#[derive(Clone)]
pub struct WebhookReceiver {
    pub database: Database,
    /// Stores each verified event with other requests' steps (see `group_commit`).
    pub commits: Arc<GroupCommit>,
    pub secrets: WebhookSecrets,
    pub clock: Arc<dyn Clock>,
    /// How far the signature's timestamp may be from our clock, either way.
    pub tolerance_s: i64,
}

/// A verified event, stored (or found stored already).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Received {
    /// The provider sent this event id before: nothing was changed.
    pub duplicate: bool,
}

/// Why an event was refused (every client-fault variant stores nothing) or could not be stored.
#[derive(Debug, thiserror::Error)]
pub enum ReceiveError {
    #[error("no webhook secret is configured for provider {0:?}")]
    UnknownProvider(String),
    #[error("the {SIGNATURE_HEADER} header is missing or not text")]
    SignatureMissing,
    #[error("the signature's timestamp is outside the tolerance: {0}")]
    SignatureStale(SignatureError),
    #[error("the signature does not verify: {0}")]
    SignatureInvalid(SignatureError),
    #[error("the body is not a webhook event: {0}")]
    InvalidBody(String),
    #[error("storing the event failed: {0}")]
    Store(#[from] GroupCommitError),
}

impl ReceiveError {
    /// The stable problem code of a refusal; `internal_error` for our own failures.
    pub fn code(&self) -> &'static str {
        match self {
            ReceiveError::UnknownProvider(_) => "unknown_provider",
            ReceiveError::SignatureMissing | ReceiveError::SignatureInvalid(_) => {
                "signature_invalid"
            }
            ReceiveError::SignatureStale(_) => "signature_stale",
            ReceiveError::InvalidBody(_) => "invalid_body",
            ReceiveError::Store(_) => "internal_error",
        }
    }

    /// The sender's fault (answer 400), as opposed to ours (answer 500 so the provider retries).
    pub fn is_client_fault(&self) -> bool {
        !matches!(self, ReceiveError::Store(_))
    }
}

impl WebhookReceiver {
    /// Verifies and stores one delivery. Checks run cheapest and least trusting first: the
    /// provider must be configured, the signature must verify over the exact bytes, and only then
    /// is the body parsed.
    #[tracing::instrument(skip_all, fields(provider = %truncate(provider, PROVIDER_ECHO_CHARS_MAX)))]
    pub async fn receive(
        &self,
        provider: &str,
        signature: Option<&str>,
        body: &[u8],
    ) -> Result<Received, ReceiveError> {
        let result = self.receive_inner(provider, signature, body).await;
        let outcome = match &result {
            Ok(Received { duplicate: true }) => "duplicate",
            Ok(Received { duplicate: false }) => "stored",
            Err(error) => error.code(),
        };
        metrics::counter!("asiento_webhooks_received_total", "outcome" => outcome).increment(1);
        if let Err(error) = &result {
            if error.is_client_fault() {
                tracing::warn!(%error, "webhook refused");
            } else {
                tracing::error!(%error, "webhook could not be stored");
            }
        }
        result
    }

    async fn receive_inner(
        &self,
        provider: &str,
        signature: Option<&str>,
        body: &[u8],
    ) -> Result<Received, ReceiveError> {
        let secret = self.secrets.get(provider).ok_or_else(|| {
            ReceiveError::UnknownProvider(truncate(provider, PROVIDER_ECHO_CHARS_MAX))
        })?;
        let signature = signature.ok_or(ReceiveError::SignatureMissing)?;
        let now_ms = self.clock.now_ms();
        asiento_psp::verify(
            secret,
            signature,
            body,
            now_ms.div_euclid(1000),
            self.tolerance_s,
        )
        .map_err(|error| match error {
            SignatureError::TimestampOutsideTolerance { .. } => ReceiveError::SignatureStale(error),
            other => ReceiveError::SignatureInvalid(other),
        })?;
        let event: WebhookEvent = serde_json::from_slice(body)
            .map_err(|error| ReceiveError::InvalidBody(error.to_string()))?;
        if event.id.is_empty() || event.id.len() > EVENT_ID_LEN_MAX {
            return Err(ReceiveError::InvalidBody(format!(
                "the event id must be 1 to {EVENT_ID_LEN_MAX} bytes"
            )));
        }
        let payment_ref = event
            .data
            .charge
            .reference
            .as_deref()
            .filter(|reference| reference.len() <= PAYMENT_REF_LEN_MAX);
        let row = InboxRow {
            provider: provider.to_owned(),
            event_id: event.id.clone(),
            event_type: event.kind.as_str().to_owned(),
            payment_ref: payment_ref.map(str::to_owned),
            payload: body.to_vec(),
            now_ms,
        };
        let work = Work {
            inbox: Some(row),
            ..Work::default()
        };
        let duplicate = match self.commits.commit(work).await? {
            Committed::Written(_) => false,
            Committed::NotFresh => true,
            other => {
                return Err(ReceiveError::Store(GroupCommitError::Unexpected(format!(
                    "{other:?}"
                ))))
            }
        };
        Ok(Received { duplicate })
    }
}

/// A verified provider event, as the inbox stores it.
#[derive(Debug, Clone)]
pub struct InboxRow {
    pub provider: String,
    pub event_id: String,
    pub event_type: String,
    pub payment_ref: Option<String>,
    pub payload: Vec<u8>,
    pub now_ms: i64,
}

/// Stores each event not stored before, inside `tx`: `true` for those new, `false` for an event
/// id the provider sent before (or twice among `rows`). One statement on PostgreSQL.
pub async fn insert_inbox_each(tx: &mut Tx, rows: &[&InboxRow]) -> Result<Vec<bool>, sqlx::Error> {
    let conn = match tx {
        Tx::Postgres(conn) => conn,
        Tx::Sqlite(conn) => {
            // SQLite runs in process: a statement per row costs no round trip.
            let sql = "insert into webhook_inbox (provider, event_id, event_type, payment_ref, \
                       payload, next_attempt_ms, received_ms) values (?1, ?2, ?3, ?4, ?5, ?6, ?6) \
                       on conflict (provider, event_id) do nothing";
            let mut stored = Vec::with_capacity(rows.len());
            for row in rows {
                let inserted = sqlx::query(sql)
                    .bind(&row.provider)
                    .bind(&row.event_id)
                    .bind(&row.event_type)
                    .bind(row.payment_ref.as_deref())
                    .bind(&row.payload)
                    .bind(row.now_ms)
                    .execute(&mut **conn)
                    .await?
                    .rows_affected();
                stored.push(inserted == 1);
            }
            return Ok(stored);
        }
    };
    let mut arguments = PgArguments::default();
    add_inbox(&mut arguments, rows).map_err(sqlx::Error::Encode)?;
    let sql = format!(
        "WITH {} SELECT provider, event_id FROM stored",
        inbox_cte(1)
    );
    let stored: Vec<(String, String)> = sqlx::query_as_with(&sql, arguments)
        .fetch_all(&mut **conn)
        .await?;
    Ok(stored_each(rows, stored))
}

/// The CTE `stored` (without `WITH`): stores each event of [`add_inbox`]'s six arrays, read from
/// `$first` on, unless stored before, `RETURNING provider, event_id` of those new. Rows go in by
/// event id (one lock order for concurrent batches), then in the order given: of two rows with
/// one event id the first is the one stored.
pub(crate) fn inbox_cte(first: usize) -> String {
    let p: Vec<usize> = (first..first + 6).collect();
    format!(
        "stored AS (insert into webhook_inbox (provider, event_id, event_type, payment_ref, \
         payload, next_attempt_ms, received_ms) \
         select p, e, t, r, b, n, n from unnest(${}::text[], ${}::text[], ${}::text[], \
         ${}::text[], ${}::bytea[], ${}::int8[]) with ordinality as u(p, e, t, r, b, n, i) \
         order by p, e, i on conflict (provider, event_id) do nothing \
         returning provider, event_id)",
        p[0], p[1], p[2], p[3], p[4], p[5]
    )
}

/// Adds the rows, as [`inbox_cte`] reads them, to `arguments`.
pub(crate) fn add_inbox(
    arguments: &mut PgArguments,
    rows: &[&InboxRow],
) -> Result<(), BoxDynError> {
    let text = |f: &dyn Fn(&InboxRow) -> &str| rows.iter().map(|r| f(r)).collect::<Vec<&str>>();
    arguments.add(text(&|r| &r.provider))?;
    arguments.add(text(&|r| &r.event_id))?;
    arguments.add(text(&|r| &r.event_type))?;
    arguments.add(
        rows.iter()
            .map(|r| r.payment_ref.as_deref())
            .collect::<Vec<_>>(),
    )?;
    arguments.add(rows.iter().map(|r| &r.payload[..]).collect::<Vec<_>>())?;
    arguments.add(rows.iter().map(|r| r.now_ms).collect::<Vec<_>>())
}

/// For each of `rows`, whether `stored` (what `stored` returned) holds it: of two rows with one
/// event id, only the first.
pub(crate) fn stored_each(rows: &[&InboxRow], stored: Vec<(String, String)>) -> Vec<bool> {
    let mut new: HashSet<(String, String)> = stored.into_iter().collect();
    rows.iter()
        .map(|r| new.remove(&(r.provider.clone(), r.event_id.clone())))
        .collect()
}

// ------------------------------------------------------------------------------ events → facts

/// The facts an event stands for, in the order to apply them: the ones it implies first (a refund
/// or a dispute implies the capture of `amount_captured`), the event's own fact last. Empty for an
/// event type we do not know (acknowledged and ignored) or a dispute event without its dispute.
pub fn facts_from_event(event: &WebhookEvent) -> Vec<ProviderFact> {
    match event.kind {
        EventType::Unknown => Vec::new(),
        // An operation's update is that operation's outcome, then what its charge now stands for.
        EventType::OperationUpdated => {
            let mut facts = Vec::with_capacity(4);
            if let Some(op) = &event.data.operation {
                facts.extend(facts::operation_fact(op));
            }
            facts.extend(facts::charge_facts(&event.data.charge));
            facts
        }
        // The charge as it stands after the change is the fact; the type only says which change.
        _ => facts::charge_facts(&event.data.charge),
    }
}

// -------------------------------------------------------------------------------------- worker

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
#[derive(Debug, Clone)]
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
        let mut rest: Vec<(&Row, Result<WebhookEvent, serde_json::Error>)> = Vec::new();
        for row in &rows {
            let event = serde_json::from_slice(&row.payload);
            match &event {
                Ok(event) if self.remembered_reflects(row, event) => reflected.push(row),
                _ => rest.push((row, event)),
            }
        }
        let events: Vec<&Result<WebhookEvent, serde_json::Error>> =
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

    /// Whether a payment state this process committed already reflects `event` (then the row is
    /// only marked, as when a read shows it reflected). `false` tells nothing: the log decides.
    fn remembered_reflects(&self, row: &Row, event: &WebhookEvent) -> bool {
        let Some(id) = event
            .data
            .charge
            .reference
            .as_deref()
            .and_then(|reference| PaymentId::parse(reference).ok())
        else {
            return false;
        };
        let Some(payment) = self.flow.committed.recall(id) else {
            return false;
        };
        let provider_matches = payment
            .record
            .as_ref()
            .is_some_and(|record| record.provider.as_str() == row.provider);
        let facts = facts_from_event(event);
        provider_matches
            && !facts.is_empty()
            && matches!(self.flow.reflects(&payment, &facts), Ok(true))
    }

    /// The payments the batch's events name, read together before any row is processed. If
    /// that fails, each row reads its payment itself.
    async fn load_payments(
        &self,
        events: &[&Result<WebhookEvent, serde_json::Error>],
    ) -> HashMap<PaymentId, LoadedPayment> {
        let ids: Vec<PaymentId> = events
            .iter()
            .filter_map(|event| event.as_ref().ok())
            .filter_map(|event| PaymentId::parse(event.data.charge.reference.as_deref()?).ok())
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
        use sqlx::Row as _;
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
                let found = sqlx::query(&sql)
                    .bind(self.owner)
                    .bind(expires_ms)
                    .bind(now_ms)
                    .bind(limit)
                    .fetch_all(&mut *tx)
                    .await?;
                tx.commit().await?;
                found
                    .iter()
                    .map(|row| -> Result<Row, sqlx::Error> {
                        Ok(Row {
                            id: row.try_get("id")?,
                            provider: row.try_get("provider")?,
                            event_id: row.try_get("event_id")?,
                            payload: row.try_get("payload")?,
                            attempts: row.try_get("attempts")?,
                            received_ms: row.try_get("received_ms")?,
                        })
                    })
                    .collect::<Result<Vec<_>, _>>()?
            }
            Database::Sqlite(pool) => {
                // No `skip locked`: the statement takes the one write lock, which serialises
                // claimers as well.
                let sql = sqlite(&format!(
                    "update webhook_inbox set lease_owner = $1, lease_expires_ms = $2, \
                     attempts = attempts + 1 where id in ({pick}) {returning}"
                ));
                let found = sqlx::query(&sql)
                    .bind(self.owner.to_string())
                    .bind(expires_ms)
                    .bind(now_ms)
                    .bind(limit)
                    .fetch_all(pool)
                    .await?;
                found
                    .iter()
                    .map(|row| -> Result<Row, sqlx::Error> {
                        Ok(Row {
                            id: row.try_get("id")?,
                            provider: row.try_get("provider")?,
                            event_id: row.try_get("event_id")?,
                            payload: row.try_get("payload")?,
                            attempts: row.try_get("attempts")?,
                            received_ms: row.try_get("received_ms")?,
                        })
                    })
                    .collect::<Result<Vec<_>, _>>()?
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
        event: Result<WebhookEvent, serde_json::Error>,
        payments: &mut HashMap<PaymentId, LoadedPayment>,
    ) -> Result<Done, WorkerError> {
        let now_ms = self.flow.clock.now_ms();
        let event = match event {
            Ok(event) => event,
            Err(error) => {
                return self
                    .bury(row, DeadReason::InvalidPayload, &error.to_string())
                    .await
            }
        };
        let facts = facts_from_event(&event);
        if facts.is_empty() {
            tracing::info!(
                kind = event.kind.as_str(),
                "webhook event acknowledged and ignored"
            );
            return self
                .finish_alone(row, Finish::Processed { outcome: "ignored" })
                .await
                .map(|kept| if kept { Done::Ignored } else { Done::Lost });
        }
        let reference = event.data.charge.reference.as_deref().unwrap_or_default();
        let Ok(payment) = PaymentId::parse(reference) else {
            let error = format!(
                "charge {} carries no payment reference",
                event.data.charge.id
            );
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
        if let Some(misfit) = facts::charge_misfit(record, &event.data.charge) {
            let error = format!(
                "charge {} does not fit payment {payment}: {} ({})",
                event.data.charge.id, misfit.kind, misfit.fingerprint
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
                let next_attempt_ms = now_ms.saturating_add(self.config.lease_busy_retry_ms);
                return self
                    .finish_alone(
                        row,
                        Finish::Retry {
                            next_attempt_ms,
                            error: "payment lease held by another worker",
                            counted: false,
                        },
                    )
                    .await
                    .map(|kept| if kept { Done::Deferred } else { Done::Lost });
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
                .finalize_loaded(loaded.take(), payment, Some(fact), None)
                .await?;
        }
        let mark = FinishRow {
            row: row.id,
            owner: self.owner,
            clock: self.flow.clock.as_ref(),
            how: Finish::Processed { outcome: "applied" },
        };
        self.flow
            .finalize_loaded(loaded, payment, Some(last), Some(&mark))
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
        match self.flow.apply_and(payment, command, &bury).await {
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

// -------------------------------------------------------------------------------------- queries

/// Rows of the inbox by status.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct InboxCounts {
    pub pending: i64,
    pub processed: i64,
    pub dead: i64,
}

/// Rows waiting to be processed, read from the pending rows' own index: the worker samples it
/// every second, so it must not scan the processed ones, which only ever grow.
pub async fn pending_count(database: &Database) -> Result<i64, sqlx::Error> {
    let sql = "select count(*) from webhook_inbox where status = 'pending'";
    match database {
        Database::Postgres(pool) => sqlx::query_scalar(sql).fetch_one(pool).await,
        Database::Sqlite(pool) => sqlx::query_scalar(sql).fetch_one(pool).await,
    }
}

/// The inbox's rows by status (a full count: for tools and tests, not for a loop).
pub async fn inbox_counts(database: &Database) -> Result<InboxCounts, sqlx::Error> {
    let sql = "select status, count(*) from webhook_inbox group by status";
    let rows: Vec<(String, i64)> = match database {
        Database::Postgres(pool) => sqlx::query_as(sql).fetch_all(pool).await?,
        Database::Sqlite(pool) => sqlx::query_as(sql).fetch_all(pool).await?,
    };
    let mut counts = InboxCounts::default();
    for (status, count) in rows {
        match status.as_str() {
            "pending" => counts.pending = count,
            "processed" => counts.processed = count,
            _ => counts.dead += count,
        }
    }
    Ok(counts)
}

/// One dead-lettered event, as the reconciliation (or a person) reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetter {
    pub id: i64,
    pub provider: String,
    pub event_id: String,
    pub event_type: String,
    /// The charge's reference as sent (our payment id, when it is one).
    pub payment_ref: Option<String>,
    pub reason: String,
    pub last_error: Option<String>,
    pub attempts: i32,
    pub received_ms: i64,
    pub finished_ms: Option<i64>,
}

/// The most rows [`dead_letters`] returns in one call.
pub const DEAD_LETTERS_PAGE_MAX: i64 = 1_000;

/// Dead letters with `reason` (all when `None`), oldest first, after inbox id `after`.
pub async fn dead_letters(
    database: &Database,
    reason: Option<DeadReason>,
    after: i64,
    limit: i64,
) -> Result<Vec<DeadLetter>, sqlx::Error> {
    let sql = "select id, provider, event_id, event_type, payment_ref, dead_reason, last_error, \
               attempts, received_ms, finished_ms from webhook_inbox \
               where status = 'dead' and ($1 is null or dead_reason = $1) and id > $2 \
               order by id limit $3";
    let reason = reason.map(DeadReason::as_str);
    let limit = limit.clamp(0, DEAD_LETTERS_PAGE_MAX);
    type Raw = (
        i64,
        String,
        String,
        String,
        Option<String>,
        String,
        Option<String>,
        i32,
        i64,
        Option<i64>,
    );
    let rows: Vec<Raw> = match database {
        Database::Postgres(pool) => {
            // PostgreSQL needs the parameter's type where it is only compared with null.
            let sql = sql.replace("$1 is null", "$1::text is null");
            sqlx::query_as(&sql)
                .bind(reason)
                .bind(after)
                .bind(limit)
                .fetch_all(pool)
                .await?
        }
        Database::Sqlite(pool) => {
            sqlx::query_as(&sqlite(sql))
                .bind(reason)
                .bind(after)
                .bind(limit)
                .fetch_all(pool)
                .await?
        }
    };
    Ok(rows
        .into_iter()
        .map(
            |(
                id,
                provider,
                event_id,
                event_type,
                payment_ref,
                reason,
                last_error,
                attempts,
                received_ms,
                finished_ms,
            )| {
                DeadLetter {
                    id,
                    provider,
                    event_id,
                    event_type,
                    payment_ref,
                    reason,
                    last_error,
                    attempts,
                    received_ms,
                    finished_ms,
                }
            },
        )
        .collect())
}

/// One SQL text for both backends: PostgreSQL's `$n` placeholders become SQLite's `?n` (both are
/// positional by number). Only for statements without `$` anywhere else.
fn sqlite(sql: &str) -> String {
    sql.replace('$', "?")
}

fn truncate(text: &str, chars_max: usize) -> String {
    text.chars().take(chars_max).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_parse_several_providers_and_hide_them() {
        let secrets: WebhookSecrets = "sim:whsec_a, other:whsec:b:c,".parse().unwrap();
        assert_eq!(secrets.get("sim"), Some("whsec_a"));
        assert_eq!(secrets.get("other"), Some("whsec:b:c"));
        assert_eq!(secrets.get("nope"), None);
        let shown = format!("{secrets:?}");
        assert!(!shown.contains("whsec"), "{shown}");
        assert!(shown.contains("sim"), "{shown}");
    }

    #[test]
    fn secrets_refuse_what_is_not_name_colon_secret() {
        let cases: [(&str, SecretsError); 4] = [
            ("sim", SecretsError::EntryMalformed { index: 0 }),
            (
                "sim:a,Bad Name:b",
                SecretsError::ProviderNameInvalid {
                    index: 1,
                    name: "Bad Name".into(),
                },
            ),
            (
                "sim:",
                SecretsError::SecretEmpty {
                    provider: "sim".into(),
                },
            ),
            (
                "sim:a,sim:b",
                SecretsError::ProviderRepeated {
                    provider: "sim".into(),
                },
            ),
        ];
        for (text, expected) in cases {
            assert_eq!(text.parse::<WebhookSecrets>(), Err(expected), "{text}");
        }
    }

    #[test]
    fn sqlite_placeholders_are_numbered_the_same() {
        assert_eq!(sqlite("a = $1 and b = $12"), "a = ?1 and b = ?12");
    }

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
