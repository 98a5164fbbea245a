//! W3-past, the last workload of `bench replay`: balances in the past (`asiento_balances::
//! balance_at`) of the seeded log's busiest account, `psp:sim:clearing` (one leg per event, a
//! million by default), at random positions, next to reads of its current balance
//! (`read_balance`, the snapshot plus the tail) in the same run. It prints
//! `W3-past at_us=<µs per read in the past> now_us=<µs per current read> ratio=<now/at>`: a
//! read in the past costs a mark's lookup plus at most `MARK_LEGS` legs, so the ratio stays
//! near 1 whatever the account's length (target ≥ 0.5: within twice a current read).

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::bail;
use asiento_balances::Point;
use asiento_domain::AccountName;
use asiento_eventstore::{Database, EventStore};
use asiento_projector::RebuildConfig;

/// Reads of each side per round.
const READS: u64 = 200;
/// The stride the positions read in the past step through the log by (a prime, so that they
/// spread over it).
const POSITION_STRIDE: u64 = 7_919_993;

/// Builds the legs projection (its marks included) by a rebuild, untimed, then times the reads,
/// alternating the sides over `rounds` rounds and keeping each side's best.
pub(crate) async fn past(
    db: &Database,
    store: &Arc<dyn EventStore>,
    tenant: &str,
    account: &AccountName,
    currency: &str,
    rounds: usize,
) -> anyhow::Result<()> {
    let building = Instant::now();
    asiento_balances::install(db).await?;
    let done = asiento_projector::rebuild(
        db,
        store,
        asiento_balances::entries_projection().as_ref(),
        &RebuildConfig::new(format!("bench-past-{}", std::process::id())),
        std::future::pending(),
    )
    .await?;
    eprintln!(
        "W3-past built the legs and their marks: {} events in {:.1}s",
        done.events_applied,
        building.elapsed().as_secs_f64()
    );
    // Statistics for the planner, as autovacuum gathers them after a bulk load (the machines
    // the benches run on may have it off): without them PostgreSQL may read an account's legs
    // through the index by time and sort them, instead of the range the key gives.
    if let Database::Postgres(pool) = db {
        sqlx::query("ANALYZE").execute(pool).await?;
    }
    let head = store.head().await?.position();
    if head == 0 {
        bail!("the log is empty");
    }
    let head = u64::try_from(head)?;
    let (mut at, mut now) = (Duration::MAX, Duration::MAX);
    let mut read = 0u64;
    for _ in 0..rounds.max(1) {
        let started = Instant::now();
        for _ in 0..READS {
            read += 1;
            let position = i64::try_from(1 + read.wrapping_mul(POSITION_STRIDE) % head)?;
            let point = Point {
                position: Some(position),
                time: None,
            };
            asiento_balances::balance_at(db, store.as_ref(), tenant, account, currency, point)
                .await?;
        }
        at = at.min(started.elapsed());
        let started = Instant::now();
        for _ in 0..READS {
            asiento_balances::read_balance(db, store.as_ref(), tenant, account, currency, None)
                .await?;
        }
        now = now.min(started.elapsed());
    }
    let per_read_us = |d: Duration| d.as_secs_f64() * 1e6 / READS as f64;
    println!(
        "W3-past at_us={:.0} now_us={:.0} ratio={:.2}",
        per_read_us(at),
        per_read_us(now),
        now.as_secs_f64() / at.as_secs_f64()
    );
    Ok(())
}
