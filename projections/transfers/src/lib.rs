//! The transfers read model: one row per transfer (and hold), for `GET /v1/transfers`: a
//! customer's open holds, a merchant's incoming transfers, a period's transfers, newest first,
//! in keyset pages.
//!
//! Why it is shaped this way:
//!
//! - **The domain folds, not this crate.** A row is the domain's `evolve` folded over the
//!   transfer's stream, rendered as the API's transfer object (`asiento_objects::transfer_json`)
//!   when the projector writes it: a list read returns stored objects and folds nothing. The row
//!   keeps the folded aggregate (`state`, the domain's serialisable `Transfer`) and a batch folds
//!   only its new events onto it, as the payments view does; `verify` checks every stored state
//!   against its stream folded again from the log.
//! - **Versions out of global order are expected.** On PostgreSQL a hold's post can reach the
//!   projector before the hold itself (the log's gap-free order is by transaction id): it waits in
//!   `transfer_pending_g{n}` until the gap fills, and a row always shows the fold of its stream's
//!   contiguous prefix.
//! - **One index per question.** By tenant and time; by the account a transfer leaves or reaches
//!   (a filter by account matches either side); by status. Each ends with (created, id), the
//!   keyset of the pages.
//!
//! The lead process installs it with the other projections and runs it in the runner; `asiento
//! verify` compares every row with a fold of the log ([`verify`]).

use std::sync::Arc;

use asiento_domain::TransferStatus;
use asiento_eventstore::{Database, StoreError};
use asiento_projector::{Projection, ProjectionError, ProjectorError};
use chrono::{DateTime, Utc};
use serde_json::Value;

mod fold;
mod projection;
mod read;
mod verify;

pub use projection::{Transfers, FINGERPRINT, NAME};
pub use read::{
    list_transfers, wait_for_position, TransferFilter, LIST_LIMIT_DEFAULT, LIST_LIMIT_MAX,
};
pub use verify::{verify, verify_in_pages, Mismatch};

/// The transfers projection, for a [`asiento_projector::Runner`] or a rebuild.
pub fn projection() -> Arc<dyn Projection> {
    Arc::new(Transfers)
}

/// Registers the projection and creates its views if this database has none yet.
pub async fn install(db: &Database) -> Result<(), ProjectorError> {
    asiento_projector::install(db, &Transfers).await
}

/// One transfer as the read model holds it.
#[derive(Debug, Clone, PartialEq)]
pub struct TransferRow {
    /// `tr_…`.
    pub id: String,
    pub tenant: String,
    pub from: String,
    pub to: String,
    pub status: TransferStatus,
    pub created_at: DateTime<Utc>,
    /// The API's transfer object, with the position of the last event folded in.
    pub object: Value,
    /// The stream version of the last event folded in.
    pub version: u64,
    pub position: i64,
}

/// One page of `GET /v1/transfers`.
#[derive(Debug, Clone, PartialEq)]
pub struct Page {
    pub data: Vec<TransferRow>,
    /// Pass back as `cursor` for the next (older) page; None on the last page.
    pub next_cursor: Option<String>,
}

/// Why a read of the transfers read model failed.
#[derive(Debug, thiserror::Error)]
pub enum ListError {
    /// The client's `cursor` is not one this API handed out (HTTP 400).
    #[error("the cursor is malformed")]
    InvalidCursor,
    /// `limit` outside 1..=[`LIST_LIMIT_MAX`] (HTTP 400).
    #[error("limit must be between 1 and {LIST_LIMIT_MAX}, got {limit}")]
    LimitOutOfRange { limit: u32 },
    /// The projection did not reach `min_position` in time (HTTP 503 `projection_lagging`).
    #[error("the transfers projection is lagging (waited {waited_ms} ms)")]
    ProjectionLagging { waited_ms: u64 },
    /// [`install`] was never called on this database.
    #[error("the transfers projection is not installed")]
    NotInstalled,
    /// A stored row that does not read back (a hand edit or a bug; ours, HTTP 500).
    #[error("transfer row {transfer_id} is corrupt: {reason}")]
    CorruptRow { transfer_id: String, reason: String },
    /// An event in the log cannot be folded (a bug upstream; ours, HTTP 500).
    #[error(transparent)]
    Projection(#[from] ProjectionError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
}

/// A status from its stored or queried name.
#[must_use]
pub fn parse_status(text: &str) -> Option<TransferStatus> {
    [
        TransferStatus::Posted,
        TransferStatus::Pending,
        TransferStatus::Voided,
        TransferStatus::Expired,
    ]
    .into_iter()
    .find(|status| status.as_str() == text)
}
