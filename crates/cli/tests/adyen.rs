//! asiento with an Adyen provider (`--providers adyen=adyen:…`, its credentials from the
//! environment) against `asiento psp-sim --dialect adyen`, whose signed notification batches reach
//! `/webhooks/adyen` under basic auth (through a relay that records the server's answers), and
//! `asiento verify` holding after each:
//! - a payment authorised and captured at once, its AUTHORISATION `[accepted]`; a manual capture
//!   received, pending, and settled (and posted) only by its CAPTURE; a refund pending until its
//!   REFUND; a refusal failed with Adyen's reason (on both backends);
//! - a refund that fails after it succeeded (REFUND_FAILED), reversed by a mirror entry; a
//!   refund received and then refused (REFUND `"false"`), released with nothing posted;
//! - a dispute lost (CHARGEBACK) and one won (CHARGEBACK, then CHARGEBACK_REVERSED), posted;
//! - a dispute lost, reinstated and lost again (CHARGEBACK, CHARGEBACK_REVERSED,
//!   SECOND_CHARGEBACK, the later two without `originalReference` as in Adyen's examples),
//!   posted whatever order the items arrive in;
//! - an EXPIRE or CANCELLATION delivered before the CAPTURE of a received capture, which still
//!   posts the capture; a partial capture's remainder expiring, not flagged;
//! - a creation whose request never arrived, and one whose answer was lost, sent again by the
//!   stale sweep and captured once; one past its expiry cancelled by our reference and left
//!   pending (not known absent yet);
//! - a delivery with the wrong basic auth is a 401 and one with an item that does not verify
//!   is refused whole: neither stores anything;
//! - a Settlement details batch announced by REPORT_AVAILABLE posts its payout to
//!   `bank:adyen:payouts` with Adyen's fees as provider fee expense, once even when the sweep
//!   finds it, and a batch whose notification was lost is found by the sweep (on both backends);
//! - one server with three providers (the simulator's protocol, the Stripe dialect and the
//!   Adyen dialect), each with its own credentials and fees: a payment refunded and one disputed
//!   and lost through each, every report reconciled, each clearing account what its provider
//!   owes.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::{Duration, Instant};

use common::adyen::{
    adyen_payment, basic, batch, deliver, provider_env, signed_item, start_rig, AdyenSim, Rig,
    WEBHOOK_PASSWORD, WEBHOOK_USER,
};
use common::free_port;
use common::stripe::{sim_control, start_stripe_sim, stripe_payment};
use common::{
    payment, payment_body, verify, wait_for, without_provider_fees, Backend, Client, Process,
    Server, TestDatabase,
};
use serde_json::{json, Value};

/// The payment's entries once there are `count` of them (the provider's fees aside).
async fn entries_until(client: &Client, id: &str, count: usize) -> Vec<Value> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let entries = without_provider_fees(client.entries_of(id).await);
        if entries.len() >= count {
            assert_eq!(entries.len(), count, "{entries:#?}");
            return entries;
        }
        assert!(
            Instant::now() < deadline,
            "{id} never had {count} entries: {entries:#?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// What `entries` moved on `account`, in sum.
fn moved(entries: &[Value], account: &str) -> i64 {
    entries
        .iter()
        .flat_map(|entry| entry["legs"].as_array().unwrap())
        .filter(|leg| leg["account"] == account)
        .map(|leg| leg["amount_minor"].as_i64().unwrap())
        .sum()
}

async fn create(client: &Client, key: &str, body: &Value) -> Value {
    let answer = client.post("/v1/payments", key, body).await;
    assert_eq!(
        answer.status,
        201,
        "{}",
        String::from_utf8_lossy(&answer.body)
    );
    answer.json()
}

fn id_of(payment: &Value) -> String {
    payment["id"].as_str().unwrap().to_owned()
}

fn psp_of(payment: &Value) -> String {
    let psp = payment["provider_charge_id"].as_str().unwrap().to_owned();
    assert_eq!(psp.len(), 16, "an Adyen pspReference: {payment}");
    psp
}

/// Asks for a capture or refund that Adyen receives (202, pending): the provider's id of it.
async fn operation_received(client: &Client, path: &str, key: &str, body: &Value) -> String {
    let answer = client.post(path, key, body).await;
    assert_eq!(
        answer.status,
        202,
        "{}",
        String::from_utf8_lossy(&answer.body)
    );
    answer.json()["operations"][0]["provider_id"]
        .as_str()
        .unwrap()
        .to_owned()
}

/// Checks that a delivery was Adyen's acknowledgement.
fn assert_accepted(delivery: &common::adyen::Delivery) {
    assert_eq!(
        (delivery.status, delivery.answer.as_str()),
        (200, "[accepted]"),
        "{delivery:?}"
    );
}

async fn payments_through_adyen(backend: Backend) {
    let database = TestDatabase::new(backend).await;
    let Rig { server, sim } = start_rig(&database, &[]).await;
    let client = server.client();

    // Authorised with automatic capture: captured at once, the AUTHORISATION accepted.
    let paid = create(&client, "adyen-1", &adyen_payment(5_000, "pm_card_ok")).await;
    assert_eq!(
        (paid["status"].as_str(), paid["provider"].as_str()),
        (Some("captured"), Some("adyen")),
        "{paid}"
    );
    let (paid_id, paid_psp) = (id_of(&paid), psp_of(&paid));
    let (authorisation, delivery) = sim.item("AUTHORISATION", &paid_psp).await;
    assert_accepted(&delivery);
    assert_eq!(authorisation["success"], "true");
    assert_eq!(authorisation["merchantReference"], paid_id.as_str());
    assert_eq!(
        authorisation["amount"],
        json!({"currency": "EUR", "value": 5_000})
    );
    let captured = entries_until(&client, &paid_id, 1).await;
    assert_eq!(
        moved(&captured, "psp:adyen:clearing"),
        -5_000,
        "{captured:#?}"
    );

    // Manual capture: authorised; the capture is received (202, pending) and posted only when
    // its CAPTURE arrives.
    let mut manual = adyen_payment(3_000, "pm_card_ok");
    manual["capture"] = json!("manual");
    let held = create(&client, "adyen-2", &manual).await;
    assert_eq!(held["status"], "authorized", "{held}");
    let (held_id, held_psp) = (id_of(&held), psp_of(&held));
    assert_accepted(&sim.item("AUTHORISATION", &held_psp).await.1);
    // The authorisation holds the amount as the customer's pending credit, nothing more.
    let hold = entries_until(&client, &held_id, 1).await;
    assert_eq!(
        moved(&hold, "pending_credits:customer:42:available"),
        3_000,
        "{hold:#?}"
    );
    assert_eq!(moved(&hold, "psp:adyen:clearing"), 0, "{hold:#?}");
    let capture = client
        .post(
            &format!("/v1/payments/{held_id}/capture"),
            "adyen-2-capture",
            &json!({}),
        )
        .await;
    assert_eq!(
        capture.status,
        202,
        "{}",
        String::from_utf8_lossy(&capture.body)
    );
    let capture = capture.json();
    let operation = &capture["operations"][0];
    assert_eq!(
        (operation["kind"].as_str(), operation["state"].as_str()),
        (Some("capture"), Some("pending")),
        "{capture}"
    );
    let capture_psp = operation["provider_id"].as_str().unwrap().to_owned();
    assert_ne!(
        capture_psp, held_psp,
        "a capture has a pspReference of its own"
    );
    assert_eq!(capture["status"], "authorized");
    assert_eq!(
        without_provider_fees(client.entries_of(&held_id).await),
        hold,
        "nothing is posted before Adyen decides"
    );
    let (item, delivery) = sim.item("CAPTURE", &capture_psp).await;
    assert_accepted(&delivery);
    assert_eq!(item["originalReference"], held_psp.as_str());
    let settled = wait_for(&client, &held_id, "the CAPTURE never settled it", |p| {
        p["status"] == "captured"
    })
    .await;
    assert_eq!(settled["captured_minor"], 3_000);
    assert_eq!(settled["operations"][0]["state"], "succeeded", "{settled}");
    // The hold, the capture, the hold's release.
    let posted = entries_until(&client, &held_id, 3).await;
    assert_eq!(moved(&posted, "psp:adyen:clearing"), -3_000, "{posted:#?}");
    assert_eq!(
        moved(&posted, "pending_credits:customer:42:available"),
        0,
        "the hold is released: {posted:#?}"
    );

    // A refund: pending until its REFUND.
    let refund = client
        .post(
            &format!("/v1/payments/{paid_id}/refunds"),
            "adyen-1-refund",
            &json!({"amount_minor": 2_000}),
        )
        .await;
    assert_eq!(
        refund.status,
        202,
        "{}",
        String::from_utf8_lossy(&refund.body)
    );
    let refund = refund.json();
    assert_eq!(refund["operations"][0]["state"], "pending", "{refund}");
    assert_eq!(refund["refunded_minor"], 0);
    let refund_psp = refund["operations"][0]["provider_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let (item, delivery) = sim.item("REFUND", &refund_psp).await;
    assert_accepted(&delivery);
    assert_eq!(item["success"], "true");
    let refunded = wait_for(&client, &paid_id, "the REFUND never settled it", |p| {
        p["operations"][0]["state"] == "succeeded"
    })
    .await;
    assert_eq!(refunded["refunded_minor"], 2_000);
    assert_eq!(refunded["status"], "partially_refunded");
    let entries = entries_until(&client, &paid_id, 2).await;
    assert_eq!(
        moved(&entries[1..], "psp:adyen:clearing"),
        2_000,
        "{entries:#?}"
    );

    // A refusal: failed with Adyen's reason, its AUTHORISATION (success "false") accepted.
    let refused = create(&client, "adyen-3", &adyen_payment(700, "pm_card_declined")).await;
    assert_eq!(refused["status"], "failed", "{refused}");
    assert_eq!(refused["failure_reason"], "Refused", "{refused}");
    let (item, delivery) = sim.item("AUTHORISATION", &psp_of(&refused)).await;
    assert_accepted(&delivery);
    assert_eq!(
        (item["success"].as_str(), item["reason"].as_str()),
        (Some("false"), Some("Refused"))
    );
    assert_eq!(
        client.entries_of(&id_of(&refused)).await,
        Vec::<Value>::new()
    );

    verify(&database);
    // The notifications changed nothing the answers had settled: the same entries.
    assert_eq!(
        without_provider_fees(client.entries_of(&paid_id).await).len(),
        2
    );
    assert_eq!(
        without_provider_fees(client.entries_of(&held_id).await).len(),
        3
    );
    assert_eq!(
        payment(&client, &paid_id).await["status"],
        "partially_refunded"
    );
}

/// The balance of `account` in EUR, as the API shows it (0 for one never posted to).
async fn balance(client: &Client, account: &str) -> i64 {
    client
        .get(&format!("/v1/accounts/{account}/balance?currency=EUR"))
        .await
        .json()["balance_minor"]
        .as_i64()
        .unwrap_or(0)
}

/// Waits until `psp:adyen:clearing`, `bank:adyen:payouts` and `expense:provider_fees:adyen`
/// hold `expected` (debits negative, as the API shows balances).
async fn wait_adyen_balances(client: &Client, expected: (i64, i64, i64), what: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let now = (
            balance(client, "psp:adyen:clearing").await,
            balance(client, "bank:adyen:payouts").await,
            balance(client, "expense:provider_fees:adyen").await,
        );
        if now == expected {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: (clearing, bank, fees) = {now:?}, expected {expected:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Adyen's fee on a `Settled` line of the dialect: 10 + 0.20 % + 0.10 % + 0.80 % of the gross,
/// each part rounded half-up.
fn adyen_fee(gross: i64) -> i64 {
    let part = |bps: i64| (gross * bps + 5_000) / 10_000;
    10 + part(20) + part(10) + part(80)
}

/// Adyen's payouts in the ledger: a Settlement details batch closed in the dialect is announced by
/// REPORT_AVAILABLE, and its payout moves the batch's net from `psp:adyen:clearing` to
/// `bank:adyen:payouts`, its fees to `expense:provider_fees:adyen`, so that clearing is back at
/// zero; a sweep that finds the same batch (a new adapter probes from batch 1) posts nothing
/// more; with every notification lost, the sweep finds the next batch by probing and posts it.
async fn adyen_payouts_reach_the_bank_account(backend: Backend) {
    let database = TestDatabase::new(backend).await;
    let rig = common::rig::Rig::start(
        &database,
        common::rig::Psp::Adyen,
        &["--reconcile-interval", "300ms", "--report-settle", "0s"],
    )
    .await;
    let client = rig.client();
    let sim = rig.adyen();

    create(&client, "po-1", &adyen_payment(10_000, "pm_card_ok")).await;
    let refunded = id_of(&create(&client, "po-2", &adyen_payment(4_000, "pm_card_ok")).await);
    let refund = client
        .post(
            &format!("/v1/payments/{refunded}/refunds"),
            "po-2-refund",
            &json!({"amount_minor": 1_500}),
        )
        .await;
    assert_eq!(
        refund.status,
        202,
        "{}",
        String::from_utf8_lossy(&refund.body)
    );
    wait_for(&client, &refunded, "the refund never settled", |p| {
        p["operations"][0]["state"] == "succeeded"
    })
    .await;
    let owed = 10_000 + 4_000 - 1_500;
    wait_adyen_balances(&client, (-owed, 0, 0), "before any payout").await;

    let files = sim.close_settlement_batch(&client).await;
    assert_eq!(
        files.len(),
        1,
        "one merchant account, one currency: {files:?}"
    );
    assert_eq!(files[0]["file"], "settlement_detail_report_batch_1.csv");
    let (item, delivery) = sim
        .item("REPORT_AVAILABLE", "settlement_detail_report_batch_1.csv")
        .await;
    assert_accepted(&delivery);
    assert_eq!(item["reason"], files[0]["url"]);
    let fees = adyen_fee(10_000) + adyen_fee(4_000);
    wait_adyen_balances(&client, (0, -(owed - fees), -fees), "after the payout").await;
    verify(&database);

    // A sweep of its own finds batch 1 again: nothing more is posted.
    rig.reconcile(&database.url).await;
    assert_eq!(
        (
            balance(&client, "psp:adyen:clearing").await,
            balance(&client, "bank:adyen:payouts").await,
            balance(&client, "expense:provider_fees:adyen").await,
        ),
        (0, -(owed - fees), -fees),
        "the payout was posted once"
    );

    // Every notification lost: batch 2 is found by the sweep probing the next batch.
    rig.drop_every_webhook().await;
    create(&client, "po-3", &adyen_payment(2_000, "pm_card_ok")).await;
    wait_adyen_balances(
        &client,
        (-2_000, -(owed - fees), -fees),
        "the third capture",
    )
    .await;
    let files = sim.close_settlement_batch(&client).await;
    assert_eq!(files[0]["file"], "settlement_detail_report_batch_2.csv");
    let all_fees = fees + adyen_fee(2_000);
    wait_adyen_balances(
        &client,
        (0, -(owed + 2_000 - all_fees), -all_fees),
        "the sweep never posted batch 2",
    )
    .await;
    assert!(
        !sim.items()
            .iter()
            .any(|(item, _)| item["eventCode"] == "REPORT_AVAILABLE"
                && item["pspReference"] == "settlement_detail_report_batch_2.csv"),
        "batch 2 was announced, so the sweep's probe is not what posted it"
    );
    verify(&database);
}

asiento_testkit::both_backends!(threads = 2; payments_through_adyen, adyen_payouts_reach_the_bank_account);

/// A refund that succeeded and then failed at the scheme (REFUND_FAILED) is reversed by a mirror
/// of its entry; the refunded total goes back to zero.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refund_that_fails_after_it_succeeded_is_reversed() {
    let database = TestDatabase::new(Backend::Sqlite).await;
    let Rig { server, sim } = start_rig(&database, &[]).await;
    let client = server.client();
    sim.control(
        &client,
        "/sim/faults",
        json!({"refund_reversal_rate": 1.0, "refund_reversal_delay_ms": 300}),
    )
    .await;
    let paid = create(&client, "reversed-1", &adyen_payment(4_000, "pm_card_ok")).await;
    let id = id_of(&paid);
    let refund_psp = operation_received(
        &client,
        &format!("/v1/payments/{id}/refunds"),
        "reversed-1-refund",
        &json!({"amount_minor": 1_500}),
    )
    .await;
    assert_accepted(&sim.item("REFUND", &refund_psp).await.1);
    let (failed, delivery) = sim.item("REFUND_FAILED", &refund_psp).await;
    assert_accepted(&delivery);
    assert_eq!(failed["amount"]["value"], 1_500);
    let reversed = wait_for(&client, &id, "the REFUND_FAILED was never applied", |p| {
        p["operations"][0]["state"] == "reversed"
    })
    .await;
    assert_eq!(reversed["refunded_minor"], 0, "{reversed}");
    assert_eq!(reversed["status"], "captured", "{reversed}");
    // The capture, the refund, and its mirror.
    let entries = entries_until(&client, &id, 3).await;
    assert_eq!(
        moved(&entries[1..2], "psp:adyen:clearing"),
        1_500,
        "{entries:#?}"
    );
    assert_eq!(
        moved(&entries[2..], "psp:adyen:clearing"),
        -1_500,
        "{entries:#?}"
    );
    assert_eq!(
        moved(&entries[1..], "customer:42:available"),
        0,
        "{entries:#?}"
    );
    verify(&database);
}

/// A dispute lost (CHARGEBACK `Lost`) withdraws the payment's money from the customer; one won
/// (CHARGEBACK `Pending`, then CHARGEBACK_REVERSED `Won`) gives back what it withdrew.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dispute_lost_and_a_dispute_won_are_posted_from_their_notifications() {
    let database = TestDatabase::new(Backend::Sqlite).await;
    let Rig { server, sim } = start_rig(&database, &[]).await;
    let client = server.client();

    let lost = create(&client, "dispute-lost", &adyen_payment(6_000, "pm_card_ok")).await;
    let (lost_id, lost_psp) = (id_of(&lost), psp_of(&lost));
    sim.control(
        &client,
        &format!("/sim/charges/{lost_psp}/dispute"),
        json!({}),
    )
    .await;
    assert_accepted(&sim.item("NOTIFICATION_OF_CHARGEBACK", &lost_psp).await.1);
    sim.control(
        &client,
        &format!("/sim/charges/{lost_psp}/dispute/close"),
        json!({"outcome": "lost"}),
    )
    .await;
    let (chargeback, delivery) = sim.item("CHARGEBACK", &lost_psp).await;
    assert_accepted(&delivery);
    assert_eq!(chargeback["additionalData"]["disputeStatus"], "Lost");
    wait_for(
        &client,
        &lost_id,
        "the lost dispute was never applied",
        |p| p["status"] == "disputed",
    )
    .await;
    let entries = entries_until(&client, &lost_id, 3).await;
    assert_eq!(
        (
            moved(&entries[1..], "psp:adyen:clearing"),
            moved(&entries[1..], "psp:adyen:disputed"),
            moved(&entries[1..], "customer:42:available")
        ),
        (6_000, 0, -6_000),
        "{entries:#?}"
    );

    let won = create(&client, "dispute-won", &adyen_payment(8_000, "pm_card_ok")).await;
    let (won_id, won_psp) = (id_of(&won), psp_of(&won));
    sim.control(
        &client,
        &format!("/sim/charges/{won_psp}/dispute"),
        json!({}),
    )
    .await;
    sim.control(
        &client,
        &format!("/sim/charges/{won_psp}/dispute/close"),
        json!({"outcome": "won"}),
    )
    .await;
    assert_accepted(&sim.item("CHARGEBACK", &won_psp).await.1);
    let (reversed, delivery) = sim.item("CHARGEBACK_REVERSED", &won_psp).await;
    assert_accepted(&delivery);
    assert_eq!(reversed["additionalData"]["disputeStatus"], "Won");
    let entries = entries_until(&client, &won_id, 3).await;
    assert_eq!(
        (
            moved(&entries[1..2], "psp:adyen:clearing"),
            moved(&entries[1..2], "psp:adyen:disputed")
        ),
        (8_000, -8_000),
        "the withdrawal: {entries:#?}"
    );
    assert_eq!(
        (
            moved(&entries[1..], "psp:adyen:clearing"),
            moved(&entries[1..], "psp:adyen:disputed"),
            moved(&entries[1..], "customer:42:available")
        ),
        (0, 0, 0),
        "the reinstatement gives it back: {entries:#?}"
    );
    let won = wait_for(&client, &won_id, "the won dispute never closed", |p| {
        p["status"] == "captured"
    })
    .await;
    assert_eq!(won["captured_minor"], 8_000);
    verify(&database);
}

/// The server's webhook counters of `outcome` (`stored`, `duplicate`, `refused`).
async fn received(client: &Client, outcome: &str) -> f64 {
    client
        .metric(&format!(
            "asiento_webhooks_received_total{{outcome=\"{outcome}\""
        ))
        .await
}

/// A delivery must carry the configured basic credentials and every item a valid HMAC; else
/// nothing of it is stored (the same item delivered properly afterwards is stored, not a
/// duplicate).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delivery_without_its_credentials_or_with_an_item_that_does_not_verify_stores_nothing() {
    let database = TestDatabase::new(Backend::Sqlite).await;
    let Rig { server, sim } = start_rig(&database, &[]).await;
    let client = server.client();
    let paid = create(&client, "auth-1", &adyen_payment(2_500, "pm_card_ok")).await;
    let (id, psp) = (id_of(&paid), psp_of(&paid));
    assert_accepted(&sim.item("AUTHORISATION", &psp).await.1);
    let stored = received(&client, "stored").await;
    assert!(stored >= 1.0, "the dialect's AUTHORISATION was stored");

    // An informational item (the ledger applies nothing for it), about our payment.
    let item = signed_item(
        "NOTIFICATION_OF_FRAUD",
        "FRAUD00000000001",
        Some(&psp),
        &id,
        2_500,
    );
    let right = basic(WEBHOOK_USER, WEBHOOK_PASSWORD);
    for authorization in [
        None,
        Some(basic(WEBHOOK_USER, "wrong")),
        Some(basic("someone", WEBHOOK_PASSWORD)),
        Some(right.replace("Basic", "Bearer")),
    ] {
        let (status, body) = deliver(
            &client,
            "adyen",
            authorization.as_deref(),
            batch(std::slice::from_ref(&item)),
        )
        .await;
        assert_eq!(status, 401, "{authorization:?}: {body}");
    }

    // One item of the batch tampered with after it was signed: the whole batch is refused.
    let mut tampered = signed_item(
        "NOTIFICATION_OF_FRAUD",
        "FRAUD00000000002",
        Some(&psp),
        &id,
        2_500,
    );
    tampered.amount.value = 1;
    let (status, body) = deliver(
        &client,
        "adyen",
        Some(&right),
        batch(&[item.clone(), tampered]),
    )
    .await;
    assert_eq!(status, 400, "{body}");
    let problem: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(problem["code"], "signature_invalid", "{problem}");
    assert_eq!(
        received(&client, "stored").await,
        stored,
        "nothing was stored"
    );

    let (status, body) = deliver(
        &client,
        "adyen",
        Some(&right),
        batch(std::slice::from_ref(&item)),
    )
    .await;
    assert_eq!((status, body.as_str()), (200, "[accepted]"));
    assert_eq!(
        received(&client, "stored").await,
        stored + 1.0,
        "stored now, not before"
    );
    let duplicates = received(&client, "duplicate").await;
    let (status, body) = deliver(&client, "adyen", Some(&right), batch(&[item])).await;
    assert_eq!((status, body.as_str()), (200, "[accepted]"));
    assert_eq!(received(&client, "duplicate").await, duplicates + 1.0);
    assert_eq!(received(&client, "stored").await, stored + 1.0);
    assert_eq!(payment(&client, &id).await["status"], "captured");
    verify(&database);
}

/// What the ledger says provider `provider` owes us for `payments`, from their own views: what
/// was captured, less what was refunded, the provider's fees and what lost disputes took back.
fn owed_by_provider(payments: &[Value]) -> i64 {
    payments
        .iter()
        .map(|payment| {
            let fees: i64 = payment["provider_fees"]
                .as_array()
                .unwrap()
                .iter()
                .map(|fee| fee["fee_minor"].as_i64().unwrap())
                .sum();
            let lost = if payment["status"] == "disputed" {
                payment["captured_minor"].as_i64().unwrap()
            } else {
                0
            };
            payment["captured_minor"].as_i64().unwrap()
                - payment["refunded_minor"].as_i64().unwrap()
                - fees
                - lost
        })
        .sum()
}

/// One server, three providers: the simulator's protocol (`asiento psp-sim`), the Stripe dialect
/// and the Adyen dialect, each in its own process with its own credentials, webhook secret,
/// provider fee and platform fee (`--fees`), each delivering its webhooks to the server. Through
/// each a payment refunded in part and a payment disputed and lost; then every report: the
/// simulator's and Stripe's settlement reports, Stripe's payout, Adyen's accounting report and a
/// Settlement details batch, whose payout goes to `bank:adyen:payouts` with Adyen's fees as
/// provider fee expense. One `asiento reconcile` over the three finds nothing open, each
/// clearing account is what its provider owes (zero where it paid out), and `asiento verify` is
/// clean.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_providers_in_one_server() {
    const SIM_SECRET: &str = "whsec_plain_sim_0123456789";
    let database = TestDatabase::new(Backend::Sqlite).await;
    let (sim_listen, stripe_listen, adyen_listen) = (
        format!("127.0.0.1:{}", free_port()),
        format!("127.0.0.1:{}", free_port()),
        format!("127.0.0.1:{}", free_port()),
    );
    let providers = format!(
        "sim=sim:http://{sim_listen},stripe=stripe:http://{stripe_listen},adyen=adyen:http://{adyen_listen}"
    );
    let mut env = provider_env("ADYEN");
    env.extend([
        (
            "ASIENTO_PROVIDER_SIM_WEBHOOK_SECRET".to_owned(),
            SIM_SECRET.to_owned(),
        ),
        (
            "ASIENTO_PROVIDER_STRIPE_API_KEY".to_owned(),
            common::stripe::API_KEY.to_owned(),
        ),
        (
            "ASIENTO_PROVIDER_STRIPE_WEBHOOK_SECRET".to_owned(),
            common::stripe::WEBHOOK_SECRET.to_owned(),
        ),
    ]);
    let env: Vec<(&str, &str)> = env
        .iter()
        .map(|(key, value)| (key.as_str(), value.as_str()))
        .collect();
    // Platform fees of each provider's own: 3 %, 2.5 % + 30, 2 %.
    let server = Server::start_with_env(
        &database.url,
        &[
            "--providers",
            &providers,
            "--fees",
            "sim:300,stripe:250+30,adyen:200",
        ],
        &env,
    );
    let sim_webhooks = format!("{}/webhooks/sim", server.base);
    // The simulator's own fee is 1.5 %; Stripe's 2.9 % (and 1500 a dispute); Adyen's its schedule.
    let mut plain = Process::spawn(
        &[
            "psp-sim",
            "--listen",
            &sim_listen,
            "--seed",
            "3",
            "--fee-bps",
            "150",
            "--webhook-url",
            &sim_webhooks,
            "--webhook-secret",
            SIM_SECRET,
        ],
        &[],
    );
    plain.wait_for_line("psp-sim listening on ");
    let _stripe = start_stripe_sim(&stripe_listen, &server.base);
    let adyen = AdyenSim::start(adyen_listen.clone(), &server).await;
    let client = server.client();

    let body = |provider: &str, amount: i64| match provider {
        "sim" => {
            let mut body = payment_body(amount, "pm_card_ok");
            body["provider"] = json!("sim");
            body
        }
        "stripe" => stripe_payment(amount, "pm_card_visa"),
        _ => adyen_payment(amount, "pm_card_ok"),
    };
    // (provider, listen, platform fee of 10000, currency)
    let each = [
        ("sim", sim_listen.as_str(), 300, "USD"),
        ("stripe", stripe_listen.as_str(), 280, "USD"),
        ("adyen", adyen_listen.as_str(), 200, "EUR"),
    ];
    let mut refunded = Vec::new();
    let mut disputed = Vec::new();
    for (provider, listen, platform_fee, _) in each {
        let paid = create(
            &client,
            &format!("three-{provider}"),
            &body(provider, 10_000),
        )
        .await;
        assert_eq!(
            (
                paid["status"].as_str(),
                paid["provider"].as_str(),
                paid["fee_minor"].as_i64()
            ),
            (Some("captured"), Some(provider), Some(platform_fee)),
            "{paid}"
        );
        let id = id_of(&paid);
        let refund = client
            .post(
                &format!("/v1/payments/{id}/refunds"),
                &format!("three-{provider}-refund"),
                &json!({"amount_minor": 500}),
            )
            .await;
        assert!(
            matches!(refund.status, 201 | 202),
            "{provider}: {}",
            String::from_utf8_lossy(&refund.body)
        );
        refunded.push(id);

        let contested = create(
            &client,
            &format!("three-{provider}-disputed"),
            &body(provider, 6_000),
        )
        .await;
        let contested_id = id_of(&contested);
        let charge = common::stripe::sim_charges(&client, listen)
            .await
            .into_iter()
            .find(|charge| charge["reference"] == contested_id.as_str())
            .unwrap_or_else(|| panic!("{provider}: no charge for {contested_id}"));
        let charge = charge["id"].as_str().unwrap();
        sim_control(
            &client,
            listen,
            &format!("/sim/charges/{charge}/dispute"),
            json!({"amount_minor": 6_000}),
        )
        .await;
        sim_control(
            &client,
            listen,
            &format!("/sim/charges/{charge}/dispute/close"),
            json!({"outcome": "lost"}),
        )
        .await;
        disputed.push(contested_id);
    }
    for ((provider, ..), (id, contested)) in each.iter().zip(refunded.iter().zip(&disputed)) {
        let after = wait_for(&client, id, "the refund never settled", |p| {
            p["operations"][0]["state"] == "succeeded"
        })
        .await;
        assert_eq!(after["refunded_minor"], 500, "{provider}: {after}");
        let entries = entries_until(&client, id, 2).await;
        assert_eq!(
            moved(&entries, &format!("psp:{provider}:clearing")),
            500 - 10_000,
            "{provider}: {entries:#?}"
        );
        wait_for(
            &client,
            contested,
            "the lost dispute was never posted",
            |p| p["status"] == "disputed",
        )
        .await;
        // The capture, the withdrawal, the loss taken from the customer.
        let entries = entries_until(&client, contested, 3).await;
        assert_eq!(
            (
                moved(&entries, &format!("psp:{provider}:clearing")),
                moved(&entries, &format!("psp:{provider}:disputed")),
            ),
            (0, 0),
            "{provider}: {entries:#?}"
        );
    }
    let (authorisation, delivery) = adyen
        .item(
            "AUTHORISATION",
            &psp_of(&payment(&client, &refunded[2]).await),
        )
        .await;
    assert_accepted(&delivery);
    assert_eq!(authorisation["merchantReference"], refunded[2].as_str());

    // Every report: Stripe pays out, Adyen closes the day and a settlement batch.
    let stripe_payouts = sim_control(&client, &stripe_listen, "/sim/payouts", json!({})).await;
    assert_eq!(
        stripe_payouts["data"].as_array().map(Vec::len),
        Some(1),
        "{stripe_payouts}"
    );
    adyen.close_accounting_days(&client).await;
    let batches = adyen.close_settlement_batch(&client).await;
    assert_eq!(batches.len(), 1, "{batches:?}");
    assert_accepted(
        &adyen
            .item("REPORT_AVAILABLE", batches[0]["file"].as_str().unwrap())
            .await
            .1,
    );
    // Adyen's fees on its two captures; its payout is the two captures less the refund, the
    // chargeback and the fees.
    let adyen_fees = adyen_fee(10_000) + adyen_fee(6_000);
    let adyen_net = 10_000 + 6_000 - 500 - 6_000 - adyen_fees;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let now = (
            balance(&client, "psp:adyen:clearing").await,
            balance(&client, "bank:adyen:payouts").await,
            balance(&client, "expense:provider_fees:adyen").await,
        );
        if now == (0, -adyen_net, -adyen_fees) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "Adyen's payout: (clearing, bank, fees) = {now:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // One sweep over the three providers' reports, each with its own credentials.
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let (ok, output) = common::asiento_with_env(
        &[
            "reconcile",
            "--database-url",
            &database.url,
            "--providers",
            &providers,
            "--settle",
            "0s",
        ],
        &env,
    );
    assert!(ok, "reconcile failed: {output}");
    let open = client
        .get("/v1/reconciliation/exceptions?status=open")
        .await
        .json();
    let open = open.as_array().or(open["data"].as_array()).unwrap().clone();
    assert!(open.is_empty(), "nothing is left for a person: {open:#?}");

    // Each clearing account is what its provider owes by the payments' own views; zero where
    // the provider paid out, the payout in its bank account. Balances are projected, so polled.
    for (provider, _, _, currency) in each {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let mut views = Vec::new();
            for id in refunded.iter().chain(&disputed) {
                let view = payment(&client, id).await;
                if view["provider"] == provider {
                    views.push(view);
                }
            }
            let owed = owed_by_provider(&views);
            let mut balances = Vec::new();
            for account in [
                format!("psp:{provider}:clearing"),
                format!("bank:{provider}:payouts"),
            ] {
                let answer = client
                    .get(&format!(
                        "/v1/accounts/{account}/balance?currency={currency}"
                    ))
                    .await
                    .json();
                balances.push(answer["balance_minor"].as_i64().unwrap_or(0));
            }
            let expected = if provider == "sim" {
                vec![-owed, 0]
            } else {
                vec![0, -owed]
            };
            if balances == expected {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{provider}: (clearing, bank) = {balances:?}, expected {expected:?}: {views:#?}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    // Each provider's own fee on the 10000 capture: 1.5 %, 2.9 %, Adyen's schedule.
    for (id, fee) in refunded.iter().zip([150, 290, adyen_fee(10_000)]) {
        let view = payment(&client, id).await;
        let fees: Vec<i64> = view["provider_fees"]
            .as_array()
            .unwrap()
            .iter()
            .map(|fee| fee["fee_minor"].as_i64().unwrap())
            .collect();
        assert_eq!(fees, vec![fee], "{view}");
    }
    assert_eq!(
        owed_by_provider(&[
            payment(&client, &refunded[2]).await,
            payment(&client, &disputed[2]).await
        ]),
        adyen_net,
        "Adyen's fees are on its payments"
    );
    verify(&database);
}

/// A refund Adyen received and then refused (REFUND, success `"false"`: here the payment is under
/// a dispute the ledger has not heard of, since NOTIFICATION_OF_CHARGEBACK moves no money) is
/// refused: nothing is posted and its amount is refundable again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refund_adyen_refuses_after_receiving_it_is_refused_and_released() {
    let database = TestDatabase::new(Backend::Sqlite).await;
    let Rig { server, sim } = start_rig(&database, &[]).await;
    let client = server.client();
    let paid = create(&client, "refused-1", &adyen_payment(4_000, "pm_card_ok")).await;
    let (id, psp) = (id_of(&paid), psp_of(&paid));
    sim.control(&client, &format!("/sim/charges/{psp}/dispute"), json!({}))
        .await;
    assert_accepted(&sim.item("NOTIFICATION_OF_CHARGEBACK", &psp).await.1);
    let refund_psp = operation_received(
        &client,
        &format!("/v1/payments/{id}/refunds"),
        "refused-1-refund",
        &json!({"amount_minor": 4_000}),
    )
    .await;
    let (item, delivery) = sim.item("REFUND", &refund_psp).await;
    assert_accepted(&delivery);
    assert_eq!(
        (item["success"].as_str(), item["reason"].as_str()),
        (Some("false"), Some("Transaction is disputed"))
    );
    let refused = wait_for(&client, &id, "the refused REFUND was never applied", |p| {
        p["operations"][0]["state"] == "refused"
    })
    .await;
    assert_eq!(refused["refunded_minor"], 0, "{refused}");
    assert_eq!(refused["status"], "captured", "{refused}");
    assert_eq!(
        refused["operations"][0]["reason"], "Transaction is disputed",
        "{refused}"
    );
    assert_eq!(
        without_provider_fees(client.entries_of(&id).await).len(),
        1,
        "only the capture"
    );
    verify(&database);
}

/// Our payments' charges at the dialect, by their reference.
async fn charges_of(rig: &common::rig::Rig, id: &str) -> Vec<Value> {
    rig.charges()
        .await
        .into_iter()
        .filter(|charge| charge["reference"] == id)
        .collect()
}

/// Adyen has no lookup, so a creation whose answer was lost is sent again, identical, under its
/// key by the stale sweep from `--operation-timeout` while the payment is wanted: a request that
/// never arrived makes the one charge now, one whose answer was lost (the first still running:
/// 704, retried) gets the first outcome. Past `--pending-timeout` the payment is no longer
/// wanted: what its request made is cancelled by our reference; nothing can be read, so it stays
/// pending (it is concluded absent only two days of reports past its expiry). Every
/// notification is dropped and the report is out of reach: only the sweep decides.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_creation_answer_is_sent_again_and_past_expiry_cancelled_by_reference() {
    let database = TestDatabase::new(Backend::Sqlite).await;
    let rig = common::rig::Rig::start(
        &database,
        common::rig::Psp::Adyen,
        &[
            "--psp-timeout",
            "300ms",
            "--operation-timeout",
            "1s",
            "--pending-timeout",
            "8s",
            "--reconcile-interval",
            "300ms",
            "--report-settle",
            "1h",
        ],
    )
    .await;
    let client = rig.client();
    rig.drop_every_webhook().await;
    let pending = |key: &'static str, body: Value| {
        let client = client.clone();
        async move {
            let answer = client.post("/v1/payments", key, &body).await;
            assert_eq!(
                answer.status,
                202,
                "{}",
                String::from_utf8_lossy(&answer.body)
            );
            let payment = answer.json();
            assert_eq!(payment["status"], "pending", "{payment}");
            id_of(&payment)
        }
    };

    // Never arrived: Adyen unreachable for longer than the request's attempts.
    rig.sim("/faults", json!({"unreachable_ms": 3_000})).await;
    let unsent = pending("lost-unsent", adyen_payment(2_000, "pm_card_ok")).await;
    // Arrived, its answer lost: the dialect answers after the request gave up.
    let unanswered = pending("lost-answer", adyen_payment(3_000, "pm_card_timeout")).await;
    for id in [&unsent, &unanswered] {
        let captured = wait_for(&client, id, "the sweep never sent it again", |p| {
            p["status"] == "captured"
        })
        .await;
        assert_eq!(
            captured["provider_charge_id"].as_str().map(str::len),
            Some(16),
            "{captured}"
        );
        assert_eq!(charges_of(&rig, id).await.len(), 1, "one charge for {id}");
        assert_eq!(entries_until(&client, id, 1).await.len(), 1);
    }

    // Every answer lost from now on: the authorisation is made, never told; past its expiry it
    // is cancelled by our reference.
    rig.sim("/faults", json!({"timeout_rate": 1.0})).await;
    let mut manual = adyen_payment(4_000, "pm_card_ok");
    manual["capture"] = json!("manual");
    let unwanted = pending("lost-unwanted", manual).await;
    let deadline = Instant::now() + Duration::from_secs(60);
    let charge = loop {
        let charges = charges_of(&rig, &unwanted).await;
        assert_eq!(charges.len(), 1, "{charges:?}");
        if charges[0]["status"] == "failed" {
            break charges[0].clone();
        }
        assert!(
            Instant::now() < deadline,
            "the unwanted authorisation was never cancelled: {charges:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(charge["amount_captured"], 0, "{charge}");
    let after = payment(&client, &unwanted).await;
    assert_eq!(after["status"], "pending", "not yet known absent: {after}");
    assert_eq!(
        without_provider_fees(client.entries_of(&unwanted).await),
        Vec::<Value>::new()
    );
    verify(&database);
}

/// Adyen does not order its notifications: a CAPTURE_FAILED delivered before the CAPTURE it
/// reverses ends the payment as the two in order do, and the CAPTURE that follows changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_capture_failed_delivered_before_its_capture_ends_the_payment_the_same_way() {
    let database = TestDatabase::new(Backend::Sqlite).await;
    let Rig { server, sim } = start_rig(&database, &[]).await;
    let client = server.client();
    let held = authorized_for_capture(&client, "failed-first-1", "pm_card_ok").await;
    let (id, psp) = (id_of(&held), psp_of(&held));
    assert_accepted(&sim.item("AUTHORISATION", &psp).await.1);
    // The dialect's CAPTURE waits long enough that the hand-made CAPTURE_FAILED is applied first.
    sim.control(&client, "/sim/faults", json!({"webhook_delay_ms": 5_000}))
        .await;
    let capture_psp = capture_asked(&client, &id, "failed-first-1-capture").await;
    let payment_id = asiento_domain::PaymentId::parse(&id).unwrap();
    let mut failed = signed_item(
        "CAPTURE_FAILED",
        &capture_psp,
        Some(&psp),
        &asiento_domain::psp_capture_key(payment_id, 1),
        4_000,
    );
    failed.reason = Some("Capture rejected by the scheme".to_owned());
    // The reason is not signed, so the item's signature still holds.
    let right = basic(WEBHOOK_USER, WEBHOOK_PASSWORD);
    let (status, body) = deliver(&client, "adyen", Some(&right), batch(&[failed])).await;
    assert_eq!((status, body.as_str()), (200, "[accepted]"));
    let reversed = capture_reversed(&client, &id).await;
    assert!(
        sim.items()
            .iter()
            .all(|(item, _)| item["eventCode"] != "CAPTURE"),
        "the CAPTURE came first, so the order under test did not happen"
    );

    // The CAPTURE, late: the worker finishes it (the third item, after the AUTHORISATION and the
    // CAPTURE_FAILED) and the payment stays as it is.
    assert_accepted(&sim.item("CAPTURE", &capture_psp).await.1);
    let deadline = Instant::now() + Duration::from_secs(30);
    while client
        .metric("asiento_webhook_events_processed_total")
        .await
        < 3.0
    {
        assert!(
            Instant::now() < deadline,
            "the late CAPTURE was never processed"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(payment(&client, &id).await, reversed);
    assert_capture_mirrored(&client, &id).await;
    verify(&database);
}

/// A capture that succeeded and then failed at the scheme (CAPTURE_FAILED) is reversed by a
/// mirror of its entry, and the payment fails with Adyen's reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_capture_that_fails_after_it_succeeded_is_reversed_and_the_payment_fails() {
    let database = TestDatabase::new(Backend::Sqlite).await;
    let Rig { server, sim } = start_rig(&database, &[]).await;
    let client = server.client();
    let held = authorized_for_capture(&client, "capture-fails-1", "pm_capture_fails").await;
    let id = id_of(&held);
    let capture_psp = capture_asked(&client, &id, "capture-fails-1-capture").await;
    assert_accepted(&sim.item("CAPTURE", &capture_psp).await.1);
    let (failed, delivery) = sim.item("CAPTURE_FAILED", &capture_psp).await;
    assert_accepted(&delivery);
    assert_eq!(failed["amount"]["value"], 4_000);
    capture_reversed(&client, &id).await;
    assert_capture_mirrored(&client, &id).await;
    verify(&database);
}

/// A payment of 4,000 with `method`, authorized for a manual capture.
async fn authorized_for_capture(client: &Client, key: &str, method: &str) -> Value {
    let mut manual = adyen_payment(4_000, method);
    manual["capture"] = json!("manual");
    let held = create(client, key, &manual).await;
    assert_eq!(held["status"], "authorized", "{held}");
    held
}

/// Asks for the capture of payment `id` under `key`: the capture's pspReference.
async fn capture_asked(client: &Client, id: &str, key: &str) -> String {
    operation_received(
        client,
        &format!("/v1/payments/{id}/capture"),
        key,
        &json!({}),
    )
    .await
}

/// Waits for payment `id` to fail by its capture's reversal, with nothing captured and no fee
/// kept: the payment then.
async fn capture_reversed(client: &Client, id: &str) -> Value {
    let reversed = wait_for(client, id, "the CAPTURE_FAILED was never applied", |p| {
        p["status"] == "failed"
    })
    .await;
    assert_eq!(reversed["operations"][0]["state"], "reversed", "{reversed}");
    assert_eq!(reversed["captured_minor"], 0, "{reversed}");
    assert_eq!(reversed["fee_minor"], 0, "{reversed}");
    reversed
}

/// The entries of a payment of 4,000 whose capture was reversed: the authorisation's hold, the
/// capture, then the hold's release and the capture's mirror (in either order), which together
/// move nothing.
async fn assert_capture_mirrored(client: &Client, id: &str) {
    let entries = entries_until(client, id, 4).await;
    assert!(
        entries[2..]
            .iter()
            .any(|entry| moved(std::slice::from_ref(entry), "psp:adyen:clearing") == 4_000),
        "no mirror of the capture: {entries:#?}"
    );
    for account in [
        "psp:adyen:clearing",
        "customer:42:available",
        "revenue:fees",
    ] {
        assert_eq!(moved(&entries, account), 0, "{account}: {entries:#?}");
    }
}

/// Posts one signed item, in a batch of its own, with the configured basic credentials.
async fn deliver_one(client: &Client, item: asiento_psp::adyen::wire::NotificationItem) {
    let right = basic(WEBHOOK_USER, WEBHOOK_PASSWORD);
    let (status, body) = deliver(client, "adyen", Some(&right), batch(&[item])).await;
    assert_eq!((status, body.as_str()), (200, "[accepted]"));
}

/// Waits until the worker has processed every item the dialect delivered (each stored once, by
/// `pspReference:eventCode:success`) and the `by_hand` items posted by the test.
async fn processed(client: &Client, sim: &AdyenSim, by_hand: usize) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let sent: std::collections::HashSet<String> = sim
            .items()
            .iter()
            .map(|(item, _)| {
                format!(
                    "{}:{}:{}",
                    item["pspReference"], item["eventCode"], item["success"]
                )
            })
            .collect();
        let wanted = (sent.len() + by_hand) as f64;
        let done = client
            .metric("asiento_webhook_events_processed_total")
            .await;
        if done >= wanted {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{done} of {wanted} webhook events processed"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits for payment `id` (captured at once for `amount`) to end as a dispute lost again after
/// a win, with `count` entries: what the provider withdrew twice and gave back once came from the
/// customer in the end, nothing stays in `psp:adyen:disputed`, and no one is asked to look.
async fn assert_lost_again(client: &Client, id: &str, amount: i64, count: usize) {
    let lost = wait_for(client, id, "the second chargeback was never posted", |p| {
        p["status"] == "disputed"
    })
    .await;
    assert_eq!(lost["needs_review"], false, "{lost}");
    let entries = entries_until(client, id, count).await;
    assert_eq!(
        (
            moved(&entries[1..], "psp:adyen:clearing"),
            moved(&entries[1..], "psp:adyen:disputed"),
            moved(&entries[1..], "customer:42:available")
        ),
        (amount, 0, -amount),
        "{entries:#?}"
    );
}

/// A dispute lost, reinstated and lost again (Adyen's CHARGEBACK, CHARGEBACK_REVERSED and
/// SECOND_CHARGEBACK), its later two items shaped as Adyen's examples are (no
/// `originalReference`: the dispute named by its own pspReference, the payment by our
/// reference): in any order the items arrive, the second loss withdraws the money again and the
/// payment ends as a lost dispute; so too as the dialect sends them (a dispute won, then a
/// second chargeback) when asked for that shape.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dispute_lost_reinstated_and_lost_again_is_posted_in_any_order() {
    let database = TestDatabase::new(Backend::Sqlite).await;
    let Rig { server, sim } = start_rig(&database, &[]).await;
    let client = server.client();

    // By hand, one payment per order, each item applied before the next is delivered. The
    // entries after all three: the capture, the withdrawal, then (in order) the loss, its
    // reinstatement and the second loss, or (a later stage first, which implies the ones
    // before it) the reinstatement and the second loss.
    let orders: [([usize; 3], usize); 3] = [([0, 1, 2], 5), ([2, 1, 0], 4), ([1, 2, 0], 4)];
    let mut by_hand = 0;
    for (n, (order, count)) in orders.into_iter().enumerate() {
        let paid = create(
            &client,
            &format!("lost-again-{n}"),
            &adyen_payment(5_000, "pm_card_ok"),
        )
        .await;
        let (id, psp) = (id_of(&paid), psp_of(&paid));
        let dispute = format!("DISPUTE{n:09}");
        let mut chargeback = signed_item("CHARGEBACK", &dispute, Some(&psp), &id, 5_000);
        // Not signed: the item's signature still holds.
        chargeback
            .additional_data
            .insert("disputeStatus".to_owned(), "Lost".to_owned());
        let items = [
            chargeback,
            signed_item("CHARGEBACK_REVERSED", &dispute, None, &id, 5_000),
            signed_item("SECOND_CHARGEBACK", &dispute, None, &id, 5_000),
        ];
        for index in order {
            deliver_one(&client, items[index].clone()).await;
            by_hand += 1;
            processed(&client, &sim, by_hand).await;
        }
        assert_lost_again(&client, &id, 5_000, count).await;
    }

    // The dialect's own items, in its order.
    sim.control(
        &client,
        "/sim/faults",
        json!({"dispute_items_as_adyen_examples": true}),
    )
    .await;
    let paid = create(
        &client,
        "lost-again-dialect",
        &adyen_payment(8_000, "pm_card_ok"),
    )
    .await;
    let (id, psp) = (id_of(&paid), psp_of(&paid));
    sim.control(&client, &format!("/sim/charges/{psp}/dispute"), json!({}))
        .await;
    sim.control(
        &client,
        &format!("/sim/charges/{psp}/dispute/close"),
        json!({"outcome": "won"}),
    )
    .await;
    let (chargeback, delivery) = sim.item("CHARGEBACK", &psp).await;
    assert_accepted(&delivery);
    let dispute = chargeback["pspReference"].as_str().unwrap().to_owned();
    let (reversed, delivery) = sim.item("CHARGEBACK_REVERSED", &dispute).await;
    assert_accepted(&delivery);
    assert!(reversed.get("originalReference").is_none(), "{reversed}");
    assert_eq!(reversed["merchantReference"], id.as_str());
    // The capture, the withdrawal and its reinstatement.
    let entries = entries_until(&client, &id, 3).await;
    assert_eq!(
        moved(&entries[1..], "psp:adyen:clearing"),
        0,
        "{entries:#?}"
    );
    sim.control(
        &client,
        &format!("/sim/charges/{psp}/dispute/second_chargeback"),
        json!({}),
    )
    .await;
    let (again, delivery) = sim.item("SECOND_CHARGEBACK", &dispute).await;
    assert_accepted(&delivery);
    assert!(again.get("originalReference").is_none(), "{again}");
    assert_lost_again(&client, &id, 8_000, 4).await;
    verify(&database);
}

/// Adyen does not order notifications: an EXPIRE or a CANCELLATION (shaped as Adyen's examples:
/// EXPIRE names the payment by its own pspReference) delivered before the CAPTURE of a capture
/// Adyen had received leaves the payment authorized, and the CAPTURE that follows posts the
/// capture as the natural order does. A partial capture whose remainder expires (EXPIRE after
/// the CAPTURE) stays captured and is not flagged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_authorisation_ended_before_its_capture_still_posts_the_capture() {
    let database = TestDatabase::new(Backend::Sqlite).await;
    let Rig { server, sim } = start_rig(&database, &[]).await;
    let client = server.client();
    let expiring = authorized_for_capture(&client, "ended-first-1", "pm_card_ok").await;
    let cancelled = authorized_for_capture(&client, "ended-first-2", "pm_card_ok").await;
    for held in [&expiring, &cancelled] {
        assert_accepted(&sim.item("AUTHORISATION", &psp_of(held)).await.1);
    }
    processed(&client, &sim, 0).await;
    // The dialect's CAPTUREs wait long enough that the hand-made ends are applied first.
    sim.control(&client, "/sim/faults", json!({"webhook_delay_ms": 5_000}))
        .await;
    let mut by_hand = 0;
    let mut captures = Vec::new();
    for (n, (held, code)) in [(&expiring, "EXPIRE"), (&cancelled, "CANCELLATION")]
        .into_iter()
        .enumerate()
    {
        let (id, psp) = (id_of(held), psp_of(held));
        let capture_psp = capture_asked(&client, &id, &format!("ended-first-{n}-capture")).await;
        let ended = match code {
            "EXPIRE" => signed_item("EXPIRE", &psp, None, &id, 4_000),
            _ => signed_item(
                "CANCELLATION",
                &format!("CANCEL{n:010}"),
                Some(&psp),
                &id,
                4_000,
            ),
        };
        deliver_one(&client, ended).await;
        by_hand += 1;
        processed(&client, &sim, by_hand).await;
        assert!(
            sim.items()
                .iter()
                .all(|(item, _)| item["eventCode"] != "CAPTURE"),
            "the CAPTURE came first, so the order under test did not happen"
        );
        let waiting = payment(&client, &id).await;
        assert_eq!(waiting["status"], "authorized", "{code}: {waiting}");
        captures.push((id, capture_psp));
    }
    for (id, capture_psp) in &captures {
        assert_accepted(&sim.item("CAPTURE", capture_psp).await.1);
        let captured = wait_for(
            &client,
            id,
            "the capture after the end was never posted",
            |p| p["status"] == "captured",
        )
        .await;
        assert_eq!(captured["captured_minor"], 4_000, "{captured}");
        assert_eq!(captured["needs_review"], false, "{captured}");
        // The authorisation's hold, the capture and the hold's release.
        let entries = entries_until(&client, id, 3).await;
        assert_eq!(
            moved(&entries, "psp:adyen:clearing"),
            -4_000,
            "{entries:#?}"
        );
    }

    sim.control(&client, "/sim/faults", json!({"webhook_delay_ms": 0}))
        .await;
    let partial = authorized_for_capture(&client, "remainder-1", "pm_card_ok").await;
    let (id, psp) = (id_of(&partial), psp_of(&partial));
    let capture_psp = operation_received(
        &client,
        &format!("/v1/payments/{id}/capture"),
        "remainder-1-capture",
        &json!({"amount_minor": 2_500}),
    )
    .await;
    assert_accepted(&sim.item("CAPTURE", &capture_psp).await.1);
    let captured = wait_for(&client, &id, "the partial capture was never posted", |p| {
        p["status"] == "captured"
    })
    .await;
    assert_eq!(captured["captured_minor"], 2_500, "{captured}");
    deliver_one(&client, signed_item("EXPIRE", &psp, None, &id, 1_500)).await;
    by_hand += 1;
    processed(&client, &sim, by_hand).await;
    let after = payment(&client, &id).await;
    assert_eq!(
        (
            &after["status"],
            &after["captured_minor"],
            &after["needs_review"]
        ),
        (&json!("captured"), &json!(2_500), &json!(false)),
        "{after}"
    );
    entries_until(&client, &id, 3).await;
    verify(&database);
}
