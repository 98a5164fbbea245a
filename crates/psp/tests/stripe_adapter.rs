//! The Stripe adapter against the simulator's Stripe dialect over real HTTP: what each answer
//! means in the port's terms, and that a lost answer re-sent under the same keys converges to
//! one PaymentIntent.
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeMap;

use asiento_psp::stripe::StripeProvider;
use asiento_psp::{
    ChargeOutcome, ChargeStatus, ClientConfig, CreateCharge, DisputeStatus, MovementKind,
    OperationStatus, PayoutStatus, Provider, ProviderError,
};
use asiento_psp_sim::Dialect;
use asiento_psp_sim::SimConfig;
use chrono::{Duration, Utc};

use common::{bounded, RunningSim};

async fn stripe_sim(hang_ms: u64) -> RunningSim {
    RunningSim::start(SimConfig {
        dialect: Dialect::Stripe,
        fee_bps: 290,
        hang_ms,
        ..SimConfig::default()
    })
    .await
}

fn adapter(sim: &RunningSim, request_timeout_ms: u64) -> StripeProvider {
    let config = ClientConfig {
        connect_timeout_ms: 500,
        request_timeout_ms,
        attempts_max: 3,
        backoff_base_ms: 5,
        backoff_max_ms: 20,
        ..ClientConfig::default()
    };
    StripeProvider::new("stripe", &sim.base, "sk_test_adapter", config).unwrap()
}

fn charge(key: &str, method: &str, capture: bool) -> CreateCharge {
    CreateCharge {
        idempotency_key: key.to_owned(),
        amount_minor: 1000,
        currency: "USD".to_owned(),
        payment_method: method.to_owned(),
        capture,
        reference: Some(format!("pay_{key}")),
        customer: None,
        metadata: BTreeMap::from([("order".to_owned(), "42".to_owned())]),
    }
}

#[tokio::test]
async fn a_captured_payment_is_a_succeeded_payment_intent_and_a_re_send_finds_the_same() {
    bounded(async {
        let sim = stripe_sim(30_000).await;
        let stripe = adapter(&sim, 2_000);
        let ChargeOutcome::Succeeded(first) = stripe
            .create_charge(&charge("k1", "pm_card_visa", true))
            .await
        else {
            panic!("a visa test card succeeds");
        };
        assert!(first.id.starts_with("pi_"), "{}", first.id);
        assert_eq!((first.amount_minor, first.amount_captured), (1000, 1000));
        assert_eq!(first.currency, "USD");
        assert_eq!(first.reference.as_deref(), Some("pay_k1"));
        assert_eq!(first.idempotency_key, "k1");
        assert_eq!(first.metadata.get("order").map(String::as_str), Some("42"));
        let ChargeOutcome::Succeeded(again) = stripe
            .create_charge(&charge("k1", "pm_card_visa", true))
            .await
        else {
            panic!("a re-send answers the same");
        };
        assert_eq!(again.id, first.id, "one PaymentIntent for one key");
        let read = stripe.get_charge(&first.id).await.unwrap().unwrap();
        assert_eq!(read.status, ChargeStatus::Succeeded);
        assert_eq!(stripe.get_charge("pi_missing").await.unwrap(), None);
        sim.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn an_authorisation_is_captured_in_part_and_refunded_as_operations() {
    bounded(async {
        let sim = stripe_sim(30_000).await;
        let stripe = adapter(&sim, 2_000);
        let ChargeOutcome::Authorized(authorized) = stripe
            .create_charge(&charge("k2", "pm_card_visa", false))
            .await
        else {
            panic!("manual capture authorizes");
        };
        let captured = stripe
            .capture(&authorized.id, Some(600), "USD", "k2:capture:1")
            .await
            .unwrap();
        assert_eq!(captured.operation.status, OperationStatus::Succeeded);
        assert_eq!(captured.operation.amount_minor, 600);
        assert_eq!(captured.operation.idempotency_key, "k2:capture:1");
        let read = stripe
            .get_operation(&captured.operation.id)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            read.idempotency_key, "k2:capture:1",
            "the capture key travels in metadata"
        );
        assert_eq!(read.status, OperationStatus::Succeeded);

        let refund = stripe
            .refund(&authorized.id, 250, "USD", "k2:refund:1")
            .await
            .unwrap();
        assert!(refund.operation.id.starts_with("re_"));
        assert_eq!(refund.operation.status, OperationStatus::Succeeded);
        assert_eq!(refund.operation.charge, authorized.id);
        let read = stripe
            .get_operation(&refund.operation.id)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            read.idempotency_key, "k2:refund:1",
            "the refund key travels in metadata"
        );
        assert_eq!(read.amount_minor, 250);

        let over = stripe
            .refund(&authorized.id, 351, "USD", "k2:refund:2")
            .await;
        let Err(ProviderError::Rejected(rejection)) = over else {
            panic!("a refund above what is left is refused: {over:?}");
        };
        assert_eq!(rejection.code, "amount_too_large");
        let charge = stripe.get_charge(&authorized.id).await.unwrap().unwrap();
        assert_eq!((charge.amount_captured, charge.amount_refunded), (600, 250));
        sim.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn declines_redirects_and_cancels_mean_what_they_say() {
    bounded(async {
        let sim = stripe_sim(30_000).await;
        let stripe = adapter(&sim, 2_000);
        let ChargeOutcome::Declined(declined) = stripe
            .create_charge(&charge("k3", "pm_card_chargeDeclined", true))
            .await
        else {
            panic!("a declining test card declines");
        };
        assert!(
            declined.id.starts_with("pi_"),
            "the 402 carries the PaymentIntent"
        );
        assert_eq!(declined.failure_code.as_deref(), Some("generic_decline"));

        let ChargeOutcome::RequiresAction(waiting) = stripe
            .create_charge(&charge("k4", "pm_card_authenticationRequired", true))
            .await
        else {
            panic!("3-D Secure waits for the customer");
        };
        let action = waiting.next_action.as_ref().expect("a redirect");
        assert!(
            action.redirect_url.contains("/authenticate"),
            "{}",
            action.redirect_url
        );
        let canceled = stripe.cancel(&waiting.id, "k4:cancel").await.unwrap();
        assert_eq!(canceled.operation.status, OperationStatus::Succeeded);
        let after = stripe.get_charge(&waiting.id).await.unwrap().unwrap();
        assert_eq!(after.status, ChargeStatus::Failed);
        assert_eq!(after.failure_code.as_deref(), Some("canceled"));
        sim.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn a_lost_confirm_answer_re_sent_under_the_same_keys_is_one_payment_intent() {
    bounded(async {
        // The confirmation of pm_card_timeout charges, then holds its answer 400 ms, past the
        // adapter's 150 ms: the outcome is unknown, never declined.
        let sim = stripe_sim(400).await;
        let stripe = adapter(&sim, 150);
        let lost = stripe
            .create_charge(&charge("k5", "pm_card_timeout", true))
            .await;
        assert!(matches!(lost, ChargeOutcome::Unknown { .. }), "{lost:?}");
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
        let ChargeOutcome::Succeeded(found) = stripe
            .create_charge(&charge("k5", "pm_card_timeout", true))
            .await
        else {
            panic!("the re-send replays the confirmation");
        };
        let charges = sim.sim.charges();
        assert_eq!(charges.len(), 1, "one charge at the provider: {charges:?}");
        assert_eq!(
            found.id.trim_start_matches("pi_"),
            charges[0].id.trim_start_matches("ch_")
        );
        sim.shutdown().await;
    })
    .await;
}

fn fees(fees: &[asiento_psp::ProviderFee]) -> Vec<i64> {
    fees.iter().map(|fee| fee.fee_minor).collect()
}

#[tokio::test]
async fn there_is_no_lookup_by_key_and_the_report_lists_the_window_with_fees() {
    bounded(async {
        let sim = stripe_sim(30_000).await;
        let stripe = adapter(&sim, 2_000);
        assert!(!stripe.capabilities().lookup_by_key);
        assert!(matches!(
            stripe.find_charge_by_key("k6").await,
            Err(ProviderError::Unsupported { .. })
        ));
        assert!(matches!(
            stripe.find_operation_by_key("k6").await,
            Err(ProviderError::Unsupported { .. })
        ));
        for n in 0..3 {
            let outcome = stripe
                .create_charge(&charge(&format!("r{n}"), "pm_card_visa", true))
                .await;
            let ChargeOutcome::Succeeded(charged) = outcome else {
                panic!("{outcome:?}");
            };
            assert_eq!(
                fees(&charged.provider_fees),
                [29],
                "the confirmation's answer carries the balance transaction's fee"
            );
        }
        let now = Utc::now();
        let report = stripe
            .settlement_report(now - Duration::minutes(5), now + Duration::minutes(5))
            .await
            .unwrap()
            .data;
        assert_eq!(report.len(), 3);
        for line in &report {
            assert_eq!(line.amount_captured, 1000);
            assert_eq!(
                fees(&line.provider_fees),
                [29],
                "2.9 % from the balance transaction"
            );
            assert!(line.provider_fees[0].transaction_id.starts_with("txn_"));
            assert!(line
                .reference
                .as_deref()
                .is_some_and(|r| r.starts_with("pay_r")));
        }
        let earlier = stripe
            .settlement_report(now - Duration::hours(2), now - Duration::hours(1))
            .await
            .unwrap()
            .data;
        assert!(earlier.is_empty());
        sim.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn captures_and_refunds_decided_later_are_pending_for_the_amount_asked() {
    bounded(async {
        let sim = stripe_sim(30_000).await;
        sim.sim
            .set_faults(
                &serde_json::from_value(serde_json::json!({
                    "async_modifications": true,
                    "async_delay_ms": 200
                }))
                .unwrap(),
            )
            .unwrap();
        let stripe = adapter(&sim, 2_000);
        let ChargeOutcome::Authorized(authorized) = stripe
            .create_charge(&charge("k7", "pm_card_visa", false))
            .await
        else {
            panic!("manual capture authorizes");
        };
        let pending = stripe
            .capture(&authorized.id, Some(700), "USD", "k7:capture")
            .await
            .unwrap();
        assert_eq!(pending.operation.status, OperationStatus::Pending);
        assert_eq!(
            pending.operation.amount_minor, 700,
            "the amount asked, not 0 received"
        );
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        let decided = loop {
            let read = stripe
                .get_operation(&pending.operation.id)
                .await
                .unwrap()
                .unwrap();
            if read.status != OperationStatus::Pending {
                break read;
            }
            assert!(std::time::Instant::now() < deadline, "never decided");
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        };
        assert_eq!(
            (decided.status, decided.amount_minor),
            (OperationStatus::Succeeded, 700)
        );
        let refund = stripe
            .refund(&authorized.id, 300, "USD", "k7:refund")
            .await
            .unwrap();
        assert_eq!(
            (refund.operation.status, refund.operation.amount_minor),
            (OperationStatus::Pending, 300)
        );
        sim.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn a_dispute_is_read_with_the_payment_intent_until_it_is_lost() {
    bounded(async {
        let sim = stripe_sim(30_000).await;
        let stripe = adapter(&sim, 2_000);
        let ChargeOutcome::Succeeded(paid) = stripe
            .create_charge(&charge("k8", "pm_card_visa", true))
            .await
        else {
            panic!("a visa test card succeeds");
        };
        let charge_id = format!("ch_{}", paid.id.trim_start_matches("pi_"));
        let control = |path: String, body: serde_json::Value| {
            let url = format!("{}/sim/charges/{charge_id}/{path}", sim.base);
            async move {
                let answer = reqwest::Client::new()
                    .post(url)
                    .json(&body)
                    .send()
                    .await
                    .unwrap();
                assert!(
                    answer.status().is_success(),
                    "{}",
                    answer.text().await.unwrap()
                );
            }
        };
        assert_eq!(
            stripe.get_charge(&paid.id).await.unwrap().unwrap().dispute,
            None
        );
        control(
            "dispute".to_owned(),
            serde_json::json!({"amount_minor": 400}),
        )
        .await;
        let open = stripe.get_charge(&paid.id).await.unwrap().unwrap();
        let dispute = open.dispute.expect("the charge's dispute comes with it");
        assert_eq!(
            (dispute.status, dispute.amount_minor),
            (DisputeStatus::Open, 400)
        );
        control(
            "dispute/close".to_owned(),
            serde_json::json!({"outcome": "lost"}),
        )
        .await;
        let lost = stripe.get_charge(&paid.id).await.unwrap().unwrap();
        let closed = lost.dispute.expect("still there");
        assert_eq!(closed.status, DisputeStatus::Lost);
        assert_eq!(
            closed.created, dispute.created,
            "one dispute, named alike by every read"
        );
        let now = Utc::now();
        let report = stripe
            .settlement_report(now - Duration::minutes(5), now + Duration::minutes(5))
            .await
            .unwrap()
            .data;
        assert_eq!(report[0].dispute_status, Some(DisputeStatus::Lost));
        sim.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn an_event_is_read_as_the_objects_it_names_stand_now() {
    bounded(async {
        let sim = stripe_sim(30_000).await;
        let stripe = adapter(&sim, 2_000);
        let ChargeOutcome::Succeeded(paid) = stripe.create_charge(&charge("k9", "pm_card_visa", true)).await else {
            panic!("a visa test card succeeds");
        };
        let event = |kind: &str, object: serde_json::Value| {
            serde_json::to_vec(&serde_json::json!({
                "id": "evt_1", "object": "event", "type": kind, "created": 1_700_000_000,
                "data": {"object": object},
            }))
            .unwrap()
        };
        // The object in the event is stale (requires_capture); the read says what it is now.
        let body = event(
            "payment_intent.amount_capturable_updated",
            serde_json::json!({"id": paid.id, "object": "payment_intent", "status": "requires_capture"}),
        );
        let read = stripe.read_event(&body).await.unwrap().expect("ours");
        assert_eq!(read.id, "evt_1");
        assert_eq!(read.data.charge.as_ref().unwrap().status, ChargeStatus::Succeeded);
        assert_eq!(read.data.charge.as_ref().unwrap().reference.as_deref(), Some("pay_k9"));

        let refund = stripe.refund(&paid.id, 100, "USD", "k9:refund").await.unwrap();
        let body = event(
            "refund.updated",
            serde_json::json!({"id": refund.operation.id, "object": "refund"}),
        );
        let read = stripe.read_event(&body).await.unwrap().expect("ours");
        let operation = read.data.operation.expect("a refund's event names the refund");
        assert_eq!((operation.status, operation.idempotency_key.as_str()), (OperationStatus::Succeeded, "k9:refund"));
        assert_eq!(read.data.charge.as_ref().unwrap().amount_refunded, 100);

        // A type the ledger does not use, and a PaymentIntent asiento did not create, are ignored.
        let unused = event("customer.created", serde_json::json!({"id": "cus_1"}));
        assert_eq!(stripe.read_event(&unused).await.unwrap(), None);
        // A payout's event names no charge: it is read as the payout it names.
        let payout = event(
            "payout.paid",
            serde_json::json!({"id": "po_1", "object": "payout", "amount": 100, "status": "paid"}),
        );
        assert_eq!(stripe.read_event(&payout).await.unwrap(), None);
        assert_eq!(stripe.payout_of_event(&payout).as_deref(), Some("po_1"));
        assert_eq!(stripe.payout_of_event(&body), None);
        let foreign = reqwest::Client::new()
            .post(format!("{}/v1/payment_intents", sim.base))
            .bearer_auth("sk_test_other")
            .form(&[("amount", "300"), ("currency", "usd"), ("payment_method_types[0]", "card")])
            .send()
            .await
            .unwrap()
            .json::<serde_json::Value>()
            .await
            .unwrap();
        let body = event("payment_intent.created", foreign.clone());
        assert_eq!(stripe.read_event(&body).await.unwrap(), None, "an unused type");
        let body = event("payment_intent.canceled", foreign);
        assert_eq!(stripe.read_event(&body).await.unwrap(), None, "not ours");

        // A body that is no event is a protocol error (dead-lettered), not a retry.
        assert!(matches!(
            stripe.read_event(b"{\"nope\": 1}").await,
            Err(ProviderError::Protocol { .. })
        ));
        sim.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn a_refund_or_a_dispute_on_an_earlier_payment_intent_is_in_the_window_it_happened_in() {
    bounded(async {
        let sim = stripe_sim(30_000).await;
        let stripe = adapter(&sim, 2_000);
        let mut charged = Vec::new();
        for key in ["w1", "w2", "w3"] {
            let outcome = stripe
                .create_charge(&charge(key, "pm_card_visa", true))
                .await;
            let ChargeOutcome::Succeeded(charge) = outcome else {
                panic!("{outcome:?}");
            };
            charged.push(charge.id);
        }
        // Stripe's times are in seconds: the window starts after the PaymentIntents were made.
        tokio::time::sleep(std::time::Duration::from_millis(1_100)).await;
        let later = Utc::now();
        stripe
            .refund(&charged[0], 400, "USD", "w1-refund")
            .await
            .unwrap();
        let disputed_charge = charged[1].replacen("pi_", "ch_", 1);
        let answer = reqwest::Client::new()
            .post(format!(
                "{}/sim/charges/{disputed_charge}/dispute",
                sim.base
            ))
            .body("{}")
            .send()
            .await
            .unwrap();
        assert!(answer.status().is_success());

        let report = stripe
            .settlement_report(later, later + Duration::minutes(5))
            .await
            .unwrap()
            .data;
        let mut ids: Vec<&str> = report.iter().map(|line| line.charge_id.as_str()).collect();
        ids.sort_unstable();
        assert_eq!(
            ids,
            [charged[0].as_str(), charged[1].as_str()],
            "the untouched PaymentIntent is in no later window"
        );
        let refunded = report
            .iter()
            .find(|line| line.charge_id == charged[0])
            .unwrap();
        assert_eq!(refunded.amount_refunded, 400);
        assert_eq!(fees(&refunded.provider_fees), [29]);
        // Each line carries the window's balance transactions of its PaymentIntent.
        let moved = |line: &asiento_psp::ReportLine| -> Vec<(MovementKind, i64, i64, i64)> {
            line.movements
                .iter()
                .map(|m| (m.kind, m.amount_minor, m.fee_minor, m.net_minor))
                .collect()
        };
        assert_eq!(moved(refunded), [(MovementKind::Refund, -400, 0, -400)]);
        assert!(refunded.movements[0].source.starts_with("re_"));
        let disputed = report
            .iter()
            .find(|line| line.charge_id == charged[1])
            .unwrap();
        assert_eq!(
            disputed.dispute.as_ref().map(|dispute| dispute.status),
            Some(DisputeStatus::Open)
        );
        assert_eq!(
            fees(&disputed.provider_fees),
            [29, 1_500],
            "the charge's fee and the dispute fee of its withdrawal"
        );
        assert_eq!(
            moved(disputed),
            [(MovementKind::DisputeWithdrawal, -1_000, 1_500, -2_500)]
        );
        let read = stripe.get_charge(&charged[1]).await.unwrap().unwrap();
        assert_eq!(read.provider_fees, disputed.provider_fees);
        sim.shutdown().await;
    })
    .await;
}

async fn sim_post(sim: &RunningSim, path: &str) -> serde_json::Value {
    let answer = reqwest::Client::new()
        .post(format!("{}{path}", sim.base))
        .body("{}")
        .send()
        .await
        .unwrap();
    assert!(answer.status().is_success(), "{path}");
    answer.json().await.unwrap()
}

#[tokio::test]
async fn a_payout_is_read_with_every_transaction_it_covered_and_the_charges_they_moved() {
    bounded(async {
        let sim = stripe_sim(30_000).await;
        let stripe = adapter(&sim, 2_000);
        let mut charged = Vec::new();
        for key in ["p1", "p2"] {
            let ChargeOutcome::Succeeded(paid) = stripe
                .create_charge(&charge(key, "pm_card_visa", true))
                .await
            else {
                panic!("a visa test card succeeds");
            };
            charged.push(paid.id);
        }
        stripe
            .refund(&charged[1], 300, "USD", "p2-refund")
            .await
            .unwrap();
        let made = sim_post(&sim, "/sim/payouts").await;
        let id = made["data"][0]["id"].as_str().unwrap().to_owned();

        let payout = stripe.get_payout(&id).await.unwrap().expect("made");
        assert_eq!(payout.status, PayoutStatus::Paid);
        assert_eq!(payout.currency, "USD");
        // 1000 less 29 each, one of them refunded 300.
        assert_eq!(payout.amount_minor, 2 * 971 - 300);
        let mut covered: Vec<(&str, i64, Option<&str>)> = payout
            .transactions
            .iter()
            .map(|txn| (txn.kind.as_str(), txn.net_minor, txn.charge_id.as_deref()))
            .collect();
        covered.sort_unstable();
        assert_eq!(
            covered,
            [
                ("charge", 971, Some(charged[0].as_str())),
                ("charge", 971, Some(charged[1].as_str())),
                ("refund", -300, Some(charged[1].as_str())),
            ]
        );
        let mut charges: Vec<(&str, Option<&str>)> = payout
            .charges
            .iter()
            .map(|charge| (charge.id.as_str(), charge.reference.as_deref()))
            .collect();
        charges.sort_unstable();
        assert_eq!(
            charges,
            [
                (charged[0].as_str(), Some("pay_p1")),
                (charged[1].as_str(), Some("pay_p2"))
            ]
        );

        // Failed after it was paid: read as failed, with nothing covered.
        sim_post(&sim, &format!("/sim/payouts/{id}/fail")).await;
        let failed = stripe.get_payout(&id).await.unwrap().unwrap();
        assert_eq!(failed.status, PayoutStatus::Failed);
        assert_eq!(failed.failure_code.as_deref(), Some("account_closed"));
        assert!(failed.transactions.is_empty());

        // The next one pays the return out again: read as what the failed one covered.
        let again = sim_post(&sim, "/sim/payouts").await;
        let again = stripe
            .get_payout(again["data"][0]["id"].as_str().unwrap())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(again.amount_minor, payout.amount_minor);
        let mut ids: Vec<&str> = again.transactions.iter().map(|t| t.id.as_str()).collect();
        let mut first: Vec<&str> = payout.transactions.iter().map(|t| t.id.as_str()).collect();
        ids.sort_unstable();
        first.sort_unstable();
        assert_eq!(ids, first);

        let now = Utc::now();
        let listed = stripe
            .payouts_created(now - Duration::minutes(5), now + Duration::minutes(5))
            .await
            .unwrap();
        assert_eq!(listed.len(), 2);
        assert!(stripe.get_payout("po_missing").await.unwrap().is_none());
        sim.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn a_payment_intent_made_under_our_key_is_found_in_stripe_s_events() {
    bounded(async {
        let sim = stripe_sim(30_000).await;
        let stripe = adapter(&sim, 2_000);
        let (from, to) = (
            Utc::now() - Duration::minutes(1),
            Utc::now() + Duration::minutes(1),
        );
        let ChargeOutcome::Succeeded(paid) = stripe
            .create_charge(&charge("ev1", "pm_card_visa", true))
            .await
        else {
            panic!("a visa test card succeeds");
        };
        let found = stripe
            .find_charge_in_events("ev1", from, to)
            .await
            .unwrap()
            .expect("the confirmation's events name it");
        assert_eq!(
            (found.id.as_str(), found.status),
            (paid.id.as_str(), ChargeStatus::Succeeded)
        );
        assert_eq!(found.reference.as_deref(), Some("pay_ev1"));
        assert_eq!(
            stripe.find_charge_in_events("ev2", from, to).await.unwrap(),
            None
        );
        // Events outside the window are not searched.
        let earlier = from - Duration::minutes(5);
        assert_eq!(
            stripe
                .find_charge_in_events("ev1", earlier, from)
                .await
                .unwrap(),
            None
        );
        sim.shutdown().await;
    })
    .await;
}

/// A window whose listings hold more objects than `report_lines_max` is halved until its first
/// part fits: the report ends early there, and asked again from its end, the rest comes the same
/// way. Every PaymentIntent is in one report, and no report holds more than the cap.
#[tokio::test]
async fn a_window_with_more_objects_than_a_report_holds_ends_early_and_comes_in_parts() {
    const CAP: usize = 3;
    bounded(async {
        let sim = stripe_sim(30_000).await;
        let stripe = StripeProvider::new(
            "stripe",
            &sim.base,
            "sk_test_adapter",
            ClientConfig {
                report_lines_max: CAP,
                ..ClientConfig::default()
            },
        )
        .unwrap();
        let from = Utc::now() - Duration::seconds(2);
        // Two PaymentIntents a second: a second never holds more than the cap.
        for n in 0..8 {
            let outcome = stripe
                .create_charge(&charge(&format!("part{n}"), "pm_card_visa", true))
                .await;
            assert!(
                matches!(outcome, ChargeOutcome::Succeeded(_)),
                "{outcome:?}"
            );
            tokio::time::sleep(std::time::Duration::from_millis(500)).await;
        }
        let to = Utc::now() + Duration::seconds(2);
        let (mut at, mut parts, mut seen) = (from, 0, Vec::new());
        while at < to {
            let report = stripe.settlement_report(at, to).await.unwrap();
            assert!(report.data.len() <= CAP, "{} lines", report.data.len());
            assert!(report.to > at && report.to <= to, "{} → {}", at, report.to);
            seen.extend(report.data.into_iter().filter_map(|line| line.reference));
            at = report.to;
            parts += 1;
        }
        assert!(parts > 1, "the window came in one report");
        seen.sort();
        seen.dedup();
        assert_eq!(seen.len(), 8, "{seen:?}");
        sim.shutdown().await;
    })
    .await;
}
