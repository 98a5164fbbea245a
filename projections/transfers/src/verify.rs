//! The checker: every transfer row compared with its stream folded again from the log.
//!
//! A row that disagrees with the fold of its stream at the same checkpoint is corrupt (a bug,
//! or a hand edit); `asiento projections rebuild transfers` replaces it with a fresh copy.

use asiento_domain::stream::TRANSFER_PREFIX;
use asiento_eventstore::{Database, EventStore};
use asiento_projector::snapshot::{disagreement, RowsOfStreams, Snapshot};

use crate::fold::Folder;
use crate::projection::VIEW;
use crate::read::{Row, COLUMNS};
use crate::{ListError, TransferRow, NAME};

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

/// Transfers compared at a time: the rows and folds the check holds.
const VERIFY_PAGE_TRANSFERS: usize = 500;

/// A row per transfer stream, keyed by the transfer's id.
const ROWS: RowsOfStreams<'static> = RowsOfStreams {
    view: VIEW,
    key_column: "transfer_id",
    prefix: TRANSFER_PREFIX,
};

/// Compares every row and its folded state with its stream folded from the log up to the read
/// model's checkpoint. Empty: the read model is right. Its memory is a page of transfers,
/// however many there are (a page at a time in one [`Snapshot`], then the transfer streams
/// without a row).
pub async fn verify(db: &Database, store: &dyn EventStore) -> Result<Vec<Mismatch>, ListError> {
    verify_in_pages(db, store, VERIFY_PAGE_TRANSFERS).await
}

/// [`verify`], `page_transfers` transfers at a time.
pub async fn verify_in_pages(
    db: &Database,
    store: &dyn EventStore,
    page_transfers: usize,
) -> Result<Vec<Mismatch>, ListError> {
    let mut snapshot = Snapshot::begin(db).await?;
    let checkpoint = snapshot
        .checkpoint(NAME)
        .await?
        .ok_or(ListError::NotInstalled)?;
    let mut mismatches = Vec::new();
    snapshot
        .compare_rows::<Row, Folder, ListError>(
            store,
            &ROWS,
            COLUMNS,
            checkpoint,
            page_transfers,
            |transfer_id, stored, folder| {
                let stored = match stored {
                    Some((row, state)) => Some((row.into_transfer()?, state)),
                    None => None,
                };
                let recomputed = folder.and_then(|folder| Some((folder.row()?, folder)));
                if let Some((stored, recomputed, state_differs)) = disagreement(stored, recomputed)
                {
                    mismatches.push(Mismatch {
                        transfer_id,
                        stored,
                        recomputed,
                        state_differs,
                    });
                }
                Ok(())
            },
        )
        .await?;
    snapshot.end().await?;
    mismatches.sort_by(|a, b| a.transfer_id.cmp(&b.transfer_id));
    Ok(mismatches)
}
