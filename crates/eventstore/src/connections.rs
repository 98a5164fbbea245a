//! The PostgreSQL store's own connections, kept outside sqlx's pool, for its
//! one-statement work: single-stream appends and reads.
//!
//! sqlx pings every connection on its way back into its pool (a `Sync` round
//! trip, and one more wake-up of a server process). An append or a read is
//! one autocommit statement, so through the pool each cost that statement plus
//! the ping, and the connection stayed out of reach until the ping came back
//! (W1-single went from 0.51 to 0.72 of the plain-SQL rate with this alone).
//! Here the store opens up to [`STORE_CONNECTIONS_MAX`] connections of its
//! own, on demand, with the pool's connect options, and keeps each one after a
//! statement that completed. A connection whose statement did not complete (a
//! transport error, or a future dropped mid-way) is closed, never reused.
//! When all are busy the work borrows from the pool, as before. The group
//! commit statement has a set of its own, whose connections plan a prepared
//! statement once ([`StoreConnections::planning_once`]).
//!
//! [`PgTx`] is a unit of work on such a connection (or on a pooled one, for
//! [`crate::Database::begin`]): BEGIN and COMMIT through sqlx's own
//! transaction manager, the connection kept after a COMMIT or ROLLBACK that
//! completed, closed (so PostgreSQL rolls back) when dropped still open.

use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use sqlx::pool::PoolConnection;
use sqlx::{Connection, PgConnection, PgPool, Postgres, TransactionManager};

/// Connections a store keeps for itself, beyond its pool's.
pub(crate) const STORE_CONNECTIONS_MAX: usize = 8;

/// The store's own connections: the idle ones, and how many are open.
#[derive(Default)]
pub(crate) struct StoreConnections {
    idle: Mutex<Vec<PgConnection>>,
    open: AtomicUsize,
    /// Startup options the connections are opened with, beyond the pool's.
    options: Vec<(&'static str, &'static str)>,
}

/// A connection lent to one statement (or one append and its follow-up
/// reads, or one transaction). `owner` is where an own connection goes back;
/// a lease with no owner holds a pooled connection.
pub(crate) struct Lease {
    owner: Option<Arc<StoreConnections>>,
    conn: Option<Leased>,
}

enum Leased {
    Own(PgConnection),
    Pooled(PoolConnection<Postgres>),
}

impl StoreConnections {
    /// Connections that plan every prepared statement once (`plan_cache_mode =
    /// force_generic_plan`), for the group commit statement. PostgreSQL plans a
    /// statement anew for each execution while such a plan looks cheaper than
    /// its generic one, which a statement over arrays always does (the planner
    /// sees each array's length); for that statement's dozens of plan nodes,
    /// planning cost more than running it for a batch of a few requests. Its
    /// generic plan probes the events' and keys' unique indexes whatever the
    /// batch holds, so one plan serves every batch.
    pub(crate) fn planning_once() -> StoreConnections {
        StoreConnections {
            options: vec![("plan_cache_mode", "force_generic_plan")],
            ..StoreConnections::default()
        }
    }

    /// An idle connection of the store's own, a new one while fewer than
    /// [`STORE_CONNECTIONS_MAX`] are open, or else one from the pool.
    pub(crate) async fn lease(self: &Arc<Self>, pool: &PgPool) -> Result<Lease, sqlx::Error> {
        let lease = |conn| Lease {
            owner: Some(Arc::clone(self)),
            conn: Some(conn),
        };
        if pool.is_closed() {
            let closed = std::mem::take(&mut *self.lock());
            self.open.fetch_sub(closed.len(), Ordering::AcqRel);
            return Err(sqlx::Error::PoolClosed);
        }
        if let Some(conn) = self.lock().pop() {
            return Ok(lease(Leased::Own(conn)));
        }
        if self.open.fetch_add(1, Ordering::AcqRel) < STORE_CONNECTIONS_MAX {
            let options = pool.connect_options().as_ref().clone();
            match PgConnection::connect_with(&options.options(self.options.iter().copied())).await {
                Ok(conn) => return Ok(lease(Leased::Own(conn))),
                Err(e) => {
                    tracing::debug!(error = %e, "store connection not opened; using the pool")
                }
            }
        }
        self.open.fetch_sub(1, Ordering::AcqRel);
        Ok(lease(Leased::Pooled(pool.acquire().await?)))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<PgConnection>> {
        self.idle.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Lease {
    /// A connection of the pool's, in a lease of its own.
    pub(crate) async fn pooled(pool: &PgPool) -> Result<Lease, sqlx::Error> {
        Ok(Lease {
            owner: None,
            conn: Some(Leased::Pooled(pool.acquire().await?)),
        })
    }

    /// The work completed (whatever its verdict): the connection is idle and
    /// serves the next statement.
    pub(crate) fn keep(mut self) {
        match (self.conn.take(), &self.owner) {
            (Some(Leased::Own(conn)), Some(owner)) => owner.lock().push(conn),
            // Back to the pool, which tests it on the way.
            (Some(Leased::Pooled(conn)), _) => drop(conn),
            _ => {}
        }
    }
}

impl Drop for Lease {
    /// Not kept: the connection may be mid-statement, so it is closed. (A
    /// pooled one goes back to the pool, which tests it on the way.)
    fn drop(&mut self) {
        if let Some(Leased::Own(conn)) = self.conn.take() {
            if let Some(owner) = &self.owner {
                owner.open.fetch_sub(1, Ordering::AcqRel);
            }
            drop(conn);
        }
    }
}

/// A transaction on a leased connection. Derefs to the connection, as
/// `sqlx::Transaction` does, so statements run on `&mut **tx`.
pub struct PgTx {
    lease: Option<Lease>,
}

impl PgTx {
    pub(crate) async fn begin(mut lease: Lease) -> Result<PgTx, sqlx::Error> {
        <Postgres as sqlx::Database>::TransactionManager::begin(&mut lease, None).await?;
        Ok(PgTx { lease: Some(lease) })
    }

    pub(crate) async fn commit(mut self) -> Result<(), sqlx::Error> {
        self.finish(true).await
    }

    pub(crate) async fn rollback(mut self) -> Result<(), sqlx::Error> {
        self.finish(false).await
    }

    async fn finish(&mut self, commit: bool) -> Result<(), sqlx::Error> {
        let Some(mut lease) = self.lease.take() else {
            return Ok(());
        };
        type Manager = <Postgres as sqlx::Database>::TransactionManager;
        if commit {
            Manager::commit(&mut lease).await?;
        } else {
            Manager::rollback(&mut lease).await?;
        }
        // Dropped on an error above: closed, and PostgreSQL rolls back.
        lease.keep();
        Ok(())
    }
}

impl Drop for PgTx {
    /// Dropped open: an own connection is closed with its transaction (it may
    /// be mid-statement); a pooled one gets a ROLLBACK queued, as
    /// `sqlx::Transaction` does, which the pool's test on return sends.
    fn drop(&mut self) {
        if let Some(mut lease) = self.lease.take() {
            if matches!(lease.conn, Some(Leased::Pooled(_))) {
                <Postgres as sqlx::Database>::TransactionManager::start_rollback(&mut lease);
            }
        }
    }
}

impl std::fmt::Debug for PgTx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgTx")
            .field("open", &self.lease.is_some())
            .finish()
    }
}

impl Deref for PgTx {
    type Target = PgConnection;
    fn deref(&self) -> &PgConnection {
        match &self.lease {
            Some(lease) => lease,
            None => unreachable!("a transaction holds its connection until it ends"),
        }
    }
}

impl DerefMut for PgTx {
    fn deref_mut(&mut self) -> &mut PgConnection {
        match &mut self.lease {
            Some(lease) => lease,
            None => unreachable!("a transaction holds its connection until it ends"),
        }
    }
}

impl Deref for Lease {
    type Target = PgConnection;
    fn deref(&self) -> &PgConnection {
        match &self.conn {
            Some(Leased::Own(conn)) => conn,
            Some(Leased::Pooled(conn)) => conn,
            None => unreachable!("a lease holds its connection until kept or dropped"),
        }
    }
}

impl DerefMut for Lease {
    fn deref_mut(&mut self) -> &mut PgConnection {
        match &mut self.conn {
            Some(Leased::Own(conn)) => conn,
            Some(Leased::Pooled(conn)) => conn,
            None => unreachable!("a lease holds its connection until kept or dropped"),
        }
    }
}
