//! Per-payment leases: one holder at a time works on a payment, whoever it is (the webhook worker,
//! the synchronous path's recovery, the reconciler).
//!
//! A lease is a row (payment id, owner, expiry). Acquiring is one compare-and-set statement:
//! insert, or take the row over when its expiry has passed. Releasing deletes the row only if the
//! caller still owns it. A lease answers "who works on this payment now"; it does not replace the
//! version check on the payment stream, because a holder can be slower than its lease (a GC pause,
//! a stuck query) and another holder can then take over: the stale one's append then fails its
//! expected version and it re-reads. The two guard different races and are used together.
//!
//! Usage from any path that works on a payment outside a client request:
//!
//! ```ignore
//! let Some(lease) = leases::acquire(&database, payment, clock.now_ms(), lease_ms).await? else {
//!     // Someone else is on it: try again later.
//!     return Ok(());
//! };
//! let result = flow.finalize(payment, fact).await;
//! leases::release(&database, &lease).await?;
//! ```
//!
//! Statements run on the pool, each in its own transaction: never call these while holding a
//! [`asiento_eventstore::Tx`] (on SQLite that `Tx` holds the one write lock).

use asiento_domain::PaymentId;
use asiento_eventstore::Database;
use uuid::Uuid;

/// How long a payment lease is held unless released: well above the p99 of processing one
/// provider fact (a few database round trips), so that a live holder is never overtaken; short
/// enough that a crashed holder delays the payment's next fact by at most this.
pub const PAYMENT_LEASE_MS_DEFAULT: i64 = 30_000;

#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    #[error("payment lease query failed: {0}")]
    Database(#[from] sqlx::Error),
}

/// A held lease on one payment. Release it when done; if the holder dies, it runs out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PaymentLease {
    pub payment: PaymentId,
    /// Fresh per acquisition, so that two pieces of work in one process never mistake each
    /// other's lease for their own.
    pub owner: Uuid,
    pub expires_ms: i64,
}

/// Takes the payment's lease if it is free or expired; `None` when another holder has it.
pub async fn acquire(
    database: &Database,
    payment: PaymentId,
    now_ms: i64,
    lease_ms: i64,
) -> Result<Option<PaymentLease>, LeaseError> {
    let lease = PaymentLease {
        payment,
        owner: Uuid::new_v4(),
        expires_ms: now_ms.saturating_add(lease_ms),
    };
    let id = payment.to_string();
    let taken = match database {
        Database::Postgres(pool) => sqlx::query(
            "insert into payment_leases (payment_id, owner, expires_ms) values ($1, $2, $3) \
             on conflict (payment_id) do update \
             set owner = excluded.owner, expires_ms = excluded.expires_ms \
             where payment_leases.expires_ms <= $4",
        )
        .bind(&id)
        .bind(lease.owner)
        .bind(lease.expires_ms)
        .bind(now_ms)
        .execute(pool)
        .await?
        .rows_affected(),
        Database::Sqlite(pool) => sqlx::query(
            "insert into payment_leases (payment_id, owner, expires_ms) values (?1, ?2, ?3) \
             on conflict (payment_id) do update \
             set owner = excluded.owner, expires_ms = excluded.expires_ms \
             where payment_leases.expires_ms <= ?4",
        )
        .bind(&id)
        .bind(lease.owner.to_string())
        .bind(lease.expires_ms)
        .bind(now_ms)
        .execute(pool)
        .await?
        .rows_affected(),
    };
    Ok((taken == 1).then_some(lease))
}

/// Gives the lease back, so the next holder need not wait for it to run out. A lease that was
/// already taken over is left to its new owner.
pub async fn release(database: &Database, lease: &PaymentLease) -> Result<(), LeaseError> {
    let id = lease.payment.to_string();
    match database {
        Database::Postgres(pool) => {
            sqlx::query("delete from payment_leases where payment_id = $1 and owner = $2")
                .bind(&id)
                .bind(lease.owner)
                .execute(pool)
                .await?;
        }
        Database::Sqlite(pool) => {
            sqlx::query("delete from payment_leases where payment_id = ?1 and owner = ?2")
                .bind(&id)
                .bind(lease.owner.to_string())
                .execute(pool)
                .await?;
        }
    }
    Ok(())
}
