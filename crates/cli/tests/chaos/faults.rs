//! The provider's faults, set on the simulator through its control route: errors, timeouts,
//! latency, duplicated, reordered and dropped webhooks and refunds that fail after succeeding on
//! every run; for half the seeds each, captures and refunds decided later by webhook and 409s
//! while a key's first request runs; once during the load, a second without the provider at all
//! (connections refused). Each seeded choice is printed, so the run's line tells which faults it
//! had. At the end of the load the faults are switched off, so that what follows converges.

use std::time::Duration;

use serde_json::json;

use crate::http::sim_call;
use asiento_testkit::Rng;

/// Sets the run's faults on the simulator at `sim`, the seeded ones drawn from `seed`.
pub async fn switch_on(http: &reqwest::Client, sim: &str, seed: u64) {
    // Half the seeds decide captures and refunds later (by webhook, or the sweep's lookup); half
    // answer 409 while a key's first request runs.
    let mut fault_rng = Rng::new(seed.wrapping_mul(17).wrapping_add(3));
    let async_modifications = fault_rng.unit() < 0.5;
    let key_in_use_conflict = fault_rng.unit() < 0.5;
    println!(
        "chaos: faults: async_modifications={async_modifications} \
         key_in_use_conflict={key_in_use_conflict} refund_reversal_rate=0.1 unreachable_ms=1000"
    );
    sim_call(
        http,
        reqwest::Method::POST,
        &format!("{sim}/sim/faults"),
        Some(json!({
            "error_rate": 0.1,
            "timeout_rate": 0.05,
            "latency_ms": 20,
            "webhook_duplicate_rate": 0.3,
            "webhook_reorder": true,
            "webhook_drop_rate": 0.2,
            "async_modifications": async_modifications,
            "async_delay_ms": 300,
            "key_in_use_conflict": key_in_use_conflict,
            "refund_reversal_rate": 0.1,
            "refund_reversal_delay_ms": 500,
        })),
    )
    .await;
}

/// Once during the load, the provider is unreachable for a second (connections refused): at a
/// seeded moment between a fifth and four fifths of the load's `seconds`.
pub fn unreachable_later(
    http: &reqwest::Client,
    sim: &str,
    seed: u64,
    seconds: f64,
) -> tokio::task::JoinHandle<()> {
    let mut unreachable_rng = Rng::new(seed.wrapping_mul(13).wrapping_add(5));
    let unreachable_at = seconds * (0.2 + 0.6 * unreachable_rng.unit());
    let http = http.clone();
    let url = format!("{sim}/sim/faults");
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs_f64(unreachable_at)).await;
        // The answer may be lost as the listener closes; the period runs either way.
        let _ = http
            .post(&url)
            .json(&json!({"unreachable_ms": 1_000}))
            .send()
            .await;
    })
}

/// Faults off: the provider answers every request as it should from now on.
pub async fn switch_off(http: &reqwest::Client, sim: &str) {
    sim_call(
        http,
        reqwest::Method::DELETE,
        &format!("{sim}/sim/faults"),
        None,
    )
    .await;
}
