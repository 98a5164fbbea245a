//! Merchant events: what a merchant is told of its payments, transfers and exceptions, derived
//! from the log by a projection, for the feed (`GET /v1/events`) and outbound webhooks.
//!
//! Why it is shaped this way:
//!
//! - **Derived, so it exists once and can be rebuilt.** Each merchant event comes from one log
//!   event (at most one per log event: `derive`, plus one per balance monitor an entry makes
//!   cross: `monitors`), and its id is a function of that event's stream and version (and the
//!   monitor's id), so a rebuild derives the same events with the same ids, and a consumer that
//!   dedups by id never acts twice.
//! - **The object as it stood.** The projection folds each touched stream through the domain's
//!   `evolve` onto the fold it stored for it (a payment's with its latest operations only, the
//!   rest archived: `archive`) and renders the object with the API's own renderer
//!   (`asiento_objects`) at that event's position.
//! - **A feed with its own numbering.** PostgreSQL's gap-free log order is by transaction id,
//!   not by position, and a stream's versions can arrive out of order; the feed numbers events
//!   (`seq`) in the order the projection derives them, so the cursor is a plain number that
//!   only grows, and a reader that pages from the start sees every event once, in order, across
//!   restarts and rebuilds (the same log derives the same numbering).
//!
//! The lead process calls [`install`] once at startup (after migrations) and runs an
//! [`asiento_projector::Runner`] with [`projection`].

use std::sync::Arc;

use asiento_eventstore::{Database, StoreError};
use asiento_projector::{Projection, ProjectorError};
use uuid::Uuid;

mod archive;
mod derive;
mod kind;
mod monitors;
mod projection;
mod read;
mod verify;

pub use kind::EventKind;
pub use monitors::{
    active_monitors, list_monitors, MonitorPage, MonitorQuery, MONITORS_LIMIT_MAX,
    MONITORS_PER_TENANT_MAX,
};
pub use projection::{MerchantEvents, FINGERPRINT, NAME};
pub use read::{
    read_after, read_one, FeedCursor, FeedEvent, FeedQuery, PAGE_LIMIT_DEFAULT, PAGE_LIMIT_MAX,
};
pub use verify::{
    verify, verify_in_pages, verify_states, verify_states_in_pages, Mismatch, StateMismatch,
};

/// The projection, for a [`asiento_projector::Runner`] or a rebuild.
pub fn projection() -> Arc<dyn Projection> {
    Arc::new(MerchantEvents)
}

/// Registers the projection and creates its views if this database has none yet.
pub async fn install(db: &Database) -> Result<(), ProjectorError> {
    asiento_projector::install(db, &MerchantEvents).await
}

/// The namespace of merchant event ids (uuid v5 of stream and version).
const EVENT_ID_NAMESPACE: Uuid = Uuid::from_u128(0x6173_6965_6e74_6f2d_6576_656e_7473_0001);

/// The id of the merchant event derived from a stream's `version`: `evt_` and 32 hex digits.
#[must_use]
pub fn event_id(stream_id: &str, version: u64) -> String {
    let name = format!("{stream_id}@{version}");
    format!(
        "evt_{}",
        Uuid::new_v5(&EVENT_ID_NAMESPACE, name.as_bytes()).simple()
    )
}

#[derive(Debug, thiserror::Error)]
pub enum FeedError {
    #[error("the cursor is malformed")]
    InvalidCursor,
    #[error("the merchant events projection is not installed")]
    NotInstalled,
    #[error("the merchant events projection did not reach the position in {waited_ms} ms")]
    Lagging { waited_ms: u64 },
    #[error(transparent)]
    Projection(#[from] asiento_projector::ProjectionError),
    #[error(transparent)]
    Database(#[from] sqlx::Error),
    #[error(transparent)]
    Store(#[from] StoreError),
}
