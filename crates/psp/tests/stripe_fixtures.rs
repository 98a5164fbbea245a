//! The adapter's Stripe types read Stripe's own published objects (`fixtures3.json` from
//! stripe/openapi, copied with its licence under `tests/fixtures/stripe/`).

use asiento_psp::stripe::wire::{
    BalanceTransaction, Charge, ChargeStatus, Dispute, ErrorType, Event, IntentStatus,
    PaymentIntent, Payout, Refund, RefundStatus,
};
use serde::de::DeserializeOwned;
use serde_json::Value;

fn fixture(name: &str) -> Value {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/stripe/fixtures3.json"
    );
    let text = std::fs::read_to_string(path).expect("the fixtures are part of the repository");
    let all: Value = serde_json::from_str(&text).expect("the fixtures are JSON");
    all["resources"][name].clone()
}

fn read<T: DeserializeOwned>(name: &str) -> T {
    serde_json::from_value(fixture(name)).unwrap_or_else(|error| panic!("{name}: {error}"))
}

#[test]
fn stripe_s_published_objects_parse_into_the_adapter_s_types() {
    let intent: PaymentIntent = read("payment_intent");
    assert_eq!(intent.id, "pi_1PgafyB7WZ01zgkWSjxsAJo3");
    assert_eq!(intent.status, IntentStatus::RequiresPaymentMethod);
    assert_eq!((intent.amount, intent.currency.as_str()), (1099, "usd"));
    assert_eq!(
        intent.last_payment_error.map(|error| error.kind),
        Some(ErrorType::IdempotencyError)
    );
    assert!(intent.latest_charge.is_none());

    let charge: Charge = read("charge");
    assert_eq!(charge.status, ChargeStatus::Succeeded);
    assert_eq!(
        charge.balance_transaction.as_ref().map(|txn| txn.id()),
        Some("txn_1PgaxNB7WZ01zgkWEV3TLf40")
    );

    let refund: Refund = read("refund");
    assert_eq!(refund.status, RefundStatus::Succeeded);
    assert_eq!(
        refund.charge.as_ref().map(|charge| charge.id()),
        Some("ch_1PgafuB7WZ01zgkWXYmPNZs8")
    );

    let txn: BalanceTransaction = read("balance_transaction");
    assert_eq!((txn.amount, txn.fee, txn.net), (100, 0, 100));
    assert_eq!(txn.reporting_category, "charge");

    let dispute: Dispute = read("dispute");
    assert_eq!(dispute.charge.id(), "ch_1PgafuB7WZ01zgkWXYmPNZs8");
    assert_eq!(dispute.status, "warning_needs_response");

    let payout: Payout = read("payout");
    assert_eq!(
        (payout.amount, payout.status.as_str()),
        (1100, "in_transit")
    );

    let event: Event = read("event");
    assert_eq!(event.kind, "plan.created");
    assert_eq!(event.data.object["object"], "plan");
}

#[test]
fn unknown_statuses_are_kept_as_other_rather_than_refused() {
    let mut intent = fixture("payment_intent");
    intent["status"] = "requires_teleportation".into();
    let intent: PaymentIntent = serde_json::from_value(intent).expect("tolerant");
    assert_eq!(intent.status, IntentStatus::Other);
}
