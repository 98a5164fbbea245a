//! The race campaign: one busy customer account, whose policy forbids overdraft, hit at once the
//! way a busy marketplace hits one customer, through the real binary over real HTTP, on
//! PostgreSQL and SQLite. Many clients at once, for the load's duration: payments to it captured
//! at once or later, two captures of one payment at once, two partial refunds of one payment at
//! once, holds on it that the expiry worker voids, others voided or posted (a post racing a void
//! of one hold among them), and transfers out of it, some refused for insufficient funds
//! (`race_campaign/workload.rs`).
//!
//! Why: every one of these is a race on the account's one debit guard or on one payment's
//! stream, and a lost race must be retried inside the server or answered 409, never 500; and a
//! race won on a stale state is money a customer does not have. So afterwards: no answer was a
//! 5xx (every answer is counted and printed; a 500 is a failure shown with its body and the
//! server's log line), each race ended as its rules say, every expiring hold expired, `asiento
//! verify` is clean, and the account's legs replayed in log order never took its posted or its
//! available balance below zero by a command (`race_campaign/ledger_walk.rs`).
//!
//! Knobs (env): `RACE_SECONDS` (8, the load's duration), `RACE_CLIENTS` (12), `RACE_SEED` (random,
//! printed; the clients' choices replay from it, their interleaving does not). This short form
//! runs with `cargo test`; `scripts/chaos` runs a long form (a release build, `RACE_SECONDS=60`
//! per backend, `--rounds N` with a seed each; `--only race` runs this campaign alone).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

mod common;

// The campaign's parts live beside it in `race_campaign/` (a test target's root resolves modules
// from its own directory, so each is named by its path).
#[path = "race_campaign/expiries.rs"]
mod expiries;
#[path = "race_campaign/ledger_walk.rs"]
mod ledger_walk;
#[path = "race_campaign/server_log.rs"]
mod server_log;
#[path = "race_campaign/tally.rs"]
mod tally;
#[path = "race_campaign/workload.rs"]
mod workload;

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use common::{asiento, Backend, Server, TestDatabase};
use serde_json::json;

use tally::{Caller, Tally};
use workload::{Worker, ACCOUNT};

/// How long `asiento verify` may take to pass after the load (projections and the sealer catch
/// up meanwhile).
const VERIFY_WITHIN: Duration = Duration::from_secs(30);
/// Runs of `asiento verify` at most.
const VERIFY_RUNS_MAX: u32 = 60;

struct Knobs {
    seconds: f64,
    clients: u64,
    seed: u64,
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|raw| raw.trim().parse().ok())
        .unwrap_or(default)
}

impl Knobs {
    fn from_env() -> Self {
        let seed = match env_or("RACE_SEED", 0u64) {
            0 => {
                let nanos = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |elapsed| elapsed.subsec_nanos());
                u64::from(nanos ^ std::process::id()) % 1_000_000_000 + 1
            }
            seed => seed,
        };
        Knobs {
            seconds: env_or("RACE_SECONDS", 8.0f64).clamp(1.0, 3_600.0),
            clients: env_or("RACE_CLIENTS", 12u64).clamp(1, 256),
            seed,
        }
    }
}

async fn race_campaign(backend: Backend) {
    let knobs = Knobs::from_env();
    let started = Instant::now();
    println!(
        "race: backend={backend:?} seed={} clients={} seconds={}",
        knobs.seed, knobs.clients, knobs.seconds
    );
    let database = TestDatabase::new(backend).await;
    let server = Server::start(&database.url, &[]);
    let tally = Arc::new(Tally::default());
    let caller = Caller {
        client: server.client(),
        tally: Arc::clone(&tally),
    };
    // The policy the account's name implies, declared: no overdraft.
    caller
        .post(
            "declare account",
            "/v1/accounts",
            "race-declare",
            &json!({"account": ACCOUNT, "currency": "USD", "overdraft": {"policy": "forbidden"}}),
            &[],
        )
        .await;

    let expiring = Arc::new(Mutex::new(Vec::new()));
    let until = Instant::now() + Duration::from_secs_f64(knobs.seconds);
    let clients: Vec<_> = (0..knobs.clients)
        .map(|number| {
            let worker = Worker::new(caller.clone(), knobs.seed, number, Arc::clone(&expiring));
            tokio::spawn(worker.run(until))
        })
        .collect();
    let mut actions = 0u32;
    for client in clients {
        match client.await {
            Ok(sent) => actions += sent,
            Err(error) => tally.fail(format!("a client panicked: {error}")),
        }
    }
    let load = started.elapsed();

    let expiring = expiring
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone();
    let phase = Instant::now();
    let holds = expiries::ended(&caller, &expiring).await;
    let expiries_took = phase.elapsed();
    if tally.count("transfer", 422, "insufficient_funds") == 0
        || tally.count("transfer", 201, "") == 0
    {
        tally.fail(
            "transfers were not both accepted and refused for insufficient funds: the campaign \
             never ran the account dry"
                .to_owned(),
        );
    }
    let phase = Instant::now();
    let walk = ledger_walk::walk(&caller, ACCOUNT, tally.last_position()).await;
    let walk_took = phase.elapsed();
    let phase = Instant::now();
    let verified = verify(&database.url).await;
    let verify_took = phase.elapsed();
    let internal = server_log::internal_errors(&server.process.log_text());

    println!(
        "race: backend={backend:?} seed={} actions={actions} took={:.1}s (load {:.1}s, holds \
         ending {:.1}s, legs {:.1}s, verify {:.1}s)",
        knobs.seed,
        started.elapsed().as_secs_f64(),
        load.as_secs_f64(),
        expiries_took.as_secs_f64(),
        walk_took.as_secs_f64(),
        verify_took.as_secs_f64(),
    );
    println!(
        "race: answers (route, status, code, count):\n{}",
        tally.table()
    );
    println!("race: holds with an expiry: {holds:?}");
    match &walk {
        Ok(walk) => {
            println!(
                "race: {ACCOUNT}: {} entries, posted {} (lowest {}), available {} (lowest {}), \
                 provider facts below zero {}",
                walk.entries,
                walk.posted,
                walk.lowest_posted,
                walk.available,
                walk.lowest_available,
                walk.fact_dips.len()
            );
            for dip in &walk.fact_dips {
                println!("  a provider fact below zero (allowed, flagged): {dip}");
            }
            for wrong in &walk.wrong {
                tally.fail(wrong.clone());
            }
        }
        Err(error) => tally.fail(format!("the legs of {ACCOUNT} could not be read: {error}")),
    }
    match &verified {
        Ok(()) => println!("race: asiento verify: clean"),
        Err(output) => {
            println!("race: asiento verify FAILED:\n{output}");
            tally.fail("asiento verify failed (above)".to_owned());
        }
    }
    if !internal.is_empty() {
        println!("race: the server's internal errors (count, message, one line as logged):");
        for (message, (count, line)) in &internal {
            println!("  {count}× {message}\n     {line}");
        }
    }
    let findings = tally.findings();
    for finding in &findings {
        println!("race: FAILURE: {finding}");
    }
    assert!(
        findings.is_empty(),
        "race campaign on {backend:?} (seed {}): {} failures, listed above",
        knobs.seed,
        findings.len()
    );
}

/// `asiento verify` until it passes, for at most [`VERIFY_WITHIN`]: its last output otherwise.
async fn verify(database_url: &str) -> Result<(), String> {
    let deadline = Instant::now() + VERIFY_WITHIN;
    let mut output = String::new();
    for _ in 0..VERIFY_RUNS_MAX {
        let url = database_url.to_owned();
        let (ok, text) =
            tokio::task::spawn_blocking(move || asiento(&["verify", "--database-url", &url]))
                .await
                .expect("verify ran");
        if ok {
            return Ok(());
        }
        output = text;
        if Instant::now() >= deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    Err(output)
}

asiento_testkit::both_backends!(threads = 2; race_campaign);
