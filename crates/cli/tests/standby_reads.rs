//! Reads from a standby, on clusters the test makes (`common::cluster`): a primary and a hot
//! standby streaming its WAL, `asiento serve --read-database-url` on both. A read with
//! `min_position` is answered by the standby once it has the write; with the standby's replay
//! paused (`pg_wal_replay_pause()`) the same read falls back to the primary within its bound and
//! never answers stale, while a read without a position answers as fresh as the standby, and
//! `/metrics` shows the standby's lag. A payment read by id comes from the primary's log: never
//! stale. With the standby gone, reads still answer, from the primary.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::{Duration, Instant};

use common::cluster::Cluster;
use common::{payment_body, Client, Server};
use serde_json::Value;

/// The server's `--read-standby-wait` here.
const STANDBY_WAIT: Duration = Duration::from_millis(500);

async fn reads(client: &Client, outcome: &str) -> f64 {
    client
        .metric_labelled(
            "asiento_standby_reads_total",
            &format!("outcome=\"{outcome}\""),
        )
        .await
}

/// A new successful payment's id and position.
async fn pay(client: &Client, key: &str) -> (String, i64) {
    let answer = client
        .post("/v1/payments", key, &payment_body(1_000, "pm_card_ok"))
        .await;
    assert_eq!(
        answer.status,
        201,
        "{}",
        String::from_utf8_lossy(&answer.body)
    );
    let body = answer.json();
    (
        body["id"].as_str().unwrap().to_owned(),
        body["position"].as_i64().unwrap(),
    )
}

/// The ids on the first page of the payments list for `query`.
async fn listed(client: &Client, query: &str) -> Vec<String> {
    let answer = client.get(&format!("/v1/payments?limit=100{query}")).await;
    assert_eq!(
        answer.status,
        200,
        "{}",
        String::from_utf8_lossy(&answer.body)
    );
    answer.json()["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|payment| payment["id"].as_str().unwrap().to_owned())
        .collect()
}

/// The client account's balance with `min_position`.
async fn balance(client: &Client, position: i64) -> Value {
    let answer = client
        .get(&format!(
            "/v1/accounts/customer:42:available/balance?currency=USD&min_position={position}"
        ))
        .await;
    assert_eq!(
        answer.status,
        200,
        "{}",
        String::from_utf8_lossy(&answer.body)
    );
    answer.json()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_answers_reads_that_it_has_and_the_primary_the_rest() {
    let primary = Cluster::primary();
    let standby = primary.standby("reads");
    let wait = format!("{}ms", STANDBY_WAIT.as_millis());
    let server = Server::start(
        &primary.url(),
        &[
            "--read-database-url",
            &standby.url(),
            "--read-standby-wait",
            &wait,
        ],
    );
    let client = server.client();

    // A write, then reads that name its position, once the standby has it (so that a loaded
    // machine's projector or replay cannot make them wait past the standby's wait): the standby
    // answers.
    let (first, position) = pay(&client, "standby-1").await;
    let covered = format!(
        "SELECT (p.checkpoint_xact, p.checkpoint_position) >= (e.xact, e.position) \
         FROM projections p, events e WHERE p.name = 'payments' AND e.position = {position}"
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    while standby.psql(common::cluster::DATABASE, &covered) != "t" {
        assert!(
            Instant::now() < deadline,
            "the standby never had the payment"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(listed(&client, &format!("&min_position={position}"))
        .await
        .contains(&first));
    let before = balance(&client, position).await;
    assert!(before["as_of_position"].as_i64().unwrap() >= position);
    assert!(
        reads(&client, "served").await >= 2.0,
        "the standby served no read"
    );
    assert_eq!(reads(&client, "lagging").await, 0.0);

    // The standby stops applying WAL: a write it does not have is read from the primary, within
    // the standby's wait plus the primary's, and is there.
    standby.psql(common::cluster::DATABASE, "SELECT pg_wal_replay_pause()");
    let deadline = Instant::now() + Duration::from_secs(30);
    while standby.psql(
        common::cluster::DATABASE,
        "SELECT pg_get_wal_replay_pause_state()",
    ) != "paused"
    {
        assert!(
            Instant::now() < deadline,
            "the standby's replay did not pause"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (second, position) = pay(&client, "standby-2").await;
    let asked = Instant::now();
    let fresh = listed(&client, &format!("&min_position={position}")).await;
    assert!(
        fresh.contains(&second),
        "a read with min_position answered stale"
    );
    assert!(
        asked.elapsed() < STANDBY_WAIT + Duration::from_secs(5),
        "the read took {:?}",
        asked.elapsed()
    );
    assert!(reads(&client, "lagging").await >= 1.0);
    let after = balance(&client, position).await;
    assert!(after["as_of_position"].as_i64().unwrap() >= position);
    assert_ne!(after["balance_minor"], before["balance_minor"], "{after}");
    assert!(reads(&client, "lagging").await >= 2.0);

    // Without a position, a read is as fresh as its standby: the paused one has not seen the
    // second payment.
    let served = reads(&client, "served").await;
    let stale = listed(&client, "").await;
    assert!(
        stale.contains(&first) && !stale.contains(&second),
        "{stale:?}"
    );
    assert!(reads(&client, "served").await > served);
    // A journal entry looked up by id that the paused standby does not have is looked up on the
    // primary (once the primary's projector has it).
    let entry = client.entries_of(&second).await[0].clone();
    let entry_id = entry["id"]
        .as_str()
        .or(entry["entry_id"].as_str())
        .unwrap_or_else(|| panic!("no id in {entry}"))
        .to_owned();
    let deadline = Instant::now() + Duration::from_secs(30);
    while client.get(&format!("/v1/journal/{entry_id}")).await.status != 200 {
        assert!(
            Instant::now() < deadline,
            "journal entry {entry_id} not found"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(reads(&client, "missing").await >= 1.0);
    // A payment read by id comes from the primary's log: never stale.
    let by_id = client.get(&format!("/v1/payments/{second}")).await;
    assert_eq!(by_id.status, 200);
    assert_eq!(by_id.json()["status"], "captured");

    // The standby's lag shows in positions and seconds.
    let lag_label = format!("standby=\"127.0.0.1:{}\"", standby.port);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let positions = client
            .metric_labelled("asiento_standby_lag_positions", &lag_label)
            .await;
        let seconds = client
            .metric_labelled("asiento_standby_lag_seconds", &lag_label)
            .await;
        if positions > 0.0 && seconds > 0.0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no lag shown: {positions} positions, {seconds} s"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // Replay resumes: the standby catches up and answers the position-free read with the second
    // payment, and its lag goes back to 0.
    standby.psql(common::cluster::DATABASE, "SELECT pg_wal_replay_resume()");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !listed(&client, "").await.contains(&second) {
        assert!(Instant::now() < deadline, "the standby did not catch up");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while client
        .metric_labelled("asiento_standby_lag_positions", &lag_label)
        .await
        > 0.0
    {
        assert!(Instant::now() < deadline, "the lag stayed above 0");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // The standby goes away: reads still answer, from the primary.
    drop(standby);
    let (third, position) = pay(&client, "standby-3").await;
    assert!(listed(&client, &format!("&min_position={position}"))
        .await
        .contains(&third));
    assert!(listed(&client, "").await.contains(&third));
    assert!(reads(&client, "failed").await >= 2.0);
}

/// `asiento bench reads`, tiny: it reads through both servers and the standby answers the
/// standby server's reads.
#[test]
fn bench_reads_measures_the_standby_against_the_primary() {
    let primary = Cluster::primary();
    let standby = primary.standby("bench");
    let output = std::process::Command::new(common::BIN)
        .args([
            "bench",
            "reads",
            "--database-url",
            &primary.url(),
            "--read-database-url",
            &standby.url(),
            "--clients",
            "3",
            "--payments",
            "30",
            "--phase",
            "500ms",
            "--rounds",
            "2",
        ])
        .env_remove("ASIENTO_BENCH_DATABASE_URL")
        .output()
        .expect("running asiento bench reads");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "stdout:\n{stdout}\nstderr:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    for side in [
        "READS-primary round 2",
        "READS-standby round 2",
        "READS ratio = ",
    ] {
        assert!(stdout.contains(side), "no {side:?} in\n{stdout}");
    }
    assert!(!stdout.contains("the standby answered 0 reads"), "{stdout}");
}
