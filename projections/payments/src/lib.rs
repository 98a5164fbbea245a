//! The payments read model: one row per payment, for `GET /v1/payments/{id}` and the
//! `GET /v1/payments` list (newest first, filtered, keyset pages).
//!
//! Why it is shaped this way:
//!
//! - **The domain folds, not this crate, and once.** A row's columns are `evolve_payment` folded
//!   over the payment's stream, so the read model can never disagree with the write side about
//!   what an event means. The row keeps the folded aggregate itself (`state`, the domain's
//!   serialisable `Payment`), and a batch folds only its new events onto it: a payment's k-th
//!   event costs what its first did. Re-reading the stream from the event store inside `apply`
//!   would need a second connection while the batch's transaction holds SQLite's only write lock
//!   (a deadlock risk), or SQL against the store's private tables. A stored state that could
//!   drift from the log is what `verify` checks: every row's state against its stream folded
//!   again from the log.
//! - **Versions out of global order are expected.** On PostgreSQL the log's gap-free order is by
//!   writing transaction id, and a transaction that took its id early (it wrote an idempotency
//!   row first) can commit version n+1 of a stream after a younger one committed version n: the
//!   projection may see n+1 first. Such an event waits in `payment_pending_g{n}` until the gap
//!   fills; a row always shows the fold of its stream's contiguous prefix.
//! - **Exact timestamps as integers.** `created_at` and `updated_at` are kept as Unix
//!   nanoseconds: PostgreSQL's timestamps stop at microseconds and SQLite's are text, and the
//!   list's keyset (created_at, id) must compare the same way on both backends, and `verify`
//!   must compare exactly.
//! - **Keyset pages.** A page cursor names the last row's (created_at, id); the next page starts
//!   strictly after it, so payments created meanwhile never shift a page (no duplicates, no
//!   gaps), unlike an offset.
//! - **Metadata as JSON, filtered by string value.** A row keeps the payment's metadata object;
//!   `metadata[key]=value` matches a string value exactly (on PostgreSQL by containment, which a
//!   GIN index answers). Other JSON values are shown, not filtered by: a filter's text cannot
//!   say whether it meant the number 7 or the string "7".
//!
//! The lead process calls [`install`] once at startup (after migrations), runs an
//! [`asiento_projector::Runner`] with [`projection`], and on reads with a `min_position` calls
//! [`wait_for_position`] first.

use std::sync::Arc;

use asiento_domain::payment::NextAction;
use asiento_domain::{PaymentId, PaymentStatus};
use asiento_eventstore::{Database, StoreError};
use asiento_projector::{Projection, ProjectionError, ProjectorError};
use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::{Map, Value};

mod fold;
mod projection;
mod read;
mod verify;

pub use asiento_projector::READ_WAIT_MS_MAX;
pub use projection::{Payments, FINGERPRINT, NAME};
pub use read::{
    export_page, get_payment, list_payments, wait_for_position, PaymentFilter, EXPORT_PAGE_ROWS,
    LIST_LIMIT_DEFAULT, LIST_LIMIT_MAX, METADATA_FILTERS_MAX,
};
pub use verify::{verify, verify_in_pages, Mismatch};

/// The payments projection, for a [`asiento_projector::Runner`] or a rebuild.
pub fn projection() -> Arc<dyn Projection> {
    Arc::new(Payments)
}

/// Registers the projection and creates its views if this database has none yet.
pub async fn install(db: &Database) -> Result<(), ProjectorError> {
    asiento_projector::install(db, &Payments).await
}

/// One payment as the read model holds it; serialises as the payment object of API.md.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PaymentRow {
    pub id: PaymentId,
    /// Not part of the API object: the caller already scoped the read to its tenant.
    #[serde(skip)]
    pub tenant: String,
    pub status: PaymentStatus,
    pub amount_minor: i64,
    pub currency: String,
    pub customer: String,
    pub provider: String,
    pub captured_minor: i64,
    pub refunded_minor: i64,
    /// The fee kept after refunds (`PaymentRecord::fee_net`).
    pub fee_minor: i64,
    pub description: Option<String>,
    pub metadata: Map<String, Value>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    /// Present only while `requires_action` (the domain clears it on every other status).
    pub next_action: Option<NextAction>,
    /// The stream version of the last event folded in; internal, for consistency checks.
    #[serde(skip)]
    pub version: u64,
    /// The global log position of the last event folded in (a read-your-writes token).
    pub position: i64,
}

/// One page of `GET /v1/payments`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Page {
    pub data: Vec<PaymentRow>,
    /// Pass back as `cursor` for the next (older) page; None on the last page.
    pub next_cursor: Option<String>,
}

/// Why a read of the payments read model failed.
#[derive(Debug, thiserror::Error)]
pub enum ViewError {
    /// The client's `cursor` is not one this API handed out (HTTP 400).
    #[error("the cursor is malformed")]
    InvalidCursor,
    /// `limit` outside 1..=[`LIST_LIMIT_MAX`] (HTTP 400).
    #[error("limit must be between 1 and {LIST_LIMIT_MAX}, got {limit}")]
    LimitOutOfRange { limit: u32 },
    /// More than [`METADATA_FILTERS_MAX`] `metadata[…]` filters (HTTP 400).
    #[error("at most {METADATA_FILTERS_MAX} metadata filters, got {count}")]
    TooManyMetadataFilters { count: usize },
    /// The projection did not reach `min_position` in time (HTTP 503 `projection_lagging`).
    #[error("the payments projection is lagging (waited {waited_ms} ms)")]
    ProjectionLagging { waited_ms: u64 },
    /// [`install`] was never called on this database.
    #[error("the payments projection is not installed")]
    NotInstalled,
    /// A stored row that does not read back (a hand edit or a bug; ours, HTTP 500).
    #[error("payment row {payment_id} is corrupt: {reason}")]
    CorruptRow { payment_id: String, reason: String },
    /// An event in the log cannot be folded (a bug upstream; ours, HTTP 500).
    #[error(transparent)]
    Projection(#[from] ProjectionError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
}
