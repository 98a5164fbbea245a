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

use asiento_projector::history::fold_log;

use crate::fold::{payment_stream, Folder};
use crate::read::Row;
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

/// Every row of the read model, with the checkpoint they are exact at, read in ONE statement
/// so that they agree even while a batch or a rebuild swap commits.
async fn snapshot_all(db: &Database) -> Result<(Cursor, BTreeMap<String, Stored>), ViewError> {
    const COLUMNS: &str = "v.payment_id, v.tenant, v.status, v.amount_minor, v.currency, \
         v.customer, v.provider, v.captured_minor, v.refunded_minor, v.fee_minor, v.created_ns, \
         v.updated_ns, v.next_action, v.version, v.position, v.description, v.metadata, v.state";
    let statement = format!(
        "SELECT p.checkpoint_xact, p.checkpoint_position, {COLUMNS} \
         FROM projections p LEFT JOIN payments v ON 1 = 1 WHERE p.name = $1"
    );
    let (cursor, rows) = on_db!(db, pool => {
        let raw = sqlx::query(&statement).bind(NAME).fetch_all(pool).await?;
        let mut cursor = None;
        let mut rows = Vec::with_capacity(raw.len());
        for r in &raw {
            cursor = Some(Cursor::new(
                r.try_get("checkpoint_xact")?,
                r.try_get("checkpoint_position")?,
            ));
            // NULL: the LEFT JOIN found no rows at all.
            if r.try_get::<Option<String>, _>("payment_id")?.is_some() {
                let Json(state) = r.try_get::<Json<Folder>, _>("state")?;
                rows.push((Row::from_row(r)?, state));
            }
        }
        (cursor, rows)
    });
    let cursor = cursor.ok_or(ViewError::NotInstalled)?;
    let mut stored = BTreeMap::new();
    for (row, state) in rows {
        let row = row.into_payment()?;
        stored.insert(row.id.to_string(), (row, state));
    }
    Ok((cursor, stored))
}

/// Every payment folded from the log alone, up to and including `upto`, with its row.
async fn recompute_all(
    store: &dyn EventStore,
    upto: Cursor,
) -> Result<BTreeMap<String, Stored>, ViewError> {
    let folds: BTreeMap<String, Folder> =
        fold_log::<_, ViewError>(store, upto, RECOMPUTE_PAGE_EVENTS, payment_stream).await?;
    let mut rows = BTreeMap::new();
    for (id, folder) in folds {
        if let Some(row) = folder.row()? {
            rows.insert(id, (row, folder));
        }
    }
    Ok(rows)
}

/// Compares every row and its folded state with its stream folded from the log up to the read
/// model's checkpoint. Empty: the read model is right.
pub async fn verify(db: &Database, store: &dyn EventStore) -> Result<Vec<Mismatch>, ViewError> {
    let (checkpoint, mut stored) = snapshot_all(db).await?;
    let mut recomputed = recompute_all(store, checkpoint).await?;
    let mut ids: Vec<String> = stored.keys().chain(recomputed.keys()).cloned().collect();
    ids.sort();
    ids.dedup();
    Ok(ids
        .into_iter()
        .filter_map(|id| {
            let stored = stored.remove(&id);
            let recomputed = recomputed.remove(&id);
            let state_differs = match (&stored, &recomputed) {
                (Some((_, ours)), Some((_, theirs))) => ours != theirs,
                _ => false,
            };
            let (stored, recomputed) = (stored.map(|s| s.0), recomputed.map(|r| r.0));
            (stored != recomputed || state_differs).then_some(Mismatch {
                payment_id: id,
                stored,
                recomputed,
                state_differs,
            })
        })
        .collect())
}
