//! Job leases: one holder per job across processes, so that one sweep (or one sealer) runs at a
//! time however many processes serve.

use asiento_eventstore::Database;
use uuid::Uuid;

use super::sqlite;

/// A held job lease (one holder per job across processes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JobLease {
    pub owner: Uuid,
    pub expires_ms: i64,
}

/// Takes `job`'s lease for `owner` if it is free, expired, or already `owner`'s (a renewal).
/// Application clock, like the payment and idempotency leases: tests move it by hand, and the
/// lease is long against any skew between hosts.
pub async fn acquire_job(
    database: &Database,
    job: &str,
    owner: Uuid,
    now_ms: i64,
    lease_ms: i64,
) -> Result<Option<JobLease>, sqlx::Error> {
    let lease = JobLease {
        owner,
        expires_ms: now_ms.saturating_add(lease_ms),
    };
    let sql = "insert into job_leases (job, owner, expires_ms) values ($1, $2, $3) \
               on conflict (job) do update set owner = excluded.owner, \
               expires_ms = excluded.expires_ms \
               where job_leases.expires_ms <= $4 or job_leases.owner = excluded.owner";
    let taken = match database {
        Database::Postgres(pool) => sqlx::query(sql)
            .bind(job)
            .bind(owner)
            .bind(lease.expires_ms)
            .bind(now_ms)
            .execute(pool)
            .await?
            .rows_affected(),
        Database::Sqlite(pool) => sqlx::query(&sqlite(sql))
            .bind(job)
            .bind(owner.to_string())
            .bind(lease.expires_ms)
            .bind(now_ms)
            .execute(pool)
            .await?
            .rows_affected(),
    };
    Ok((taken == 1).then_some(lease))
}

pub async fn release_job(database: &Database, job: &str, owner: Uuid) -> Result<(), sqlx::Error> {
    let sql = "delete from job_leases where job = $1 and owner = $2";
    match database {
        Database::Postgres(pool) => {
            sqlx::query(sql).bind(job).bind(owner).execute(pool).await?;
        }
        Database::Sqlite(pool) => {
            sqlx::query(&sqlite(sql))
                .bind(job)
                .bind(owner.to_string())
                .execute(pool)
                .await?;
        }
    }
    Ok(())
}
