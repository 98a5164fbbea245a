//! The read side through real processes: projector failover under SIGKILL, a rebuild while
//! payments flow and reads continue, read-your-writes with `min_position`, and a snapshot row
//! corrupted by hand found by comparison with the log and repaired by a rebuild.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::{Duration, Instant};

use asiento_eventstore::Database;
use common::{payment_body, Backend, Client, Process, Server, TestDatabase};
use serde_json::json;

/// Every balance snapshot equals the recomputation from the log once the projector caught up.
async fn assert_balances_match_the_log(database_url: &str) {
    let database = Database::connect(database_url).await.unwrap();
    let store = database.event_store();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let mismatches = asiento_balances::verify(&database, store.as_ref())
            .await
            .unwrap();
        let lag = projections_status(database_url)
            .iter()
            .find(|line| line.starts_with("balances "))
            .map(|line| line.split_whitespace().nth(4).unwrap_or("1").to_owned())
            .unwrap_or_default();
        if mismatches.is_empty() && lag == "0" {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "balances differ from the log: {mismatches:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn run_cli(args: &[&str]) -> String {
    let output = std::process::Command::new(common::BIN)
        .args(args)
        .env("ASIENTO_LOG", "warn")
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "asiento {args:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn projections_status(database_url: &str) -> Vec<String> {
    run_cli(&["projections", "status", "--database-url", database_url])
        .lines()
        .map(str::to_owned)
        .collect()
}

/// The PID of the process holding the `balances` lease, from `asiento projections status`.
fn balances_owner_pid(database_url: &str) -> Option<u32> {
    let status = projections_status(database_url);
    let line = status.iter().find(|line| line.starts_with("balances "))?;
    if line.contains("lease expired") {
        return None;
    }
    // owner = host:projector:PID:suffix
    let owner = line.split_whitespace().nth(6)?;
    owner.split(':').nth(2)?.parse().ok()
}

async fn pay(client: &Client, key: &str, customer: &str, amount: i64) -> i64 {
    let mut body = payment_body(amount, "pm_card_ok");
    body["customer"] = json!(customer);
    let answer = client.post("/v1/payments", key, &body).await;
    assert_eq!(
        answer.status,
        201,
        "{}",
        String::from_utf8_lossy(&answer.body)
    );
    answer.json()["position"].as_i64().unwrap()
}

/// Two projector processes on one PostgreSQL: one is active; SIGKILL it while payments flow and
/// the other takes over within the lease time; nothing is applied twice or skipped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn projector_failover_after_sigkill() {
    let database = TestDatabase::new(Backend::Postgres).await;
    let server = Server::start(&database.url, &["--role", "api"]);
    let client = server.client();
    let spawn_projector = || {
        let mut process = Process::spawn(
            &[
                "serve",
                "--role",
                "projector",
                "--listen",
                "127.0.0.1:0",
                "--database-url",
                &database.url,
            ],
            &[],
        );
        process.wait_for_line("projectors running as");
        process
    };
    let mut first = spawn_projector();
    let mut second = spawn_projector();

    for index in 0..20 {
        pay(
            &client,
            &format!("before-{index}"),
            &format!("c{}", index % 3),
            1_000 + index,
        )
        .await;
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    let owner = loop {
        if let Some(pid) = balances_owner_pid(&database.url) {
            break pid;
        }
        assert!(Instant::now() < deadline, "no projector took the lease");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let (active, standby) = if owner == first.child.id() {
        (&mut first, &mut second)
    } else {
        assert_eq!(owner, second.child.id(), "the owner is one of ours");
        (&mut second, &mut first)
    };

    // Kill the active one while payments keep coming.
    let load = {
        let client = client.clone();
        tokio::spawn(async move {
            for index in 0..40 {
                pay(
                    &client,
                    &format!("during-{index}"),
                    &format!("c{}", index % 3),
                    500 + index,
                )
                .await;
            }
        })
    };
    tokio::time::sleep(Duration::from_millis(150)).await;
    let killed_at = Instant::now();
    active.kill();
    load.await.unwrap();

    let standby_pid = standby.child.id();
    let deadline = Instant::now() + Duration::from_secs(30);
    while balances_owner_pid(&database.url) != Some(standby_pid) {
        assert!(Instant::now() < deadline, "the standby never took over");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The runner's lease is 10 s; allow for heart-beat and polling on a loaded machine.
    assert!(
        killed_at.elapsed() < Duration::from_secs(25),
        "took over in {:?}",
        killed_at.elapsed()
    );
    assert_balances_match_the_log(&database.url).await;
}

/// A rebuild while payments flow: reads never fail, and the result equals the live balances and
/// the log.
async fn rebuild_while_payments_flow(backend: Backend) {
    let database = TestDatabase::new(backend).await;
    let server = Server::start(&database.url, &[]);
    let client = server.client();
    for index in 0..30 {
        pay(&client, &format!("seed-{index}"), "42", 100 + index).await;
    }
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let client = client.clone();
        let stop = stop.clone();
        tokio::spawn(async move {
            let mut index = 0;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                pay(&client, &format!("flow-{index}"), "42", 50).await;
                index += 1;
            }
            index
        })
    };
    let reader = {
        let client = client.clone();
        let stop = stop.clone();
        tokio::spawn(async move {
            let mut reads = 0;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                let balance = client
                    .get("/v1/accounts/customer:42:available/balance?currency=USD")
                    .await;
                assert_eq!(
                    balance.status,
                    200,
                    "a read failed during the rebuild: {}",
                    String::from_utf8_lossy(&balance.body)
                );
                let list = client.get("/v1/payments?limit=5").await;
                assert_eq!(list.status, 200, "a list failed during the rebuild");
                reads += 1;
            }
            reads
        })
    };
    let output = tokio::task::spawn_blocking({
        let url = database.url.clone();
        move || run_cli(&["projections", "rebuild", "balances", "--database-url", &url])
    })
    .await
    .unwrap();
    assert!(output.contains("rebuilt balances"), "{output}");
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let payments = writer.await.unwrap();
    let reads = reader.await.unwrap();
    assert!(payments > 0 && reads > 0, "the rebuild ran beside traffic");
    assert!(projections_status(&database.url)
        .iter()
        .any(|line| line.starts_with("balances ") && line.split_whitespace().nth(1) == Some("2")));
    assert_balances_match_the_log(&database.url).await;
}

/// A balance read right after a payment, with its position as `min_position`, includes it.
async fn read_your_writes(backend: Backend) {
    let database = TestDatabase::new(backend).await;
    let server = Server::start(&database.url, &[]);
    let client = server.client();
    let (mut expected, mut last) = (0, 0);
    for index in 0..5 {
        let position = pay(&client, &format!("ryw-{index}"), "9", 10_000).await;
        last = position;
        expected += 9_700;
        let balance = client
            .get(&format!(
                "/v1/accounts/customer:9:available/balance?currency=USD&min_position={position}"
            ))
            .await;
        assert_eq!(balance.status, 200);
        assert_eq!(balance.json()["balance_minor"], expected);
        assert!(balance.json()["as_of_position"].as_i64().unwrap() >= position);
        let listed = client
            .get(&format!("/v1/payments?customer=9&min_position={position}"))
            .await;
        assert_eq!(listed.json()["data"].as_array().unwrap().len(), index + 1);
    }
    // Legs come from their own read model (ledger_entries): read-your-writes again.
    let entries = client
        .get(&format!(
            "/v1/accounts/customer:9:available/entries?currency=USD&limit=2&min_position={last}"
        ))
        .await;
    let page = entries.json();
    assert_eq!(page["data"].as_array().unwrap().len(), 2);
    let after = page["next_after"].as_i64().unwrap();
    let rest = client
        .get(&format!(
            "/v1/accounts/customer:9:available/entries?currency=USD&after={after}"
        ))
        .await
        .json();
    assert_eq!(rest["data"].as_array().unwrap().len(), 3);
    let entry_id = page["data"][0]["entry_id"].as_str().unwrap();
    let entry = client.get(&format!("/v1/journal/{entry_id}")).await;
    assert_eq!(entry.status, 200);
    let sum: i64 = entry.json()["legs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|leg| leg["amount_minor"].as_i64().unwrap())
        .sum();
    assert_eq!(sum, 0, "a journal entry sums to zero");
    let hidden = client
        .with_key("sk_test_beta_0123456789abcdef")
        .get(&format!("/v1/journal/{entry_id}"))
        .await;
    assert_eq!(hidden.status, 404);
}

/// `min_position=0` names no event ("nothing written yet"): every read answers at once, on an
/// empty log and after writes, while a position the log never had stays a 400.
async fn min_position_zero_is_satisfied_at_once(backend: Backend) {
    let database = TestDatabase::new(backend).await;
    let server = Server::start(&database.url, &[]);
    let client = server.client();
    let reads = [
        "/v1/accounts/customer:3:available/balance?currency=USD&min_position=0",
        "/v1/accounts/customer:3:available/entries?currency=USD&min_position=0",
        "/v1/payments?customer=3&min_position=0",
    ];
    for round in ["empty log", "after a payment"] {
        for path in reads {
            let started = Instant::now();
            let answer = client.get(path).await;
            assert_eq!(
                answer.status,
                200,
                "{round}: {path}: {}",
                String::from_utf8_lossy(&answer.body)
            );
            assert!(
                started.elapsed() < Duration::from_secs(2),
                "{round}: {path} waited {:?}",
                started.elapsed()
            );
        }
        // A journal entry read with 0 is not refused for its position: it looks the entry up.
        let entry = client
            .get("/v1/journal/je_00000000000000000000000000?min_position=0")
            .await;
        assert_eq!(
            (entry.status, entry.code().as_str()),
            (404, "entry_not_found")
        );
        pay(&client, "zero-1", "3", 1_000).await;
    }
    let unknown = client
        .get("/v1/accounts/customer:3:available/balance?currency=USD&min_position=999999999")
        .await;
    assert_eq!(
        (unknown.status, unknown.code().as_str()),
        (400, "unknown_position")
    );
}

/// A snapshot row corrupted by hand is found by comparing with the log and repaired by a rebuild.
async fn corrupted_snapshot_is_found_and_repaired(backend: Backend) {
    let database = TestDatabase::new(backend).await;
    let server = Server::start(&database.url, &[]);
    let client = server.client();
    let mut last = 0;
    for index in 0..3 {
        last = pay(&client, &format!("c-{index}"), "5", 2_000).await;
    }
    // Read-your-writes: the projection includes the last payment before it is corrupted.
    let seen = client
        .get(&format!(
            "/v1/accounts/customer:5:available/balance?currency=USD&min_position={last}"
        ))
        .await;
    assert_eq!(seen.json()["balance_minor"], 3 * 1_940);
    assert_balances_match_the_log(&database.url).await;
    let db = Database::connect(&database.url).await.unwrap();
    let corrupt = common::shift_balance_sql(backend, "customer:5:available", 1);
    let changed = match &db {
        Database::Postgres(pool) => sqlx::query(&corrupt)
            .execute(pool)
            .await
            .unwrap()
            .rows_affected(),
        Database::Sqlite(pool) => sqlx::query(&corrupt)
            .execute(pool)
            .await
            .unwrap()
            .rows_affected(),
    };
    assert_eq!(changed, 1);
    let mismatches = asiento_balances::verify(&db, db.event_store().as_ref())
        .await
        .unwrap();
    assert_eq!(mismatches.len(), 1, "{mismatches:?}");
    assert_eq!(
        mismatches[0].snapshot_minor.minor() - mismatches[0].recomputed_minor.minor(),
        1
    );
    run_cli(&[
        "projections",
        "rebuild",
        "balances",
        "--database-url",
        &database.url,
    ]);
    assert_balances_match_the_log(&database.url).await;
    let balance = client
        .get(&format!(
            "/v1/accounts/customer:5:available/balance?currency=USD&min_position={last}"
        ))
        .await;
    assert_eq!(balance.json()["balance_minor"], 3 * 1_940);
}

asiento_testkit::both_backends!(threads = 2;
    rebuild_while_payments_flow,
    read_your_writes,
    min_position_zero_is_satisfied_at_once,
    corrupted_snapshot_is_found_and_repaired,
);
