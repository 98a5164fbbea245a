//! Rebuild aside, then swap: a fresh generation is filled from position zero while the live one
//! keeps serving, and one short transaction makes it live.
//!
//! 1. Claim: under the registry row's lock, allocate generation g' (or resume an abandoned
//!    rebuild of the same code from its checkpoint), record it in `projection_rebuilds` with a
//!    lease, and create its tables.
//! 2. Build: apply the log in batches into g', each batch committing g' rows and the rebuild's
//!    checkpoint together (no runner lease needed: nobody else writes g').
//! 3. Swap, in one transaction holding the registry row: apply the last events, re-point the
//!    views, make g' active with its checkpoint and this code's fingerprint, retire g. The live
//!    runner's next checkpoint update then matches nothing (wrong generation), it rolls back and
//!    resumes on g' from the swapped-in checkpoint.
//! 4. Drop g's tables, after the swap (never inside it: the drop waits for readers and writers
//!    still on g, and the swap must stay short). If that fails the runner sweeps them later.

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;

use asiento_eventstore::{Cursor, Database, EventStore, RecordedEvent, StoreError, Tx};

use crate::clock::sql;
use crate::registry::{self, backend_of};
use crate::{ms_i64, Projection, ProjectorError};

/// Events per rebuild batch unless configured otherwise: the most one read returns. A rebuild
/// batch is private to its generation and commits asynchronously, so it can be large; what it
/// saves is one write of every touched row (a balance) per batch (docs/benchmarks.md).
pub const REBUILD_BATCH_SIZE_MAX_DEFAULT: usize = asiento_eventstore::READ_BATCH_MAX;
/// A rebuild whose process died can be taken over after this long without progress.
pub const REBUILD_LEASE_MS_DEFAULT: u64 = 30_000;

#[derive(Debug, Clone)]
pub struct RebuildConfig {
    /// Unique per rebuilding process (see [`crate::RunnerConfig::owner`]).
    pub owner: String,
    pub batch_size_max: usize,
    pub lease_ms: u64,
}

impl RebuildConfig {
    pub fn new(owner: impl Into<String>) -> RebuildConfig {
        RebuildConfig {
            owner: owner.into(),
            batch_size_max: REBUILD_BATCH_SIZE_MAX_DEFAULT,
            lease_ms: REBUILD_LEASE_MS_DEFAULT,
        }
    }
}

/// What a finished rebuild did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RebuildReport {
    pub name: String,
    /// The generation now active.
    pub generation: i64,
    /// The generation it replaced (its tables are dropped, or queued to be).
    pub previous_generation: i64,
    /// The new generation's checkpoint at the swap.
    pub checkpoint: Cursor,
    /// Events applied by this call (a resumed rebuild counts only its own).
    pub events_applied: u64,
    /// Whether it continued an interrupted rebuild of the same code.
    pub resumed: bool,
}

/// Rebuilds `projection` from position zero into a new generation and swaps it in; see the
/// module docs. Reads keep being served from the live generation throughout. When `shutdown`
/// resolves first, the work so far is kept and a later call resumes it.
pub async fn rebuild(
    db: &Database,
    store: &Arc<dyn EventStore>,
    projection: &dyn Projection,
    config: &RebuildConfig,
    shutdown: impl Future<Output = ()>,
) -> Result<RebuildReport, ProjectorError> {
    let name = projection.name();
    let owner = config.owner.as_str();
    // A page never holds more than the store reads at once; a shorter one would read as the tail.
    let batch_size = config
        .batch_size_max
        .clamp(1, asiento_eventstore::READ_BATCH_MAX);
    registry::install(db, projection).await?;
    let claim = claim(db, projection, config).await?;
    if let Err(e) = registry::drop_retired(db, projection).await {
        tracing::warn!(projection = name, error = %e, "retired generations not dropped yet");
    }
    let generation = claim.generation;
    let mut checkpoint = claim.checkpoint;
    let mut events_applied: u64 = 0;
    tracing::info!(projection = name, generation, resumed = claim.resumed, from = %checkpoint, "rebuild started");

    // Pages are read one ahead while a batch applies; each is its own short query, so no
    // snapshot stays open across batches (a long one would keep PostgreSQL from pruning the
    // balance rows every batch updates). A short page means we are at the tail: the swap applies
    // what is left, under the registry lock, and the runner whatever comes after.
    let mut pages = Prefetch::start(Arc::clone(store), checkpoint, batch_size);
    let mut shutdown = pin!(shutdown);
    loop {
        let batch = tokio::select! {
            biased;
            () = &mut shutdown => {
                give_up(db, name, owner).await;
                return Err(ProjectorError::Interrupted { name: name.to_owned() });
            }
            batch = pages.next() => batch?,
        };
        let Some(batch) = batch else {
            break;
        };
        let Some(last) = batch.last().map(|e| e.cursor) else {
            break;
        };
        let mut tx = db.begin().await?;
        relax_durability(&mut tx).await?;
        projection.apply(&mut tx, generation, &batch).await?;
        if !advance(
            &mut tx,
            name,
            owner,
            generation,
            checkpoint,
            last,
            config.lease_ms,
        )
        .await?
        {
            tx.rollback().await?;
            return Err(ProjectorError::RebuildTakenOver {
                name: name.to_owned(),
            });
        }
        tx.commit().await?;
        checkpoint = last;
        events_applied += batch.len() as u64;
        tracing::info!(projection = name, generation, checkpoint = %checkpoint, events_applied, "rebuild progress");
    }
    drop(pages);

    // The swap.
    let mut tx = db.begin().await?;
    let previous_generation = lock_registry(&mut tx, name).await?;
    let tail = store.read_all(checkpoint, batch_size).await?;
    let mut swapped_at = checkpoint;
    if let Some(last) = tail.last().map(|e| e.cursor) {
        projection.apply(&mut tx, generation, &tail).await?;
        swapped_at = last;
    }
    if !advance(
        &mut tx,
        name,
        owner,
        generation,
        checkpoint,
        swapped_at,
        config.lease_ms,
    )
    .await?
    {
        tx.rollback().await?;
        return Err(ProjectorError::RebuildTakenOver {
            name: name.to_owned(),
        });
    }
    events_applied += tail.len() as u64;
    projection.point_views(&mut tx, generation).await?;
    let statement = sql(
        backend_of(&tx),
        "UPDATE projections SET generation = $2, fingerprint = $3, checkpoint_xact = $4, \
             checkpoint_position = $5, applied_ms = NOW_MS WHERE name = $1",
    );
    on_tx!(&mut tx, conn => {
        sqlx::query(&statement)
            .bind(name)
            .bind(generation)
            .bind(projection.fingerprint())
            .bind(swapped_at.xact())
            .bind(swapped_at.position())
            .execute(&mut *conn)
            .await?;
        sqlx::query(
            "INSERT INTO projection_retired (name, generation) VALUES ($1, $2) \
             ON CONFLICT DO NOTHING",
        )
        .bind(name)
        .bind(previous_generation)
        .execute(&mut *conn)
        .await?;
        sqlx::query("DELETE FROM projection_rebuilds WHERE name = $1")
            .bind(name)
            .execute(&mut *conn)
            .await?
            .rows_affected()
    });
    tx.commit().await?;
    tracing::info!(projection = name, generation, previous_generation, checkpoint = %swapped_at, "rebuild swapped in");

    if let Err(e) = registry::drop_retired(db, projection).await {
        tracing::warn!(projection = name, error = %e, "old generation not dropped yet; the runner drops it");
    }
    Ok(RebuildReport {
        name: name.to_owned(),
        generation,
        previous_generation,
        checkpoint: swapped_at,
        events_applied,
        resumed: claim.resumed,
    })
}

/// Reads the log page by page, one page ahead of the consumer, and ends after the first page
/// shorter than `batch_size` (that page is not handed out: it is the tail, read again by the
/// swap). The reading task stops when this is dropped.
struct Prefetch {
    pages: tokio::sync::mpsc::Receiver<Result<Vec<RecordedEvent>, StoreError>>,
    reader: tokio::task::JoinHandle<()>,
}

impl Prefetch {
    fn start(store: Arc<dyn EventStore>, from: Cursor, batch_size: usize) -> Prefetch {
        let (tx, pages) = tokio::sync::mpsc::channel(1);
        let reader = tokio::spawn(async move {
            let mut after = from;
            loop {
                let page = store.read_all(after, batch_size).await;
                let full = match &page {
                    Ok(events) if events.len() >= batch_size => events.last().map(|e| e.cursor),
                    Ok(_) => return,
                    Err(_) => None,
                };
                if tx.send(page).await.is_err() {
                    return;
                }
                match full {
                    Some(last) => after = last,
                    None => return,
                }
            }
        });
        Prefetch { pages, reader }
    }

    /// The next full page, `None` at the tail.
    async fn next(&mut self) -> Result<Option<Vec<RecordedEvent>>, StoreError> {
        self.pages.recv().await.transpose()
    }
}

impl Drop for Prefetch {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

struct Claim {
    generation: i64,
    checkpoint: Cursor,
    resumed: bool,
}

/// Step 1: a new generation, or an abandoned one of the same code to resume.
async fn claim(
    db: &Database,
    projection: &dyn Projection,
    config: &RebuildConfig,
) -> Result<Claim, ProjectorError> {
    let name = projection.name();
    let owner = config.owner.as_str();
    let code = projection.fingerprint();
    let lease_ms = ms_i64(config.lease_ms);
    let mut tx = db.begin().await?;
    lock_registry(&mut tx, name).await?;
    let select = sql(
        backend_of(&tx),
        "SELECT generation, fingerprint, checkpoint_xact, checkpoint_position, owner, \
                lease_expires_ms < NOW_MS FROM projection_rebuilds WHERE name = $1",
    );
    let existing: Option<(i64, String, i64, i64, String, bool)> = on_tx!(&mut tx, conn => {
        sqlx::query_as(&select).bind(name).fetch_optional(conn).await?
    });
    if let Some((generation, fingerprint, x, p, holder, expired)) = existing {
        if holder != owner && !expired {
            tx.rollback().await?;
            return Err(ProjectorError::RebuildInProgress {
                name: name.to_owned(),
                owner: holder,
            });
        }
        if fingerprint == code {
            let take = sql(
                backend_of(&tx),
                "UPDATE projection_rebuilds SET owner = $2, lease_expires_ms = NOW_MS + $3 \
                 WHERE name = $1",
            );
            on_tx!(&mut tx, conn => {
                sqlx::query(&take).bind(name).bind(owner).bind(lease_ms).execute(conn).await?.rows_affected()
            });
            tx.commit().await?;
            return Ok(Claim {
                generation,
                checkpoint: Cursor::new(x, p),
                resumed: true,
            });
        }
        // Built by other code: worthless now. Retire it and start afresh.
        on_tx!(&mut tx, conn => {
            sqlx::query(
                "INSERT INTO projection_retired (name, generation) VALUES ($1, $2) \
                 ON CONFLICT DO NOTHING",
            )
            .bind(name)
            .bind(generation)
            .execute(&mut *conn)
            .await?;
            sqlx::query("DELETE FROM projection_rebuilds WHERE name = $1")
                .bind(name)
                .execute(&mut *conn)
                .await?
                .rows_affected()
        });
    }
    let insert = sql(
        backend_of(&tx),
        "INSERT INTO projection_rebuilds \
             (name, generation, fingerprint, owner, lease_expires_ms, started_ms) \
         VALUES ($1, $2, $3, $4, NOW_MS + $5, NOW_MS)",
    );
    let generation: i64 = on_tx!(&mut tx, conn => {
        let generation: i64 = sqlx::query_scalar(
            "UPDATE projections SET generations_made = generations_made + 1 WHERE name = $1 \
             RETURNING generations_made",
        )
        .bind(name)
        .fetch_one(&mut *conn)
        .await?;
        sqlx::query(&insert)
            .bind(name)
            .bind(generation)
            .bind(code)
            .bind(owner)
            .bind(lease_ms)
            .execute(&mut *conn)
            .await?;
        generation
    });
    projection.create_generation(&mut tx, generation).await?;
    tx.commit().await?;
    Ok(Claim {
        generation,
        checkpoint: Cursor::START,
        resumed: false,
    })
}

/// Takes the registry row for the rest of `tx` and returns the active generation. On SQLite the
/// transaction already holds the database's write lock (BEGIN IMMEDIATE).
async fn lock_registry(tx: &mut Tx, name: &str) -> Result<i64, ProjectorError> {
    let generation: Option<i64> = match tx {
        Tx::Postgres(t) => {
            sqlx::query_scalar("SELECT generation FROM projections WHERE name = $1 FOR UPDATE")
                .bind(name)
                .fetch_optional(&mut **t)
                .await?
        }
        Tx::Sqlite(t) => {
            sqlx::query_scalar("SELECT generation FROM projections WHERE name = $1")
                .bind(name)
                .fetch_optional(&mut **t)
                .await?
        }
    };
    generation.ok_or_else(|| ProjectorError::NotInstalled {
        name: name.to_owned(),
    })
}

/// A rebuild batch commits without waiting for its WAL flush (PostgreSQL). Safe: its rows and
/// the rebuild's checkpoint commit together, so a batch lost in a server crash is lost whole and
/// the resumed rebuild reads it again; nothing is served from the generation before the swap,
/// which commits durably. SQLite has no per-transaction equivalent.
async fn relax_durability(tx: &mut Tx) -> Result<(), sqlx::Error> {
    if let Tx::Postgres(t) = tx {
        sqlx::query("SET LOCAL synchronous_commit = off")
            .execute(&mut **t)
            .await?;
    }
    Ok(())
}

/// Moves the rebuild's checkpoint and renews its lease; false if another process took it over.
async fn advance(
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
        "UPDATE projection_rebuilds SET checkpoint_xact = $4, checkpoint_position = $5, \
             lease_expires_ms = NOW_MS + $3 \
         WHERE name = $1 AND owner = $2 AND generation = $6 \
           AND checkpoint_xact = $7 AND checkpoint_position = $8",
    );
    let updated = on_tx!(tx, conn => {
        sqlx::query(&statement)
            .bind(name)
            .bind(owner)
            .bind(ms_i64(lease_ms))
            .bind(to.xact())
            .bind(to.position())
            .bind(generation)
            .bind(from.xact())
            .bind(from.position())
            .execute(conn)
            .await?
            .rows_affected()
    });
    Ok(updated == 1)
}

/// An interrupted rebuild lets its lease lapse at once, so that the next call resumes it without
/// waiting.
async fn give_up(db: &Database, name: &str, owner: &str) {
    let released = crate::on_db!(db, pool => {
        sqlx::query(
            "UPDATE projection_rebuilds SET lease_expires_ms = 0 WHERE name = $1 AND owner = $2",
        )
        .bind(name)
        .bind(owner)
        .execute(pool)
        .await
        .map(|_| ())
    });
    if let Err(e) = released {
        tracing::warn!(projection = name, error = %e, "rebuild lease not released; it expires by itself");
    }
}
