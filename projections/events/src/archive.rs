//! The payments' archived operations: what a payment's fold (`PaymentWindow`) no longer holds,
//! a row per operation, so that folding a payment's event reads and writes only its recent
//! operations however many it has.
//!
//! A batch loads back only what its events read (`PaymentWindow::needs`: an operation named by
//! an event, the open ones, or all of a payment's for a cancel's end), and writes the rows
//! leaving its windows and the loaded ones it changed. `verify_states` assembles each payment
//! from its window and its rows.

use std::collections::HashMap;

use asiento_domain::payment::{ArchiveNeed, ArchivedOperation};
use asiento_domain::Operation;
use asiento_eventstore::Tx;
use asiento_projector::{on_tx, ProjectionError};
use sqlx::types::Json;

/// The table of a generation, and the view over the active one that the checker reads.
pub(crate) const TABLE: &str = "merchant_event_operations_g";
pub(crate) const VIEW: &str = "merchant_event_operations";

pub(crate) fn ddl(g: i64, postgres: bool) -> Vec<String> {
    let (int, json, boolean, rowid) = if postgres {
        ("BIGINT", "JSONB", "BOOLEAN", "")
    } else {
        ("INTEGER", "TEXT", "INTEGER", " WITHOUT ROWID")
    };
    vec![
        format!(
            "CREATE TABLE {TABLE}{g} (
                stream_id   TEXT      NOT NULL,
                idx         {int}     NOT NULL CHECK (idx >= 0),
                kind        TEXT      NOT NULL,
                op_sequence {int}     NOT NULL,
                operation   {json}    NOT NULL,
                open        {boolean} NOT NULL,
                PRIMARY KEY (stream_id, idx)){rowid}"
        ),
        format!("CREATE INDEX {TABLE}{g}_open ON {TABLE}{g} (stream_id) WHERE open"),
        format!(
            "CREATE INDEX {TABLE}{g}_by_operation ON {TABLE}{g} (stream_id, kind, op_sequence)"
        ),
    ]
}

type OperationRow = (i64, Json<Operation>);

fn archived(rows: Vec<OperationRow>) -> Result<Vec<ArchivedOperation>, ProjectionError> {
    rows.into_iter()
        .map(|(index, Json(operation))| {
            Ok(ArchivedOperation {
                index: u32::try_from(index).map_err(|_| ProjectionError::Malformed {
                    position: 0,
                    reason: format!("an archived operation's index {index} is out of range"),
                })?,
                operation,
            })
        })
        .collect()
}

/// The archived operations `need` names of the payment stream `stream_id`.
pub(crate) async fn load(
    tx: &mut Tx,
    g: i64,
    stream_id: &str,
    need: &ArchiveNeed,
) -> Result<Vec<ArchivedOperation>, ProjectionError> {
    let mut rows: Vec<OperationRow> = Vec::new();
    match need {
        ArchiveNeed::Nothing => {}
        ArchiveNeed::All => {
            let statement = format!("SELECT idx, operation FROM {TABLE}{g} WHERE stream_id = $1");
            rows = on_tx!(tx, conn => {
                sqlx::query_as(&statement).bind(stream_id).fetch_all(conn).await?
            });
        }
        ArchiveNeed::Some { named, open } => {
            if *open {
                let statement =
                    format!("SELECT idx, operation FROM {TABLE}{g} WHERE stream_id = $1 AND open");
                rows = on_tx!(tx, conn => {
                    sqlx::query_as(&statement).bind(stream_id).fetch_all(conn).await?
                });
            }
            let statement = format!(
                "SELECT idx, operation FROM {TABLE}{g} \
                 WHERE stream_id = $1 AND kind = $2 AND op_sequence = $3"
            );
            for (kind, sequence) in named {
                let found: Vec<OperationRow> = on_tx!(tx, conn => {
                    sqlx::query_as(&statement)
                        .bind(stream_id)
                        .bind(kind.as_str())
                        .bind(i64::from(*sequence))
                        .fetch_all(conn)
                        .await?
                });
                rows.extend(found);
            }
        }
    }
    archived(rows)
}

/// Writes the rows that left the batch's windows or changed, each in place of its index's row.
pub(crate) async fn store(
    tx: &mut Tx,
    g: i64,
    rows: &[(String, ArchivedOperation)],
) -> Result<(), ProjectionError> {
    if rows.is_empty() {
        return Ok(());
    }
    let columns = "(stream_id, idx, kind, op_sequence, operation, open)";
    let on_conflict = "ON CONFLICT (stream_id, idx) DO UPDATE SET kind = excluded.kind, \
                       op_sequence = excluded.op_sequence, operation = excluded.operation, \
                       open = excluded.open";
    match tx {
        Tx::Postgres(t) => {
            let statement = format!(
                "INSERT INTO {TABLE}{g} {columns} SELECT * FROM UNNEST($1::text[], $2::int8[], \
                 $3::text[], $4::int8[], $5::jsonb[], $6::bool[]) {on_conflict}"
            );
            sqlx::query(&statement)
                .bind(rows.iter().map(|(id, _)| id.as_str()).collect::<Vec<_>>())
                .bind(
                    rows.iter()
                        .map(|(_, r)| i64::from(r.index))
                        .collect::<Vec<_>>(),
                )
                .bind(
                    rows.iter()
                        .map(|(_, r)| r.operation.kind.as_str())
                        .collect::<Vec<_>>(),
                )
                .bind(
                    rows.iter()
                        .map(|(_, r)| i64::from(r.operation.sequence))
                        .collect::<Vec<_>>(),
                )
                .bind(
                    rows.iter()
                        .map(|(_, r)| Json(&r.operation))
                        .collect::<Vec<_>>(),
                )
                .bind(
                    rows.iter()
                        .map(|(_, r)| r.operation.state.is_open())
                        .collect::<Vec<_>>(),
                )
                .execute(&mut **t)
                .await?;
        }
        Tx::Sqlite(t) => {
            let statement = format!(
                "INSERT INTO {TABLE}{g} {columns} VALUES ($1, $2, $3, $4, $5, $6) {on_conflict}"
            );
            for (id, row) in rows {
                sqlx::query(&statement)
                    .bind(id)
                    .bind(i64::from(row.index))
                    .bind(row.operation.kind.as_str())
                    .bind(i64::from(row.operation.sequence))
                    .bind(Json(&row.operation))
                    .bind(row.operation.state.is_open())
                    .execute(&mut **t)
                    .await?;
            }
        }
    }
    Ok(())
}

/// Every archived operation of the active generation, by stream, for the checker.
pub(crate) fn by_stream(
    rows: Vec<(String, i64, Json<Operation>)>,
) -> Result<HashMap<String, Vec<ArchivedOperation>>, ProjectionError> {
    let mut streams: HashMap<String, Vec<OperationRow>> = HashMap::new();
    for (stream_id, index, operation) in rows {
        streams
            .entry(stream_id)
            .or_default()
            .push((index, operation));
    }
    streams
        .into_iter()
        .map(|(id, rows)| Ok((id, archived(rows)?)))
        .collect()
}
