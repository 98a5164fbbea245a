//! The projection runtime: turns the event log into read models, exactly once, with one active
//! writer per projection and rebuilds that never take a read model offline.
//!
//! Why it is shaped this way:
//!
//! - **Exactly-once by one transaction.** A batch's read-model writes and the move of the
//!   projection's checkpoint commit in one database transaction. The checkpoint update is a
//!   compare-and-set on (generation, lease owner, previous checkpoint): a runner that lost its
//!   lease, or whose generation a rebuild swapped out, updates nothing and rolls the batch back.
//!   Leases keep two runners from doing the work twice; the compare-and-set is what makes a
//!   double apply impossible even if a lease were wrong.
//! - **Leases on the database clock.** Expiry times are computed by the statements themselves
//!   (`now` of the database), so processes on several machines compare against one clock.
//!   A killed process simply stops renewing; its open transaction dies with its connection.
//! - **Generations.** A read model lives in tables named after a generation (`balances_g3`)
//!   behind stable views (`balances`). A rebuild fills generation g+1 from position zero while
//!   generation g keeps serving, then one transaction applies the last events, re-points the
//!   views and makes g+1 active. Readers only ever see a complete generation.
//! - **Fingerprints.** A projection names the version of its code and schema. A runner whose
//!   code differs from what built the active generation refuses to resume on it and says that
//!   `asiento projections rebuild NAME` is needed (it does not rebuild on its own: a rebuild of a
//!   large log is an operation to schedule, and the balance read side stays exact meanwhile
//!   because it adds the unprojected tail itself).
//!
//! Architecture invariant: a projection's checkpoint and its read-model rows only ever change
//! together, in one transaction guarded by the registry row.

pub mod history;
pub mod keyset;
pub mod snapshot;

use asiento_eventstore::{RecordedEvent, StoreError, Tx};

#[doc(hidden)]
pub mod __private {
    pub use asiento_eventstore::{Database, Tx};
}

/// Runs `$body` with `$conn` bound to the `&mut` connection of either backend's transaction.
/// The body is compiled once per backend, so one SQL text (with `$1` placeholders, which sqlx
/// accepts on SQLite too) serves both.
#[macro_export]
macro_rules! on_tx {
    ($tx:expr, $conn:ident => $body:expr) => {
        match $tx {
            $crate::__private::Tx::Postgres(t) => {
                let $conn = &mut **t;
                $body
            }
            $crate::__private::Tx::Sqlite(t) => {
                let $conn = &mut **t;
                $body
            }
        }
    };
}

/// Runs `$body` with `$pool` bound to either backend's pool.
#[macro_export]
macro_rules! on_db {
    ($db:expr, $pool:ident => $body:expr) => {
        match $db {
            $crate::__private::Database::Postgres($pool) => $body,
            $crate::__private::Database::Sqlite($pool) => $body,
        }
    };
}

mod clock;
mod rebuild;
mod registry;
mod runner;
mod status;
mod wait;

pub use clock::now_ms_sql;
pub use rebuild::{rebuild, RebuildConfig, RebuildReport, REBUILD_BATCH_SIZE_MAX_DEFAULT};
pub use registry::{checkpoint, install, Checkpoint};
pub use runner::{Runner, RunnerConfig};
pub use status::{status, ProjectionStatus, RebuildStatus};
pub use wait::{wait_for_position, WaitError, READ_WAIT_MS_MAX};

/// A read model built from the event log.
///
/// The runtime owns the checkpoint, the lease and the transactions; a projection only knows its
/// tables. Every method gets the generation it must touch, and names its tables after it, so
/// that a rebuild can fill a fresh copy while the live one serves.
#[async_trait::async_trait]
pub trait Projection: Send + Sync + 'static {
    /// Stable name: the registry key and the argument of `asiento projections rebuild NAME`.
    fn name(&self) -> &'static str;

    /// Changes whenever the code that builds the read model, or its schema, changes in a way
    /// that makes data built by the old code wrong for the new one.
    fn fingerprint(&self) -> &'static str;

    /// Creates the (empty) tables of `generation`.
    async fn create_generation(&self, tx: &mut Tx, generation: i64) -> Result<(), ProjectionError>;

    /// Points the stable views that readers query at the tables of `generation`. Runs inside the
    /// swap transaction, so readers see either the old generation or the new one, never neither.
    async fn point_views(&self, tx: &mut Tx, generation: i64) -> Result<(), ProjectionError>;

    /// Drops the tables of a generation no view points at any more.
    async fn drop_generation(&self, tx: &mut Tx, generation: i64) -> Result<(), ProjectionError>;

    /// Applies a batch of events, in log order, to the tables of `generation`. The runtime
    /// commits the checkpoint in the same transaction; on error it rolls everything back and
    /// retries the batch later, so an event that cannot be applied stops the projection (it is
    /// never skipped: a skipped journal entry is a wrong balance).
    async fn apply(
        &self,
        tx: &mut Tx,
        generation: i64,
        events: &[RecordedEvent],
    ) -> Result<(), ProjectionError>;
}

/// Why a projection could not apply a batch or change its tables.
#[derive(Debug, thiserror::Error)]
pub enum ProjectionError {
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A stored event the projection cannot read. The projection stops at it.
    #[error("event at position {position} cannot be projected: {reason}")]
    Malformed { position: i64, reason: String },
}

/// Errors of the runtime (registry, runner, rebuild, status).
#[derive(Debug, thiserror::Error)]
pub enum ProjectorError {
    #[error(transparent)]
    Projection(#[from] ProjectionError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
    /// The active generation was built by other code: resuming would mix two versions.
    #[error(
        "projection {name} was built by fingerprint {stored}, this code is {code}: \
         run `asiento projections rebuild {name}`"
    )]
    FingerprintChanged {
        name: String,
        stored: String,
        code: String,
    },
    #[error("projection {name} is not installed")]
    NotInstalled { name: String },
    #[error("a rebuild of {name} is already running (owner {owner})")]
    RebuildInProgress { name: String, owner: String },
    /// Another process took over this rebuild (its lease had expired).
    #[error("the rebuild of {name} was taken over by another process")]
    RebuildTakenOver { name: String },
    /// The rebuild was asked to stop; it resumes from its checkpoint when started again.
    #[error("the rebuild of {name} was interrupted; run it again to resume")]
    Interrupted { name: String },
    #[error("the event subscription ended")]
    SubscriptionEnded,
}

/// Points the stable view `view` at one generation's table (`SELECT * FROM {table}`), inside the
/// caller's transaction: what a projection's `point_views` does for each of its views.
pub async fn point_view(tx: &mut Tx, view: &str, table: &str) -> Result<(), ProjectionError> {
    let select = format!("SELECT * FROM {table}");
    match tx {
        // Transactional, and every generation has the same columns, which CREATE OR REPLACE
        // VIEW requires.
        Tx::Postgres(t) => {
            sqlx::query(&format!("CREATE OR REPLACE VIEW {view} AS {select}"))
                .execute(&mut **t)
                .await?;
        }
        // SQLite has no CREATE OR REPLACE VIEW; both statements are in the caller's transaction.
        Tx::Sqlite(t) => {
            sqlx::query(&format!("DROP VIEW IF EXISTS {view}"))
                .execute(&mut **t)
                .await?;
            sqlx::query(&format!("CREATE VIEW {view} AS {select}"))
                .execute(&mut **t)
                .await?;
        }
    }
    Ok(())
}

/// A lease or limit in milliseconds as the database's `bigint`.
pub(crate) fn ms_i64(ms: u64) -> i64 {
    i64::try_from(ms).unwrap_or(i64::MAX)
}
