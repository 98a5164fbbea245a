//! The checker: every payment row, and the folded state it keeps for the next batch, compared
//! with its stream folded again from the log.
//!
//! A row or a state that disagrees with the fold of its stream at the same checkpoint is corrupt
//! (a bug, or a hand edit); `asiento projections rebuild payments` replaces it with a fresh copy.

use asiento_domain::stream::PAYMENT_PREFIX;
use asiento_eventstore::{Database, EventStore};
use asiento_projector::snapshot::{disagreement, RowsOfStreams, Snapshot};

use crate::fold::Folder;
use crate::read::{Row, COLUMNS, VIEW};
use crate::{PaymentRow, ViewError, NAME};

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

/// A row per payment stream, keyed by the payment's id.
const ROWS: RowsOfStreams<'static> = RowsOfStreams {
    view: VIEW,
    key_column: "payment_id",
    prefix: PAYMENT_PREFIX,
};

/// Compares every row and its folded state with its stream folded from the log up to the read
/// model's checkpoint. Empty: the read model is right. Its memory is a page of payments, however
/// many there are: the rows are read a page at a time in one [`Snapshot`], then the payment
/// streams without a row.
pub async fn verify(db: &Database, store: &dyn EventStore) -> Result<Vec<Mismatch>, ViewError> {
    verify_in_pages(db, store, VERIFY_PAGE_PAYMENTS).await
}

/// [`verify`], `page_payments` payments at a time.
pub async fn verify_in_pages(
    db: &Database,
    store: &dyn EventStore,
    page_payments: usize,
) -> Result<Vec<Mismatch>, ViewError> {
    let mut snapshot = Snapshot::begin(db).await?;
    let checkpoint = snapshot
        .checkpoint(NAME)
        .await?
        .ok_or(ViewError::NotInstalled)?;
    let mut mismatches = Vec::new();
    snapshot
        .compare_rows::<Row, Folder, ViewError>(
            store,
            &ROWS,
            COLUMNS,
            checkpoint,
            page_payments,
            |payment_id, stored, folder| {
                let stored = match stored {
                    Some((row, state)) => Some((row.into_payment()?, state)),
                    None => None,
                };
                let recomputed = match folder {
                    Some(folder) => with_row(folder)?,
                    None => None,
                };
                if let Some((stored, recomputed, state_differs)) = disagreement(stored, recomputed)
                {
                    mismatches.push(Mismatch {
                        payment_id,
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
    mismatches.sort_by(|a, b| a.payment_id.cmp(&b.payment_id));
    Ok(mismatches)
}

/// A stream's fold with its row; `None` when the stream gives no payment.
fn with_row(folder: Folder) -> Result<Option<Stored>, ViewError> {
    Ok(folder.row()?.map(|row| (row, folder)))
}
