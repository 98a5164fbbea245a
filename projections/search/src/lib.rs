//! Payment search: every id a support person may be given, mapped to its payment, per tenant.
//!
//! A merchant's customer quotes an order number, a Stripe dashboard shows a `pi_…`, an Adyen
//! report a pspReference, a merchant's log an Idempotency-Key: [`find`] answers which of the
//! tenant's payments each names. The projection derives the index from the payment streams:
//! the payment id, the Idempotency-Key of every request that wrote to it, the keys we sent the
//! provider, the provider's charge, operation, request, dispute and balance transaction ids, the
//! journal entries it posted, and the string (or integer) values of its metadata and its
//! description ([`Kind`] lists them).
//!
//! Why it is shaped this way:
//!
//! - **A set of rows, no fold.** Every term comes from one event (and the payment's tenant and
//!   creation time from its `PaymentIntended`), and no event takes a term away, so the index of
//!   a payment is the union over its events: the order they arrive in does not matter, and a
//!   row written twice is one row (the primary key), so an event applied twice adds nothing.
//! - **Tenant-scoped rows.** Each row carries the payment's tenant and every lookup names one,
//!   so another tenant's payment is never found, whatever the term.
//! - **Exact terms.** A term is stored as given, trimmed, up to [`TERM_CHARS_MAX`] characters
//!   (longer values are not indexed): ids are matched exactly, never by prefix or case, so a
//!   search cannot wander into payments that merely look alike.
//!
//! The lead process calls [`install`] once at startup (after migrations) and runs an
//! [`asiento_projector::Runner`] with [`projection`].

use std::sync::Arc;

use asiento_eventstore::{Database, StoreError};
use asiento_projector::{Projection, ProjectionError, ProjectorError};
use serde::Serialize;

mod projection;
mod read;
mod terms;
mod verify;

pub use asiento_projector::READ_WAIT_MS_MAX;
pub use projection::{PaymentSearch, FINGERPRINT, NAME};
pub use read::{find, wait_for_position, FIND_LIMIT_MAX};
pub use terms::{normalize, Kind, TERM_CHARS_MAX};
pub use verify::{verify, verify_in_pages, Mismatch};

/// The payment search projection, for a [`asiento_projector::Runner`] or a rebuild.
pub fn projection() -> Arc<dyn Projection> {
    Arc::new(PaymentSearch)
}

/// Registers the projection and creates its views if this database has none yet.
pub async fn install(db: &Database) -> Result<(), ProjectorError> {
    asiento_projector::install(db, &PaymentSearch).await
}

/// A payment a term names, and how ([`Kind::as_str`]: `payment_id`, `idempotency_key`,
/// `charge_id`, `metadata` …).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Match {
    pub payment_id: String,
    pub kind: String,
}

/// Why a search failed.
#[derive(Debug, thiserror::Error)]
pub enum SearchError {
    /// The projection did not reach a position in time (HTTP 503 `projection_lagging`).
    #[error("the payment search projection is lagging (waited {waited_ms} ms)")]
    ProjectionLagging { waited_ms: u64 },
    /// [`install`] was never called on this database.
    #[error("the payment search projection is not installed")]
    NotInstalled,
    /// An event in the log cannot be read (a bug upstream; ours, HTTP 500).
    #[error(transparent)]
    Projection(#[from] ProjectionError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
}
