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
//! When all are busy the work borrows from the pool, as before.

use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};

use sqlx::pool::PoolConnection;
use sqlx::{Connection, PgConnection, PgPool, Postgres};

/// Connections a store keeps for itself, beyond its pool's.
pub(crate) const STORE_CONNECTIONS_MAX: usize = 8;

/// The store's own connections: the idle ones, and how many are open.
#[derive(Default)]
pub(crate) struct StoreConnections {
    idle: Mutex<Vec<PgConnection>>,
    open: AtomicUsize,
}

/// A connection lent to one statement (or one append and its follow-up reads).
pub(crate) struct Lease<'a> {
    owner: &'a StoreConnections,
    conn: Option<Leased>,
}

enum Leased {
    Own(PgConnection),
    Pooled(PoolConnection<Postgres>),
}

impl StoreConnections {
    /// An idle connection of the store's own, a new one while fewer than
    /// [`STORE_CONNECTIONS_MAX`] are open, or else one from the pool.
    pub(crate) async fn lease(&self, pool: &PgPool) -> Result<Lease<'_>, sqlx::Error> {
        let lease = |conn| Lease {
            owner: self,
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
            match PgConnection::connect_with(&pool.connect_options()).await {
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

impl Lease<'_> {
    /// The work completed (whatever its verdict): the connection is idle and
    /// serves the next statement.
    pub(crate) fn keep(mut self) {
        match self.conn.take() {
            Some(Leased::Own(conn)) => self.owner.lock().push(conn),
            // Back to the pool, which tests it on the way.
            Some(Leased::Pooled(conn)) => drop(conn),
            None => {}
        }
    }
}

impl Drop for Lease<'_> {
    /// Not kept: the connection may be mid-statement, so it is closed.
    fn drop(&mut self) {
        if let Some(Leased::Own(conn)) = self.conn.take() {
            self.owner.open.fetch_sub(1, Ordering::AcqRel);
            drop(conn);
        }
    }
}

impl Deref for Lease<'_> {
    type Target = PgConnection;
    fn deref(&self) -> &PgConnection {
        match &self.conn {
            Some(Leased::Own(conn)) => conn,
            Some(Leased::Pooled(conn)) => conn,
            None => unreachable!("a lease holds its connection until kept or dropped"),
        }
    }
}

impl DerefMut for Lease<'_> {
    fn deref_mut(&mut self) -> &mut PgConnection {
        match &mut self.conn {
            Some(Leased::Own(conn)) => conn,
            Some(Leased::Pooled(conn)) => conn,
            None => unreachable!("a lease holds its connection until kept or dropped"),
        }
    }
}
