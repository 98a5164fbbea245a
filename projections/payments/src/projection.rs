//! The projection: payment streams from the log into two tables per generation.
//!
//! - `payments_g{n}`: one row per payment whose `PaymentIntended` has been applied: the
//!   columns the list filters and shows (its metadata as JSON), and `state`, the payment folded
//!   over its events 1..=version without its operations (`fold::Folder`), onto which the next
//!   batch folds only its new events;
//! - `payment_pending_g{n}`: events seen ahead of a gap in their stream's versions, waiting for
//!   the missing one (PostgreSQL's gap-free order is by transaction id, not by stream version).
//!
//! Readers use the view `payments`, which points at the active generation.

use asiento_eventstore::{RecordedEvent, Tx};
use asiento_projector::{on_tx, Projection, ProjectionError};
use sqlx::types::Json;

use asiento_projector::history::{fold_batch, Tables, FOLD_TABLE_POSTGRES};

use crate::fold::{payment_stream, to_ns, Folder};
use crate::PaymentRow;

/// The registry name, and the argument of `asiento projections rebuild payments`.
pub const NAME: &str = "payments";
/// Bump when the tables or the way they are filled change: runners then refuse the old data
/// until `asiento projections rebuild payments`.
pub const FINGERPRINT: &str = "payments-v4";

/// The payments read model. Stateless: everything lives in the database.
#[derive(Debug, Clone, Copy, Default)]
pub struct Payments;

/// The stable view readers query, and the generation table behind it.
const VIEW: &str = "payments";
const TABLE: &str = "payments_g";
const PENDING_TABLE: &str = "payment_pending_g";

/// The list's three access paths (API.md filters), newest first within a tenant. Each ends with
/// the payment id so that the keyset (created, id) is read straight from the index. On
/// PostgreSQL a GIN index answers the metadata filters (containment of `{key: value}`).
fn indexes(g: i64, postgres: bool) -> Vec<String> {
    let metadata = postgres.then(|| {
        format!(
            "CREATE INDEX {TABLE}{g}_by_metadata ON {TABLE}{g} USING GIN (metadata jsonb_path_ops)"
        )
    });
    [
        ("by_created", ""),
        ("by_status", "status, "),
        ("by_customer", "customer, "),
    ]
    .iter()
    .map(|(name, column)| {
        format!(
            "CREATE INDEX {TABLE}{g}_{name} ON {TABLE}{g} \
             (tenant, {column}created_ns DESC, payment_id DESC)"
        )
    })
    .chain(metadata)
    .collect()
}

fn ddl_postgres(g: i64) -> Vec<String> {
    let mut statements = vec![
        format!(
            "CREATE TABLE {TABLE}{g} (
                payment_id     TEXT   PRIMARY KEY,
                tenant         TEXT   NOT NULL,
                status         TEXT   NOT NULL,
                amount_minor   BIGINT NOT NULL,
                currency       TEXT   NOT NULL,
                customer       TEXT   NOT NULL,
                provider       TEXT   NOT NULL,
                captured_minor BIGINT NOT NULL,
                refunded_minor BIGINT NOT NULL,
                fee_minor      BIGINT NOT NULL,
                description    TEXT,
                metadata       JSONB  NOT NULL,
                created_ns     BIGINT NOT NULL,
                updated_ns     BIGINT NOT NULL,
                next_action    JSONB,
                version        BIGINT NOT NULL CHECK (version >= 1),
                position       BIGINT NOT NULL,
                state          JSONB  NOT NULL) {FOLD_TABLE_POSTGRES}"
        ),
        format!(
            "CREATE TABLE {PENDING_TABLE}{g} (
                payment_id TEXT   NOT NULL,
                version    BIGINT NOT NULL,
                event      JSONB  NOT NULL,
                PRIMARY KEY (payment_id, version))"
        ),
    ];
    statements.extend(indexes(g, true));
    statements
}

fn ddl_sqlite(g: i64) -> Vec<String> {
    let mut statements = vec![
        format!(
            "CREATE TABLE {TABLE}{g} (
                payment_id     TEXT    PRIMARY KEY,
                tenant         TEXT    NOT NULL,
                status         TEXT    NOT NULL,
                amount_minor   INTEGER NOT NULL,
                currency       TEXT    NOT NULL,
                customer       TEXT    NOT NULL,
                provider       TEXT    NOT NULL,
                captured_minor INTEGER NOT NULL,
                refunded_minor INTEGER NOT NULL,
                fee_minor      INTEGER NOT NULL,
                description    TEXT,
                metadata       TEXT    NOT NULL,
                created_ns     INTEGER NOT NULL,
                updated_ns     INTEGER NOT NULL,
                next_action    TEXT,
                version        INTEGER NOT NULL CHECK (version >= 1),
                position       INTEGER NOT NULL,
                state          TEXT    NOT NULL) WITHOUT ROWID"
        ),
        format!(
            "CREATE TABLE {PENDING_TABLE}{g} (
                payment_id TEXT    NOT NULL,
                version    INTEGER NOT NULL,
                event      TEXT    NOT NULL,
                PRIMARY KEY (payment_id, version)) WITHOUT ROWID"
        ),
    ];
    statements.extend(indexes(g, false));
    statements
}

#[async_trait::async_trait]
impl Projection for Payments {
    fn name(&self) -> &'static str {
        NAME
    }

    fn fingerprint(&self) -> &'static str {
        FINGERPRINT
    }

    async fn create_generation(&self, tx: &mut Tx, g: i64) -> Result<(), ProjectionError> {
        let statements = match tx {
            Tx::Postgres(_) => ddl_postgres(g),
            Tx::Sqlite(_) => ddl_sqlite(g),
        };
        for statement in statements {
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
            id_column: "payment_id",
        };
        let mut changed = Vec::new();
        for (_, state) in fold_batch::<Folder>(tx, tables, events, payment_stream).await? {
            if let Some(row) = state.row()? {
                changed.push(Columns::of(row, state)?);
            }
        }
        upsert(tx, g, changed).await
    }
}

/// A row as its columns are stored.
struct Columns {
    row: PaymentRow,
    created_ns: i64,
    updated_ns: i64,
    version: i64,
    state: Folder,
}

impl Columns {
    fn of(row: PaymentRow, state: Folder) -> Result<Columns, ProjectionError> {
        let at_position = |reason: &str| ProjectionError::Malformed {
            position: row.position,
            reason: reason.to_owned(),
        };
        Ok(Columns {
            created_ns: to_ns(row.created_at)
                .ok_or_else(|| at_position("created_at is outside 1677..2262"))?,
            updated_ns: to_ns(row.updated_at)
                .ok_or_else(|| at_position("updated_at is outside 1677..2262"))?,
            version: i64::try_from(row.version)
                .map_err(|_| at_position("stream version overflows i64"))?,
            row,
            state,
        })
    }
}

const UPSERT_COLUMNS: &str = "(payment_id, tenant, status, amount_minor, currency, customer,
             provider, captured_minor, refunded_minor, fee_minor, created_ns, updated_ns,
             next_action, version, position, state, description, metadata)";

const UPSERT_ON_CONFLICT: &str = "ON CONFLICT (payment_id) DO UPDATE SET
             tenant = excluded.tenant, status = excluded.status,
             amount_minor = excluded.amount_minor, currency = excluded.currency,
             customer = excluded.customer, provider = excluded.provider,
             captured_minor = excluded.captured_minor, refunded_minor = excluded.refunded_minor,
             fee_minor = excluded.fee_minor, created_ns = excluded.created_ns,
             updated_ns = excluded.updated_ns, next_action = excluded.next_action,
             version = excluded.version, position = excluded.position,
             state = excluded.state, description = excluded.description,
             metadata = excluded.metadata";

/// Writes the batch's changed rows: one UNNEST statement on PostgreSQL (each payment appears once:
/// `apply` grouped the batch by payment), a statement per row on SQLite (in process).
async fn upsert(tx: &mut Tx, g: i64, rows: Vec<Columns>) -> Result<(), ProjectionError> {
    if rows.is_empty() {
        return Ok(());
    }
    match tx {
        Tx::Postgres(t) => {
            let statement = format!(
                "INSERT INTO {TABLE}{g} {UPSERT_COLUMNS}
                 SELECT * FROM UNNEST($1::text[], $2::text[], $3::text[], $4::int8[], $5::text[],
                     $6::text[], $7::text[], $8::int8[], $9::int8[], $10::int8[], $11::int8[],
                     $12::int8[], $13::jsonb[], $14::int8[], $15::int8[], $16::jsonb[],
                     $17::text[], $18::jsonb[])
                 {UPSERT_ON_CONFLICT}"
            );
            let column = |f: &dyn Fn(&Columns) -> i64| rows.iter().map(f).collect::<Vec<i64>>();
            let text = |f: &dyn Fn(&Columns) -> &str| rows.iter().map(f).collect::<Vec<&str>>();
            let ids: Vec<String> = rows.iter().map(|c| c.row.id.to_string()).collect();
            sqlx::query(&statement)
                .bind(ids)
                .bind(text(&|c| &c.row.tenant))
                .bind(text(&|c| c.row.status.as_str()))
                .bind(column(&|c| c.row.amount_minor))
                .bind(text(&|c| &c.row.currency))
                .bind(text(&|c| &c.row.customer))
                .bind(text(&|c| &c.row.provider))
                .bind(column(&|c| c.row.captured_minor))
                .bind(column(&|c| c.row.refunded_minor))
                .bind(column(&|c| c.row.fee_minor))
                .bind(column(&|c| c.created_ns))
                .bind(column(&|c| c.updated_ns))
                .bind(
                    rows.iter()
                        .map(|c| c.row.next_action.as_ref().map(Json))
                        .collect::<Vec<_>>(),
                )
                .bind(column(&|c| c.version))
                .bind(column(&|c| c.row.position))
                .bind(rows.iter().map(|c| Json(&c.state)).collect::<Vec<_>>())
                .bind(
                    rows.iter()
                        .map(|c| c.row.description.as_deref())
                        .collect::<Vec<_>>(),
                )
                .bind(
                    rows.iter()
                        .map(|c| Json(&c.row.metadata))
                        .collect::<Vec<_>>(),
                )
                .execute(&mut **t)
                .await?;
        }
        Tx::Sqlite(t) => {
            let statement = format!(
                "INSERT INTO {TABLE}{g} {UPSERT_COLUMNS}
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16,
                     $17, $18)
                 {UPSERT_ON_CONFLICT}"
            );
            for c in &rows {
                sqlx::query(&statement)
                    .bind(c.row.id.to_string())
                    .bind(&c.row.tenant)
                    .bind(c.row.status.as_str())
                    .bind(c.row.amount_minor)
                    .bind(&c.row.currency)
                    .bind(&c.row.customer)
                    .bind(&c.row.provider)
                    .bind(c.row.captured_minor)
                    .bind(c.row.refunded_minor)
                    .bind(c.row.fee_minor)
                    .bind(c.created_ns)
                    .bind(c.updated_ns)
                    .bind(c.row.next_action.as_ref().map(Json))
                    .bind(c.version)
                    .bind(c.row.position)
                    .bind(Json(&c.state))
                    .bind(c.row.description.as_deref())
                    .bind(Json(&c.row.metadata))
                    .execute(&mut **t)
                    .await?;
            }
        }
    }
    Ok(())
}
