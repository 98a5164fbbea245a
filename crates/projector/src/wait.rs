//! Read-your-writes for read models: wait until a projection has applied a given event.

use std::time::{Duration, Instant};

use asiento_eventstore::{Database, EventStore, StoreError};

use crate::registry::{checkpoint, Checkpoint};

/// The longest a read waits for a projection to reach the client's `min_position` (API.md: then
/// 503 `projection_lagging`).
pub const READ_WAIT_MS_MAX: u64 = 5_000;
/// How often a waiting read looks at the checkpoint again.
const WAIT_POLL_MS: u64 = 20;

#[derive(Debug, thiserror::Error)]
pub enum WaitError {
    /// The projection did not reach the event in time (or no such event was committed).
    #[error("projection has not reached position {position} after {waited_ms} ms")]
    Lagging { position: i64, waited_ms: u64 },
    #[error("projection {name} is not installed")]
    NotInstalled { name: String },
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
}

/// Waits (polling, at most `timeout_ms`) until projection `name` has applied the event at
/// `position` (an API client's read-your-writes token), and returns the checkpoint that covers
/// it. Positions are not commit order on PostgreSQL, so "covers" means the checkpoint cursor is
/// at or after that event's cursor in the gap-free order. A position of 0 or less is covered.
pub async fn wait_for_position(
    db: &Database,
    store: &dyn EventStore,
    name: &str,
    position: i64,
    timeout_ms: u64,
) -> Result<Checkpoint, WaitError> {
    let started = Instant::now();
    let mut target = None;
    loop {
        let current = checkpoint(db, name)
            .await?
            .ok_or_else(|| WaitError::NotInstalled {
                name: name.to_owned(),
            })?;
        if position <= 0 {
            return Ok(current);
        }
        if target.is_none() {
            target = store.cursor_of_position(position).await?;
        }
        if target.is_some_and(|t| current.cursor >= t) {
            return Ok(current);
        }
        let waited_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        if waited_ms >= timeout_ms {
            return Err(WaitError::Lagging {
                position,
                waited_ms,
            });
        }
        tokio::time::sleep(Duration::from_millis(
            WAIT_POLL_MS.min(timeout_ms - waited_ms),
        ))
        .await;
    }
}
