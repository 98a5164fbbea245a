//! `asiento serve` as a newcomer meets it: the curl example it prints creates a captured payment;
//! several providers run side by side, each with its own base URL and fee schedule; the
//! operational routes answer without a key.
#![allow(clippy::unwrap_used)]

mod common;

use common::{payment_body, Backend, Process, Server, Simulator, TestDatabase};
use serde_json::json;

/// The curl command `serve` prints on a fresh database (with the demo key it just created) creates
/// a captured payment, exactly as the README promises.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_printed_curl_example_creates_a_captured_payment() {
    let database = TestDatabase::new(Backend::Sqlite).await;
    let mut server = Process::spawn(
        &[
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--database-url",
            &database.url,
        ],
        &[],
    );
    let first = server.wait_for_line("try: curl");
    let second = server.wait_for_line("-H 'Idempotency-Key");
    let third = server.wait_for_line("-d '{");
    let command = format!(
        "{}\n{}\n{}",
        first.trim_start_matches("try: "),
        second,
        third
    );
    assert!(
        command.contains("sk_demo_"),
        "the demo key is in the example: {command}"
    );
    let output = tokio::task::spawn_blocking(move || {
        std::process::Command::new("sh")
            .arg("-c")
            .arg(&command)
            .output()
    })
    .await
    .unwrap()
    .expect("sh and curl are on the machine");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let payment: serde_json::Value = serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|_| panic!("not JSON: {}", String::from_utf8_lossy(&output.stdout)));
    assert_eq!(payment["status"], "captured");
    assert_eq!(payment["fee_minor"], 300);
}

/// Two simulators as two providers: a payment goes to the provider it names, with that
/// provider's fees, and to no other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_providers_side_by_side() {
    let database = TestDatabase::new(Backend::Postgres).await;
    let sim = Simulator::start(&[]);
    let acme = Simulator::start(&[]);
    let providers = format!("sim={},acme={}", sim.base, acme.base);
    let server = Server::start(
        &database.url,
        &["--providers", &providers, "--fees", "sim:300,acme:250+30"],
    );
    let client = server.client();

    let mut body = payment_body(10_000, "pm_card_ok");
    body["provider"] = json!("acme");
    let via_acme = client.post("/v1/payments", "a-1", &body).await.json();
    assert_eq!(
        (
            via_acme["provider"].as_str(),
            via_acme["fee_minor"].as_i64()
        ),
        (Some("acme"), Some(280))
    );
    let via_sim = client
        .post("/v1/payments", "s-1", &payment_body(10_000, "pm_card_ok"))
        .await
        .json();
    assert_eq!(
        (via_sim["provider"].as_str(), via_sim["fee_minor"].as_i64()),
        (Some("sim"), Some(300))
    );

    let references = |charges: Vec<serde_json::Value>| -> Vec<String> {
        charges
            .iter()
            .map(|charge| charge["reference"].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(
        references(acme.charges().await),
        vec![via_acme["id"].as_str().unwrap().to_owned()]
    );
    assert_eq!(
        references(sim.charges().await),
        vec![via_sim["id"].as_str().unwrap().to_owned()]
    );

    let entries = client.entries_of(via_acme["id"].as_str().unwrap()).await;
    let clearing: Vec<_> = entries[0]["legs"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|leg| leg["account"] == "psp:acme:clearing")
        .collect();
    assert_eq!(clearing.len(), 1);
    assert_eq!(clearing[0]["amount_minor"], -10_000);

    body["provider"] = json!("nope");
    let unknown = client.post("/v1/payments", "n-1", &body).await;
    assert_eq!(
        (unknown.status, unknown.code().as_str()),
        (400, "unknown_provider")
    );
}

/// Health, readiness, metrics and the OpenAPI document need no key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operational_routes_need_no_key() {
    let database = TestDatabase::new(Backend::Sqlite).await;
    let server = Server::start(&database.url, &[]);
    let anonymous = reqwest::Client::new();
    for (path, needle) in [
        ("/healthz", "ok"),
        ("/readyz", "ready"),
        ("/metrics", ""),
        ("/openapi.json", "\"openapi\":\"3.1"),
    ] {
        let response = anonymous
            .get(format!("{}{path}", server.base))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200, "{path}");
        let text = response.text().await.unwrap();
        assert!(text.contains(needle), "{path}: {text}");
    }
    // A payment makes the flow's metrics appear.
    let client = server.client();
    client
        .post("/v1/payments", "m-1", &payment_body(100, "pm_card_ok"))
        .await;
    let metrics = anonymous
        .get(format!("{}/metrics", server.base))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(metrics.contains("asiento_"), "{metrics}");
}
