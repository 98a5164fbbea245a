//! Signed webhooks to merchants: each tenant's endpoints, and the delivery to them of every
//! merchant event (`asiento_merchant_events`) at least once.
//!
//! Why it is shaped this way:
//!
//! - **Derived from the feed.** The dispatcher turns the gap-free feed into one delivery per
//!   (endpoint, event) with its cursor in the same transaction, so no event is skipped or
//!   dispatched twice; a delivery is retried until it succeeds or three days pass. Deliveries are
//!   at least once and never ordered: a consumer dedups by the event id (the same on every
//!   delivery and in the feed) and orders by the feed, not by arrival.
//! - **Bounded per endpoint.** A merchant that answers slowly or not at all holds at most its
//!   own few attempts (`deliver`), never another's.
//! - **No server-side request forgery** (`url_policy`): checked at registration and at every
//!   connection, after DNS resolution.
//! - **Endpoints are configuration**, in tables beside the log: they move no money, and their
//!   secrets must not be in an append-only log.
//!
//! The one fact about endpoints the log holds: an endpoint that failed every delivery for the
//! whole retry window is disabled with an `EndpointDisabled` event on its own stream
//! (`webhook_endpoint-we_…`), which the feed tells as `webhook_endpoint.disabled`.

use std::future::Future;
use std::time::Duration;

use asiento_eventstore::Database;

pub mod backoff;
pub mod deliver;
pub mod deliveries;
pub mod dispatch;
pub mod endpoints;
pub mod signature;
pub mod url_policy;

pub use deliver::{Deliverer, DeliveryConfig};

#[derive(Debug, thiserror::Error)]
pub enum OutboundError {
    #[error("{0}")]
    UrlRefused(url_policy::UrlRefused),
    #[error("{0}")]
    Invalid(String),
    #[error("no such webhook endpoint")]
    NotFound,
    #[error("stored webhook data is inconsistent: {0}")]
    Corrupt(String),
    #[error("the HTTP client cannot be built: {0}")]
    Client(String),
    #[error("appending to the log failed: {0}")]
    Append(String),
    #[error(transparent)]
    Idempotency(#[from] asiento_app::idempotency::IdempotencyError),
    #[error(transparent)]
    Feed(#[from] asiento_merchant_events::FeedError),
    #[error(transparent)]
    Store(#[from] asiento_eventstore::StoreError),
    #[error(transparent)]
    Database(#[from] sqlx::Error),
}

/// How often the worker looks for events to dispatch and deliveries due.
pub const ROUND_INTERVAL: Duration = Duration::from_millis(200);

/// Dispatches and delivers until `shutdown`: the webhook sender of a worker process.
pub async fn run(db: Database, deliverer: Deliverer, shutdown: impl Future<Output = ()>) {
    tokio::pin!(shutdown);
    let mut tick = tokio::time::interval(ROUND_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut rounds: u64 = 0;
    loop {
        tokio::select! {
            () = &mut shutdown => return,
            _ = tick.tick() => {}
        }
        let now_ms = chrono::Utc::now().timestamp_millis();
        loop {
            match dispatch::dispatch_round(&db, now_ms).await {
                Ok(n) if n == dispatch::DISPATCH_PAGE as usize => continue,
                Ok(_) => break,
                Err(error) => {
                    tracing::warn!(%error, "dispatching merchant events failed; retrying");
                    break;
                }
            }
        }
        if let Err(error) = deliverer.round(now_ms).await {
            tracing::warn!(%error, "a webhook delivery round failed; retrying");
        }
        rounds += 1;
        if rounds % 25 == 0 {
            match pending(&db).await {
                Ok(count) => {
                    metrics::gauge!("asiento_webhook_deliveries_pending").set(count as f64)
                }
                Err(error) => tracing::warn!(%error, "counting pending webhook deliveries failed"),
            }
        }
    }
}

async fn pending(db: &Database) -> Result<i64, sqlx::Error> {
    let sql = "select count(*) from webhook_deliveries where status = 'pending'";
    match db {
        Database::Postgres(pool) => sqlx::query_scalar(sql).fetch_one(pool).await,
        Database::Sqlite(pool) => sqlx::query_scalar(sql).fetch_one(pool).await,
    }
}
