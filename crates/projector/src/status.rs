//! What `asiento projections status` shows: per projection, its generation, checkpoint, lag,
//! lease owner and fingerprint, and any rebuild in progress.

use asiento_eventstore::{Cursor, Database, EventStore};
use chrono::{DateTime, Utc};

use crate::clock::{datetime_of_ms, now_ms_sql};
use crate::{Projection, ProjectorError};

#[derive(Debug, Clone, PartialEq)]
pub struct ProjectionStatus {
    pub name: String,
    pub generation: i64,
    /// The fingerprint of the code that built the active generation.
    pub fingerprint: String,
    /// This binary's fingerprint for the projection, if it knows the projection.
    pub code_fingerprint: Option<String>,
    /// This binary's code differs from what built the active generation: runners refuse to
    /// resume until `asiento projections rebuild NAME`.
    pub rebuild_needed: bool,
    pub checkpoint: Cursor,
    /// When the last batch committed.
    pub applied_at: Option<DateTime<Utc>>,
    /// Events in the log after the checkpoint (approximate on PostgreSQL: positions are not
    /// dense in commit order); 0 when caught up.
    pub lag_events: i64,
    /// Age of the oldest event not yet applied; 0 when caught up.
    pub lag_ms: i64,
    /// The runner holding (or last holding) the lease.
    pub owner: Option<String>,
    pub lease_expires_at: Option<DateTime<Utc>>,
    /// Whether `owner`'s lease is still running (by the database clock).
    pub lease_live: bool,
    pub rebuild: Option<RebuildStatus>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct RebuildStatus {
    pub generation: i64,
    pub fingerprint: String,
    pub checkpoint: Cursor,
    pub owner: String,
    /// False: the rebuilding process is gone; the next rebuild resumes from `checkpoint`.
    pub lease_live: bool,
    pub started_at: Option<DateTime<Utc>>,
}

#[derive(sqlx::FromRow)]
struct Row {
    name: String,
    generation: i64,
    fingerprint: String,
    checkpoint_xact: i64,
    checkpoint_position: i64,
    applied_ms: Option<i64>,
    lease_owner: Option<String>,
    lease_expires_ms: i64,
    now_ms: i64,
    r_generation: Option<i64>,
    r_fingerprint: Option<String>,
    r_checkpoint_xact: Option<i64>,
    r_checkpoint_position: Option<i64>,
    r_owner: Option<String>,
    r_lease_expires_ms: Option<i64>,
    r_started_ms: Option<i64>,
}

/// The status of every installed projection, by name. `projections` are this binary's, for
/// comparing fingerprints.
pub async fn status(
    db: &Database,
    store: &dyn EventStore,
    projections: &[&dyn Projection],
) -> Result<Vec<ProjectionStatus>, ProjectorError> {
    let statement = format!(
        "SELECT p.name, p.generation, p.fingerprint, p.checkpoint_xact, p.checkpoint_position, \
                p.applied_ms, p.lease_owner, p.lease_expires_ms, {now} AS now_ms, \
                r.generation AS r_generation, r.fingerprint AS r_fingerprint, \
                r.checkpoint_xact AS r_checkpoint_xact, \
                r.checkpoint_position AS r_checkpoint_position, r.owner AS r_owner, \
                r.lease_expires_ms AS r_lease_expires_ms, r.started_ms AS r_started_ms \
         FROM projections p LEFT JOIN projection_rebuilds r ON r.name = p.name \
         ORDER BY p.name",
        now = now_ms_sql(db.backend())
    );
    let rows: Vec<Row> = on_db!(db, pool => {
        sqlx::query_as(&statement).fetch_all(pool).await?
    });
    let head = store.head().await?;
    let mut out = Vec::with_capacity(rows.len());
    for row in rows {
        let checkpoint = Cursor::new(row.checkpoint_xact, row.checkpoint_position);
        let next = store.read_all(checkpoint, 1).await?;
        let (lag_events, lag_ms) = match next.first() {
            None => (0, 0),
            Some(e) => (
                (head.position() - checkpoint.position()).max(1),
                (Utc::now() - e.recorded_at).num_milliseconds().max(0),
            ),
        };
        let code_fingerprint = projections
            .iter()
            .find(|p| p.name() == row.name)
            .map(|p| p.fingerprint().to_owned());
        let rebuild = match (row.r_generation, row.r_owner) {
            (Some(generation), Some(owner)) => Some(RebuildStatus {
                generation,
                fingerprint: row.r_fingerprint.unwrap_or_default(),
                checkpoint: Cursor::new(
                    row.r_checkpoint_xact.unwrap_or_default(),
                    row.r_checkpoint_position.unwrap_or_default(),
                ),
                owner,
                lease_live: row.r_lease_expires_ms.is_some_and(|ms| ms >= row.now_ms),
                started_at: row.r_started_ms.and_then(datetime_of_ms),
            }),
            _ => None,
        };
        out.push(ProjectionStatus {
            rebuild_needed: code_fingerprint
                .as_ref()
                .is_some_and(|code| *code != row.fingerprint),
            code_fingerprint,
            name: row.name,
            generation: row.generation,
            fingerprint: row.fingerprint,
            checkpoint,
            applied_at: row.applied_ms.and_then(datetime_of_ms),
            lag_events,
            lag_ms,
            lease_live: row.lease_owner.is_some() && row.lease_expires_ms >= row.now_ms,
            owner: row.lease_owner,
            lease_expires_at: datetime_of_ms(row.lease_expires_ms),
            rebuild,
        });
    }
    Ok(out)
}
