//! The invariant checker (`asiento verify`, and on a schedule inside `serve`) and the sealer that
//! makes the log tamper-evident.
//!
//! [`Checker::check_once`] reads the whole log (in the gap-free global order, or in passes that
//! keep its memory bounded: `scan.rs`), and checks:
//! - every journal entry sums to zero per currency (`entry_zero_sum`, named by entry id);
//! - stream versions run 1, 2, 3 … without a gap or a repeat (`stream_versions`, by stream);
//! - every captured payment has exactly one capture posting, and no other payment has one
//!   (`capture_posting`, by payment);
//! - every client account's debit guard holds the balance its entries sum to, and every client
//!   account with entries has a guard (`guard_balance`, by tenant:account:currency): the guard
//!   is what refuses an overdraft, so a guard that drifted from the ledger would refuse wrongly;
//! - the hash chain of every stream matches its seals (`hash_chain`, by stream, version and
//!   position): an edited event breaks the hash of the first seal at or after it, a deleted one
//!   breaks contiguity or leaves a seal without its event;
//! - no idempotency record is in flight past its lease by more than the grace the reconciler
//!   needs to finish it (`idempotency_lease`, by tenant/method/route/key);
//! - the events table still refuses UPDATE and DELETE (`events_immutable`), tried inside a
//!   transaction that is always rolled back;
//! - payouts post their lines, and a payment paid out in full has nothing left in clearing
//!   (`payout_share`, `payout_clearing`: `payouts.rs`).
//!
//! Checks that need a read model (snapshots equal recomputation, the payment list equals the fold
//! of each stream) live with their projections; the binary passes them in as [`ExtraCheck`]s, so
//! this crate does not depend on projections (the dependency points inward).
//!
//! Every completed run, serve's scheduled ones ([`Checker::run`]) and `asiento verify`'s
//! ([`Checker::check_and_record`]), is stored in `verify_runs`, the newest 100 kept
//! (`runs.rs`); [`last_run`] reads the newest.
//!
//! **The seal chain.** hash(event) = SHA-256(hash of the stream's previous event, or 32 zero
//! bytes ‖ SHA-256 of the canonical JSON of (stream id, version, event id, type, schema, data,
//! metadata)). The [`Sealer`] writes seals off the append path (the append hot path is
//! untouched), under the `sealer` job lease, only ever for events after its cursor: a seal is
//! never recomputed, so a tampered log cannot re-seal itself. It chains every event it passes but
//! stores one seal per stream per batch, the hash at the stream's last event in the batch: that
//! hash covers every event of the stream up to it, so an event changed anywhere before it breaks
//! it (the checker names the seal's version; the changed event is at or before it, after the
//! stream's previous seal). One row per stream and batch instead of one per event: under load a
//! payment's events mostly fall into one batch. Logs sealed event by event (before 2026-11-30)
//! are the case of one-event ranges. The residual window: an event
//! appended since the sealer's last pass (at most one sealer interval, 250 ms by default) has
//! no seal yet, and an edit made inside that window would be sealed as written. Closing it would
//! mean hashing inside the append transaction, which the event-log benchmark forbids; the checker
//! reports how many events are still unsealed so the window is visible.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use asiento_eventstore::{Cursor, Database, EventStore, RecordedEvent, Tx};
use serde_json::json;
use sha2::{Digest, Sha256};
use uuid::Uuid;

mod payouts;
mod runs;
mod scan;

pub use runs::{last_run, record, RunViolation, VerifyRun, RUNS_KEPT_MAX};

use crate::clock::Clock;
use crate::idempotency::canonical_body_hash;
use crate::reconcile::{acquire_job, release_job};

/// The job lease the sealer holds.
pub const SEALER_JOB: &str = "sealer";
/// Events read per batch by the checker and the sealer.
pub const EVENTS_PER_BATCH_MAX: usize = 1_000;
/// How often `serve` seals new events. Short, for a small unsealed window, and so that the sealer
/// reads the new events while they are still in the store's cache of the log's tail (at 1 s it
/// fell behind that window under load and read ≈ 40 % of the log a second time from the
/// database).
pub const SEAL_INTERVAL_MS_DEFAULT: u64 = 250;
/// How long the sealer holds its job lease; renewed every interval and every batch, so a killed
/// sealer's successor takes over within this time.
pub const SEAL_LEASE_MS_DEFAULT: i64 = 10_000;
/// How often `serve` runs every check.
pub const VERIFY_INTERVAL_MS_DEFAULT: u64 = 10 * 60_000;
/// How long an idempotency record may stay in flight past its lease before it is a violation: the
/// pending timeout plus a sweep interval (API.md defaults), the time the reconciler needs to
/// finish a request whose process died.
pub const IDEMPOTENCY_GRACE_MS_DEFAULT: i64 = 16 * 60_000;
/// Streams one pass of the log scan keeps state for: ≈ 0.5 KB each in `serve` (their tallies and
/// ids), so a pass holds ≈ 4 MB at most. A log with more streams is read in several passes that
/// together read it about twice, whatever their number, and each pass reads every payout event
/// again (`scan.rs`).
pub const STREAMS_PER_PASS_MAX_DEFAULT: usize = 8_192;
/// Violations reported per check, at most; the count says how many more there were.
pub const VIOLATIONS_PER_CHECK_MAX: usize = 1_000;

/// The checks, named as the metric label `asiento_invariant_violations{check="…"}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Check {
    EntryZeroSum,
    Snapshot,
    CapturePosting,
    GuardBalance,
    PaymentReadModel,
    /// A transfers read-model row differs from the fold of its stream.
    TransferReadModel,
    /// The merchant events feed differs from its derivation from the log.
    MerchantEvents,
    /// The payment search index differs from its derivation from the log.
    PaymentSearch,
    StreamVersions,
    IdempotencyLease,
    EventsImmutable,
    HashChain,
    /// A stored event that no longer decodes.
    Undecodable,
    PayoutShare,
    PayoutClearing,
}

impl Check {
    pub const ALL: [Check; 15] = [
        Check::EntryZeroSum,
        Check::Snapshot,
        Check::CapturePosting,
        Check::GuardBalance,
        Check::PaymentReadModel,
        Check::TransferReadModel,
        Check::MerchantEvents,
        Check::PaymentSearch,
        Check::StreamVersions,
        Check::IdempotencyLease,
        Check::EventsImmutable,
        Check::HashChain,
        Check::Undecodable,
        Check::PayoutShare,
        Check::PayoutClearing,
    ];

    pub const fn as_str(self) -> &'static str {
        match self {
            Check::EntryZeroSum => "entry_zero_sum",
            Check::Snapshot => "snapshot",
            Check::CapturePosting => "capture_posting",
            Check::GuardBalance => "guard_balance",
            Check::PaymentReadModel => "payment_read_model",
            Check::TransferReadModel => "transfer_read_model",
            Check::MerchantEvents => "merchant_events",
            Check::PaymentSearch => "payment_search",
            Check::StreamVersions => "stream_versions",
            Check::IdempotencyLease => "idempotency_lease",
            Check::EventsImmutable => "events_immutable",
            Check::HashChain => "hash_chain",
            Check::Undecodable => "undecodable",
            Check::PayoutShare => "payout_share",
            Check::PayoutClearing => "payout_clearing",
        }
    }
}

impl fmt::Display for Check {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One broken invariant: which check, what it is about (entry id, stream id, snapshot key…), and
/// what is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    pub check: Check,
    pub subject: String,
    pub detail: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}: {}", self.check, self.subject, self.detail)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum InvariantError {
    #[error("invariant query failed: {0}")]
    Database(#[from] sqlx::Error),
    #[error(transparent)]
    Store(#[from] asiento_eventstore::StoreError),
    #[error("the {check} check could not run: {message}")]
    Extra { check: Check, message: String },
    /// A stored run that does not read back (a hand edit or a bug).
    #[error("verify run {id} is corrupt: {reason}")]
    CorruptRun { id: i64, reason: String },
    #[error("stream {stream_id} cannot be sealed: version {version} follows sealed {sealed}")]
    Unsealable {
        stream_id: String,
        version: u64,
        sealed: u64,
    },
}

/// What an [`ExtraCheck`] answers: its violations, or why it could not run.
pub type ExtraFuture<'a> =
    std::pin::Pin<Box<dyn Future<Output = Result<Vec<Violation>, String>> + Send + 'a>>;

/// A check that lives outside this crate (read models): the binary passes it in. A boxed future
/// rather than an async-trait, so implementers need no macro crate.
pub trait ExtraCheck: Send + Sync {
    fn check(&self) -> Check;
    fn violations<'a>(&'a self, database: &'a Database) -> ExtraFuture<'a>;
}

/// What a run found.
#[derive(Debug, Clone, Default)]
pub struct Report {
    pub violations: Vec<Violation>,
    /// Violations beyond [`VIOLATIONS_PER_CHECK_MAX`] per check, not listed.
    pub omitted: BTreeMap<Check, usize>,
    pub events_checked: u64,
    pub streams_checked: u64,
    /// Events after the sealer's cursor: not covered by the hash chain yet.
    pub unsealed: u64,
    /// Passes the log scan took (one per [`Checker::streams_per_pass`] streams, and one or more
    /// for the guards when there are more streams than that).
    pub passes: u64,
    /// Events the log scan read, counted each time a pass read one: about twice the log's
    /// length, plus its payout events once per pass, when it took more than one pass.
    pub events_read: u64,
}

impl Report {
    pub fn is_ok(&self) -> bool {
        self.violations.is_empty()
    }

    pub fn count(&self, check: Check) -> usize {
        self.violations.iter().filter(|v| v.check == check).count()
            + self.omitted.get(&check).copied().unwrap_or(0)
    }

    fn push(&mut self, check: Check, subject: impl Into<String>, detail: impl Into<String>) {
        if self.violations.iter().filter(|v| v.check == check).count() >= VIOLATIONS_PER_CHECK_MAX {
            *self.omitted.entry(check).or_default() += 1;
            return;
        }
        self.violations.push(Violation {
            check,
            subject: subject.into(),
            detail: detail.into(),
        });
    }

    /// Sets `asiento_invariant_violations{check}` for every check.
    pub fn export_metrics(&self) {
        for check in Check::ALL {
            metrics::gauge!("asiento_invariant_violations", "check" => check.as_str())
                .set(self.count(check) as f64);
        }
        metrics::gauge!("asiento_events_unsealed").set(self.unsealed as f64);
    }
}

/// The hash of one event given its stream's previous hash.
pub fn event_hash(previous: Option<&[u8]>, event: &RecordedEvent) -> [u8; 32] {
    let canonical = canonical_body_hash(&json!({
        "stream_id": event.stream_id,
        "version": event.version,
        "event_id": event.event_id,
        "event_type": event.event_type,
        "schema": event.schema,
        "data": event.data,
        "metadata": event.metadata,
    }));
    let mut hasher = Sha256::new();
    hasher.update(previous.unwrap_or(&[0u8; 32]));
    hasher.update(canonical.0);
    hasher.finalize().into()
}

fn sqlite(sql: &str) -> String {
    sql.replace('$', "?")
}

async fn seal_cursor(database: &Database) -> Result<Cursor, sqlx::Error> {
    let sql = "select xact, position from event_seal_cursor where id = 1";
    let row: Option<(i64, i64)> = match database {
        Database::Postgres(pool) => sqlx::query_as(sql).fetch_optional(pool).await?,
        Database::Sqlite(pool) => sqlx::query_as(sql).fetch_optional(pool).await?,
    };
    Ok(row.map_or(Cursor::START, |(xact, position)| {
        Cursor::new(xact, position)
    }))
}

/// Seals at the given positions: position → (stream id, version, hash).
async fn seals_at(
    database: &Database,
    positions: &[i64],
) -> Result<HashMap<i64, (String, i64, Vec<u8>)>, sqlx::Error> {
    type Row = (i64, String, i64, Vec<u8>);
    let rows: Vec<Row> = match database {
        Database::Postgres(pool) => {
            sqlx::query_as(
                "select position, stream_id, version, hash from event_seals \
                 where position = any($1)",
            )
            .bind(positions)
            .fetch_all(pool)
            .await?
        }
        Database::Sqlite(pool) => {
            let list = serde_json::to_string(positions).unwrap_or_else(|_| "[]".to_owned());
            sqlx::query_as(
                "select position, stream_id, version, hash from event_seals \
                 where position in (select value from json_each(?1))",
            )
            .bind(list)
            .fetch_all(pool)
            .await?
        }
    };
    Ok(rows
        .into_iter()
        .map(|(position, stream, version, hash)| (position, (stream, version, hash)))
        .collect())
}

/// Runs every check.
pub struct Checker {
    pub database: Database,
    pub clock: Arc<dyn Clock>,
    pub idempotency_grace_ms: i64,
    /// Streams one pass over the log keeps state for (`scan.rs`).
    pub streams_per_pass: usize,
    pub extra: Vec<Arc<dyn ExtraCheck>>,
}

impl Checker {
    pub fn new(database: Database, clock: Arc<dyn Clock>) -> Self {
        Checker {
            database,
            clock,
            idempotency_grace_ms: IDEMPOTENCY_GRACE_MS_DEFAULT,
            streams_per_pass: STREAMS_PER_PASS_MAX_DEFAULT,
            extra: Vec::new(),
        }
    }

    pub fn with(mut self, check: Arc<dyn ExtraCheck>) -> Self {
        self.extra.push(check);
        self
    }

    /// Every check, once. A violation is a finding, not an error: errors are checks that could
    /// not run.
    pub async fn check_once(&self) -> Result<Report, InvariantError> {
        let mut report = Report::default();
        self.scan_log(&mut report).await?;
        self.check_orphan_seals(&mut report).await?;
        self.check_idempotency(&mut report).await?;
        self.check_immutable(&mut report).await?;
        for extra in &self.extra {
            let found = extra.violations(&self.database).await.map_err(|message| {
                InvariantError::Extra {
                    check: extra.check(),
                    message,
                }
            })?;
            for violation in found {
                report.push(violation.check, violation.subject, violation.detail);
            }
        }
        Ok(report)
    }

    /// A seal whose event is gone: the event was deleted.
    async fn check_orphan_seals(&self, report: &mut Report) -> Result<(), InvariantError> {
        let sql = "select s.position, s.stream_id, s.version from event_seals s \
                   left join events e on e.position = s.position \
                   where e.position is null order by s.position limit $1";
        let limit = i64::try_from(VIOLATIONS_PER_CHECK_MAX).unwrap_or(i64::MAX);
        let rows: Vec<(i64, String, i64)> = match &self.database {
            Database::Postgres(pool) => sqlx::query_as(sql).bind(limit).fetch_all(pool).await?,
            Database::Sqlite(pool) => {
                sqlx::query_as(&sqlite(sql))
                    .bind(limit)
                    .fetch_all(pool)
                    .await?
            }
        };
        for (position, stream, version) in rows {
            report.push(
                Check::HashChain,
                stream,
                format!("version {version} (position {position}) was sealed and is gone"),
            );
        }
        Ok(())
    }

    async fn check_idempotency(&self, report: &mut Report) -> Result<(), InvariantError> {
        let before_ms = self
            .clock
            .now_ms()
            .saturating_sub(self.idempotency_grace_ms);
        let sql = "select tenant, method, route, key, lease_expires_ms from idempotency_keys \
                   where state = 'in_flight' and lease_expires_ms < $1 \
                   order by lease_expires_ms limit $2";
        let limit = i64::try_from(VIOLATIONS_PER_CHECK_MAX).unwrap_or(i64::MAX);
        type Row = (String, String, String, String, i64);
        let rows: Vec<Row> = match &self.database {
            Database::Postgres(pool) => {
                sqlx::query_as(sql)
                    .bind(before_ms)
                    .bind(limit)
                    .fetch_all(pool)
                    .await?
            }
            Database::Sqlite(pool) => {
                sqlx::query_as(&sqlite(sql))
                    .bind(before_ms)
                    .bind(limit)
                    .fetch_all(pool)
                    .await?
            }
        };
        for (tenant, method, route, key, expires_ms) in rows {
            report.push(
                Check::IdempotencyLease,
                format!("{tenant} {method} {route} {key}"),
                format!("in flight; its lease ran out at {expires_ms} ms"),
            );
        }
        Ok(())
    }

    /// Tries an UPDATE and a DELETE of the first event inside a transaction that is always rolled
    /// back: both must be refused.
    async fn check_immutable(&self, report: &mut Report) -> Result<(), InvariantError> {
        for (operation, sql) in [
            (
                "UPDATE",
                "update events set event_type = event_type \
                 where position = (select min(position) from events)",
            ),
            (
                "DELETE",
                "delete from events where position = (select min(position) from events)",
            ),
        ] {
            let mut tx = self.database.begin().await?;
            let (outcome, empty) = match &mut tx {
                Tx::Postgres(tx) => (sqlx::query(sql).execute(&mut **tx).await.map(|_| ()), false),
                Tx::Sqlite(tx) => {
                    // Row triggers: an empty log has no row to try them on.
                    let count: i64 = sqlx::query_scalar("select count(*) from events")
                        .fetch_one(&mut **tx)
                        .await?;
                    (
                        sqlx::query(sql).execute(&mut **tx).await.map(|_| ()),
                        count == 0,
                    )
                }
            };
            tx.rollback().await?;
            if outcome.is_ok() && !empty {
                report.push(
                    Check::EventsImmutable,
                    "events",
                    format!("the events table accepted {operation}"),
                );
            }
        }
        Ok(())
    }

    /// Every check, once, and the run stored (`verify_runs`): what `asiento verify` does. Fails
    /// if the run cannot be stored.
    pub async fn check_and_record(&self) -> Result<Report, InvariantError> {
        let started_ms = self.clock.now_ms();
        let report = self.check_once().await?;
        record(&self.database, &report, started_ms, self.clock.now_ms()).await?;
        Ok(report)
    }

    /// Runs every check every `interval` until `shutdown`, exporting the counts as
    /// `asiento_invariant_violations{check}`, logging each violation and storing each completed
    /// run (a run that could not be stored is logged; its counts are exported all the same).
    pub async fn run(&self, interval: Duration, shutdown: impl Future<Output = ()>) {
        tokio::pin!(shutdown);
        loop {
            let started_ms = self.clock.now_ms();
            match self.check_once().await {
                Ok(report) => {
                    report.export_metrics();
                    for violation in &report.violations {
                        tracing::error!(%violation, "invariant violated");
                    }
                    let finished_ms = self.clock.now_ms();
                    if let Err(error) =
                        record(&self.database, &report, started_ms, finished_ms).await
                    {
                        tracing::error!(%error, "the invariant run could not be stored");
                    }
                }
                Err(error) => tracing::error!(%error, "invariant checks could not run"),
            }
            tokio::select! {
                () = &mut shutdown => break,
                () = tokio::time::sleep(interval) => {}
            }
        }
    }
}

/// The newest seal of each stream in `$1` (PostgreSQL): one backward probe of the `(stream_id,
/// version)` index per stream. A stream's seals only grow (one per sealing batch that touches
/// it, so a customer's or a provider account's stream gathers thousands), and a read of every
/// seal of each stream would make each batch slower than the last.
pub const SEAL_HEADS_SQL: &str = "select s.stream_id, h.version, h.hash \
     from unnest($1::text[]) as s(stream_id) \
     cross join lateral (select e.version, e.hash from event_seals e \
     where e.stream_id = s.stream_id order by e.version desc limit 1) h";

/// Writes the seals of new events (see the module docs).
pub struct Sealer {
    pub database: Database,
    /// One store for the sealer's life: on PostgreSQL it keeps its own connections.
    store: Arc<dyn EventStore>,
    pub clock: Arc<dyn Clock>,
    /// Fresh per sealer: the job lease it holds carries it.
    pub owner: Uuid,
    pub interval_ms: u64,
    pub lease_ms: i64,
}

impl Sealer {
    pub fn new(database: Database, clock: Arc<dyn Clock>) -> Self {
        Sealer {
            store: database.event_store(),
            database,
            clock,
            owner: Uuid::new_v4(),
            interval_ms: SEAL_INTERVAL_MS_DEFAULT,
            lease_ms: SEAL_LEASE_MS_DEFAULT,
        }
    }

    /// Reads through `store` instead of a store of its own: a process's readers that share one
    /// store share its cache of the newest events (one database read for all of them).
    #[must_use]
    pub fn with_store(mut self, store: Arc<dyn EventStore>) -> Self {
        self.store = store;
        self
    }

    pub async fn run(&self, shutdown: impl Future<Output = ()>) {
        tokio::pin!(shutdown);
        let interval = Duration::from_millis(self.interval_ms.max(1));
        loop {
            if let Err(error) = self.seal_once().await {
                tracing::error!(%error, "sealing failed");
                metrics::counter!("asiento_seal_failures_total").increment(1);
            }
            tokio::select! {
                () = &mut shutdown => break,
                () = tokio::time::sleep(interval) => {}
            }
        }
        if let Err(error) = release_job(&self.database, SEALER_JOB, self.owner).await {
            tracing::warn!(%error, "sealer lease not released; it runs out by itself");
        }
    }

    /// Takes or renews the sealer's job lease; `false` when another sealer holds it.
    async fn hold_lease(&self) -> Result<bool, InvariantError> {
        let now_ms = self.clock.now_ms();
        let held = acquire_job(
            &self.database,
            SEALER_JOB,
            self.owner,
            now_ms,
            self.lease_ms,
        )
        .await?;
        Ok(held.is_some())
    }

    /// Seals every event readable now; `None` when another sealer holds the lease, else how
    /// many events were sealed.
    pub async fn seal_once(&self) -> Result<Option<u64>, InvariantError> {
        if !self.hold_lease().await? {
            return Ok(None);
        }
        let mut cursor = seal_cursor(&self.database).await?;
        let mut sealed = 0u64;
        loop {
            // A long catch-up keeps its lease batch by batch; one that lost it stops.
            if sealed > 0 && !self.hold_lease().await? {
                break;
            }
            let events = self.store.read_all(cursor, EVENTS_PER_BATCH_MAX).await?;
            let Some(last) = events.last() else {
                break;
            };
            let next = last.cursor;
            // Heads are read before the transaction begins (one query for the batch's streams);
            // within the batch they chain.
            let mut heads = self.heads(&events).await?;
            let mut rows: Vec<(i64, String, i64, [u8; 32])> = Vec::with_capacity(events.len());
            for event in &events {
                let head = heads.get(&event.stream_id).copied();
                let (version, previous) = head.map_or((0, None), |(v, h)| (v, Some(h)));
                if event.version != version + 1 {
                    return Err(InvariantError::Unsealable {
                        stream_id: event.stream_id.clone(),
                        version: event.version,
                        sealed: version,
                    });
                }
                let hash = event_hash(previous.as_ref().map(|h| &h[..]), event);
                heads.insert(event.stream_id.clone(), (event.version, hash));
                let version = i64::try_from(event.version).unwrap_or(i64::MAX);
                rows.push((event.position, event.stream_id.clone(), version, hash));
            }
            let chained = rows.len() as u64;
            let seals = last_of_each_stream(rows);
            let mut tx = self.database.begin().await?;
            insert_seals(&mut tx, &seals, next).await?;
            tx.commit().await?;
            sealed += chained;
            cursor = next;
            if events.len() < EVENTS_PER_BATCH_MAX {
                break;
            }
        }
        metrics::counter!("asiento_events_sealed_total").increment(sealed);
        Ok(Some(sealed))
    }

    /// The last seal of every stream among `events` that has one.
    async fn heads(
        &self,
        events: &[RecordedEvent],
    ) -> Result<HashMap<String, (u64, [u8; 32])>, InvariantError> {
        let mut streams: Vec<&str> = events.iter().map(|e| e.stream_id.as_str()).collect();
        streams.sort_unstable();
        streams.dedup();
        let rows: Vec<(String, i64, Vec<u8>)> = match &self.database {
            Database::Postgres(pool) => {
                sqlx::query_as(SEAL_HEADS_SQL)
                    .bind(&streams)
                    .fetch_all(pool)
                    .await?
            }
            Database::Sqlite(pool) => {
                // In process: a statement per stream costs no round trip.
                let mut conn = pool.acquire().await?;
                let mut rows = Vec::with_capacity(streams.len());
                for stream_id in streams {
                    let row: Option<(String, i64, Vec<u8>)> = sqlx::query_as(
                        "select stream_id, version, hash from event_seals where stream_id = ? \
                         order by version desc limit 1",
                    )
                    .bind(stream_id)
                    .fetch_optional(&mut *conn)
                    .await?;
                    rows.extend(row);
                }
                rows
            }
        };
        Ok(rows
            .into_iter()
            .filter_map(|(stream_id, version, hash)| {
                Some((
                    stream_id,
                    (
                        u64::try_from(version).ok()?,
                        <[u8; 32]>::try_from(hash).ok()?,
                    ),
                ))
            })
            .collect())
    }
}

/// The seal rows to store of a batch's chained events (in log order): each stream's last.
fn last_of_each_stream(
    rows: Vec<(i64, String, i64, [u8; 32])>,
) -> Vec<(i64, String, i64, [u8; 32])> {
    let mut seen = std::collections::HashSet::with_capacity(rows.len());
    let mut last: Vec<_> = rows
        .into_iter()
        .rev()
        .filter(|row| seen.insert(row.1.clone()))
        .collect();
    last.reverse();
    last
}

async fn insert_seals(
    tx: &mut Tx,
    rows: &[(i64, String, i64, [u8; 32])],
    cursor: Cursor,
) -> Result<(), sqlx::Error> {
    let insert = "insert into event_seals (position, stream_id, version, hash) \
                  values ($1, $2, $3, $4)";
    let advance = "insert into event_seal_cursor (id, xact, position) values (1, $1, $2) \
                   on conflict (id) do update set xact = excluded.xact, \
                   position = excluded.position";
    match tx {
        Tx::Postgres(tx) => {
            // One statement for the batch.
            sqlx::query(
                "insert into event_seals (position, stream_id, version, hash) \
                 select * from unnest($1::int8[], $2::text[], $3::int8[], $4::bytea[])",
            )
            .bind(rows.iter().map(|r| r.0).collect::<Vec<_>>())
            .bind(rows.iter().map(|r| r.1.as_str()).collect::<Vec<_>>())
            .bind(rows.iter().map(|r| r.2).collect::<Vec<_>>())
            .bind(rows.iter().map(|r| &r.3[..]).collect::<Vec<_>>())
            .execute(&mut **tx)
            .await?;
            sqlx::query(advance)
                .bind(cursor.xact())
                .bind(cursor.position())
                .execute(&mut **tx)
                .await?;
        }
        Tx::Sqlite(tx) => {
            for (position, stream, version, hash) in rows {
                sqlx::query(&sqlite(insert))
                    .bind(position)
                    .bind(stream)
                    .bind(version)
                    .bind(&hash[..])
                    .execute(&mut **tx)
                    .await?;
            }
            sqlx::query(&sqlite(advance))
                .bind(cursor.xact())
                .bind(cursor.position())
                .execute(&mut **tx)
                .await?;
        }
    }
    Ok(())
}
