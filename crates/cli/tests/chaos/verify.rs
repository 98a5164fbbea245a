//! The books prove: `asiento verify` on the run's database, asked again for a while after the
//! checks (projections and the sealer catch up meanwhile). With `CHAOS_REQUIRE_SEALED=1` it must
//! also find every event sealed, which after a kill waits for the dead owner's job lease to run
//! out. The job leases left at the end are printed with the verdict, for the diagnosis of a
//! stalled worker.

use std::time::{Duration, Instant};

use crate::common::asiento;
use crate::knobs;

/// What `asiento verify` concluded.
pub struct Verdict {
    pub verified: bool,
    /// Its last output.
    pub output: String,
    /// Its `N not sealed` part (empty when it printed none).
    pub unsealed: String,
}

/// Runs `asiento verify` until it passes or its deadline (30 s, 120 s when every event must be
/// sealed), and prints its last output with the job leases.
pub async fn books(database_url: &str) -> Verdict {
    // The books prove, once the sealer has caught up.
    // The books prove. With CHAOS_REQUIRE_SEALED=1, also wait until the sealer has covered every
    // event (after a kill, its job lease of a dead owner must run out first).
    let require_sealed = knobs::require_sealed();
    let leases = job_leases(database_url).await;
    let verify_deadline =
        Instant::now() + Duration::from_secs(if require_sealed { 120 } else { 30 });
    let (verified, verify_output) = loop {
        let (ok, output) = asiento(&["verify", "--database-url", database_url]);
        let sealed = output.contains("; 0 not sealed");
        if (ok && (sealed || !require_sealed)) || Instant::now() > verify_deadline {
            break (ok && (sealed || !require_sealed), output);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let unsealed = verify_output
        .split(';')
        .find(|part| part.contains("not sealed"))
        .map(|part| part.trim().to_owned())
        .unwrap_or_default();
    println!(
        "chaos: verify: {} | job leases at the end: {leases}",
        verify_output.trim()
    );
    Verdict {
        verified,
        output: verify_output,
        unsealed,
    }
}

/// The job leases (reconciler sweep, sealer) and how long each still runs, for the diagnosis of a
/// stalled worker after a kill.
async fn job_leases(url: &str) -> String {
    let Ok(database) = asiento_eventstore::Database::connect(url).await else {
        return "?".to_owned();
    };
    let result: Result<Option<String>, sqlx::Error> = match &database {
        asiento_eventstore::Database::Postgres(pool) => {
            sqlx::query_scalar(
                "select string_agg(job || ':' || ((expires_ms - (extract(epoch from now()) * 1000)::bigint) / 1000)::text || 's', ' ') from job_leases",
            )
            .fetch_one(pool)
            .await
        }
        asiento_eventstore::Database::Sqlite(pool) => {
            sqlx::query_scalar(
                "select group_concat(job || ':' || ((expires_ms - cast((julianday('now') - 2440587.5) * 86400000 as integer)) / 1000) || 's', ' ') from job_leases",
            )
            .fetch_one(pool)
            .await
        }
    };
    match result {
        Ok(text) => text.unwrap_or_default(),
        Err(error) => format!("? ({error})"),
    }
}
