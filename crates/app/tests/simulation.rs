//! A deterministic simulation of the payment flow, in the spirit of TigerBeetle's VOPR.
//!
//! From a seed, one pseudo-random stream drives the real `app` layer (`PaymentFlow`,
//! `LedgerFlow`, `Reconciler`, `Sealer`) on a SQLite file, against an in-memory provider and a
//! manual clock: which request comes next (a new payment, a retry with the same key and body, a
//! capture, a refund, a transfer), which provider fact a webhook delivers (the latest or a stale
//! one, repeated, out of order), what the customer and the provider do on their side, how far the
//! clock moves, when the reconciler sweeps, and how every provider write goes wrong.
//!
//! **Crash points.** A provider write (charge, capture, refund) can answer normally; fail before
//! doing anything (`Unknown`, no effect); lose its answer (the effect happens, the caller gets
//! `Unknown`); or crash the process before or after the effect. Those are the await points between
//! the steps of every flow (claim + intent committed → provider call → finalize committed), so a
//! crash there abandons the work exactly where a real process death would. A crash is a
//! cancellation: the provider raises a `Notify` and never answers; the operation runs under
//! `tokio::select!` against that signal, so the future is dropped at that await and nothing after
//! it runs. The "process" restarts: a new pool, new flows and a new reconciler on the same SQLite
//! file (only what committed survives), and the client retries with its key once the idempotency
//! lease has run out. This is deterministic because the crash is decided by the seeded stream at a
//! named point, not by counting polls: the number of polls of a sqlx future depends on its worker
//! thread, so dropping a future after N polls would not replay.
//!
//! **The provider's profile.** Each seed draws what kind of provider it plays against
//! (`Profile`): lookups by key and by id or not (`Capabilities`; a lookup the profile lacks
//! answers `Unsupported`), synchronous or asynchronous captures and refunds (answered `Pending`
//! and decided later, sometimes failed), late refund reversals (a succeeded refund fails and the
//! charge's refunded total goes back down), a key lifetime (a write under an older key is a new
//! one), whether a dispute's webhooks get through, whether an authorisation can be cancelled by
//! our reference (Adyen's technical cancel, asked for a payment never answered once it expired),
//! and how long past its expiry the report must be compared before such a charge is concluded
//! absent. Each `operation.updated` the provider
//! sends is delivered as it happens or dropped; a disputed charge may go dark (none of its
//! webhooks arrives again, so the sweep's lookups and the settlement report, which carries the
//! dispute, must tell). A refund on a disputed charge is refused (`charge_disputed`).
//!
//! **Checked after every step:** the real invariant checker (`Checker::check_once`: zero-sum
//! entries, stream versions, one capture posting per captured payment, idempotency leases, the
//! events table's immutability, seals), and simulation truths: the provider holds at most one
//! charge per payment; an idempotency key that got a 2xx names one payment forever; a replay is
//! byte for byte the first answer; the provider holds at most one capture or refund per key. At
//! the end of a seed, time runs on past the operation timeouts, the key lifetimes and the pending
//! deadline (the reconciler sweeping): every capture and refund must then be closed, unless the
//! profile makes it unresolvable (pending at a provider without lookups, or requested past its
//! key's lifetime), and then it must have its `operation_unresolved` exception. Every final state
//! is delivered (a dark charge's never); the ledger must then agree with the provider about every
//! charge (captured, refunded net of reversals, the provider's fees, the dispute and its outcome)
//! and every operation.
//!
//! Run: `cargo test -p asiento-app --test simulation` (`SIMULATION_SEEDS`, default 1000,
//! `SIMULATION_SEED_START`, `SIMULATION_STEPS`, default 20). A failure prints its seed, step and
//! trace; `SIMULATION_SEED=<n> cargo test -p asiento-app --test simulation` replays it exactly
//! (the trace is printed then, too). `scripts/simulate` runs many more seeds in release.
//!
//! **Files.** The simulation's parts live beside this file in `simulation/`: `knobs.rs` (the
//! world's fixed numbers, the provider's `Profile` drawn per seed, the `Fault` drawn per write),
//! `provider.rs` (the simulated provider's memory and its own behaviour: keys, asynchronous
//! decisions, reversals, the armed fault, what people do at the provider without us),
//! `provider_api.rs` (the `Provider` trait as the app calls it), `client.rs` (requests, their keys
//! and what the client learnt), `world.rs` (the process, the clock, attempts under faults and
//! crashes, restarts, time passing with sweeps, webhook delivery), `steps.rs` (what happens next,
//! drawn step by step), `checks.rs` (what must hold after every step and at the end),
//! `converge.rs` (the end of a seed) and `report.rs` (what a seed did, for the summary line). This
//! file runs the seeds.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

// A test target's root resolves modules from its own directory, so each part is named by its path.
#[path = "simulation/checks.rs"]
mod checks;
#[path = "simulation/client.rs"]
mod client;
#[path = "simulation/converge.rs"]
mod converge;
#[path = "simulation/knobs.rs"]
mod knobs;
#[path = "simulation/provider.rs"]
mod provider;
#[path = "simulation/provider_api.rs"]
mod provider_api;
#[path = "simulation/report.rs"]
mod report;
#[path = "simulation/steps.rs"]
mod steps;
#[path = "simulation/world.rs"]
mod world;

use report::SeedStats;
use world::Sim;

/// Seeds the bounded run checks unless `SIMULATION_SEEDS` says otherwise.
const SEEDS_DEFAULT: u64 = 1_000;
/// Steps per seed unless `SIMULATION_STEPS` says otherwise.
const STEPS_DEFAULT: u32 = 20;
/// Seeds run at once (each alone in its task, on its own file, so each still replays): a seed
/// mostly waits on SQLite, so a few at once use the cores.
const JOBS_DEFAULT: u64 = 8;

async fn run_seed(seed: u64, steps: u32, verbose: bool) -> SeedStats {
    let mut sim = Sim::new(seed).await;
    let profile = sim.provider.profile();
    sim.note(format!("profile {profile:?}"));
    for step in 1..=steps {
        sim.step = step;
        sim.step_once().await;
        sim.check().await;
    }
    let unresolved = sim.converge().await;
    if verbose {
        println!("seed {seed} passed:\n{}", sim.trace);
    }
    SeedStats::of(&sim, profile, unresolved).await
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().map(|raw| {
        raw.trim()
            .parse()
            .unwrap_or_else(|_| panic!("{name} must be a number, not {raw:?}"))
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn simulation_seeds_hold_every_invariant() {
    let steps = env_u64("SIMULATION_STEPS").map_or(STEPS_DEFAULT, |steps| steps as u32);
    if let Some(seed) = env_u64("SIMULATION_SEED") {
        run_seed(seed, steps, true).await;
        return;
    }
    let start = env_u64("SIMULATION_SEED_START").unwrap_or(0);
    let count = env_u64("SIMULATION_SEEDS").unwrap_or(SEEDS_DEFAULT);
    let jobs = env_u64("SIMULATION_JOBS").unwrap_or(JOBS_DEFAULT).max(1) as usize;
    let began = std::time::Instant::now();
    let mut total = SeedStats::default();
    let mut seeds = start..start + count;
    let mut running = tokio::task::JoinSet::new();
    loop {
        while running.len() < jobs {
            let Some(seed) = seeds.next() else { break };
            running.spawn(async move { (seed, run_seed(seed, steps, false).await) });
        }
        let Some(joined) = running.join_next().await else {
            break;
        };
        match joined {
            Ok((_seed, stats)) => total.add(&stats),
            // The seed's panic carries its number, step and trace: pass it on as it is.
            Err(error) if error.is_panic() => std::panic::resume_unwind(error.into_panic()),
            Err(error) => panic!("a seed's task failed: {error}"),
        }
    }
    total.print_total(count, start, steps, began);
}
