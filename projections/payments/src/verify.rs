//! The checker: every payment row, and the folded state it keeps for the next batch, compared
//! with its stream folded again from the log.
//!
//! A row or a state that disagrees with the fold of its stream at the same checkpoint is corrupt
//! (a bug, or a hand edit); `asiento projections rebuild payments` replaces it with a fresh copy.

use std::collections::BTreeMap;

use asiento_eventstore::{Cursor, Database, EventStore};
use asiento_projector::on_db;
use sqlx::types::Json;
use sqlx::{FromRow, Row as _};

use asiento_domain::stream::PAYMENT_PREFIX;
use asiento_projector::history::fold_streams;

use crate::fold::Folder;
use crate::read::{Row, COLUMNS, VIEW};
use crate::{PaymentRow, ViewError, NAME};

/// Events per log read while recomputing.
const RECOMPUTE_PAGE_EVENTS: usize = 5_000;

/// A payment whose row disagrees with its stream. `stored` None: the row is missing;
/// `recomputed` None: the row has no payment in the log (up to the checkpoint).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mismatch {
    pub payment_id: String,
    pub stored: Option<PaymentRow>,
    pub recomputed: Option<PaymentRow>,
    /// The folded state the row keeps (what the next batch folds onto) differs from the
    /// stream's fold, whether or not the columns do.
    pub state_differs: bool,
}

/// A row as stored: its columns, and its folded state.
type Stored = (PaymentRow, Folder);

/// Payments compared at a time: the rows and folds the check holds.
const VERIFY_PAGE_PAYMENTS: usize = 500;

/// Compares every row and its folded state with its stream folded from the log up to the read
/// model's checkpoint. Empty: the read model is right.
///
/// Its memory is one page of payments, however many there are: the rows are read a page at a
/// time, in one snapshot of the database (a `REPEATABLE READ` transaction on PostgreSQL, a read
/// transaction on SQLite) so that every page is exact at the checkpoint read first, even while
/// batches or a rebuild's swap commit; each page's streams are folded from the log (which only
/// grows) up to that checkpoint. Then the payments in the log up to it that have no row.
pub async fn verify(db: &Database, store: &dyn EventStore) -> Result<Vec<Mismatch>, ViewError> {
    verify_in_pages(db, store, VERIFY_PAGE_PAYMENTS).await
}

/// [`verify`], `page_payments` payments at a time.
pub async fn verify_in_pages(
    db: &Database,
    store: &dyn EventStore,
    page_payments: usize,
) -> Result<Vec<Mismatch>, ViewError> {
    let postgres = matches!(db, Database::Postgres(_));
    let mut mismatches = Vec::new();
    on_db!(db, pool => {
        let mut tx = pool.begin().await?;
        if postgres {
            sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
                .execute(&mut *tx)
                .await?;
        }
        let checkpoint: Option<(i64, i64)> = sqlx::query_as(
            "SELECT checkpoint_xact, checkpoint_position FROM projections WHERE name = $1",
        )
        .bind(NAME)
        .fetch_optional(&mut *tx)
        .await?;
        let (xact, position) = checkpoint.ok_or(ViewError::NotInstalled)?;
        let checkpoint = Cursor::new(xact, position);
        let page_limit = i64::try_from(page_payments.max(1)).unwrap_or(i64::MAX);

        let rows_statement = format!(
            "SELECT {COLUMNS}, state FROM {VIEW} WHERE payment_id > $1 \
             ORDER BY payment_id LIMIT $2"
        );
        let mut after = String::new();
        loop {
            let raw = sqlx::query(&rows_statement)
                .bind(&after)
                .bind(page_limit)
                .fetch_all(&mut *tx)
                .await?;
            let Some(last) = raw.last() else {
                break;
            };
            after = last.try_get("payment_id")?;
            let mut stored: Vec<Stored> = Vec::with_capacity(raw.len());
            for r in &raw {
                let Json(state) = r.try_get::<Json<Folder>, _>("state")?;
                stored.push((Row::from_row(r)?.into_payment()?, state));
            }
            let streams: Vec<String> = stored
                .iter()
                .map(|(row, _)| asiento_domain::payment_stream(row.id))
                .collect();
            let mut folds = recompute(store, &streams, checkpoint).await?;
            for ((row, state), stream) in stored.into_iter().zip(&streams) {
                let recomputed = folds.remove(stream).flatten();
                push_mismatch(&mut mismatches, row.id.to_string(), Some((row, state)), recomputed);
            }
        }

        // Payment streams up to the checkpoint without a row.
        let missing_statement = format!(
            "SELECT e.stream_id FROM events e WHERE e.version = 1 \
             AND e.stream_id LIKE '{PAYMENT_PREFIX}%' AND e.stream_id > $1 \
             AND ({xact}, e.position) <= ($2, $3) \
             AND NOT EXISTS (SELECT 1 FROM {VIEW} v WHERE v.payment_id = substr(e.stream_id, {from})) \
             ORDER BY e.stream_id LIMIT $4",
            // SQLite's log has no transaction ids: its cursors' are 0.
            xact = if postgres { "e.xact" } else { "0" },
            from = PAYMENT_PREFIX.len() + 1
        );
        let mut after = String::new();
        loop {
            let streams: Vec<String> = sqlx::query_scalar(&missing_statement)
                .bind(&after)
                .bind(checkpoint.xact())
                .bind(checkpoint.position())
                .bind(page_limit)
                .fetch_all(&mut *tx)
                .await?;
            let Some(last) = streams.last() else {
                break;
            };
            after = last.clone();
            let mut folds = recompute(store, &streams, checkpoint).await?;
            for stream in &streams {
                let Some(recomputed) = folds.remove(stream).flatten() else {
                    continue;
                };
                let id = recomputed.0.id.to_string();
                push_mismatch(&mut mismatches, id, None, Some(recomputed));
            }
        }
        tx.rollback().await?;
    });
    mismatches.sort_by(|a, b| a.payment_id.cmp(&b.payment_id));
    Ok(mismatches)
}

/// `streams` folded from the log alone up to and including `upto`, each with its row (`None`:
/// the stream gives no payment).
async fn recompute(
    store: &dyn EventStore,
    streams: &[String],
    upto: Cursor,
) -> Result<BTreeMap<String, Option<Stored>>, ViewError> {
    let folds: BTreeMap<String, Folder> =
        fold_streams::<_, ViewError>(store, streams, upto, RECOMPUTE_PAGE_EVENTS).await?;
    let mut rows = BTreeMap::new();
    for (stream, folder) in folds {
        let row = folder.row()?.map(|row| (row, folder));
        rows.insert(stream, row);
    }
    Ok(rows)
}

/// Adds a mismatch when the row or its folded state differs from the fold of its stream.
fn push_mismatch(
    mismatches: &mut Vec<Mismatch>,
    payment_id: String,
    stored: Option<Stored>,
    recomputed: Option<Stored>,
) {
    let state_differs = match (&stored, &recomputed) {
        (Some((_, ours)), Some((_, theirs))) => ours != theirs,
        _ => false,
    };
    let (stored, recomputed) = (stored.map(|s| s.0), recomputed.map(|r| r.0));
    if stored != recomputed || state_differs {
        mismatches.push(Mismatch {
            payment_id,
            stored,
            recomputed,
            state_differs,
        });
    }
}
