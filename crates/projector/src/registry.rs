//! The registry row of each projection (migration 0020): install, lease, checkpoint.
//!
//! Every statement that moves a checkpoint names the generation, the lease owner and the
//! checkpoint it expects to replace; a statement that matches no row is how a runner learns that
//! it lost its lease or that a rebuild swapped its generation out.

use asiento_eventstore::{Backend, Cursor, Database, Tx};

use crate::clock::sql;
use crate::{ms_i64, Projection, ProjectorError};

/// Lock wait for dropping a retired generation on PostgreSQL: a reader still on the old tables,
/// or a runner that has not yet noticed the swap, makes the drop wait; past this it gives up
/// and the next sweep tries again.
pub(crate) const DROP_LOCK_TIMEOUT_MS: u64 = 2_000;

/// Where a projection stands, as its registry row says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checkpoint {
    /// The generation readers see (its tables are behind the views).
    pub generation: i64,
    /// The code/schema version that built `generation`.
    pub fingerprint: String,
    /// The last event applied to `generation`; [`Cursor::START`] before the first.
    pub cursor: Cursor,
}

pub(crate) fn backend_of(tx: &Tx) -> Backend {
    match tx {
        Tx::Postgres(_) => Backend::Postgres,
        Tx::Sqlite(_) => Backend::Sqlite,
    }
}

/// Registers the projection with an empty generation 1 behind its views, unless it is
/// registered already (then nothing changes, whatever the fingerprint). Safe to call from
/// several processes at once, and cheap when installed: call it at startup before serving reads.
pub async fn install(db: &Database, projection: &dyn Projection) -> Result<(), ProjectorError> {
    let name = projection.name();
    let found: Option<i64> = on_db!(db, pool => {
        sqlx::query_scalar("SELECT generation FROM projections WHERE name = $1")
            .bind(name)
            .fetch_optional(pool)
            .await?
    });
    if found.is_some() {
        return Ok(());
    }
    let mut tx = db.begin().await?;
    // On PostgreSQL a concurrent installer waits here on the uncommitted key and then inserts
    // nothing; on SQLite the IMMEDIATE transaction serialises installers.
    let inserted = on_tx!(&mut tx, conn => {
        sqlx::query(
            "INSERT INTO projections (name, generation, fingerprint, generations_made) \
             VALUES ($1, 1, $2, 1) ON CONFLICT (name) DO NOTHING",
        )
        .bind(name)
        .bind(projection.fingerprint())
        .execute(conn)
        .await?
        .rows_affected()
    });
    if inserted == 0 {
        tx.rollback().await?;
        return Ok(());
    }
    projection.create_generation(&mut tx, 1).await?;
    projection.point_views(&mut tx, 1).await?;
    tx.commit().await?;
    tracing::info!(projection = name, "projection installed (generation 1)");
    Ok(())
}

/// The projection's registry row, or None if it is not installed.
pub async fn checkpoint(db: &Database, name: &str) -> Result<Option<Checkpoint>, sqlx::Error> {
    let row: Option<(i64, String, i64, i64)> = on_db!(db, pool => {
        sqlx::query_as(
            "SELECT generation, fingerprint, checkpoint_xact, checkpoint_position \
             FROM projections WHERE name = $1",
        )
        .bind(name)
        .fetch_optional(pool)
        .await?
    });
    Ok(row.map(|(generation, fingerprint, x, p)| Checkpoint {
        generation,
        fingerprint,
        cursor: Cursor::new(x, p),
    }))
}

/// Takes (or keeps) the lease if it is free, expired or already ours. None: someone else holds it.
pub(crate) async fn acquire(
    db: &Database,
    name: &str,
    owner: &str,
    lease_ms: u64,
) -> Result<Option<Checkpoint>, sqlx::Error> {
    // A compare-and-set in one statement: of two runners racing for an expired lease, the
    // second re-evaluates the condition against the first one's row and matches nothing.
    let statement = sql(
        db.backend(),
        "UPDATE projections SET lease_owner = $2, lease_expires_ms = NOW_MS + $3 \
         WHERE name = $1 AND (lease_owner IS NULL OR lease_owner = $2 OR lease_expires_ms < NOW_MS) \
         RETURNING generation, fingerprint, checkpoint_xact, checkpoint_position",
    );
    let row: Option<(i64, String, i64, i64)> = on_db!(db, pool => {
        sqlx::query_as(&statement)
            .bind(name)
            .bind(owner)
            .bind(ms_i64(lease_ms))
            .fetch_optional(pool)
            .await?
    });
    Ok(row.map(|(generation, fingerprint, x, p)| Checkpoint {
        generation,
        fingerprint,
        cursor: Cursor::new(x, p),
    }))
}

/// Extends our lease on `generation`. None: the lease is someone else's now, or a rebuild made
/// another generation active; either way this runner must stop writing.
pub(crate) async fn renew(
    db: &Database,
    name: &str,
    owner: &str,
    generation: i64,
    lease_ms: u64,
) -> Result<Option<Cursor>, sqlx::Error> {
    let statement = sql(
        db.backend(),
        "UPDATE projections SET lease_expires_ms = NOW_MS + $3 \
         WHERE name = $1 AND lease_owner = $2 AND generation = $4 \
         RETURNING checkpoint_xact, checkpoint_position",
    );
    let row: Option<(i64, i64)> = on_db!(db, pool => {
        sqlx::query_as(&statement)
            .bind(name)
            .bind(owner)
            .bind(ms_i64(lease_ms))
            .bind(generation)
            .fetch_optional(pool)
            .await?
    });
    Ok(row.map(|(x, p)| Cursor::new(x, p)))
}

/// Moves the checkpoint from `from` to `to` inside the batch's transaction, renewing the lease.
/// False: the batch must be rolled back (lease lost, generation swapped, or the checkpoint moved
/// under us, which the lease should make impossible but this makes harmless).
pub(crate) async fn advance(
    tx: &mut Tx,
    name: &str,
    owner: &str,
    generation: i64,
    from: Cursor,
    to: Cursor,
    lease_ms: u64,
) -> Result<bool, sqlx::Error> {
    let statement = sql(
        backend_of(tx),
        "UPDATE projections SET checkpoint_xact = $5, checkpoint_position = $6, \
             applied_ms = NOW_MS, lease_expires_ms = NOW_MS + $3 \
         WHERE name = $1 AND lease_owner = $2 AND generation = $4 \
           AND checkpoint_xact = $7 AND checkpoint_position = $8",
    );
    let updated = on_tx!(tx, conn => {
        sqlx::query(&statement)
            .bind(name)
            .bind(owner)
            .bind(ms_i64(lease_ms))
            .bind(generation)
            .bind(to.xact())
            .bind(to.position())
            .bind(from.xact())
            .bind(from.position())
            .execute(conn)
            .await?
            .rows_affected()
    });
    Ok(updated == 1)
}

/// Gives the lease up (graceful shutdown), so another runner takes over without waiting for it
/// to expire.
pub(crate) async fn release(db: &Database, name: &str, owner: &str) -> Result<(), sqlx::Error> {
    on_db!(db, pool => {
        sqlx::query(
            "UPDATE projections SET lease_owner = NULL, lease_expires_ms = 0 \
             WHERE name = $1 AND lease_owner = $2",
        )
        .bind(name)
        .bind(owner)
        .execute(pool)
        .await?
        .rows_affected()
    });
    Ok(())
}

/// Drops the tables of retired generations (each in its own short transaction). Returns how
/// many were dropped. Never touches the active generation or one being rebuilt.
pub(crate) async fn drop_retired(
    db: &Database,
    projection: &dyn Projection,
) -> Result<usize, ProjectorError> {
    let name = projection.name();
    let generations: Vec<i64> = on_db!(db, pool => {
        sqlx::query_scalar(
            "SELECT r.generation FROM projection_retired r JOIN projections p ON p.name = r.name \
             WHERE r.name = $1 AND r.generation <> p.generation \
               AND r.generation NOT IN \
                   (SELECT b.generation FROM projection_rebuilds b WHERE b.name = $1) \
             ORDER BY r.generation",
        )
        .bind(name)
        .fetch_all(pool)
        .await?
    });
    let mut dropped = 0;
    for generation in generations {
        let mut tx = db.begin().await?;
        if let Tx::Postgres(t) = &mut tx {
            sqlx::query(&format!("SET LOCAL lock_timeout = {DROP_LOCK_TIMEOUT_MS}"))
                .execute(&mut **t)
                .await?;
        }
        projection.drop_generation(&mut tx, generation).await?;
        on_tx!(&mut tx, conn => {
            sqlx::query("DELETE FROM projection_retired WHERE name = $1 AND generation = $2")
                .bind(name)
                .bind(generation)
                .execute(conn)
                .await?
                .rows_affected()
        });
        tx.commit().await?;
        tracing::info!(projection = name, generation, "retired generation dropped");
        dropped += 1;
    }
    Ok(dropped)
}
