//! Stripe's payouts in the ledger, black box, on both backends: the real binary with a Stripe
//! provider against `asiento psp-sim --dialect stripe`, `asiento verify` holding after each step:
//! - a payout paid (`payout.paid`) moves what it covered, net of Stripe's fees and refunds, from
//!   `psp:stripe:clearing` to `bank:stripe:payouts`: the clearing account is back at zero;
//! - the same payout failing after it was paid (`payout.failed`) puts it back in clearing;
//! - the next payout pays the failed one's money out again with what came in since;
//! - a dispute's withdrawal, taken from clearing as it opens, is in the payout that follows, and
//!   its reinstatement, once won, in the next one;
//! - with every webhook lost, the reconciliation sweep finds the payout in its report window and
//!   posts it.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::{Duration, Instant};

use common::stripe::{balance, captured, sim_charges, sim_control, sim_faults, start_rig};
use common::{verify, wait_for, Backend, Client, TestDatabase};
use serde_json::{json, Value};

/// Waits until clearing and the bank account hold `clearing` and `bank`.
async fn wait_balances(client: &Client, clearing: i64, bank: i64, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let now = (
            balance(client, "psp:stripe:clearing").await,
            balance(client, "bank:stripe:payouts").await,
        );
        if now == (clearing, bank) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: (clearing, bank) = {now:?}, expected {:?}",
            (clearing, bank)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn pay_out(client: &Client, sim_listen: &str) -> Value {
    let made = sim_control(client, sim_listen, "/sim/payouts", json!({})).await;
    let payouts = made["data"].as_array().unwrap();
    assert_eq!(payouts.len(), 1, "one currency, one payout: {made}");
    payouts[0].clone()
}

async fn payouts_reach_the_bank_account(backend: Backend) {
    let database = TestDatabase::new(backend).await;
    let rig = start_rig(
        &database,
        &["--psp-timeout", "500ms", "--reconcile-interval", "300ms"],
    );
    let client = rig.server.client();
    let sim = rig.sim_listen.clone();

    // 10000 less Stripe's 2.9 % (290), and 4000 less 116 with 1500 refunded.
    captured(&client, "po-1", 10_000).await;
    let refunded = captured(&client, "po-2", 4_000).await;
    let refund = client
        .post(
            &format!("/v1/payments/{refunded}/refunds"),
            "po-2-refund",
            &json!({"amount_minor": 1_500}),
        )
        .await;
    assert_eq!(
        refund.status,
        201,
        "{}",
        String::from_utf8_lossy(&refund.body)
    );
    let owed = (10_000 - 290) + (4_000 - 116 - 1_500);
    wait_balances(&client, -owed, 0, "before any payout").await;

    let payout = pay_out(&client, &sim).await;
    assert_eq!(payout["amount"], owed, "{payout}");
    wait_balances(&client, 0, -owed, "after the payout").await;
    verify(&database);

    // The bank returns it: the money is Stripe's to pay again, so it is owed to us again.
    let id = payout["id"].as_str().unwrap();
    sim_control(&client, &sim, &format!("/sim/payouts/{id}/fail"), json!({})).await;
    wait_balances(&client, -owed, 0, "after the payout failed").await;
    verify(&database);

    // The next payout covers the failed one's return and what came in since.
    captured(&client, "po-3", 2_000).await;
    let again = pay_out(&client, &sim).await;
    let owed = owed + (2_000 - 58);
    assert_eq!(again["amount"], owed, "{again}");
    wait_balances(&client, 0, -owed, "after the second payout").await;
    verify(&database);

    // A dispute: Stripe withdraws its amount (and a 1500 fee) as it opens, so the payout that
    // follows pays out less, and the clearing account, which took the withdrawal, is at zero
    // again. Won, the amount comes back and is paid out with the next payout.
    captured(&client, "po-4", 20_000).await;
    let disputed = captured(&client, "po-5", 2_000).await;
    let charge = sim_charges(&client, &sim)
        .await
        .into_iter()
        .find(|charge| charge["reference"] == disputed.as_str())
        .and_then(|charge| charge["id"].as_str().map(str::to_owned))
        .unwrap();
    sim_control(
        &client,
        &sim,
        &format!("/sim/charges/{charge}/dispute"),
        json!({}),
    )
    .await;
    wait_for(&client, &disputed, "the dispute never opened", |p| {
        p["status"] == "disputed" && p["provider_fees"].as_array().is_some_and(|f| f.len() == 2)
    })
    .await;
    assert_eq!(balance(&client, "psp:stripe:disputed").await, -2_000);
    let third = pay_out(&client, &sim).await;
    let net = (20_000 - 580) + (2_000 - 58 - 2_000 - 1_500);
    assert_eq!(third["amount"], net, "{third}");
    let owed = owed + net;
    wait_balances(&client, 0, -owed, "after a payout with an open dispute").await;
    verify(&database);
    sim_control(
        &client,
        &sim,
        &format!("/sim/charges/{charge}/dispute/close"),
        json!({"outcome": "won"}),
    )
    .await;
    wait_for(&client, &disputed, "the dispute was never won", |p| {
        p["status"] == "captured"
    })
    .await;
    assert_eq!(balance(&client, "psp:stripe:disputed").await, 0);
    wait_balances(&client, -2_000, -owed, "after the dispute was won").await;
    let fourth = pay_out(&client, &sim).await;
    assert_eq!(fourth["amount"], 2_000, "{fourth}");
    wait_balances(
        &client,
        0,
        -(owed + 2_000),
        "after the reinstatement was paid out",
    )
    .await;
    verify(&database);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn payouts_reach_the_bank_account_sqlite() {
    payouts_reach_the_bank_account(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn payouts_reach_the_bank_account_postgres() {
    payouts_reach_the_bank_account(Backend::Postgres).await;
}

/// Every webhook lost: the payments settle by the sweep, and so does the payout.
async fn a_payout_whose_webhooks_were_lost_is_posted_by_the_sweep(backend: Backend) {
    let database = TestDatabase::new(backend).await;
    let rig = start_rig(
        &database,
        &[
            "--psp-timeout",
            "500ms",
            "--reconcile-interval",
            "300ms",
            "--report-settle",
            "1s",
        ],
    );
    let client = rig.server.client();
    let sim = rig.sim_listen.clone();
    sim_faults(&client, &sim, json!({"webhook_drop_rate": 1.0})).await;

    captured(&client, "lost-1", 10_000).await;
    let payout = pay_out(&client, &sim).await;
    assert_eq!(payout["amount"], 9_710, "{payout}");
    wait_balances(&client, 0, -9_710, "the sweep never posted the payout").await;
    verify(&database);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_payout_whose_webhooks_were_lost_is_posted_by_the_sweep_sqlite() {
    a_payout_whose_webhooks_were_lost_is_posted_by_the_sweep(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_payout_whose_webhooks_were_lost_is_posted_by_the_sweep_postgres() {
    a_payout_whose_webhooks_were_lost_is_posted_by_the_sweep(Backend::Postgres).await;
}
