//! A server whose provider `stripe` is `asiento psp-sim --dialect stripe` in its own process, and
//! the simulator's control and truth routes there: shared by the Stripe suite and the suites that
//! run against both dialects.

use serde_json::{json, Value};

use super::{free_port, list_at, payment_body, wait_for, Client, Process, Server, TestDatabase};

pub const WEBHOOK_SECRET: &str = "whsec_stripe_test_0123456789";
pub const API_KEY: &str = "sk_test_asiento_stripe";

/// The Stripe dialect on `listen`, delivering its events to the server at `server`.
pub fn start_stripe_sim(listen: &str, server: &str) -> Process {
    let webhook_url = format!("{server}/webhooks/stripe");
    let mut process = Process::spawn(
        &[
            "psp-sim",
            "--dialect",
            "stripe",
            "--listen",
            listen,
            "--seed",
            "5",
            "--fee-bps",
            "290",
            "--hang-ms",
            "1500",
            "--webhook-url",
            &webhook_url,
            "--webhook-secret",
            WEBHOOK_SECRET,
        ],
        &[],
    );
    process.wait_for_line("psp-sim listening on ");
    process
}

/// A server whose provider `stripe` is the Stripe dialect. The server calls its provider only for
/// a payment, so the simulator starts after it, on a port chosen before, knowing where to deliver.
pub struct Rig {
    pub server: Server,
    pub sim_listen: String,
    pub sim: Process,
}

pub fn start_rig(database: &TestDatabase, extra: &[&str]) -> Rig {
    let sim_listen = format!("127.0.0.1:{}", free_port());
    let providers = format!("stripe=stripe:http://{sim_listen}");
    let mut args = vec!["--providers", providers.as_str()];
    args.extend_from_slice(extra);
    let server = Server::start_with_env(
        &database.url,
        &args,
        &[
            ("ASIENTO_PROVIDER_STRIPE_API_KEY", API_KEY),
            ("ASIENTO_PROVIDER_STRIPE_WEBHOOK_SECRET", WEBHOOK_SECRET),
        ],
    );
    let sim = start_stripe_sim(&sim_listen, &server.base);
    Rig {
        server,
        sim_listen,
        sim,
    }
}

pub fn stripe_payment(amount_minor: i64, method: &str) -> Value {
    let mut body = payment_body(amount_minor, method);
    body["provider"] = json!("stripe");
    body
}

/// A control route of the simulator (`/sim/faults`, `/sim/charges/{id}/dispute`, …), and what
/// it answered.
pub async fn sim_control(client: &Client, sim_listen: &str, path: &str, body: Value) -> Value {
    let answer = client
        .http
        .post(format!("http://{sim_listen}{path}"))
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = answer.status();
    let text = answer.text().await.unwrap();
    assert!(status.is_success(), "{text}");
    serde_json::from_str(&text).unwrap_or(Value::Null)
}

pub async fn sim_faults(client: &Client, sim_listen: &str, faults: Value) {
    sim_control(client, sim_listen, "/sim/faults", faults).await;
}

/// A truth list of the simulator (`/sim/charges`, `/sim/operations`).
pub async fn sim_truth(client: &Client, sim_listen: &str, path: &str) -> Vec<Value> {
    list_at(client, &format!("http://{sim_listen}{path}")).await
}

/// The dialect's PaymentIntents, newest first (up to 100): unconfirmed ones included, which hold
/// no charge.
pub async fn payment_intents(client: &Client, sim_listen: &str) -> Vec<Value> {
    let request = client
        .http
        .get(format!("http://{sim_listen}/v1/payment_intents?limit=100"))
        .bearer_auth(API_KEY);
    client.send(request).await.json()["data"]
        .as_array()
        .unwrap()
        .clone()
}

pub async fn sim_charges(client: &Client, sim_listen: &str) -> Vec<Value> {
    sim_truth(client, sim_listen, "/sim/charges").await
}

/// A payment captured at Stripe, with Stripe's fee posted (its webhooks applied); its id.
pub async fn captured(client: &Client, key: &str, amount_minor: i64) -> String {
    let created = client
        .post(
            "/v1/payments",
            key,
            &stripe_payment(amount_minor, "pm_card_visa"),
        )
        .await;
    assert_eq!(
        created.status,
        201,
        "{}",
        String::from_utf8_lossy(&created.body)
    );
    let id = created.json()["id"].as_str().unwrap().to_owned();
    wait_for(client, &id, "Stripe's fee was never posted", |p| {
        p["status"] == "captured" && p["provider_fees"].as_array().is_some_and(|f| f.len() == 1)
    })
    .await;
    id
}

/// The client's tenant's current USD balance of `account` (0 for an account it never used).
pub async fn balance(client: &Client, account: &str) -> i64 {
    client
        .get(&format!("/v1/accounts/{account}/balance?currency=USD"))
        .await
        .json()["balance_minor"]
        .as_i64()
        .unwrap_or(0)
}
