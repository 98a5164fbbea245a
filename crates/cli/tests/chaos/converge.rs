//! Convergence after the load: with faults off, the checks run again and again until everything is
//! settled or the knobs' convergence time is up. The reconciler inside `asiento serve` settles
//! what is pending; every fourth round a manual `asiento reconcile` (bounded, as it may wait on a
//! sweep lease held elsewhere) sweeps too, and in the Adyen dialect every round first has the
//! simulator publish its accounting report, the only source for what a dropped notification
//! told.

use std::time::{Duration, Instant};

use crate::checks::{check, Findings};
use crate::http::sim_call;
use crate::knobs::Knobs;
use crate::load::Record;
use crate::processes::asiento_bounded;
use crate::settings::{operation_pending_deadline, pending_timeout};

/// The findings of the last round (settled, or the deadline's), and what the last unsettled round
/// still waited for (empty if the first round settled).
pub async fn converge(
    http: &reqwest::Client,
    base: &str,
    sim: &str,
    database_url: &str,
    provider: &[String; 2],
    knobs: &Knobs,
    record: &Record,
) -> (Findings, String) {
    let absence_unconfirmed = (knobs.dialect == "adyen").then(|| {
        // The server's pending timeout, and a second of leeway between its clock and ours.
        let seconds: u64 = pending_timeout("adyen")
            .trim_end_matches('s')
            .parse()
            .unwrap();
        Duration::from_secs(seconds + 1)
    });
    let deadline = Instant::now() + knobs.converge;
    let mut rounds = 0u32;
    let mut waited_for = String::new();
    let findings = loop {
        if knobs.dialect == "adyen" {
            // Adyen's daily accounting report, generated for every day up to today (a day is
            // announced once; the file keeps growing with what is booked on it later): the only
            // source for what a dropped notification told.
            sim_call(
                http,
                reqwest::Method::POST,
                &format!("{sim}/sim/reports/accounting"),
                None,
            )
            .await;
        }
        let findings = check(http, base, sim, record, absence_unconfirmed).await;
        if findings.settled() || Instant::now() > deadline {
            break findings;
        }
        // What the last unsettled round still waited for, for the phases line.
        waited_for = findings
            .pending
            .iter()
            .chain(&findings.mismatches)
            .chain(&findings.lost)
            .chain(&findings.open_operations)
            .chain(&findings.operation_mismatches)
            .next()
            .cloned()
            .unwrap_or_default();
        rounds += 1;
        if rounds % 4 == 0 {
            // A manual sweep, bounded: it waits for a sweep lease held elsewhere.
            let args = vec![
                "reconcile".to_owned(),
                "--database-url".to_owned(),
                database_url.to_owned(),
                provider[0].clone(),
                provider[1].clone(),
                "--settle".to_owned(),
                "0s".to_owned(),
                "--pending-timeout".to_owned(),
                match knobs.dialect.as_str() {
                    dialect @ ("stripe" | "adyen") => pending_timeout(dialect).to_owned(),
                    _ => "1s".to_owned(),
                },
                // As the server's sweeps: open operations are driven after a second.
                "--operation-timeout".to_owned(),
                "1s".to_owned(),
                "--operation-pending-deadline".to_owned(),
                operation_pending_deadline(&knobs.dialect).to_owned(),
            ];
            let (ok, output) = tokio::task::spawn_blocking(move || {
                asiento_bounded(&args, Duration::from_secs(10))
            })
            .await
            .unwrap();
            if !ok {
                println!("chaos: manual reconcile did not finish: {}", output.trim());
            }
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    (findings, waited_for)
}
