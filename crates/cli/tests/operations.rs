//! Provider operations through the real binary, on both backends and against the in-process
//! simulator, the Stripe dialect (which has no lookup by our key) and the Adyen dialect (no lookup
//! at all, every modification decided after it is received): a refund or capture sent while the
//! provider is unreachable answers 202 and ends with exactly one provider operation and its
//! posting, with no client retry; a refund the provider refuses is a 422 (at Adyen a 202, then
//! refused by its REFUND) that releases its amount; a refund that fails after it succeeded posts a
//! reversing entry; a lost dispute whose every webhook was dropped is posted by the sweep (at
//! Adyen, whose accounting report does not say how a chargeback ends, as an open dispute with its
//! money withdrawn). `asiento verify` holds after each.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::{Duration, Instant};

use common::rig::{Psp, Rig};
use common::{verify, wait_for, without_provider_fees, Backend, Client, TestDatabase};
use serde_json::{json, Value};

const SECRET: &str = "whsec_test_0123456789";

/// A rig whose reconciler sweeps every 300 ms, drives operations at once and compares report
/// windows up to `report_settle` ago (an hour keeps the report from seeing anything the test
/// does, so that only what the test drives reaches the ledger).
async fn start_rig(database: &TestDatabase, psp: Psp, report_settle: &str) -> Rig {
    let mut extra = vec![
        "--reconcile-interval",
        "300ms",
        "--operation-timeout",
        "0s",
        "--report-settle",
        report_settle,
    ];
    if psp == Psp::Sim {
        extra.extend(["--webhook-secret", SECRET]);
    }
    Rig::start(database, psp, &extra).await
}

async fn create(client: &Client, key: &str, body: &Value) -> String {
    let created = client.post("/v1/payments", key, body).await;
    assert_eq!(
        created.status,
        201,
        "{}",
        String::from_utf8_lossy(&created.body)
    );
    created.json()["id"].as_str().unwrap().to_owned()
}

/// Refunds `amount` of payment `id` (its only refund), waits until the provider has refunded it
/// (at once, or at Adyen once it decided the refund it received), then has the provider fail that
/// refund: a reversal after success.
async fn refund_then_fail(rig: &Rig, id: &str, key: &str, amount: i64) {
    let refund = rig
        .client()
        .post(
            &format!("/v1/payments/{id}/refunds"),
            key,
            &json!({ "amount_minor": amount }),
        )
        .await;
    let expected = if rig.psp == Psp::Adyen { 202 } else { 201 };
    assert_eq!(
        refund.status,
        expected,
        "{}",
        String::from_utf8_lossy(&refund.body)
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    let operation = loop {
        let refunds = rig.operations_of(id, "refund").await;
        assert_eq!(refunds.len(), 1, "{refunds:?}");
        if refunds[0]["status"] == "succeeded" {
            break refunds[0]["id"].as_str().unwrap().to_owned();
        }
        assert!(
            Instant::now() < deadline,
            "the provider never refunded: {refunds:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    rig.sim(&format!("/operations/{operation}/fail"), json!({}))
        .await;
}

/// The refund entries among `entries`: money back to `psp:{provider}:clearing` (a provider's fee
/// also raises the clearing account, and is not one).
fn refund_entries(entries: &[Value], provider: &str) -> usize {
    let clearing = format!("psp:{provider}:clearing");
    entries
        .iter()
        .filter(|entry| {
            let legs = entry["legs"].as_array().unwrap();
            legs.iter()
                .any(|leg| leg["account"] == clearing && leg["amount_minor"].as_i64() > Some(0))
                && !legs.iter().any(|leg| {
                    leg["account"]
                        .as_str()
                        .is_some_and(|account| account.starts_with("expense:provider_fees:"))
                })
        })
        .count()
}

/// A refund and a capture sent while the provider is unreachable answer 202 and are finished by
/// the reconciler alone, with one operation each at the provider and one posting.
async fn unreachable_refund_and_capture_at(backend: Backend, psp: Psp) {
    let database = TestDatabase::new(backend).await;
    let rig = start_rig(&database, psp, "0s").await;
    let client = rig.client();

    let refunded = create(&client, "op-refund", &rig.payment(5_000, "pm_card_ok")).await;
    let mut manual = rig.payment(3_000, "pm_card_ok");
    manual["capture"] = json!("manual");
    let captured = create(&client, "op-capture", &manual).await;

    // Long enough that both requests give up (four attempts, under a second each) inside it.
    rig.sim("/faults", json!({"unreachable_ms": 5_000})).await;
    let refund = client
        .post(
            &format!("/v1/payments/{refunded}/refunds"),
            "op-refund-1",
            &json!({"amount_minor": 5_000}),
        )
        .await;
    assert_eq!(
        refund.status,
        202,
        "{}",
        String::from_utf8_lossy(&refund.body)
    );
    assert_eq!(refund.json()["operations"][0]["state"], "requested");
    let capture = client
        .post(
            &format!("/v1/payments/{captured}/capture"),
            "op-capture-1",
            &json!({}),
        )
        .await;
    assert_eq!(
        capture.status,
        202,
        "{}",
        String::from_utf8_lossy(&capture.body)
    );

    // No client retry: the reconciler finishes both once the provider is back.
    let after = wait_for(&client, &refunded, "the refund never settled", |p| {
        p["status"] == "refunded"
    })
    .await;
    assert_eq!(after["refunded_minor"], 5_000);
    assert_eq!(after["operations"][0]["state"], "succeeded");
    wait_for(&client, &captured, "the capture never settled", |p| {
        p["status"] == "captured"
    })
    .await;
    assert_eq!(rig.operations_of(&refunded, "refund").await.len(), 1);
    assert_eq!(rig.operations_of(&captured, "capture").await.len(), 1);
    assert_eq!(
        refund_entries(&client.entries_of(&refunded).await, rig.provider()),
        1
    );
    // The replay answers what the first request answered.
    let replay = client
        .post(
            &format!("/v1/payments/{refunded}/refunds"),
            "op-refund-1",
            &json!({"amount_minor": 5_000}),
        )
        .await;
    assert_eq!(replay.status, 202);
    verify(&database);
}

async fn unreachable_refund_and_capture(backend: Backend) {
    unreachable_refund_and_capture_at(backend, Psp::Sim).await;
}

async fn unreachable_refund_and_capture_at_stripe(backend: Backend) {
    unreachable_refund_and_capture_at(backend, Psp::Stripe).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refunds_and_captures_sent_while_the_provider_is_unreachable_converge_sqlite() {
    unreachable_refund_and_capture(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refunds_and_captures_sent_while_the_provider_is_unreachable_converge_postgres() {
    unreachable_refund_and_capture(Backend::Postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refunds_and_captures_sent_while_stripe_is_unreachable_converge_sqlite() {
    unreachable_refund_and_capture_at_stripe(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refunds_and_captures_sent_while_stripe_is_unreachable_converge_postgres() {
    unreachable_refund_and_capture_at_stripe(Backend::Postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refunds_and_captures_sent_while_adyen_is_unreachable_converge_sqlite() {
    unreachable_refund_and_capture_at(Backend::Sqlite, Psp::Adyen).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refunds_and_captures_sent_while_adyen_is_unreachable_converge_postgres() {
    unreachable_refund_and_capture_at(Backend::Postgres, Psp::Adyen).await;
}

/// Waits until the worker has finished every webhook event the server stored, and no more came
/// in for a moment.
async fn webhooks_processed(client: &Client) {
    let counts = || async {
        (
            client
                .metric("asiento_webhooks_received_total{outcome=\"stored\"")
                .await,
            client
                .metric("asiento_webhook_events_processed_total")
                .await,
        )
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (stored, processed) = counts().await;
        if processed >= stored {
            tokio::time::sleep(Duration::from_millis(300)).await;
            if counts().await == (stored, processed) {
                return;
            }
        }
        assert!(
            Instant::now() < deadline,
            "the worker never finished the stored webhooks: {stored} stored, {processed} processed"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn refusal_reversal_and_lost_dispute(backend: Backend, psp: Psp) {
    let database = TestDatabase::new(backend).await;
    // The provider's dispute below must stay unknown to us (no webhook, no report) until the
    // refund meets it.
    let rig = start_rig(&database, psp, "1h").await;
    let client = rig.client();

    // A refund the provider refuses (its charge is under a dispute we have not heard of) is a
    // 422 and releases its amount.
    let refused = create(&client, "refused", &rig.payment(4_000, "pm_card_ok")).await;
    let charge = rig.charge_of(&refused).await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    // At Adyen the refusal comes by notification (the dispute's own moves no money until it is
    // decided), so webhooks stay on there.
    if psp != Psp::Adyen {
        rig.drop_every_webhook().await;
        // Stripe's events are read by fetching what they name as it is now: one still in the
        // inbox when the dispute opens would tell us of the dispute.
        webhooks_processed(&client).await;
    }
    rig.sim(
        &format!("/charges/{charge}/dispute"),
        json!({"amount_minor": 4_000}),
    )
    .await;
    let answer = client
        .post(
            &format!("/v1/payments/{refused}/refunds"),
            "refused-1",
            &json!({"amount_minor": 4_000}),
        )
        .await;
    if psp == Psp::Adyen {
        // Received (202), then refused by its REFUND `"false"`: released, nothing posted.
        assert_eq!(
            answer.status,
            202,
            "{}",
            String::from_utf8_lossy(&answer.body)
        );
        let after = wait_for(&client, &refused, "the refusal never arrived", |p| {
            p["operations"][0]["state"] == "refused"
        })
        .await;
        assert_eq!(after["refunded_minor"], 0, "{after}");
    } else {
        assert_eq!(
            answer.status,
            422,
            "{}",
            String::from_utf8_lossy(&answer.body)
        );
        assert_eq!(answer.code(), "refund_refused");
    }
    rig.sim(
        &format!("/charges/{charge}/dispute/close"),
        json!({"outcome": "won"}),
    )
    .await;
    let again = client
        .post(
            &format!("/v1/payments/{refused}/refunds"),
            "refused-2",
            &json!({"amount_minor": 4_000}),
        )
        .await;
    if psp == Psp::Adyen {
        assert_eq!(
            again.status,
            202,
            "{}",
            String::from_utf8_lossy(&again.body)
        );
        wait_for(&client, &refused, "the second refund never settled", |p| {
            p["status"] == "refunded"
        })
        .await;
    } else {
        assert_eq!(
            again.status,
            201,
            "{}",
            String::from_utf8_lossy(&again.body)
        );
    }

    drop(rig);
    let rig = start_rig(&database, psp, "0s").await;
    let client = rig.client();

    // A refund that fails after it succeeded is reversed by its own entry.
    let reversed = create(&client, "reversed", &rig.payment(6_000, "pm_card_ok")).await;
    refund_then_fail(&rig, &reversed, "reversed-1", 2_500).await;
    let after = wait_for(&client, &reversed, "the reversal never arrived", |p| {
        p["operations"][0]["state"] == "reversed"
    })
    .await;
    assert_eq!(after["status"], "captured");
    assert_eq!(after["refunded_minor"], 0);
    let entries = without_provider_fees(client.entries_of(&reversed).await);
    assert_eq!(entries.len(), 3, "capture, refund, reversal: {entries:?}");

    // A lost dispute whose every webhook is dropped is posted by the sweep (the report).
    rig.drop_every_webhook().await;
    let disputed = create(&client, "disputed", &rig.payment(7_000, "pm_card_ok")).await;
    let charge = rig.charge_of(&disputed).await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    rig.sim(
        &format!("/charges/{charge}/dispute"),
        json!({"amount_minor": 7_000}),
    )
    .await;
    rig.sim(
        &format!("/charges/{charge}/dispute/close"),
        json!({"outcome": "lost"}),
    )
    .await;
    wait_for(
        &client,
        &disputed,
        "the lost dispute was never posted",
        |p| p["status"] == "disputed",
    )
    .await;
    // The capture, the provider's withdrawal as the dispute opened (clearing +7000, disputed
    // −7000), and the loss: the withdrawn money was the customer's (disputed +7000, customer
    // −7000). Adyen's accounting report tells the chargeback's money, not its end: the dispute
    // stays open with its money withdrawn.
    let (count, expected) = if psp == Psp::Adyen {
        (2, (7_000, -7_000, 0))
    } else {
        (3, (7_000, 0, -7_000))
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    let entries = loop {
        let entries = without_provider_fees(client.entries_of(&disputed).await);
        if entries.len() == count {
            break entries;
        }
        assert!(Instant::now() < deadline, "no dispute entries: {entries:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let moved = |account: &str| -> i64 {
        entries
            .iter()
            .skip(1)
            .flat_map(|entry| entry["legs"].as_array().unwrap())
            .filter(|leg| leg["account"] == account)
            .map(|leg| leg["amount_minor"].as_i64().unwrap())
            .sum()
    };
    let provider = rig.provider();
    assert_eq!(
        (
            moved(&format!("psp:{provider}:clearing")),
            moved(&format!("psp:{provider}:disputed")),
            moved("customer:42:available")
        ),
        expected,
        "{entries:?}"
    );

    // A reversal whose webhook is lost (webhooks are still dropped) is found when the report
    // shows less refunded than we do: the refund is read again and reversed. At Adyen, where
    // nothing can be read, the accounting report's rows name the refund (its REFUND was lost
    // too): it succeeded, then was reversed.
    let dark = create(&client, "reversed-dark", &rig.payment(5_000, "pm_card_ok")).await;
    refund_then_fail(&rig, &dark, "reversed-dark-1", 2_000).await;
    let after = wait_for(&client, &dark, "the lost reversal was never posted", |p| {
        p["operations"][0]["state"] == "reversed"
    })
    .await;
    assert_eq!(after["refunded_minor"], 0);
    assert_eq!(after["needs_review"], false, "{after}");

    // What the merchant is told of each, in order.
    let refunds = "payment.refunded,payment.refund_failed";
    let disputes = "payment.disputed,payment.dispute_closed";
    let lost_dispute: &[&str] = if psp == Psp::Adyen {
        &["payment.disputed"]
    } else {
        &["payment.disputed", "payment.dispute_closed"]
    };
    for (payment, types, told) in [
        (
            &refused,
            refunds,
            &["payment.refund_failed", "payment.refunded"][..],
        ),
        (
            &reversed,
            refunds,
            &["payment.refunded", "payment.refund_failed"],
        ),
        (
            &dark,
            refunds,
            &["payment.refunded", "payment.refund_failed"],
        ),
        (&disputed, disputes, lost_dispute),
    ] {
        let events = common::merchant_events_of(&client, types, payment, told.len()).await;
        let kinds: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
        assert_eq!(kinds, told, "{payment}");
        if types == refunds {
            assert!(
                events
                    .iter()
                    .all(|e| e["data"]["operation"]["kind"] == "refund"),
                "{events:?}"
            );
        }
    }
    verify(&database);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_release_reversals_reverse_and_lost_disputes_are_posted_sqlite() {
    refusal_reversal_and_lost_dispute(Backend::Sqlite, Psp::Sim).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_release_reversals_reverse_and_lost_disputes_are_posted_postgres() {
    refusal_reversal_and_lost_dispute(Backend::Postgres, Psp::Sim).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_release_reversals_reverse_and_lost_disputes_are_posted_at_stripe_sqlite() {
    refusal_reversal_and_lost_dispute(Backend::Sqlite, Psp::Stripe).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_release_reversals_reverse_and_lost_disputes_are_posted_at_stripe_postgres() {
    refusal_reversal_and_lost_dispute(Backend::Postgres, Psp::Stripe).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_release_reversals_reverse_and_lost_disputes_are_posted_at_adyen_sqlite() {
    refusal_reversal_and_lost_dispute(Backend::Sqlite, Psp::Adyen).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_release_reversals_reverse_and_lost_disputes_are_posted_at_adyen_postgres() {
    refusal_reversal_and_lost_dispute(Backend::Postgres, Psp::Adyen).await;
}
