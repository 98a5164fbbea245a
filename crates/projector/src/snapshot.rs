//! A read model read a page at a time, every page exact at one checkpoint: how the checkers
//! (`verify`) compare a read model with the log without holding all its rows, or all its folds,
//! at once.
//!
//! A [`Snapshot`] is one read-only transaction that sees the database as it was when it began
//! (`REPEATABLE READ` on PostgreSQL; on SQLite a read transaction, whose first read fixes what it
//! sees): the projection's checkpoint read first and every page of rows read after it agree,
//! while batches and a rebuild's swap commit meanwhile. The log only grows, so the streams of a
//! page are read from it outside the snapshot and cut at the checkpoint ([`fold_streams`]).

use asiento_eventstore::{Cursor, Database, EventStore, StoreError};
use serde::de::DeserializeOwned;
use sqlx::postgres::PgRow;
use sqlx::sqlite::SqliteRow;
use sqlx::types::Json;
use sqlx::{FromRow, Row as _};

use crate::history::{fold_streams, StreamFold};
use crate::ProjectionError;

/// One read-only snapshot of the database (see the module's doc).
pub enum Snapshot {
    Postgres(sqlx::Transaction<'static, sqlx::Postgres>),
    Sqlite(sqlx::Transaction<'static, sqlx::Sqlite>),
}

/// Runs `$body` with `$conn` bound to the `&mut` connection of the snapshot's transaction, for
/// either backend (as [`on_tx!`](crate::on_tx)).
#[macro_export]
macro_rules! on_snapshot {
    ($snapshot:expr, $conn:ident => $body:expr) => {
        match $snapshot {
            $crate::snapshot::Snapshot::Postgres(t) => {
                let $conn = &mut **t;
                $body
            }
            $crate::snapshot::Snapshot::Sqlite(t) => {
                let $conn = &mut **t;
                $body
            }
        }
    };
}

impl Snapshot {
    pub async fn begin(db: &Database) -> Result<Snapshot, sqlx::Error> {
        Ok(match db {
            Database::Postgres(pool) => {
                let mut tx = pool.begin().await?;
                sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
                    .execute(&mut *tx)
                    .await?;
                Snapshot::Postgres(tx)
            }
            Database::Sqlite(pool) => Snapshot::Sqlite(pool.begin().await?),
        })
    }

    /// The cursor the projection's rows are exact at; `None` when it is not installed.
    pub async fn checkpoint(&mut self, projection: &str) -> Result<Option<Cursor>, sqlx::Error> {
        let row: Option<(i64, i64)> = on_snapshot!(self, conn => {
            sqlx::query_as(
                "SELECT checkpoint_xact, checkpoint_position FROM projections WHERE name = $1",
            )
            .bind(projection)
            .fetch_optional(conn)
            .await?
        });
        Ok(row.map(|(xact, position)| Cursor::new(xact, position)))
    }

    /// Up to `limit` streams named `prefix` + an id whose first event is at or before `upto`,
    /// after `after` in the database's order of stream ids; with `without_rows`, only those whose
    /// id is no row's key there (the streams a read model is missing).
    pub async fn streams(
        &mut self,
        prefix: &str,
        without_rows: Option<&RowsOfStreams<'_>>,
        after: &str,
        upto: Cursor,
        limit: usize,
    ) -> Result<Vec<String>, sqlx::Error> {
        let without = without_rows.map_or(String::new(), |rows| {
            format!(
                "AND NOT EXISTS (SELECT 1 FROM {view} v \
                 WHERE v.{key_column} = substr(e.stream_id, {from}))",
                view = rows.view,
                key_column = rows.key_column,
                from = rows.prefix.len() + 1
            )
        });
        let statement = |xact: &str| {
            format!(
                "SELECT e.stream_id FROM events e WHERE e.version = 1 \
                 AND e.stream_id LIKE '{prefix}%' AND substr(e.stream_id, 1, {length}) = '{prefix}' \
                 AND e.stream_id > $1 \
                 AND ({xact}, e.position) <= ($2, $3) {without} \
                 ORDER BY e.stream_id LIMIT $4",
                // LIKE ignores case on SQLite: the prefix is compared exactly too.
                length = prefix.len()
            )
        };
        self.ids_up_to(statement, after, upto, limit).await
    }

    /// The ids `statement(xact)` selects: a query whose `$1` is the id to go on after, `$2, $3`
    /// the cursor `upto` and `$4` the limit, given `xact`, the expression of an event `e`'s
    /// transaction id (SQLite's log has none: its cursors' are 0).
    pub async fn ids_up_to(
        &mut self,
        statement: impl FnOnce(&str) -> String,
        after: &str,
        upto: Cursor,
        limit: usize,
    ) -> Result<Vec<String>, sqlx::Error> {
        let statement = statement(match self {
            Snapshot::Postgres(_) => "e.xact",
            Snapshot::Sqlite(_) => "0",
        });
        let limit = i64::try_from(limit.max(1)).unwrap_or(i64::MAX);
        Ok(on_snapshot!(self, conn => {
            sqlx::query_scalar(&statement)
                .bind(after)
                .bind(upto.xact())
                .bind(upto.position())
                .bind(limit)
                .fetch_all(conn)
                .await?
        }))
    }

    /// Every stream of `rows`' kind without a row there, folded from the log up to `upto`, `page`
    /// streams at a time, each given to `missing` with its stream id.
    pub async fn fold_streams_without_rows<F, E>(
        &mut self,
        store: &dyn EventStore,
        rows: &RowsOfStreams<'_>,
        upto: Cursor,
        page: usize,
        mut missing: impl FnMut(String, F) -> Result<(), E>,
    ) -> Result<(), E>
    where
        F: StreamFold,
        E: From<StoreError> + From<ProjectionError> + From<sqlx::Error>,
    {
        let mut after = String::new();
        loop {
            let streams = self
                .streams(rows.prefix, Some(rows), &after, upto, page)
                .await?;
            let Some(last) = streams.last() else {
                return Ok(());
            };
            after = last.clone();
            let folds = fold_streams::<F, E>(store, &streams, upto, CHECK_PAGE_EVENTS).await?;
            for (stream, fold) in folds {
                missing(stream, fold)?;
            }
        }
    }

    /// Compares every row of `rows` with its stream folded from the log up to `upto`, `page`
    /// rows at a time in the order of their keys, then every stream without a row:
    /// `compare(key, row, fold)` gets the row's key, the row (its `columns` as `R`, its `state`
    /// column as `F`) and the stream's fold (`None`: the stream has no event up to `upto`).
    pub async fn compare_rows<R, F, E>(
        &mut self,
        store: &dyn EventStore,
        rows: &RowsOfStreams<'_>,
        columns: &str,
        upto: Cursor,
        page: usize,
        mut compare: impl FnMut(String, Option<(R, F)>, Option<F>) -> Result<(), E>,
    ) -> Result<(), E>
    where
        R: for<'r> FromRow<'r, PgRow> + for<'r> FromRow<'r, SqliteRow> + Send + Unpin,
        F: StreamFold + DeserializeOwned,
        E: From<StoreError> + From<ProjectionError> + From<sqlx::Error>,
    {
        let RowsOfStreams {
            view,
            key_column,
            prefix,
        } = rows;
        let statement = format!(
            "SELECT {key_column} AS row_key, {columns}, state FROM {view} \
             WHERE {key_column} > $1 ORDER BY {key_column} LIMIT $2"
        );
        let limit = i64::try_from(page.max(1)).unwrap_or(i64::MAX);
        let mut after = String::new();
        loop {
            let stored: Vec<(String, R, F)> = on_snapshot!(&mut *self, conn => {
                let raw = sqlx::query(&statement)
                    .bind(&after)
                    .bind(limit)
                    .fetch_all(conn)
                    .await?;
                let mut stored = Vec::with_capacity(raw.len());
                for r in &raw {
                    let Json(state) = r.try_get::<Json<F>, _>("state")?;
                    stored.push((r.try_get("row_key")?, R::from_row(r)?, state));
                }
                stored
            });
            let Some((last, ..)) = stored.last() else {
                break;
            };
            after = last.clone();
            let streams: Vec<String> = stored
                .iter()
                .map(|(key, ..)| format!("{prefix}{key}"))
                .collect();
            let mut folds = fold_streams::<F, E>(store, &streams, upto, CHECK_PAGE_EVENTS).await?;
            for ((key, row, state), stream) in stored.into_iter().zip(&streams) {
                compare(key, Some((row, state)), folds.remove(stream))?;
            }
        }
        self.fold_streams_without_rows(store, rows, upto, page, |stream, fold| {
            let key = stream.strip_prefix(*prefix).unwrap_or(&stream).to_owned();
            compare(key, None, Some(fold))
        })
        .await
    }

    /// Ends the snapshot (it wrote nothing).
    pub async fn end(self) -> Result<(), sqlx::Error> {
        match self {
            Snapshot::Postgres(tx) => tx.rollback().await,
            Snapshot::Sqlite(tx) => tx.rollback().await,
        }
    }
}

/// A row and its folded state as stored against the row and state of its stream's fold:
/// `Some((stored row, recomputed row, whether the states differ))` when they disagree.
pub fn disagreement<R: PartialEq, F: PartialEq>(
    stored: Option<(R, F)>,
    recomputed: Option<(R, F)>,
) -> Option<(Option<R>, Option<R>, bool)> {
    let states_differ = match (&stored, &recomputed) {
        (Some((_, ours)), Some((_, theirs))) => ours != theirs,
        _ => false,
    };
    let (stored, recomputed) = (stored.map(|s| s.0), recomputed.map(|r| r.0));
    (stored != recomputed || states_differ).then_some((stored, recomputed, states_differ))
}

/// Events per log read while a checker reads the log: a page of events decoded at once is what a
/// check holds beside its rows and folds, in a server that checks while it serves.
pub const CHECK_PAGE_EVENTS: usize = 1_000;

/// A read model with a row per stream: the row's key is the stream id after `prefix` (all of it
/// when `prefix` is empty).
pub struct RowsOfStreams<'a> {
    pub view: &'a str,
    pub key_column: &'a str,
    pub prefix: &'a str,
}
