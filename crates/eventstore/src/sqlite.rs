//! The SQLite backend: the embedded default (one file, WAL mode).
//!
//! SQLite runs one write transaction at a time, and every append runs under
//! `BEGIN IMMEDIATE`, which takes the write lock before reading the stream's
//! version. So the version read cannot go stale before the insert, rowids
//! (positions) are handed out in commit order, and reading by position alone
//! is gap-free. Statements run in-process, so the per-event INSERTs of a batch
//! cost no network round trips.
//!
//! Wake-ups: subscribers of the same store instance are woken through a watch
//! channel right after an append commits; everyone else (other processes,
//! other store instances, `append_in` whose commit the store does not see)
//! is covered by polling.

use std::sync::Arc;
use std::time::Duration;

use futures::stream::BoxStream;
use futures::StreamExt;
use sqlx::{SqliteConnection, SqlitePool};
use tokio::sync::watch;

use crate::classify::{self, Stored, StreamResult, Verdict};
use crate::subscription::{self, Tail};
use crate::tail_cache::TailCache;
use crate::{
    AppendError, Appended, Cursor, EventRow, EventStore, RecordedEvent, StoreError, StreamAppend,
    Tx, Upcaster,
};

/// How often a subscriber re-reads when nothing woke it.
pub const SQLITE_POLL_INTERVAL_MS: u64 = 50;

const SELECT_EVENT: &str = "SELECT position, 0 AS xact, stream_id, version, event_id, event_type, \
                            schema, data, metadata, recorded_at FROM events";

/// A list bound as one JSON array parameter, read back with `json_each`.
fn json_list<T: serde::Serialize>(items: &[T]) -> String {
    serde_json::to_string(items).expect("a list of strings or integers always serialises")
}

/// The event log on SQLite.
#[derive(Clone)]
pub struct SqliteEventStore {
    pool: SqlitePool,
    upcaster: Arc<dyn Upcaster>,
    /// Bumped after each commit of `append`, to wake this instance's subscribers.
    appended: Arc<watch::Sender<u64>>,
    /// The newest stretch of the log, shared by this process's readers.
    tail: Arc<TailCache>,
}

impl SqliteEventStore {
    pub fn new(pool: SqlitePool, upcaster: Arc<dyn Upcaster>) -> SqliteEventStore {
        let (appended, _) = watch::channel(0);
        SqliteEventStore {
            pool,
            upcaster,
            appended: Arc::new(appended),
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
        let rows: Vec<EventRow> = sqlx::query_as(&format!(
            "{SELECT_EVENT} WHERE position > ? ORDER BY position LIMIT ?"
        ))
        .bind(after.position())
        .bind(crate::clamp_limit(limit))
        .fetch_all(&self.pool)
        .await?;
        self.decode(rows)
    }

    fn wake(&self) {
        self.appended.send_modify(|n| *n = n.wrapping_add(1));
    }
}

enum StreamOutcome {
    Written(StreamResult),
    Replayed(StreamResult),
}

/// Appends all streams on a connection that holds the write lock.
async fn append_streams(
    conn: &mut SqliteConnection,
    streams: &[StreamAppend],
) -> Result<(Appended, bool), AppendError> {
    let mut written = Vec::with_capacity(streams.len());
    let mut replayed = Vec::with_capacity(streams.len());
    for append in streams {
        match append_stream(conn, append).await? {
            StreamOutcome::Written(r) => written.push(r),
            StreamOutcome::Replayed(r) => replayed.push(r),
        }
    }
    if written.is_empty() {
        return Ok((crate::merge(replayed), false));
    }
    if let Some(r) = replayed.first() {
        // Part re-send, part new: not a re-send of one earlier append.
        let event_id = streams
            .iter()
            .find(|s| s.stream_id == r.stream_id)
            .and_then(|s| s.events.first())
            .map_or(uuid::Uuid::nil(), |e| e.event_id);
        return Err(AppendError::EventIdTaken { event_id });
    }
    Ok((crate::merge(written), true))
}

async fn append_stream(
    conn: &mut SqliteConnection,
    append: &StreamAppend,
) -> Result<StreamOutcome, AppendError> {
    let current = stream_version_on(conn, &append.stream_id).await?;
    if !append.expected.holds(current) {
        return verdict(conn, append, current).await;
    }
    let mut rows = Vec::with_capacity(append.events.len());
    let mut version = current;
    for event in &append.events {
        version += 1;
        let db_version = i64::try_from(version).map_err(|_| AppendError::Conflict {
            stream_id: append.stream_id.clone(),
            expected: append.expected,
            actual: Some(current),
        })?;
        let inserted: Result<i64, sqlx::Error> = sqlx::query_scalar(
            "INSERT INTO events (stream_id, version, event_id, event_type, schema, data, metadata) \
             VALUES (?, ?, ?, ?, ?, ?, ?) RETURNING position",
        )
        .bind(append.stream_id.as_str())
        .bind(db_version)
        .bind(event.event_id)
        .bind(event.event_type.as_str())
        .bind(event.schema)
        .bind(sqlx::types::Json(&event.data))
        .bind(sqlx::types::Json(&event.metadata))
        .fetch_one(&mut *conn)
        .await;
        match inserted {
            Ok(position) => rows.push((position, db_version, 0)),
            // The version is ours (we hold the write lock), so this is an
            // event id stored before: a re-send, or a reused id.
            Err(e) if is_unique_violation(&e) && rows.is_empty() => {
                return verdict(conn, append, current).await;
            }
            Err(e) if is_unique_violation(&e) => {
                return Err(AppendError::EventIdTaken {
                    event_id: event.event_id,
                });
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(StreamOutcome::Written(classify::result_of(
        &append.stream_id,
        &rows,
    )?))
}

async fn verdict(
    conn: &mut SqliteConnection,
    append: &StreamAppend,
    current: u64,
) -> Result<StreamOutcome, AppendError> {
    let mut stored = Vec::new();
    for event in &append.events {
        let row: Option<(String, i64, i64)> =
            sqlx::query_as("SELECT stream_id, version, position FROM events WHERE event_id = ?")
                .bind(event.event_id)
                .fetch_optional(&mut *conn)
                .await?;
        if let Some((stream_id, version, position)) = row {
            stored.push(Stored {
                event_id: event.event_id,
                stream_id,
                version,
                position,
                xact: 0,
            });
        }
    }
    match classify::classify(append, &stored, current)? {
        Verdict::Replayed(r) => Ok(StreamOutcome::Replayed(r)),
        Verdict::Refused(e) => Err(e),
        // Under the write lock nothing can race us: a holding expectation
        // with no stored ids was written above, so this is unreachable in
        // practice; report it as the conflict it would have been.
        Verdict::Retry => Err(AppendError::Conflict {
            stream_id: append.stream_id.clone(),
            expected: append.expected,
            actual: (current > 0).then_some(current),
        }),
    }
}

fn is_unique_violation(e: &sqlx::Error) -> bool {
    e.as_database_error()
        .is_some_and(|d| d.kind() == sqlx::error::ErrorKind::UniqueViolation)
}

async fn stream_version_on(
    conn: &mut SqliteConnection,
    stream_id: &str,
) -> Result<u64, StoreError> {
    let v: Option<i64> = sqlx::query_scalar("SELECT max(version) FROM events WHERE stream_id = ?")
        .bind(stream_id)
        .fetch_one(&mut *conn)
        .await?;
    match v {
        None => Ok(0),
        Some(v) => crate::version_from_db(0, v),
    }
}

#[async_trait::async_trait]
impl EventStore for SqliteEventStore {
    #[tracing::instrument(skip_all, fields(streams = streams.len()))]
    async fn append(&self, streams: &[StreamAppend]) -> Result<Appended, AppendError> {
        crate::validate(streams)?;
        let mut tx = crate::begin_sqlite(&self.pool).await?;
        match append_streams(&mut tx, streams).await {
            Ok((appended, true)) => {
                tx.commit().await.map_err(StoreError::from)?;
                self.wake();
                Ok(appended)
            }
            Ok((appended, false)) => {
                tx.rollback().await.map_err(StoreError::from)?;
                Ok(appended)
            }
            Err(e) => {
                tx.rollback().await.map_err(StoreError::from)?;
                Err(e)
            }
        }
    }

    #[tracing::instrument(skip_all, fields(streams = streams.len()))]
    async fn append_in(
        &self,
        tx: &mut Tx,
        streams: &[StreamAppend],
    ) -> Result<Appended, AppendError> {
        crate::validate(streams)?;
        let Tx::Sqlite(tx) = tx else {
            return Err(StoreError::BackendMismatch.into());
        };
        append_streams(tx, streams)
            .await
            .map(|(appended, _)| appended)
    }

    async fn begin(&self) -> Result<Tx, StoreError> {
        Ok(Tx::Sqlite(crate::begin_sqlite(&self.pool).await?))
    }

    async fn read_streams_page(
        &self,
        stream_ids: &[String],
        after: Option<(&str, u64)>,
        limit: usize,
    ) -> Result<Vec<RecordedEvent>, StoreError> {
        let (after_stream, after_version) = after.unwrap_or(("", 0));
        let rows: Vec<EventRow> = sqlx::query_as(&format!(
            "{SELECT_EVENT} WHERE stream_id IN (SELECT value FROM json_each(?)) \
             AND (stream_id, version) > (?, ?) ORDER BY stream_id, version LIMIT ?"
        ))
        .bind(json_list(stream_ids))
        .bind(after_stream)
        .bind(i64::try_from(after_version).unwrap_or(i64::MAX))
        .bind(crate::clamp_limit(limit))
        .fetch_all(&self.pool)
        .await?;
        self.decode(rows)
    }

    async fn stream_ids_after(
        &self,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<String>, StoreError> {
        let ids: Vec<String> = sqlx::query_scalar(
            "SELECT DISTINCT stream_id FROM events WHERE stream_id > ? \
             ORDER BY stream_id LIMIT ?",
        )
        .bind(after.unwrap_or(""))
        .bind(crate::clamp_limit(limit))
        .fetch_all(&self.pool)
        .await?;
        Ok(ids)
    }

    async fn read_positions(&self, positions: &[i64]) -> Result<Vec<RecordedEvent>, StoreError> {
        let rows: Vec<EventRow> = sqlx::query_as(&format!(
            "{SELECT_EVENT} WHERE position IN (SELECT value FROM json_each(?)) ORDER BY position"
        ))
        .bind(json_list(positions))
        .fetch_all(&self.pool)
        .await?;
        self.decode(rows)
    }

    async fn last_event(&self, stream_id: &str) -> Result<Option<RecordedEvent>, StoreError> {
        let rows: Vec<EventRow> = sqlx::query_as(&format!(
            "{SELECT_EVENT} WHERE stream_id = ? ORDER BY version DESC LIMIT 1"
        ))
        .bind(stream_id)
        .fetch_all(&self.pool)
        .await?;
        Ok(self.decode(rows)?.pop())
    }

    async fn read_stream(
        &self,
        stream_id: &str,
        from_version: u64,
        limit: usize,
    ) -> Result<Vec<RecordedEvent>, StoreError> {
        let from = i64::try_from(from_version).unwrap_or(i64::MAX);
        let rows: Vec<EventRow> = sqlx::query_as(&format!(
            "{SELECT_EVENT} WHERE stream_id = ? AND version >= ? ORDER BY version LIMIT ?"
        ))
        .bind(stream_id)
        .bind(from)
        .bind(crate::clamp_limit(limit))
        .fetch_all(&self.pool)
        .await?;
        self.decode(rows)
    }

    async fn stream_version(&self, stream_id: &str) -> Result<Option<u64>, StoreError> {
        let mut conn = self.pool.acquire().await?;
        let v = stream_version_on(&mut conn, stream_id).await?;
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
        let last: Option<i64> = sqlx::query_scalar("SELECT max(position) FROM events")
            .fetch_one(&self.pool)
            .await?;
        Ok(last.map_or(Cursor::START, |p| Cursor::new(0, p)))
    }

    async fn cursor_of_position(&self, position: i64) -> Result<Option<Cursor>, StoreError> {
        let found: Option<i64> =
            sqlx::query_scalar("SELECT position FROM events WHERE position = ?")
                .bind(position)
                .fetch_optional(&self.pool)
                .await?;
        Ok(found.map(|p| Cursor::new(0, p)))
    }

    fn subscribe(
        &self,
        from: Cursor,
        batch_size: usize,
    ) -> BoxStream<'static, Result<Vec<RecordedEvent>, StoreError>> {
        subscription::subscribe(
            SqliteTail {
                appended: self.appended.subscribe(),
                store: self.clone(),
            },
            from,
            batch_size,
        )
    }
}

struct SqliteTail {
    store: SqliteEventStore,
    appended: watch::Receiver<u64>,
}

#[async_trait::async_trait]
impl Tail for SqliteTail {
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
            let sql = format!("{SELECT_EVENT} WHERE position > ? ORDER BY position LIMIT ?");
            let upcaster = Arc::clone(&store.upcaster);
            let rows = sqlx::query_as::<_, EventRow>(&sql)
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
        // Whatever was announced so far is covered by the re-read that follows.
        self.appended.borrow_and_update();
        Ok(())
    }

    async fn wait(&mut self) -> bool {
        let poll = tokio::time::sleep(Duration::from_millis(SQLITE_POLL_INTERVAL_MS));
        tokio::select! {
            // The sender lives as long as the store; if it is gone, polling remains.
            _ = self.appended.changed() => {}
            () = poll => {}
        }
        true
    }
}
