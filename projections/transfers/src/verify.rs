//! The checker: every transfer row compared with its stream folded again from the log.
//!
//! A row that disagrees with the fold of its stream at the same checkpoint is corrupt (a bug,
//! or a hand edit); `asiento projections rebuild transfers` replaces it with a fresh copy.

use std::collections::BTreeMap;

use asiento_eventstore::{Cursor, Database, EventStore};
use asiento_projector::history::fold_log;
use asiento_projector::on_db;
use sqlx::types::Json;
use sqlx::{FromRow, Row as _};

use crate::fold::{transfer_stream, Folder};
use crate::projection::VIEW;
use crate::read::{Row, COLUMNS};
use crate::{ListError, TransferRow, NAME};

/// Events per log read while recomputing.
const RECOMPUTE_PAGE_EVENTS: usize = 5_000;

/// A transfer whose row disagrees with its stream. `stored` None: the row is missing;
/// `recomputed` None: the row has no transfer in the log (up to the checkpoint).
#[derive(Debug, Clone, PartialEq)]
pub struct Mismatch {
    pub transfer_id: String,
    pub stored: Option<TransferRow>,
    pub recomputed: Option<TransferRow>,
    /// The folded state the row keeps (what the next batch folds onto) differs from the
    /// stream's fold, whether or not the columns do.
    pub state_differs: bool,
}

/// A row as stored: its columns, and its folded state.
type Stored = (TransferRow, Folder);

/// Every row, with the checkpoint they are exact at, read in ONE statement so that they agree
/// even while a batch or a rebuild swap commits.
async fn snapshot_all(db: &Database) -> Result<(Cursor, BTreeMap<String, Stored>), ListError> {
    let columns: Vec<String> = COLUMNS
        .split(", ")
        .chain(["state"])
        .map(|c| format!("v.{c}"))
        .collect();
    let statement = format!(
        "SELECT p.checkpoint_xact, p.checkpoint_position, {} \
         FROM projections p LEFT JOIN {VIEW} v ON 1 = 1 WHERE p.name = $1",
        columns.join(", ")
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
            if r.try_get::<Option<String>, _>("transfer_id")?.is_some() {
                let Json(state) = r.try_get::<Json<Folder>, _>("state")?;
                rows.push((Row::from_row(r)?, state));
            }
        }
        (cursor, rows)
    });
    let cursor = cursor.ok_or(ListError::NotInstalled)?;
    let mut stored = BTreeMap::new();
    for (row, state) in rows {
        let row = row.into_transfer()?;
        stored.insert(row.id.clone(), (row, state));
    }
    Ok((cursor, stored))
}

/// Every transfer folded from the log alone, up to and including `upto`, with its row.
async fn recompute_all(
    store: &dyn EventStore,
    upto: Cursor,
) -> Result<BTreeMap<String, Stored>, ListError> {
    let folds: BTreeMap<String, Folder> =
        fold_log::<_, ListError>(store, upto, RECOMPUTE_PAGE_EVENTS, transfer_stream).await?;
    Ok(folds
        .into_iter()
        .filter_map(|(id, folder)| folder.row().map(|row| (id, (row, folder))))
        .collect())
}

/// Compares every row and its folded state with its stream folded from the log up to the read
/// model's checkpoint. Empty: the read model is right.
pub async fn verify(db: &Database, store: &dyn EventStore) -> Result<Vec<Mismatch>, ListError> {
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
                transfer_id: id,
                stored,
                recomputed,
                state_differs,
            })
        })
        .collect())
}
