//! The PostgreSQL backend: the production store.
//!
//! **Gap-free order.** Identity values are taken before commit, so positions
//! do not follow commit order. Each row records its transaction id (`xact`),
//! and readers take only rows with `xact < pg_snapshot_xmin(current snapshot)`,
//! ordered by (xact, position). Every transaction below the snapshot's xmin
//! has finished, and a new transaction always gets a larger id than xmin, so
//! no row can ever appear behind a cursor that was handed out. The price: one
//! long-open writing transaction holds back what readers see (never what they
//! eventually get).
//!
//! **Round trips.** A single-stream append is one autocommit statement: it
//! computes the next version, checks the expectation and inserts all events
//! (UNNEST) at once; the unique (stream_id, version) index decides races. If
//! it writes nothing or hits a unique violation, a second look tells a
//! re-send from a conflict. Multi-stream appends run one such statement per
//! stream in one transaction. A single event is bound as scalars rather than
//! arrays. Single-stream appends and reads run on the store's own connections
//! (`connections.rs`), which spares each statement sqlx's ping on release.
//!
//! **Wake-ups.** A NOTIFY inside the writing transaction would serialise all
//! committing writers on PostgreSQL's notify queue lock (and with it their
//! WAL flushes, defeating group commit). Instead, a successful append
//! schedules one NOTIFY after it, coalescing all appends of 25 ms (so that
//! subscribers read fewer, larger batches); subscribers also poll on a short
//! timer, which covers events that are committed but still above the xmin
//! horizon.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::stream::BoxStream;
use futures::StreamExt;
use sqlx::postgres::{PgArguments, PgListener, PgPoolOptions};
use sqlx::types::Json;
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

use crate::classify::{self, Stored, StreamResult, Verdict};
use crate::connections::{Lease, PgTx, StoreConnections};
use crate::each::EachAppend;
use crate::subscription::{self, Tail};
use crate::tail_cache::TailCache;
use crate::{
    AppendError, Appended, Cursor, EventRow, EventStore, ExpectedVersion, RecordedEvent,
    StoreError, StreamAppend, Tx, Upcaster, READ_BATCH_MAX,
};

/// The LISTEN/NOTIFY channel announcing new events.
pub const NOTIFY_CHANNEL: &str = "asiento_events";
/// A wake-up needs no durability: it commits without waiting for its WAL
/// flush (`set_config(…, true)` lasts for this statement's own transaction).
const NOTIFY_SQL: &str = "SELECT set_config('synchronous_commit', 'off', true), pg_notify($1, '')";
/// Appends within this window share one NOTIFY.
const NOTIFY_COALESCE_MS: u64 = 25;
/// A subscriber re-reads at least this often even without a NOTIFY: an event
/// may be committed but not yet readable (an older transaction still open).
pub const PG_POLL_INTERVAL_MS: u64 = 100;
/// Attempts for an append whose expectation still holds after losing a race
/// (only `Any`, or a statement that ran on a just-outdated snapshot).
const APPEND_ATTEMPTS_MAX: usize = 32;

/// The shared shape of an append statement: next version = last version +
/// ordinal; the WHERE clause is the expectation ($7: 0 Any, 1 NoStream,
/// 2 StreamExists, 3 Exact($8)). A batch comes as arrays ($2–$6, UNNEST); a
/// single event as scalars, which spares PostgreSQL five array decodes, a
/// function scan and a sort per append.
macro_rules! insert_sql {
    (many, $conflict:literal) => {
        concat!(
            "WITH cur AS (SELECT coalesce(max(version), 0) AS v FROM events WHERE stream_id = $1) ",
            "INSERT INTO events (stream_id, version, event_id, event_type, schema, data, metadata) ",
            "SELECT $1, cur.v + e.ord, e.event_id, e.event_type, e.schema, e.data, e.metadata ",
            "FROM cur, unnest($2::uuid[], $3::text[], $4::int4[], $5::jsonb[], $6::jsonb[]) ",
            "WITH ORDINALITY AS e(event_id, event_type, schema, data, metadata, ord) ",
            insert_sql!(expectation),
            "ORDER BY e.ord ",
            $conflict,
            "RETURNING position, version, xact"
        )
    };
    (one, $conflict:literal) => {
        concat!(
            "WITH cur AS (SELECT coalesce(max(version), 0) AS v FROM events WHERE stream_id = $1) ",
            "INSERT INTO events (stream_id, version, event_id, event_type, schema, data, metadata) ",
            "SELECT $1, cur.v + 1, $2::uuid, $3::text, $4::int4, $5::jsonb, $6::jsonb FROM cur ",
            insert_sql!(expectation),
            $conflict,
            "RETURNING position, version, xact"
        )
    };
    (expectation) => {
        "WHERE CASE $7::int4 WHEN 0 THEN true WHEN 1 THEN cur.v = 0 WHEN 2 THEN cur.v > 0 \
         ELSE cur.v = $8::int8 END "
    };
}

/// One append statement in autocommit. No ON CONFLICT: a unique violation
/// undoes the whole statement, so a batch is all-or-nothing.
const INSERT_AUTOCOMMIT: Insert = Insert {
    many: insert_sql!(many, ""),
    one: insert_sql!(one, ""),
};

/// The same inside a caller's transaction, where an error would poison the
/// whole transaction: conflicting rows are skipped instead, and a short row
/// count tells the caller to roll back.
const INSERT_IN_TX: Insert = Insert {
    many: insert_sql!(many, "ON CONFLICT DO NOTHING "),
    one: insert_sql!(one, "ON CONFLICT DO NOTHING "),
};

/// An append statement for batches and for single events.
struct Insert {
    many: &'static str,
    one: &'static str,
}

const SELECT_EVENT: &str = "SELECT position, xact, stream_id, version, event_id, event_type, \
                            schema, data, metadata, recorded_at FROM events";

/// The xid below which every transaction has finished, in this statement's snapshot.
const HORIZON: &str = "pg_snapshot_xmin(pg_current_snapshot())::text::bigint";

/// A store connection lent for one autocommit statement of the caller's
/// ([`EventStore::statement_connection`]); derefs to the connection. Give it
/// back with [`PgConn::finished`] once the database answered; dropped
/// otherwise, it is closed (it may be mid-statement).
pub struct PgConn {
    lease: Lease,
    notifier: Arc<Notifier>,
}

impl PgConn {
    /// The statement completed or the database refused it (`result`): the
    /// connection is idle again and is kept; if the statement appended
    /// events (`appended`), subscribers are woken.
    pub fn finished<T>(self, result: &Result<T, sqlx::Error>, appended: bool) {
        if appended {
            self.notifier.poke();
        }
        match result {
            Ok(_) | Err(sqlx::Error::Database(_)) => self.lease.keep(),
            Err(_) => drop(self.lease),
        }
    }
}

impl std::ops::Deref for PgConn {
    type Target = PgConnection;
    fn deref(&self) -> &PgConnection {
        &self.lease
    }
}

impl std::ops::DerefMut for PgConn {
    fn deref_mut(&mut self) -> &mut PgConnection {
        &mut self.lease
    }
}

/// The event log on PostgreSQL.
#[derive(Clone)]
pub struct PgEventStore {
    pool: PgPool,
    upcaster: Arc<dyn Upcaster>,
    notifier: Arc<Notifier>,
    connections: Arc<StoreConnections>,
    /// The connections of the group commit statement (`statement_connection`).
    statement_connections: Arc<StoreConnections>,
    /// The newest stretch of the log, shared by this process's readers.
    tail: Arc<TailCache>,
}

impl PgEventStore {
    pub fn new(pool: PgPool, upcaster: Arc<dyn Upcaster>) -> PgEventStore {
        let connections = Arc::new(StoreConnections::default());
        PgEventStore {
            notifier: Arc::new(Notifier {
                pool: pool.clone(),
                connections: Arc::clone(&connections),
                scheduled: AtomicBool::new(false),
            }),
            connections,
            statement_connections: Arc::new(StoreConnections::planning_once()),
            pool,
            upcaster,
            tail: Arc::default(),
        }
    }

    fn decode(&self, rows: Vec<EventRow>) -> Result<Vec<RecordedEvent>, StoreError> {
        rows.into_iter()
            .map(|r| r.into_recorded(self.upcaster.as_ref()))
            .collect()
    }

    /// `read_all` without the tail cache.
    async fn read_all_from_db(
        &self,
        after: Cursor,
        limit: usize,
    ) -> Result<Vec<RecordedEvent>, StoreError> {
        let mut conn = self.connections.lease(&self.pool).await?;
        let rows: Vec<EventRow> = sqlx::query_as(&format!(
            "{SELECT_EVENT} WHERE (xact, position) > ($1, $2) AND xact < {HORIZON} \
             ORDER BY xact, position LIMIT $3"
        ))
        .bind(after.xact())
        .bind(after.position())
        .bind(crate::clamp_limit(limit))
        .fetch_all(&mut *conn)
        .await?;
        conn.keep();
        self.decode(rows)
    }

    /// One single-stream append as one autocommit statement, on one of the
    /// store's own connections where one is free (see `connections`).
    async fn append_one(&self, append: &StreamAppend) -> Result<Appended, AppendError> {
        let mut conn = self
            .connections
            .lease(&self.pool)
            .await
            .map_err(StoreError::from)?;
        let verdict = append_on(&mut conn, append).await;
        if verdict.is_ok() {
            self.notifier.poke();
        }
        // Every answer the database gave leaves the connection idle; only a
        // transport error (returned before this point) may not.
        if !matches!(verdict, Err(AppendError::Store(StoreError::Database(_)))) {
            conn.keep();
        }
        verdict.map(|result| crate::merge(vec![result]))
    }

    /// A multi-stream append in its own transaction, retried as a whole when
    /// an `Any` stream lost a race.
    async fn append_many(&self, streams: &[StreamAppend]) -> Result<Appended, AppendError> {
        for _ in 0..APPEND_ATTEMPTS_MAX {
            let mut tx = self.pool.begin().await.map_err(StoreError::from)?;
            match append_streams(&mut tx, streams).await {
                Ok(Outcome::Written(appended)) => {
                    tx.commit().await.map_err(StoreError::from)?;
                    self.notifier.poke();
                    return Ok(appended);
                }
                Ok(Outcome::Replayed(appended)) => {
                    tx.rollback().await.map_err(StoreError::from)?;
                    return Ok(appended);
                }
                Err(Failure::Retry) => {
                    tx.rollback().await.map_err(StoreError::from)?;
                }
                Err(Failure::Refused(e)) => {
                    tx.rollback().await.map_err(StoreError::from)?;
                    return Err(e);
                }
            }
        }
        let mut conn = self.pool.acquire().await.map_err(StoreError::from)?;
        Err(conflict_now(&mut conn, &streams[0]).await)
    }
}

/// Sends at most one NOTIFY per coalescing window, always after the appends
/// that asked for it.
struct Notifier {
    pool: PgPool,
    connections: Arc<StoreConnections>,
    scheduled: AtomicBool,
}

impl Notifier {
    fn poke(self: &Arc<Self>) {
        if self.scheduled.swap(true, Ordering::AcqRel) {
            return;
        }
        let this = Arc::clone(self);
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(NOTIFY_COALESCE_MS)).await;
            // Cleared before sending: an append landing after this point asks
            // for (and gets) a NOTIFY of its own.
            this.scheduled.store(false, Ordering::Release);
            let sent = async {
                let mut conn = this.connections.lease(&this.pool).await?;
                sqlx::query(NOTIFY_SQL)
                    .bind(NOTIFY_CHANNEL)
                    .execute(&mut *conn)
                    .await?;
                conn.keep();
                Ok::<_, sqlx::Error>(())
            };
            if let Err(e) = sent.await {
                // Subscribers poll as well; a lost wake-up only adds latency.
                tracing::debug!(error = %e, "event notification not sent");
            }
        });
    }
}

enum Outcome {
    Written(Appended),
    Replayed(Appended),
}

enum Failure {
    /// Nothing useful was written; the whole append may be tried again.
    Retry,
    Refused(AppendError),
}

impl From<StoreError> for Failure {
    fn from(e: StoreError) -> Failure {
        Failure::Refused(AppendError::Store(e))
    }
}

impl From<sqlx::Error> for Failure {
    fn from(e: sqlx::Error) -> Failure {
        Failure::Refused(e.into())
    }
}

/// [`PgEventStore::append_one`] on a given connection: insert, and if the
/// expectation did not hold, look and decide between a re-send, a refusal
/// and another attempt.
async fn append_on(
    conn: &mut PgConnection,
    append: &StreamAppend,
) -> Result<StreamResult, AppendError> {
    for _ in 0..APPEND_ATTEMPTS_MAX {
        let inserted: Result<Vec<(i64, i64, i64)>, sqlx::Error> =
            bind_insert(&INSERT_AUTOCOMMIT, append)
                .fetch_all(&mut *conn)
                .await;
        match inserted {
            Ok(rows) if rows.len() == append.events.len() => {
                return Ok(classify::result_of(&append.stream_id, &rows)?);
            }
            // Zero rows: the expectation did not hold.
            Ok(_) => {}
            Err(e) if is_unique_violation(&e) => {}
            Err(e) => return Err(e.into()),
        }
        match classify_on(conn, append).await? {
            Verdict::Replayed(result) => return Ok(result),
            Verdict::Refused(e) => return Err(e),
            Verdict::Retry => continue,
        }
    }
    Err(conflict_now(conn, append).await)
}

/// Appends every stream inside an open transaction. A stream that was
/// already stored by an identical append counts as replayed; a request that
/// mixes replayed and new streams is not a re-send and is refused.
async fn append_streams(
    conn: &mut PgConnection,
    streams: &[StreamAppend],
) -> Result<Outcome, Failure> {
    let mut written = Vec::with_capacity(streams.len());
    let mut replayed = Vec::with_capacity(streams.len());
    for append in streams {
        match append_stream_in_tx(conn, append).await? {
            StreamOutcome::Written(r) => written.push(r),
            StreamOutcome::Replayed(r) => replayed.push(r),
        }
    }
    match (written.is_empty(), replayed.first()) {
        (true, _) => Ok(Outcome::Replayed(crate::merge(replayed))),
        (false, None) => Ok(Outcome::Written(crate::merge(written))),
        (false, Some(r)) => {
            let event_id = streams
                .iter()
                .find(|s| s.stream_id == r.stream_id)
                .and_then(|s| s.events.first())
                .map_or(Uuid::nil(), |e| e.event_id);
            Err(Failure::Refused(AppendError::EventIdTaken { event_id }))
        }
    }
}

enum StreamOutcome {
    Written(StreamResult),
    Replayed(StreamResult),
}

async fn append_stream_in_tx(
    conn: &mut PgConnection,
    append: &StreamAppend,
) -> Result<StreamOutcome, Failure> {
    for _ in 0..APPEND_ATTEMPTS_MAX {
        let rows: Vec<(i64, i64, i64)> = bind_insert(&INSERT_IN_TX, append)
            .fetch_all(&mut *conn)
            .await?;
        if rows.len() == append.events.len() {
            return Ok(StreamOutcome::Written(classify::result_of(
                &append.stream_id,
                &rows,
            )?));
        }
        if !rows.is_empty() {
            // Part of the batch collided with a concurrent writer; the rest
            // is written in this transaction and must be rolled back.
            return Err(Failure::Retry);
        }
        // Nothing written: the transaction is still clean, look and decide.
        match classify_on(conn, append).await? {
            Verdict::Replayed(r) => return Ok(StreamOutcome::Replayed(r)),
            Verdict::Refused(e) => return Err(Failure::Refused(e)),
            Verdict::Retry => continue,
        }
    }
    Err(Failure::Retry)
}

/// [`EventStore::append_each_in`] on PostgreSQL: every request's events in one statement (see
/// `each.rs`), unless one expects `Any` or `StreamExists`.
async fn append_each_on(
    conn: &mut PgConnection,
    requests: &[&[StreamAppend]],
) -> Result<Vec<Option<Appended>>, AppendError> {
    let Some(each) = EachAppend::of((0..).zip(requests.iter().copied()))? else {
        return append_each_one_by_one(conn, requests).await;
    };
    let sql = format!(
        "WITH {} SELECT event_id, position, version, xact FROM each_written",
        EachAppend::ctes(1, "true")
    );
    let mut arguments = PgArguments::default();
    each.add_to(&mut arguments)
        .map_err(|e| StoreError::Database(sqlx::Error::Encode(e)))?;
    let rows: Vec<(Uuid, i64, i64, i64)> = sqlx::query_as_with(&sql, arguments)
        .fetch_all(&mut *conn)
        .await
        .map_err(StoreError::from)?;
    crate::each::each_results(requests, rows)
}

/// The requests one after the other, each as `append_in` would write it.
async fn append_each_one_by_one(
    conn: &mut PgConnection,
    requests: &[&[StreamAppend]],
) -> Result<Vec<Option<Appended>>, AppendError> {
    let mut results = Vec::with_capacity(requests.len());
    for streams in requests {
        match append_streams(conn, streams).await {
            // As `append_in` answers: a re-sent request is its first result.
            Ok(Outcome::Written(appended) | Outcome::Replayed(appended)) => {
                results.push(Some(appended))
            }
            Err(Failure::Retry | Failure::Refused(AppendError::Conflict { .. })) => {
                results.push(None)
            }
            Err(Failure::Refused(e)) => return Err(e),
        }
    }
    Ok(results)
}

fn bind_insert<'q>(
    sql: &Insert,
    append: &'q StreamAppend,
) -> sqlx::query::QueryAs<'q, sqlx::Postgres, (i64, i64, i64), sqlx::postgres::PgArguments> {
    let (kind, exact): (i32, i64) = match append.expected {
        ExpectedVersion::Any => (0, 0),
        ExpectedVersion::NoStream => (1, 0),
        ExpectedVersion::StreamExists => (2, 0),
        // A version beyond i64 can never be current: -1 never matches.
        ExpectedVersion::Exact(n) => (3, i64::try_from(n).unwrap_or(-1)),
    };
    let query = if let [event] = append.events.as_slice() {
        sqlx::query_as(sql.one)
            .bind(append.stream_id.as_str())
            .bind(event.event_id)
            .bind(event.event_type.as_str())
            .bind(event.schema)
            .bind(Json(&event.data))
            .bind(Json(&event.metadata))
    } else {
        let events = &append.events;
        sqlx::query_as(sql.many)
            .bind(append.stream_id.as_str())
            .bind(events.iter().map(|e| e.event_id).collect::<Vec<_>>())
            .bind(
                events
                    .iter()
                    .map(|e| e.event_type.as_str())
                    .collect::<Vec<_>>(),
            )
            .bind(events.iter().map(|e| e.schema).collect::<Vec<_>>())
            .bind(events.iter().map(|e| Json(&e.data)).collect::<Vec<_>>())
            .bind(events.iter().map(|e| Json(&e.metadata)).collect::<Vec<_>>())
    };
    query.bind(kind).bind(exact)
}

fn is_unique_violation(e: &sqlx::Error) -> bool {
    e.as_database_error()
        .is_some_and(|d| d.kind() == sqlx::error::ErrorKind::UniqueViolation)
}

async fn stream_version_on(conn: &mut PgConnection, stream_id: &str) -> Result<u64, StoreError> {
    let v: Option<i64> = sqlx::query_scalar("SELECT max(version) FROM events WHERE stream_id = $1")
        .bind(stream_id)
        .fetch_one(&mut *conn)
        .await?;
    match v {
        None => Ok(0),
        Some(v) => crate::version_from_db(0, v),
    }
}

async fn classify_on(
    conn: &mut PgConnection,
    append: &StreamAppend,
) -> Result<Verdict, StoreError> {
    let ids: Vec<Uuid> = append.events.iter().map(|e| e.event_id).collect();
    let stored: Vec<(Uuid, String, i64, i64, i64)> = sqlx::query_as(
        "SELECT event_id, stream_id, version, position, xact FROM events WHERE event_id = ANY($1)",
    )
    .bind(ids)
    .fetch_all(&mut *conn)
    .await?;
    let stored: Vec<Stored> = stored
        .into_iter()
        .map(|(event_id, stream_id, version, position, xact)| Stored {
            event_id,
            stream_id,
            version,
            position,
            xact,
        })
        .collect();
    let actual = stream_version_on(conn, &append.stream_id).await?;
    classify::classify(append, &stored, actual)
}

/// The conflict to report once retries are exhausted.
async fn conflict_now(conn: &mut PgConnection, append: &StreamAppend) -> AppendError {
    match stream_version_on(conn, &append.stream_id).await {
        Ok(actual) => AppendError::Conflict {
            stream_id: append.stream_id.clone(),
            expected: append.expected,
            actual: (actual > 0).then_some(actual),
        },
        Err(e) => e.into(),
    }
}

#[async_trait::async_trait]
impl EventStore for PgEventStore {
    #[tracing::instrument(skip_all, fields(streams = streams.len()))]
    async fn append(&self, streams: &[StreamAppend]) -> Result<Appended, AppendError> {
        crate::validate(streams)?;
        match streams {
            [one] => self.append_one(one).await,
            _ => self.append_many(streams).await,
        }
    }

    #[tracing::instrument(skip_all, fields(streams = streams.len()))]
    async fn append_in(
        &self,
        tx: &mut Tx,
        streams: &[StreamAppend],
    ) -> Result<Appended, AppendError> {
        crate::validate(streams)?;
        let Tx::Postgres(tx) = tx else {
            return Err(StoreError::BackendMismatch.into());
        };
        let appended = match append_streams(tx, streams).await {
            Ok(Outcome::Written(a)) => {
                // Usually the caller commits within the coalescing window;
                // if not, subscribers find the events on their next poll.
                self.notifier.poke();
                a
            }
            Ok(Outcome::Replayed(a)) => a,
            Err(Failure::Refused(e)) => return Err(e),
            Err(Failure::Retry) => {
                let actual = stream_version_on(tx, &streams[0].stream_id).await?;
                return Err(AppendError::Conflict {
                    stream_id: streams[0].stream_id.clone(),
                    expected: streams[0].expected,
                    actual: (actual > 0).then_some(actual),
                });
            }
        };
        Ok(appended)
    }

    #[tracing::instrument(skip_all, fields(requests = requests.len()))]
    async fn append_each_in(
        &self,
        tx: &mut Tx,
        requests: &[&[StreamAppend]],
    ) -> Result<Vec<Option<Appended>>, AppendError> {
        for streams in requests {
            crate::validate(streams)?;
        }
        let Tx::Postgres(tx) = tx else {
            return Err(StoreError::BackendMismatch.into());
        };
        let results = append_each_on(tx, requests).await?;
        if results.iter().any(Option::is_some) {
            self.notifier.poke();
        }
        Ok(results)
    }

    async fn begin(&self) -> Result<Tx, StoreError> {
        let lease = self.connections.lease(&self.pool).await?;
        Ok(Tx::Postgres(PgTx::begin(lease).await?))
    }

    async fn statement_connection(&self) -> Result<Option<PgConn>, StoreError> {
        Ok(Some(PgConn {
            lease: self.statement_connections.lease(&self.pool).await?,
            notifier: Arc::clone(&self.notifier),
        }))
    }

    async fn read_streams(&self, stream_ids: &[String]) -> Result<Vec<RecordedEvent>, StoreError> {
        let mut events: Vec<RecordedEvent> = Vec::new();
        loop {
            let after = events
                .last()
                .map(|last| (last.stream_id.as_str(), last.version));
            let page = self
                .read_streams_page(stream_ids, after, READ_BATCH_MAX)
                .await?;
            let full = page.len() == READ_BATCH_MAX;
            events.extend(page);
            if !full {
                return Ok(events);
            }
        }
    }

    async fn read_streams_page(
        &self,
        stream_ids: &[String],
        after: Option<(&str, u64)>,
        limit: usize,
    ) -> Result<Vec<RecordedEvent>, StoreError> {
        let (after_stream, after_version) = after.unwrap_or(("", 0));
        let mut conn = self.connections.lease(&self.pool).await?;
        // Keyset paging on the (stream_id, version) index.
        let rows: Vec<EventRow> = sqlx::query_as(&format!(
            "{SELECT_EVENT} WHERE stream_id = ANY($1) AND (stream_id, version) > ($2, $3) \
             ORDER BY stream_id, version LIMIT $4"
        ))
        .bind(stream_ids)
        .bind(after_stream)
        .bind(i64::try_from(after_version).unwrap_or(i64::MAX))
        .bind(crate::clamp_limit(limit))
        .fetch_all(&mut *conn)
        .await?;
        conn.keep();
        self.decode(rows)
    }

    async fn stream_ids_after(
        &self,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<String>, StoreError> {
        let mut conn = self.connections.lease(&self.pool).await?;
        // Read off the (stream_id, version) index, one step per event of the streams listed.
        let ids: Vec<String> = sqlx::query_scalar(
            "SELECT DISTINCT stream_id FROM events WHERE stream_id > $1 \
             ORDER BY stream_id LIMIT $2",
        )
        .bind(after.unwrap_or(""))
        .bind(crate::clamp_limit(limit))
        .fetch_all(&mut *conn)
        .await?;
        conn.keep();
        Ok(ids)
    }

    async fn read_positions(&self, positions: &[i64]) -> Result<Vec<RecordedEvent>, StoreError> {
        let mut conn = self.connections.lease(&self.pool).await?;
        let rows: Vec<EventRow> = sqlx::query_as(&format!(
            "{SELECT_EVENT} WHERE position = ANY($1) ORDER BY xact, position"
        ))
        .bind(positions)
        .fetch_all(&mut *conn)
        .await?;
        conn.keep();
        self.decode(rows)
    }

    async fn last_event(&self, stream_id: &str) -> Result<Option<RecordedEvent>, StoreError> {
        let mut conn = self.connections.lease(&self.pool).await?;
        let rows: Vec<EventRow> = sqlx::query_as(&format!(
            "{SELECT_EVENT} WHERE stream_id = $1 ORDER BY version DESC LIMIT 1"
        ))
        .bind(stream_id)
        .fetch_all(&mut *conn)
        .await?;
        conn.keep();
        Ok(self.decode(rows)?.pop())
    }

    async fn read_stream(
        &self,
        stream_id: &str,
        from_version: u64,
        limit: usize,
    ) -> Result<Vec<RecordedEvent>, StoreError> {
        let from = i64::try_from(from_version).unwrap_or(i64::MAX);
        let mut conn = self.connections.lease(&self.pool).await?;
        let rows: Vec<EventRow> = sqlx::query_as(&format!(
            "{SELECT_EVENT} WHERE stream_id = $1 AND version >= $2 ORDER BY version LIMIT $3"
        ))
        .bind(stream_id)
        .bind(from)
        .bind(crate::clamp_limit(limit))
        .fetch_all(&mut *conn)
        .await?;
        conn.keep();
        self.decode(rows)
    }

    async fn stream_version(&self, stream_id: &str) -> Result<Option<u64>, StoreError> {
        let mut conn = self.connections.lease(&self.pool).await?;
        let v = stream_version_on(&mut conn, stream_id).await?;
        conn.keep();
        Ok((v > 0).then_some(v))
    }

    async fn read_all(
        &self,
        after: Cursor,
        limit: usize,
    ) -> Result<Vec<RecordedEvent>, StoreError> {
        self.tail
            .read_all(after, limit, |after, limit| {
                self.read_all_from_db(after, limit)
            })
            .await
    }

    async fn head(&self) -> Result<Cursor, StoreError> {
        let mut conn = self.connections.lease(&self.pool).await?;
        let last: Option<(i64, i64)> = sqlx::query_as(&format!(
            "SELECT xact, position FROM events WHERE xact < {HORIZON} \
             ORDER BY xact DESC, position DESC LIMIT 1"
        ))
        .fetch_optional(&mut *conn)
        .await?;
        conn.keep();
        Ok(last.map_or(Cursor::START, |(x, p)| Cursor::new(x, p)))
    }

    async fn cursor_of_position(&self, position: i64) -> Result<Option<Cursor>, StoreError> {
        let mut conn = self.connections.lease(&self.pool).await?;
        let xact: Option<i64> = sqlx::query_scalar("SELECT xact FROM events WHERE position = $1")
            .bind(position)
            .fetch_optional(&mut *conn)
            .await?;
        conn.keep();
        Ok(xact.map(|x| Cursor::new(x, position)))
    }

    fn subscribe(
        &self,
        from: Cursor,
        batch_size: usize,
    ) -> BoxStream<'static, Result<Vec<RecordedEvent>, StoreError>> {
        subscription::subscribe(
            PgTail {
                store: self.clone(),
                listener: None,
            },
            from,
            batch_size,
        )
    }
}

/// Live tail on PostgreSQL: LISTEN on a connection of its own (so a
/// subscription never holds one of the pool's), plus polling.
struct PgTail {
    store: PgEventStore,
    listener: Option<PgListener>,
}

#[async_trait::async_trait]
impl Tail for PgTail {
    async fn read(
        &mut self,
        after: Cursor,
        limit: usize,
    ) -> Result<Vec<RecordedEvent>, StoreError> {
        self.store.read_all(after, limit).await
    }

    fn read_ahead(&self, after: Cursor, batch_size: usize) -> subscription::Batches {
        let (tx, rx) = tokio::sync::mpsc::channel(subscription::READ_AHEAD_BATCHES_MAX);
        let store = self.store.clone();
        tokio::spawn(async move {
            let sql = format!(
                "{SELECT_EVENT} WHERE (xact, position) > ($1, $2) AND xact < {HORIZON} \
                 ORDER BY xact, position LIMIT $3"
            );
            let upcaster = Arc::clone(&store.upcaster);
            let rows = sqlx::query_as::<_, EventRow>(&sql)
                .bind(after.xact())
                .bind(after.position())
                // READ_AHEAD_ROWS_MAX is far below i64::MAX.
                .bind(subscription::READ_AHEAD_ROWS_MAX as i64)
                .fetch(&store.pool)
                .map(|row| row?.into_recorded(upcaster.as_ref()));
            subscription::send_batches(rows, batch_size, tx).await;
        });
        rx
    }

    async fn arm(&mut self) -> Result<(), StoreError> {
        let options = (*self.store.pool.connect_options()).clone();
        let own = PgPoolOptions::new()
            .max_connections(1)
            .test_before_acquire(false)
            .connect_lazy_with(options);
        let mut listener = PgListener::connect_with(&own).await?;
        listener.listen(NOTIFY_CHANNEL).await?;
        self.listener = Some(listener);
        Ok(())
    }

    async fn wait(&mut self) -> bool {
        let poll = tokio::time::sleep(Duration::from_millis(PG_POLL_INTERVAL_MS));
        let Some(listener) = self.listener.as_mut() else {
            poll.await;
            return false;
        };
        tokio::select! {
            received = listener.recv() => match received {
                Ok(_) => {
                    // One read covers every wake-up that is already queued.
                    while listener.next_buffered().is_some() {}
                    true
                }
                Err(e) => {
                    tracing::warn!(error = %e, "event subscription lost its LISTEN connection");
                    self.listener = None;
                    false
                }
            },
            () = poll => true,
        }
    }
}
