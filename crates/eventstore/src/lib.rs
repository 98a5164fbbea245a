//! The append-only event log: one [`EventStore`] trait, a PostgreSQL backend
//! (production) and a SQLite backend (the embedded default), both on sqlx.
//!
//! Why it is shaped this way:
//!
//! - **Atomic multi-stream appends with per-stream expectations.** A journal
//!   entry and the guard on an account commit together or not at all, so one
//!   append may touch several streams, each with its own [`ExpectedVersion`].
//!   A mismatch is [`AppendError::Conflict`] and nothing of the append is
//!   written.
//! - **Idempotent appends.** Re-sending the same event ids with the same
//!   expectation answers the original [`Appended`] instead of a conflict or a
//!   second copy, so a client retrying after a lost answer is safe.
//! - **A gap-free global order.** PostgreSQL hands out identity values before
//!   commit, so tailing by `position` alone can skip an event whose
//!   transaction commits late. Readers therefore move along a [`Cursor`]
//!   (commit-order key, position) and only read what can no longer be
//!   overtaken; see `postgres.rs` for the argument.
//! - **Round trips are the cost.** A single-stream append on PostgreSQL is one
//!   statement in autocommit (no BEGIN/COMMIT), the pool does not ping on
//!   acquire, and batches go as one UNNEST insert. [`EachAppend`] (`each.rs`) is
//!   the append CTE that group commit embeds in its one statement per batch, and
//!   `tail_cache` lets the readers of one process share one read of the newest
//!   events.
//!
//! Architecture invariant: rows of `events` are never updated or deleted; a
//! trigger rejects it on both backends.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures::stream::BoxStream;
use serde::{Deserialize, Serialize};
use sqlx::migrate::Migrator;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use uuid::Uuid;

mod classify;
mod connections;
mod data;
mod each;
mod postgres;
pub mod primary;
pub mod scratch;
mod sqlite;
mod subscription;
mod tail_cache;

pub use connections::PgTx;
pub use data::EventData;
pub use each::{each_results, EachAppend};
pub use postgres::{PgConn, PgEventStore};
pub use sqlite::SqliteEventStore;

/// Connections in a PostgreSQL pool. Subscriptions do not take from it (each
/// LISTENs on its own connection).
pub const PG_POOL_CONNECTIONS_MAX: u32 = 16;
/// How long a read waits for a connection to a standby before it fails (and is asked of the
/// primary): a standby that is down must not hold reads for sqlx's 30 s default.
pub const STANDBY_ACQUIRE_MS: u64 = 2_000;
/// Connections in a SQLite pool: WAL lets readers run beside the one writer.
pub const SQLITE_POOL_CONNECTIONS_MAX: u32 = 8;
/// How long a SQLite writer waits for the write lock before giving up.
pub const SQLITE_BUSY_TIMEOUT_MS: u64 = 10_000;
/// Events in one append, across all its streams. Bounds the statement size.
pub const EVENTS_PER_APPEND_MAX: usize = 10_000;
/// Rows one `read_all`/`read_stream` call or one subscription batch may return.
pub const READ_BATCH_MAX: usize = 10_000;

static PG_MIGRATOR: Migrator = sqlx::migrate!("../../migrations/postgres");
static SQLITE_MIGRATOR: Migrator = sqlx::migrate!("../../migrations/sqlite");

/// Which database a [`Database`] talks to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Postgres,
    Sqlite,
}

/// Errors of the store itself (as opposed to rejections of an append).
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
    #[error("migration failed: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    #[error("unsupported database url: expected postgres://… or sqlite://…")]
    UnsupportedUrl,
    #[error("none of the database url's hosts is a primary (accepts writes)")]
    NoPrimary,
    #[error("could not create the directory for the SQLite file: {0}")]
    CreateDir(#[source] std::io::Error),
    #[error("a transaction of one backend was given to the store of the other")]
    BackendMismatch,
    #[error("stored event at position {position} is malformed: {reason}")]
    Corrupt { position: i64, reason: &'static str },
}

/// What the writer believes about a stream's current version.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ExpectedVersion {
    /// No expectation: append at the end, whatever it is. Races are retried
    /// internally, so this never conflicts in [`EventStore::append`].
    Any,
    /// The stream must not exist yet.
    NoStream,
    /// The stream must have at least one event.
    StreamExists,
    /// The stream's last version must be exactly this (0 = does not exist).
    /// Behind *and* ahead are both conflicts: versions never have gaps.
    Exact(u64),
}

impl ExpectedVersion {
    /// Whether the expectation holds for a stream whose last version is
    /// `current` (0 = the stream does not exist).
    pub fn holds(self, current: u64) -> bool {
        match self {
            ExpectedVersion::Any => true,
            ExpectedVersion::NoStream => current == 0,
            ExpectedVersion::StreamExists => current > 0,
            ExpectedVersion::Exact(n) => current == n,
        }
    }
}

/// Context carried with each event. Serialised as a JSON object without the
/// absent fields.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Metadata {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub correlation_id: Option<Uuid>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub causation_id: Option<Uuid>,
    /// The client's Idempotency-Key of the request that caused the event.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<String>,
}

/// An event to append.
#[derive(Debug, Clone, PartialEq)]
pub struct NewEvent {
    /// Chosen by the writer, so that a re-sent append is recognised.
    pub event_id: Uuid,
    pub event_type: String,
    /// Version of the payload's shape, for [`Upcaster`]s.
    pub schema: i32,
    pub data: serde_json::Value,
    pub metadata: Metadata,
}

/// The events for one stream within an append, with the writer's expectation.
#[derive(Debug, Clone, PartialEq)]
pub struct StreamAppend {
    pub stream_id: String,
    pub expected: ExpectedVersion,
    pub events: Vec<NewEvent>,
}

/// A point in the gap-free global order. Ordered by (commit-order key,
/// position); [`Cursor::START`] precedes every event.
///
/// On PostgreSQL the key is the writing transaction's id; on SQLite, where
/// writers are serialised and positions already follow commit order, it is 0.
/// Projections store both numbers as their checkpoint.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub struct Cursor {
    xact: i64,
    position: i64,
}

impl Cursor {
    /// Before every event.
    pub const START: Cursor = Cursor {
        xact: 0,
        position: 0,
    };

    /// Rebuilds a cursor from its two parts (e.g. a stored checkpoint).
    pub const fn new(xact: i64, position: i64) -> Cursor {
        Cursor { xact, position }
    }

    /// The commit-order key (PostgreSQL transaction id; 0 on SQLite).
    pub const fn xact(self) -> i64 {
        self.xact
    }

    /// The global position of the event this cursor points at.
    pub const fn position(self) -> i64 {
        self.position
    }
}

/// `xact.position`, e.g. `7412.1033`; parsed back by [`FromStr`], so a
/// cursor can travel as an opaque string.
impl fmt::Display for Cursor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.xact, self.position)
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("a cursor is written as <xact>.<position>")]
pub struct CursorParseError;

impl FromStr for Cursor {
    type Err = CursorParseError;
    fn from_str(s: &str) -> Result<Cursor, CursorParseError> {
        let (xact, position) = s.split_once('.').ok_or(CursorParseError)?;
        Ok(Cursor {
            xact: xact.parse().map_err(|_| CursorParseError)?,
            position: position.parse().map_err(|_| CursorParseError)?,
        })
    }
}

/// An event as stored, after upcasting.
#[derive(Debug, Clone, PartialEq)]
pub struct RecordedEvent {
    /// Unique and increasing in the order appends *started*; an API client's
    /// read-your-writes token. Not a safe tailing key: use `cursor`.
    pub position: i64,
    pub cursor: Cursor,
    pub stream_id: String,
    pub version: u64,
    pub event_id: Uuid,
    pub event_type: String,
    pub schema: i32,
    pub data: EventData,
    pub metadata: Metadata,
    pub recorded_at: DateTime<Utc>,
}

/// The outcome of a successful (or successfully replayed) append.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Appended {
    /// Each stream of the request, in request order, with its new last version.
    pub streams: Vec<(String, u64)>,
    /// Smallest and largest position written by the append.
    pub first_position: i64,
    pub last_position: i64,
    /// The cursor of the append's last event in the global order: a
    /// projection whose checkpoint reached it has seen the whole append.
    pub last_cursor: Cursor,
}

/// Why an append was refused. Nothing of a refused append is written.
#[derive(Debug, thiserror::Error)]
pub enum AppendError {
    /// The stream's version did not match the expectation.
    #[error("stream {stream_id}: expected {expected:?}, actual version {actual:?}")]
    Conflict {
        stream_id: String,
        expected: ExpectedVersion,
        /// The stream's last version when the conflict was seen; None = no stream.
        actual: Option<u64>,
    },
    /// An event id is already stored, and the request is not an identical
    /// re-send of the append that stored it.
    #[error("event id {event_id} is already stored by another append")]
    EventIdTaken { event_id: Uuid },
    /// The request has no streams, or a stream without events.
    #[error("an append needs at least one event in each stream")]
    NoEvents,
    #[error("an append has more than {EVENTS_PER_APPEND_MAX} events")]
    TooManyEvents,
    #[error("stream {stream_id} appears twice in one append")]
    StreamRepeated { stream_id: String },
    #[error("event id {event_id} appears twice in one append")]
    EventIdRepeated { event_id: Uuid },
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl From<sqlx::Error> for AppendError {
    fn from(e: sqlx::Error) -> AppendError {
        AppendError::Store(StoreError::Database(e))
    }
}

/// Rewrites old payload versions into the current one as events are read.
/// Stored events are never changed; upcasting happens on every read.
pub trait Upcaster: Send + Sync {
    /// Whether [`Upcaster::upcast`] may change events of this type and
    /// schema; when it says no, the stored payload is handed out as it is,
    /// without parsing it.
    fn applies(&self, _event_type: &str, _schema: i32) -> bool {
        true
    }

    fn upcast(
        &self,
        event_type: &str,
        schema: i32,
        data: serde_json::Value,
    ) -> (i32, serde_json::Value);
}

/// The upcaster that changes nothing.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoUpcast;

impl Upcaster for NoUpcast {
    fn applies(&self, _event_type: &str, _schema: i32) -> bool {
        false
    }

    fn upcast(
        &self,
        _event_type: &str,
        schema: i32,
        data: serde_json::Value,
    ) -> (i32, serde_json::Value) {
        (schema, data)
    }
}

/// The event log.
#[async_trait::async_trait]
pub trait EventStore: Send + Sync {
    /// Appends atomically to all streams of the request, in its own short
    /// transaction (or one autocommit statement where that alone is atomic).
    async fn append(&self, streams: &[StreamAppend]) -> Result<Appended, AppendError>;

    /// Appends inside the caller's unit of work. On any error the caller must
    /// roll back (or drop) `tx`: part of the append may be written in it.
    /// Events appended here are seen by subscribers once `tx` commits; the
    /// wake-up may lag up to a subscriber's poll interval.
    async fn append_in(
        &self,
        tx: &mut Tx,
        streams: &[StreamAppend],
    ) -> Result<Appended, AppendError>;

    /// Appends several independent requests inside `tx` (group commit): for
    /// each, `Some` when every stream of it was written, `None` when one of its
    /// expectations did not hold. Unless every entry is `Some`, part of the
    /// requests may be written in `tx` and the caller must roll it back. The
    /// requests are applied in order: of two requests expecting the same
    /// version of a stream at most one is written, and a request expecting
    /// the version an earlier one leaves is written after it (a chain), unless
    /// that earlier one is not. PostgreSQL writes all requests with one
    /// statement when they expect only `NoStream` or `Exact`.
    async fn append_each_in(
        &self,
        tx: &mut Tx,
        requests: &[&[StreamAppend]],
    ) -> Result<Vec<Option<Appended>>, AppendError> {
        let mut results = Vec::with_capacity(requests.len());
        for streams in requests {
            match self.append_in(tx, streams).await {
                Ok(appended) => results.push(Some(appended)),
                Err(AppendError::Conflict { .. }) => results.push(None),
                Err(e) => return Err(e),
            }
        }
        Ok(results)
    }

    /// A unit of work on this store's database, as [`Database::begin`], but on
    /// PostgreSQL on one of the store's own connections where one is free.
    async fn begin(&self) -> Result<Tx, StoreError>;

    /// A connection for one autocommit statement of the caller's that appends with
    /// [`EachAppend`] (group commit writes a whole batch so): PostgreSQL only, `None` on other
    /// backends. Its prepared statements are planned once, not per execution (see
    /// `connections::StoreConnections::planning_once`). See [`PgConn`] for how to give it back.
    async fn statement_connection(&self) -> Result<Option<PgConn>, StoreError> {
        Ok(None)
    }

    /// Up to `limit` events of one stream with `version >= from_version`, in
    /// version order.
    async fn read_stream(
        &self,
        stream_id: &str,
        from_version: u64,
        limit: usize,
    ) -> Result<Vec<RecordedEvent>, StoreError>;

    /// Every event of each of `stream_ids`, each stream's events together and
    /// in version order (the order of the streams is the backend's): the
    /// streams of a batch of work with as few round trips as the backend
    /// allows (one per [`READ_BATCH_MAX`] events on PostgreSQL).
    async fn read_streams(&self, stream_ids: &[String]) -> Result<Vec<RecordedEvent>, StoreError> {
        let mut ids: Vec<&String> = stream_ids.iter().collect();
        ids.sort();
        ids.dedup();
        let mut events = Vec::new();
        for id in ids {
            loop {
                let from = events
                    .last()
                    .filter(|last: &&RecordedEvent| &last.stream_id == id)
                    .map_or(1, |last| last.version + 1);
                let page = self.read_stream(id, from, READ_BATCH_MAX).await?;
                let full = page.len() == READ_BATCH_MAX;
                events.extend(page);
                if !full {
                    break;
                }
            }
        }
        Ok(events)
    }

    /// One page of many streams: up to `limit` events of `stream_ids` after `after` (a stream id
    /// and version; `None` before every event), in (stream id, version) order, stream ids in the
    /// backend's own order (its collation). For a reader that must not hold a stream whole.
    async fn read_streams_page(
        &self,
        stream_ids: &[String],
        after: Option<(&str, u64)>,
        limit: usize,
    ) -> Result<Vec<RecordedEvent>, StoreError>;

    /// Up to `limit` ids of streams with events, each once, after `after` in the backend's own
    /// order of stream ids (the order [`EventStore::read_streams_page`] reads them in).
    async fn stream_ids_after(
        &self,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<String>, StoreError>;

    /// The events at `positions` that exist, in the gap-free global order.
    async fn read_positions(&self, positions: &[i64]) -> Result<Vec<RecordedEvent>, StoreError>;

    /// The stream's last event, if it has any (one statement: a guard's state).
    async fn last_event(&self, stream_id: &str) -> Result<Option<RecordedEvent>, StoreError>;

    /// The stream's last version; None if it has no events.
    async fn stream_version(&self, stream_id: &str) -> Result<Option<u64>, StoreError>;

    /// Up to `limit` events strictly after `after` in the gap-free global
    /// order. An event not returned now can never later appear before the
    /// last event returned.
    async fn read_all(&self, after: Cursor, limit: usize)
        -> Result<Vec<RecordedEvent>, StoreError>;

    /// The cursor of the last event `read_all` can currently return
    /// ([`Cursor::START`] for an empty log); for measuring lag.
    async fn head(&self) -> Result<Cursor, StoreError>;

    /// The cursor of the event at `position`, if it is committed. A reader whose
    /// cursor reached it has seen that event (read-your-writes for API clients).
    async fn cursor_of_position(&self, position: i64) -> Result<Option<Cursor>, StoreError>;

    /// Events after `from` in batches of at most `batch_size`: first catching
    /// up, then tailing live. Never ends by itself; drop it to stop. After an
    /// `Err` item the stream keeps going (it retries after a short pause).
    fn subscribe(
        &self,
        from: Cursor,
        batch_size: usize,
    ) -> BoxStream<'static, Result<Vec<RecordedEvent>, StoreError>>;
}

/// A connection pool to one of the two backends.
#[derive(Debug, Clone)]
pub enum Database {
    Postgres(sqlx::PgPool),
    Sqlite(sqlx::SqlitePool),
}

/// A unit of work spanning the event log and other tables of the same
/// database (the idempotency record, the webhook-inbox row and projection
/// checkpoints commit in the same transaction as the events).
#[derive(Debug)]
pub enum Tx {
    Postgres(PgTx),
    /// Begun with `BEGIN IMMEDIATE`: it takes the write lock up front, so it
    /// never fails half-way upgrading a read lock (`SQLITE_BUSY_SNAPSHOT`).
    Sqlite(sqlx::Transaction<'static, sqlx::Sqlite>),
}

impl Tx {
    pub async fn commit(self) -> Result<(), StoreError> {
        match self {
            Tx::Postgres(tx) => tx.commit().await?,
            Tx::Sqlite(tx) => tx.commit().await?,
        }
        Ok(())
    }

    pub async fn rollback(self) -> Result<(), StoreError> {
        match self {
            Tx::Postgres(tx) => tx.rollback().await?,
            Tx::Sqlite(tx) => tx.rollback().await?,
        }
        Ok(())
    }

    /// Marks where one part of the transaction begins, so that the part alone can be undone
    /// ([`Tx::rollback_to_savepoint`]) or kept ([`Tx::release_savepoint`]). One at a time.
    pub async fn savepoint(&mut self) -> Result<(), StoreError> {
        self.execute("SAVEPOINT part").await
    }

    /// Undoes what was written since [`Tx::savepoint`] (also after a failed statement, which on
    /// PostgreSQL leaves the transaction unusable until then) and ends the part.
    pub async fn rollback_to_savepoint(&mut self) -> Result<(), StoreError> {
        self.execute("ROLLBACK TO SAVEPOINT part").await?;
        self.execute("RELEASE SAVEPOINT part").await
    }

    /// Keeps what was written since [`Tx::savepoint`] and ends the part.
    pub async fn release_savepoint(&mut self) -> Result<(), StoreError> {
        self.execute("RELEASE SAVEPOINT part").await
    }

    async fn execute(&mut self, sql: &str) -> Result<(), StoreError> {
        match self {
            Tx::Postgres(tx) => {
                sqlx::query(sql).execute(&mut **tx).await?;
            }
            Tx::Sqlite(tx) => {
                sqlx::query(sql).execute(&mut **tx).await?;
            }
        }
        Ok(())
    }
}

impl Database {
    /// Opens a pool for `postgres://…` or `sqlite://path` (also `sqlite:path`).
    ///
    /// PostgreSQL: a URL may name several hosts (`postgres://u@db1,db2/asiento`); the pool then
    /// connects to the one that is the primary and follows it to a promoted standby
    /// ([`primary`]).
    ///
    /// SQLite: the file and its parent directory are created if missing; WAL
    /// journal, `synchronous=FULL` (a committed payment event must survive a
    /// power cut, which NORMAL does not promise in WAL mode), a busy timeout
    /// of [`SQLITE_BUSY_TIMEOUT_MS`], foreign keys on.
    pub async fn connect(url: &str) -> Result<Database, StoreError> {
        let pool_size = if url.starts_with("sqlite:") {
            SQLITE_POOL_CONNECTIONS_MAX
        } else {
            PG_POOL_CONNECTIONS_MAX
        };
        Database::connect_with_pool_size(url, pool_size).await
    }

    /// [`Database::connect`] with a chosen number of pooled connections.
    pub async fn connect_with_pool_size(
        url: &str,
        connections_max: u32,
    ) -> Result<Database, StoreError> {
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            let pool_options = PgPoolOptions::new()
                .max_connections(connections_max)
                // A ping per acquire is a round trip per command; a broken
                // connection surfaces as an error on first use instead.
                .test_before_acquire(false);
            if let Some(hosts) = primary::hosts(url)? {
                let current = primary::find(&hosts).await.ok_or(StoreError::NoPrimary)?;
                let pool = pool_options.connect_with(hosts[current].clone()).await?;
                primary::follow(pool.clone(), hosts, current);
                return Ok(Database::Postgres(pool));
            }
            let pool = pool_options
                .connect_with(PgConnectOptions::from_str(url)?)
                .await?;
            Ok(Database::Postgres(pool))
        } else if url.starts_with("sqlite:") {
            let options = SqliteConnectOptions::from_str(url)?
                .create_if_missing(true)
                .journal_mode(SqliteJournalMode::Wal)
                .synchronous(SqliteSynchronous::Full)
                .busy_timeout(Duration::from_millis(SQLITE_BUSY_TIMEOUT_MS))
                .foreign_keys(true);
            if let Some(dir) = options.get_filename().parent() {
                if !dir.as_os_str().is_empty() {
                    std::fs::create_dir_all(dir).map_err(StoreError::CreateDir)?;
                }
            }
            let pool = SqlitePoolOptions::new()
                .max_connections(connections_max)
                .test_before_acquire(false)
                .connect_with(options)
                .await?;
            Ok(Database::Sqlite(pool))
        } else {
            Err(StoreError::UnsupportedUrl)
        }
    }

    /// A pool to a PostgreSQL standby that only serves reads: it connects on first use (a
    /// standby down at start or later fails reads, which their caller then asks of the primary)
    /// and gives up on a connection after [`STANDBY_ACQUIRE_MS`] instead of holding a read.
    pub fn connect_standby(url: &str, connections_max: u32) -> Result<Database, StoreError> {
        if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
            return Err(StoreError::UnsupportedUrl);
        }
        let options = PgConnectOptions::from_str(url)?;
        let pool = PgPoolOptions::new()
            .max_connections(connections_max)
            .acquire_timeout(Duration::from_millis(STANDBY_ACQUIRE_MS))
            .test_before_acquire(false)
            .connect_lazy_with(options);
        Ok(Database::Postgres(pool))
    }

    pub fn backend(&self) -> Backend {
        match self {
            Database::Postgres(_) => Backend::Postgres,
            Database::Sqlite(_) => Backend::Sqlite,
        }
    }

    /// Applies the migrations embedded in the binary for this backend.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        match self {
            Database::Postgres(pool) => PG_MIGRATOR.run(pool).await?,
            Database::Sqlite(pool) => SQLITE_MIGRATOR.run(pool).await?,
        }
        Ok(())
    }

    /// One round trip to the database (for `/readyz`).
    pub async fn ping(&self) -> Result<(), StoreError> {
        match self {
            Database::Postgres(pool) => {
                sqlx::query("SELECT 1").execute(pool).await?;
            }
            Database::Sqlite(pool) => {
                sqlx::query("SELECT 1").execute(pool).await?;
            }
        }
        Ok(())
    }

    /// Whether an embedded migration has not been applied (successfully) yet.
    pub async fn migrations_pending(&self) -> Result<bool, StoreError> {
        let (migrator, applied) = match self {
            Database::Postgres(pool) => {
                let exists: bool =
                    sqlx::query_scalar("SELECT to_regclass('_sqlx_migrations') IS NOT NULL")
                        .fetch_one(pool)
                        .await?;
                if !exists {
                    return Ok(true);
                }
                let applied: Vec<i64> =
                    sqlx::query_scalar("SELECT version FROM _sqlx_migrations WHERE success")
                        .fetch_all(pool)
                        .await?;
                (&PG_MIGRATOR, applied)
            }
            Database::Sqlite(pool) => {
                let exists: bool = sqlx::query_scalar(
                    "SELECT count(*) > 0 FROM sqlite_master \
                     WHERE type = 'table' AND name = '_sqlx_migrations'",
                )
                .fetch_one(pool)
                .await?;
                if !exists {
                    return Ok(true);
                }
                let applied: Vec<i64> =
                    sqlx::query_scalar("SELECT version FROM _sqlx_migrations WHERE success")
                        .fetch_all(pool)
                        .await?;
                (&SQLITE_MIGRATOR, applied)
            }
        };
        Ok(migrator
            .iter()
            .filter(|m| m.migration_type.is_up_migration())
            .any(|m| !applied.contains(&m.version)))
    }

    /// Starts a unit of work (see [`Tx`]).
    pub async fn begin(&self) -> Result<Tx, StoreError> {
        match self {
            Database::Postgres(pool) => Ok(Tx::Postgres(
                PgTx::begin(connections::Lease::pooled(pool).await?).await?,
            )),
            Database::Sqlite(pool) => Ok(Tx::Sqlite(begin_sqlite(pool).await?)),
        }
    }

    /// The event log on this database, reading payloads as stored.
    pub fn event_store(&self) -> Arc<dyn EventStore> {
        self.event_store_with(Arc::new(NoUpcast))
    }

    /// The event log on this database, upcasting payloads on read.
    pub fn event_store_with(&self, upcaster: Arc<dyn Upcaster>) -> Arc<dyn EventStore> {
        match self {
            Database::Postgres(pool) => Arc::new(PgEventStore::new(pool.clone(), upcaster)),
            Database::Sqlite(pool) => Arc::new(SqliteEventStore::new(pool.clone(), upcaster)),
        }
    }
}

/// Checks what both backends refuse before touching the database.
fn validate(streams: &[StreamAppend]) -> Result<(), AppendError> {
    if streams.is_empty() || streams.iter().any(|s| s.events.is_empty()) {
        return Err(AppendError::NoEvents);
    }
    let total: usize = streams.iter().map(|s| s.events.len()).sum();
    if total > EVENTS_PER_APPEND_MAX {
        return Err(AppendError::TooManyEvents);
    }
    let mut stream_ids = std::collections::HashSet::with_capacity(streams.len());
    let mut event_ids = std::collections::HashSet::with_capacity(total);
    for s in streams {
        if !stream_ids.insert(s.stream_id.as_str()) {
            return Err(AppendError::StreamRepeated {
                stream_id: s.stream_id.clone(),
            });
        }
        for e in &s.events {
            if !event_ids.insert(e.event_id) {
                return Err(AppendError::EventIdRepeated {
                    event_id: e.event_id,
                });
            }
        }
    }
    Ok(())
}

/// `BEGIN IMMEDIATE` on a pooled SQLite connection, in a task of its own so
/// that it always completes, whoever stops waiting for it. sqlx-sqlite (0.8) executes the
/// BEGIN on its worker thread and hands the result back through a rendezvous
/// channel; a caller that stops waiting at the wrong moment (a client that
/// disconnects, a timeout) can leave the BEGIN acknowledged with no
/// `Transaction` to roll it back: the connection goes back to the pool inside
/// a transaction that holds the write lock, and every later write fails with
/// "database is locked" (the conformance test
/// `appends_abandoned_mid_flight_write_all_or_nothing` caught this). Once
/// begun, the `Transaction` rolls back when dropped, so the rest of the work
/// may be abandoned safely.
async fn begin_sqlite(
    pool: &sqlx::SqlitePool,
) -> Result<sqlx::Transaction<'static, sqlx::Sqlite>, StoreError> {
    let pool = pool.clone();
    tokio::spawn(async move { pool.begin_with("BEGIN IMMEDIATE").await })
        .await
        .map_err(|_| StoreError::from(sqlx::Error::WorkerCrashed))?
        .map_err(StoreError::from)
}

/// Versions are `u64` in the API and `bigint` in the database.
fn version_from_db(position: i64, version: i64) -> Result<u64, StoreError> {
    u64::try_from(version).map_err(|_| StoreError::Corrupt {
        position,
        reason: "negative version",
    })
}

/// The caller's limit, clamped to what one round trip may carry.
fn clamp_limit(limit: usize) -> i64 {
    // READ_BATCH_MAX is far below i64::MAX, so the cast cannot truncate.
    limit.clamp(1, READ_BATCH_MAX) as i64
}

/// One stored event as both backends select it, columns in this order:
/// position, xact, stream_id, version, event_id, event_type, schema, data,
/// metadata, recorded_at (SQLite selects `0 AS xact`). Decoded by index: a
/// by-name lookup per column per row is measurable on a million-event replay.
struct EventRow {
    position: i64,
    xact: i64,
    stream_id: String,
    version: i64,
    event_id: Uuid,
    event_type: String,
    schema: i32,
    data: sqlx::types::Json<Box<serde_json::value::RawValue>>,
    metadata: sqlx::types::Json<Metadata>,
    recorded_at: DateTime<Utc>,
}

impl<'r, R> sqlx::FromRow<'r, R> for EventRow
where
    R: sqlx::Row,
    usize: sqlx::ColumnIndex<R>,
    i64: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    i32: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    String: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    Uuid: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    sqlx::types::Json<Box<serde_json::value::RawValue>>:
        sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    sqlx::types::Json<Metadata>: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    DateTime<Utc>: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    fn from_row(row: &'r R) -> Result<EventRow, sqlx::Error> {
        Ok(EventRow {
            position: row.try_get(0)?,
            xact: row.try_get(1)?,
            stream_id: row.try_get(2)?,
            version: row.try_get(3)?,
            event_id: row.try_get(4)?,
            event_type: row.try_get(5)?,
            schema: row.try_get(6)?,
            data: row.try_get(7)?,
            metadata: row.try_get(8)?,
            recorded_at: row.try_get(9)?,
        })
    }
}

impl EventRow {
    fn into_recorded(self, upcaster: &dyn Upcaster) -> Result<RecordedEvent, StoreError> {
        let version = version_from_db(self.position, self.version)?;
        let (schema, data) = if upcaster.applies(&self.event_type, self.schema) {
            let data = EventData::from_raw(self.data.0).into_value();
            let (schema, data) = upcaster.upcast(&self.event_type, self.schema, data);
            (schema, EventData::from(data))
        } else {
            (self.schema, EventData::from_raw(self.data.0))
        };
        Ok(RecordedEvent {
            position: self.position,
            cursor: Cursor::new(self.xact, self.position),
            stream_id: self.stream_id,
            version,
            event_id: self.event_id,
            event_type: self.event_type,
            schema,
            data,
            metadata: self.metadata.0,
            recorded_at: self.recorded_at,
        })
    }
}

/// Merges the per-stream results of one append into the caller's answer.
fn merge(results: Vec<classify::StreamResult>) -> Appended {
    let first_position = results
        .iter()
        .map(|r| r.first_position)
        .min()
        .unwrap_or_default();
    let last_position = results
        .iter()
        .map(|r| r.last_position)
        .max()
        .unwrap_or_default();
    let last_cursor = results
        .iter()
        .map(|r| r.last_cursor)
        .max()
        .unwrap_or_default();
    Appended {
        streams: results
            .into_iter()
            .map(|r| (r.stream_id, r.version))
            .collect(),
        first_position,
        last_position,
        last_cursor,
    }
}
