//! The last workloads of `bench replay`, on its seeded log (one journal entry per event, a
//! million by default):
//!
//! - W3-past: balances in the past (`asiento_balances::balance_at`) of the busiest account,
//!   `psp:sim:clearing` (a leg per entry), at positions spread over the log, next to reads of
//!   its current balance (`read_balance`, the snapshot plus the tail) in the same run. It prints
//!   `W3-past at_us=<µs per read in the past> now_us=<µs per current read> ratio=<now/at>`: a
//!   read in the past costs a mark and at most `MARK_LEGS` legs per account, whatever the
//!   account's length (target ≥ 0.5: within twice a current read).
//! - W3-export: the whole journal as CSV (`GET /v1/journal`, `Accept: text/csv`) from a real
//!   `asiento serve --role api` on the same database, read to the end; it prints
//!   `W3-export entries=<n> rows=<legs> rss_idle_kb=<the server idle> rss_warm_kb=<idle after
//!   an export> rss_peak_kb=<its peak during a second> ratio=<peak/warm>`: the body is written
//!   page by page, so the peak stays near the warm server's (target ≤ 1.2) however long the
//!   period.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
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

/// The whole journal as CSV, read to the end: its bytes and lines.
async fn csv_export(client: &reqwest::Client, base: &str) -> anyhow::Result<(u64, u64)> {
    let mut response = client
        .get(format!("{base}/v1/journal"))
        .bearer_auth(super::bench_e2e::BENCH_API_KEY)
        .header("accept", "text/csv")
        .send()
        .await?
        .error_for_status()
        .context("the journal's CSV")?;
    let (mut bytes, mut rows) = (0u64, 0u64);
    while let Some(chunk) = response.chunk().await? {
        bytes += chunk.len() as u64;
        rows += chunk.iter().filter(|b| **b == b'\n').count() as u64;
    }
    Ok((bytes, rows))
}

/// W3-export: the journal of the whole log as CSV from a server of its own, the peak of its
/// memory during an export against its memory once warmed by one.
pub(crate) async fn export(url: &str, entries: u64) -> anyhow::Result<()> {
    let bin = std::env::current_exe()?;
    let server = super::bench_e2e::Server::start(&bin, url, &["--role", "api"]).await?;
    let outcome = async {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let idle_kb = super::bench_e2e::proc_kb(server.pid, "VmRSS");
        let client = reqwest::Client::new();
        // Warm: one whole export first, so that what an export sets up once (connections,
        // statements, the allocator's pools) is in the warm figure; then the server's peak is
        // reset (Linux's clear_refs) and the export measured is the second.
        csv_export(&client, &server.base).await?;
        tokio::time::sleep(Duration::from_secs(1)).await;
        let reset = std::fs::write(format!("/proc/{}/clear_refs", server.pid), "5").is_ok();
        if !reset {
            bail!("the server's peak memory cannot be reset (/proc/<pid>/clear_refs)");
        }
        let warm_kb = super::bench_e2e::proc_kb(server.pid, "VmRSS");
        let started = Instant::now();
        let (bytes, rows) = csv_export(&client, &server.base).await?;
        let elapsed = started.elapsed();
        let peak_kb = super::bench_e2e::proc_kb(server.pid, "VmHWM");
        // The header, then a row per leg: two or three legs per seeded entry.
        if rows < 1 + 2 * entries || rows > 1 + 3 * entries {
            bail!("the CSV has {rows} lines for {entries} entries");
        }
        println!(
            "W3-export entries={entries} rows={} rss_idle_kb={idle_kb} rss_warm_kb={warm_kb} \
             rss_peak_kb={peak_kb} ratio={:.2}",
            rows - 1,
            peak_kb as f64 / warm_kb.max(1) as f64
        );
        eprintln!(
            "W3-export {:.1} MB in {:.1}s",
            bytes as f64 / 1e6,
            elapsed.as_secs_f64()
        );
        anyhow::Ok(())
    }
    .await;
    server.stop().await?;
    outcome
}
