//! The projection: transfer streams from the log into two tables per generation.
//!
//! - `transfers_g{n}`: one row per transfer whose request has been applied: the columns the list
//!   filters by, the rendered transfer object, and `state`, the transfer folded over its events
//!   1..=version, onto which the next batch folds only its new events;
//! - `transfer_pending_g{n}`: events seen ahead of a gap in their stream's versions.
//!
//! Readers use the view `transfers`, which points at the active generation.

use asiento_eventstore::{RecordedEvent, Tx};
use asiento_projector::history::{fold_batch, Tables};
use asiento_projector::{on_tx, Projection, ProjectionError};
use sqlx::types::Json;

use crate::fold::{transfer_stream, Folder};
use crate::TransferRow;

/// The registry name, and the argument of `asiento projections rebuild transfers`.
pub const NAME: &str = "transfers";
/// Bump when the tables or the way they are filled change: runners then refuse the old data
/// until `asiento projections rebuild transfers`.
pub const FINGERPRINT: &str = "transfers-v2";

/// The transfers read model. Stateless: everything lives in the database.
#[derive(Debug, Clone, Copy, Default)]
pub struct Transfers;

pub(crate) const VIEW: &str = "transfers";
const TABLE: &str = "transfers_g";
const PENDING_TABLE: &str = "transfer_pending_g";

/// The list's access paths, newest first within a tenant, each ending with the keyset.
fn indexes(g: i64) -> Vec<String> {
    [
        ("by_created", ""),
        ("by_from", "from_account, "),
        ("by_to", "to_account, "),
        ("by_status", "status, "),
    ]
    .iter()
    .map(|(name, column)| {
        format!(
            "CREATE INDEX {TABLE}{g}_{name} ON {TABLE}{g} \
             (tenant, {column}created_ns DESC, transfer_id DESC)"
        )
    })
    .collect()
}

fn ddl(g: i64, postgres: bool) -> Vec<String> {
    let (int, json, rowid) = if postgres {
        ("BIGINT", "JSONB", "")
    } else {
        ("INTEGER", "TEXT", " WITHOUT ROWID")
    };
    let mut statements = vec![
        format!(
            "CREATE TABLE {TABLE}{g} (
                transfer_id  TEXT  PRIMARY KEY,
                tenant       TEXT  NOT NULL,
                from_account TEXT  NOT NULL,
                to_account   TEXT  NOT NULL,
                status       TEXT  NOT NULL,
                created_ns   {int} NOT NULL,
                version      {int} NOT NULL CHECK (version >= 1),
                position     {int} NOT NULL,
                object       {json} NOT NULL,
                state        {json} NOT NULL){rowid}"
        ),
        format!(
            "CREATE TABLE {PENDING_TABLE}{g} (
                transfer_id TEXT  NOT NULL,
                version     {int} NOT NULL,
                event       {json} NOT NULL,
                PRIMARY KEY (transfer_id, version)){rowid}"
        ),
    ];
    statements.extend(indexes(g));
    statements
}

#[async_trait::async_trait]
impl Projection for Transfers {
    fn name(&self) -> &'static str {
        NAME
    }

    fn fingerprint(&self) -> &'static str {
        FINGERPRINT
    }

    async fn create_generation(&self, tx: &mut Tx, g: i64) -> Result<(), ProjectionError> {
        let postgres = matches!(tx, Tx::Postgres(_));
        for statement in ddl(g, postgres) {
            on_tx!(tx, conn => sqlx::query(&statement).execute(conn).await?.rows_affected());
        }
        Ok(())
    }

    async fn point_views(&self, tx: &mut Tx, g: i64) -> Result<(), ProjectionError> {
        asiento_projector::point_view(tx, VIEW, &format!("{TABLE}{g}")).await
    }

    async fn drop_generation(&self, tx: &mut Tx, g: i64) -> Result<(), ProjectionError> {
        for table in [TABLE, PENDING_TABLE] {
            let statement = format!("DROP TABLE IF EXISTS {table}{g}");
            on_tx!(tx, conn => sqlx::query(&statement).execute(conn).await?.rows_affected());
        }
        Ok(())
    }

    async fn apply(
        &self,
        tx: &mut Tx,
        g: i64,
        events: &[RecordedEvent],
    ) -> Result<(), ProjectionError> {
        let (rows, pending) = (format!("{TABLE}{g}"), format!("{PENDING_TABLE}{g}"));
        let tables = Tables {
            rows: &rows,
            pending: &pending,
            id_column: "transfer_id",
        };
        let mut changed = Vec::new();
        for (_, state) in fold_batch::<Folder>(tx, tables, events, transfer_stream).await? {
            if let Some(row) = state.row() {
                changed.push(Columns::of(row, state)?);
            }
        }
        upsert(tx, g, &changed).await
    }
}

/// A row as its columns are stored.
struct Columns {
    row: TransferRow,
    created_ns: i64,
    version: i64,
    state: Folder,
}

impl Columns {
    fn of(row: TransferRow, state: Folder) -> Result<Columns, ProjectionError> {
        let at_position = |reason: &str| ProjectionError::Malformed {
            position: row.position,
            reason: reason.to_owned(),
        };
        Ok(Columns {
            created_ns: row
                .created_at
                .timestamp_nanos_opt()
                .ok_or_else(|| at_position("created_at is outside 1677..2262"))?,
            version: i64::try_from(row.version)
                .map_err(|_| at_position("stream version overflows i64"))?,
            row,
            state,
        })
    }
}

const UPSERT_COLUMNS: &str = "(transfer_id, tenant, from_account, to_account, status, created_ns,
             version, position, object, state)";

const UPSERT_ON_CONFLICT: &str = "ON CONFLICT (transfer_id) DO UPDATE SET
             tenant = excluded.tenant, from_account = excluded.from_account,
             to_account = excluded.to_account, status = excluded.status,
             created_ns = excluded.created_ns, version = excluded.version,
             position = excluded.position, object = excluded.object, state = excluded.state";

/// Writes the batch's changed rows: one UNNEST statement on PostgreSQL (each transfer appears
/// once: `apply` grouped the batch by transfer), a statement per row on SQLite (in process).
async fn upsert(tx: &mut Tx, g: i64, rows: &[Columns]) -> Result<(), ProjectionError> {
    if rows.is_empty() {
        return Ok(());
    }
    match tx {
        Tx::Postgres(t) => {
            let statement = format!(
                "INSERT INTO {TABLE}{g} {UPSERT_COLUMNS}
                 SELECT * FROM UNNEST($1::text[], $2::text[], $3::text[], $4::text[], $5::text[],
                     $6::int8[], $7::int8[], $8::int8[], $9::jsonb[], $10::jsonb[])
                 {UPSERT_ON_CONFLICT}"
            );
            let text = |f: &dyn Fn(&Columns) -> &str| rows.iter().map(f).collect::<Vec<&str>>();
            let int = |f: &dyn Fn(&Columns) -> i64| rows.iter().map(f).collect::<Vec<i64>>();
            sqlx::query(&statement)
                .bind(text(&|c| &c.row.id))
                .bind(text(&|c| &c.row.tenant))
                .bind(text(&|c| &c.row.from))
                .bind(text(&|c| &c.row.to))
                .bind(text(&|c| c.row.status.as_str()))
                .bind(int(&|c| c.created_ns))
                .bind(int(&|c| c.version))
                .bind(int(&|c| c.row.position))
                .bind(rows.iter().map(|c| Json(&c.row.object)).collect::<Vec<_>>())
                .bind(rows.iter().map(|c| Json(&c.state)).collect::<Vec<_>>())
                .execute(&mut **t)
                .await?;
        }
        Tx::Sqlite(t) => {
            let statement = format!(
                "INSERT INTO {TABLE}{g} {UPSERT_COLUMNS}
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
                 {UPSERT_ON_CONFLICT}"
            );
            for c in rows {
                sqlx::query(&statement)
                    .bind(&c.row.id)
                    .bind(&c.row.tenant)
                    .bind(&c.row.from)
                    .bind(&c.row.to)
                    .bind(c.row.status.as_str())
                    .bind(c.created_ns)
                    .bind(c.version)
                    .bind(c.row.position)
                    .bind(Json(&c.row.object))
                    .bind(Json(&c.state))
                    .execute(&mut **t)
                    .await?;
            }
        }
    }
    Ok(())
}
