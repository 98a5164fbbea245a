//! `POST /v1/payments/{id}/cancel` through the real binary, on both backends, against the
//! in-process simulator, the Stripe dialect (PaymentIntent cancel, answered at once) and the Adyen
//! dialect (`/cancels` received, decided by its CANCELLATION notification):
//! - an authorized payment canceled: `canceled`, its hold released by its own entry, one cancel at
//!   the provider, `payment.canceled` in the feed, the key's replay the same answer, and nothing
//!   more to cancel or capture;
//! - a cancel sent while the provider is unreachable: 202, then canceled by the reconciler alone,
//!   with one cancel at the provider and no client retry;
//! - captures racing cancels: each payment ends captured or canceled as the provider decided (its
//!   own record agrees), never both, never a 5xx.
//!
//! `asiento verify` holds after each.
#![allow(clippy::unwrap_used)]

mod common;

use common::rig::{Psp, Rig};
use common::{merchant_events_of, verify, wait_for, Backend, Client, TestDatabase};
use serde_json::{json, Value};

/// Where an authorization holds its amount for the customer.
const HOLD: &str = "pending_credits:customer:42:available";

/// Payments whose capture and cancel race.
const RACES: usize = 6;

async fn start_rig(database: &TestDatabase, psp: Psp) -> Rig {
    let extra = ["--reconcile-interval", "300ms", "--operation-timeout", "0s"];
    Rig::start(database, psp, &extra).await
}

/// A manual payment of `amount` through the rig's provider, authorized.
async fn authorized(rig: &Rig, key: &str, amount: i64) -> String {
    let mut body = rig.payment(amount, "pm_card_ok");
    body["capture"] = json!("manual");
    let created = rig.client().post("/v1/payments", key, &body).await;
    assert_eq!(
        created.status,
        201,
        "{}",
        String::from_utf8_lossy(&created.body)
    );
    let created = created.json();
    assert_eq!(created["status"], "authorized", "{created}");
    created["id"].as_str().unwrap().to_owned()
}

async fn cancel(client: &Client, id: &str, key: &str) -> common::Answer {
    client
        .post(&format!("/v1/payments/{id}/cancel"), key, &json!({}))
        .await
}

/// What the payment's entries moved on `account`, in sum, and how many entries there are.
async fn moved(client: &Client, id: &str, account: &str) -> (i64, usize) {
    let entries = common::without_provider_fees(client.entries_of(id).await);
    let sum = entries
        .iter()
        .flat_map(|entry| entry["legs"].as_array().unwrap())
        .filter(|leg| leg["account"] == account)
        .map(|leg| leg["amount_minor"].as_i64().unwrap())
        .sum();
    (sum, entries.len())
}

/// The canceled end: nothing captured, the hold and its release the only entries, one cancel
/// of ours at the provider, every operation of ours closed.
async fn assert_canceled(rig: &Rig, id: &str) {
    let client = rig.client();
    let payment = wait_for(&client, id, "never canceled", |p| p["status"] == "canceled").await;
    assert_eq!(payment["captured_minor"], 0, "{payment}");
    let cancels: Vec<&Value> = payment["operations"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|op| op["kind"] == "cancel")
        .collect();
    assert_eq!(cancels.len(), 1, "{payment}");
    assert_eq!(cancels[0]["state"], "succeeded", "{payment}");
    let (held, entries) = moved(&client, id, HOLD).await;
    assert_eq!((held, entries), (0, 2), "the hold and its release");
    assert_eq!(rig.operations_of(id, "cancel").await.len(), 1);
    assert_eq!(rig.charge_of(id).await["amount_captured"], 0);
}

async fn cancels_at(backend: Backend, psp: Psp) {
    let database = TestDatabase::new(backend).await;
    let rig = start_rig(&database, psp).await;
    let client = rig.client();
    // Adyen receives a cancel and decides it later; the others answer at once.
    let answered = if psp == Psp::Adyen { 202 } else { 200 };

    // A lost order: the authorization released.
    let lost = authorized(&rig, "cancel-lost", 4_000).await;
    let first = cancel(&client, &lost, "cancel-lost-1").await;
    assert_eq!(
        first.status,
        answered,
        "{}",
        String::from_utf8_lossy(&first.body)
    );
    assert_canceled(&rig, &lost).await;
    let replay = cancel(&client, &lost, "cancel-lost-1").await;
    assert_eq!((replay.status, &replay.body), (first.status, &first.body));
    assert!(replay.replayed());
    let again = cancel(&client, &lost, "cancel-lost-2").await;
    assert_eq!(
        (again.status, again.code()),
        (409, "invalid_transition".into())
    );
    let capture = client
        .post(
            &format!("/v1/payments/{lost}/capture"),
            "cancel-lost-capture",
            &json!({}),
        )
        .await;
    assert_eq!(capture.status, 409, "nothing is left to capture");
    let events = merchant_events_of(&client, "payment.canceled", &lost, 1).await;
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0]["data"]["object"]["status"], "canceled");
    assert_eq!(events[0]["data"]["operation"]["kind"], "cancel");
    // Only an authorized payment has an authorization to cancel.
    let paid = rig.payment(1_000, "pm_card_ok");
    let paid = client
        .post("/v1/payments", "cancel-paid", &paid)
        .await
        .json();
    let paid = paid["id"].as_str().unwrap();
    let refused = cancel(&client, paid, "cancel-paid-1").await;
    assert_eq!(
        (refused.status, refused.code()),
        (409, "invalid_transition".into())
    );
    let body = client
        .post(
            &format!("/v1/payments/{paid}/cancel"),
            "cancel-paid-2",
            &json!({"amount_minor": 5}),
        )
        .await;
    assert_eq!((body.status, body.code()), (400, "unknown_field".into()));

    // Sent while the provider is unreachable: finished by the reconciler, no client retry.
    let unreachable = authorized(&rig, "cancel-unreachable", 2_500).await;
    rig.sim("/faults", json!({"unreachable_ms": 5_000})).await;
    let pending = cancel(&client, &unreachable, "cancel-unreachable-1").await;
    assert_eq!(
        pending.status,
        202,
        "{}",
        String::from_utf8_lossy(&pending.body)
    );
    let pending = pending.json();
    assert_eq!(pending["status"], "authorized", "{pending}");
    assert_eq!(pending["operations"][0]["state"], "requested", "{pending}");
    assert_canceled(&rig, &unreachable).await;

    // Captures racing cancels: the provider takes whichever reaches it first.
    let mut raced = Vec::new();
    for n in 0..RACES {
        raced.push(authorized(&rig, &format!("race-{n}"), 1_000 + n as i64).await);
    }
    let answers = futures::future::join_all(raced.iter().enumerate().map(|(n, id)| {
        let client = client.clone();
        async move {
            let (capture_path, capture_key) = (
                format!("/v1/payments/{id}/capture"),
                format!("race-{n}-capture"),
            );
            let (cancel_key, empty) = (format!("race-{n}-cancel"), json!({}));
            let capture = client.post(&capture_path, &capture_key, &empty);
            let cancel = cancel(&client, id, &cancel_key);
            // Alternate which is sent first, so that both orders reach the provider.
            if n % 2 == 0 {
                tokio::join!(capture, cancel)
            } else {
                let (cancel, capture) = tokio::join!(cancel, capture);
                (capture, cancel)
            }
        }
    }))
    .await;
    let (mut captured, mut canceled) = (0, 0);
    for (id, (capture, cancel)) in raced.iter().zip(&answers) {
        for answer in [capture, cancel] {
            assert!(
                matches!(answer.status, 200 | 202 | 409 | 422),
                "{}: {}",
                answer.status,
                String::from_utf8_lossy(&answer.body)
            );
        }
        // Ended, and the losing operation told too (refused, or at Adyen by a CANCELLATION or
        // CAPTURE whose success is "false").
        let ended = wait_for(&client, id, "the race never ended", |p| {
            p["status"] != "authorized"
                && p["operations"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .all(|op| op["state"] != "requested" && op["state"] != "pending")
        })
        .await;
        let charge = rig.charge_of(id).await;
        match ended["status"].as_str() {
            Some("captured") => {
                captured += 1;
                assert_eq!(
                    ended["captured_minor"], charge["amount_captured"],
                    "{ended}"
                );
                assert_ne!(charge["amount_captured"], 0, "{charge}");
                let (held, _) = moved(&client, id, HOLD).await;
                assert_eq!(held, 0, "the hold ended with the capture");
            }
            Some("canceled") => {
                canceled += 1;
                assert_eq!(charge["amount_captured"], 0, "{charge}");
                assert_canceled(&rig, id).await;
            }
            other => panic!("a race ended {other:?}: {ended}"),
        }
        assert_eq!(ended["needs_review"], false, "{ended}");
    }
    assert_eq!(captured + canceled, RACES);
    verify(&database);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancels_through_the_simulator_sqlite() {
    cancels_at(Backend::Sqlite, Psp::Sim).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancels_through_the_simulator_postgres() {
    cancels_at(Backend::Postgres, Psp::Sim).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancels_through_stripe_sqlite() {
    cancels_at(Backend::Sqlite, Psp::Stripe).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancels_through_stripe_postgres() {
    cancels_at(Backend::Postgres, Psp::Stripe).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancels_through_adyen_sqlite() {
    cancels_at(Backend::Sqlite, Psp::Adyen).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancels_through_adyen_postgres() {
    cancels_at(Backend::Postgres, Psp::Adyen).await;
}
