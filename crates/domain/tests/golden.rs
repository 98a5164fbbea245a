//! Golden JSON, one fixture per stored event type: the exact payload each
//! type is written as. A renamed type, a renamed or retyped field, or a
//! schema bump without a fixture fails here, before it reaches a stored log.
// Test code: a failed unwrap is a failed test, which is what we want.
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeSet;

use asiento_domain::exception::{ExceptionEvent, ExceptionRecorded, ExceptionResolved, Resolution};
use asiento_domain::guard::Pending;
use asiento_domain::guard::{AccountDeclared, BalanceChanged, GuardEvent, OverdraftFlagged};
use asiento_domain::hold::{HoldPosted, HoldVoided, VoidReason};
use asiento_domain::monitor::{
    BalanceField, Condition, MonitorCreated, MonitorDeleted, MonitorEvent, Threshold,
};
use asiento_domain::payment::*;
use asiento_domain::transfer::{TransferEvent, TransferRequested};
use asiento_domain::*;
use common::*;
use serde_json::{json, Value};

const AT: &str = "2025-11-24T16:00:10Z";
const PAY: &str = "pay_01900000000070008000000000000042";

fn entry_json() -> Value {
    json!({
        "entry": {
            "id": EntryId::derived(&format!("{PAY}:capture")).to_string(),
            "tenant": "acme",
            "legs": [
                {"account": "psp:sim:clearing", "currency": "USD", "amount_minor": -10000},
                {"account": "customer:42:available", "currency": "USD", "amount_minor": 9700},
                {"account": "revenue:fees", "currency": "USD", "amount_minor": 300}
            ],
            "reverses": null
        },
        "at": AT
    })
}

fn payment_fixtures() -> Vec<(PaymentEvent, Value)> {
    vec![
        (
            PaymentEvent::PaymentIntended(PaymentIntended {
                payment_id: pid(),
                tenant: tenant(),
                amount_minor: amt(10_000),
                currency: usd(),
                customer: CustomerId::parse("42").unwrap(),
                provider: ProviderName::parse("sim").unwrap(),
                capture: CaptureMode::Manual,
                description: Some("order 1001".into()),
                metadata: [("order".to_owned(), json!("1001"))].into_iter().collect(),
                psp_key: "psp_01900000000070008000000000000042".into(),
                payment_method: None,
                at: at(10),
            }),
            json!({
                "payment_id": PAY, "tenant": "acme", "amount_minor": 10000, "currency": "USD",
                "customer": "42", "provider": "sim", "capture": "manual",
                "description": "order 1001", "metadata": {"order": "1001"},
                "psp_key": "psp_01900000000070008000000000000042", "at": AT
            }),
        ),
        (
            PaymentEvent::ChargeRequested(ChargeRequested {
                psp_key: "psp_x".into(),
                at: at(10),
            }),
            json!({"psp_key": "psp_x", "at": AT}),
        ),
        (
            PaymentEvent::ActionRequired(ActionRequired {
                charge_id: CHARGE.into(),
                redirect_url: URL.into(),
                at: at(10),
            }),
            json!({"charge_id": "ch_1", "redirect_url": URL, "at": AT}),
        ),
        (
            PaymentEvent::ChargeAuthorized(ChargeAuthorized {
                charge_id: CHARGE.into(),
                amount_minor: amt(10_000),
                held: true,
                at: at(10),
            }),
            // Without `held` (events written before authorizations were held) it decodes as
            // holding nothing: see `an_authorization_written_before_holds_holds_nothing`.
            json!({"charge_id": "ch_1", "amount_minor": 10000, "held": true, "at": AT}),
        ),
        (
            PaymentEvent::CaptureRequested(CaptureRequested {
                sequence: 2,
                amount_minor: amt(6_000),
                psp_key: "psp_x_capture_2".into(),
                at: at(10),
            }),
            json!({"sequence": 2, "amount_minor": 6000, "psp_key": "psp_x_capture_2", "at": AT}),
        ),
        (
            e_captured(10_000, 300, false),
            json!({
                "charge_id": "ch_1", "amount_minor": 10000, "fee_minor": 300,
                "fees": {"bps": 300, "fixed_minor": 0}, "implied": false, "at": AT
            }),
        ),
        (
            PaymentEvent::ChargeFailed(ChargeFailed {
                charge_id: None,
                reason: "card_declined".into(),
                at: at(10),
            }),
            json!({"charge_id": null, "reason": "card_declined", "at": AT}),
        ),
        (
            PaymentEvent::AuthorizationEnded(AuthorizationEnded {
                charge_id: "ch_1".into(),
                reason: "expired".into(),
                at: at(10),
            }),
            json!({"charge_id": "ch_1", "reason": "expired", "at": AT}),
        ),
        (
            PaymentEvent::PaymentExpired(PaymentExpired { at: at(10) }),
            json!({"at": AT}),
        ),
        (
            PaymentEvent::CancelRequested(CancelRequested {
                sequence: 1,
                amount_minor: amt(10_000),
                psp_key: "psp_01900000000070008000000000000042_cancel_1".into(),
                at: at(10),
            }),
            json!({
                "sequence": 1,
                "amount_minor": 10000,
                "psp_key": "psp_01900000000070008000000000000042_cancel_1",
                "at": AT
            }),
        ),
        (
            PaymentEvent::CancelSucceeded(CancelSucceeded {
                sequence: 1,
                provider_id: Some("pi_1/cancel".into()),
                at: at(10),
            }),
            json!({"sequence": 1, "provider_id": "pi_1/cancel", "at": AT}),
        ),
        (
            PaymentEvent::PaymentCanceled(PaymentCanceled { at: at(10) }),
            json!({"at": AT}),
        ),
        (
            PaymentEvent::RefundRequested(RefundRequested {
                sequence: 2,
                amount_minor: amt(2_500),
                requested_total_minor: amt(5_000),
                psp_key: "psp_x_refund_2".into(),
                at: at(10),
            }),
            json!({
                "sequence": 2, "amount_minor": 2500, "requested_total_minor": 5000,
                "psp_key": "psp_x_refund_2", "at": AT
            }),
        ),
        (
            PaymentEvent::RefundSettled(RefundSettled {
                sequence: Some(2),
                refund_id: Some("re_2".into()),
                charge_id: CHARGE.into(),
                amount_minor: amt(2_500),
                refunded_total_minor: amt(5_000),
                fee_reversed_minor: amt(75),
                at: at(10),
            }),
            json!({
                "sequence": 2, "refund_id": "re_2", "charge_id": "ch_1", "amount_minor": 2500,
                "refunded_total_minor": 5000, "fee_reversed_minor": 75, "at": AT
            }),
        ),
        (
            PaymentEvent::OperationReceived(OperationReceived {
                kind: OperationKind::Refund,
                sequence: 2,
                provider_id: Some("re_2".into()),
                at: at(10),
            }),
            json!({"kind": "refund", "sequence": 2, "provider_id": "re_2", "at": AT}),
        ),
        (
            PaymentEvent::OperationAnswered(OperationAnswered {
                kind: OperationKind::Refund,
                sequence: 2,
                request_id: "req_2".into(),
                replayed: true,
                at: at(10),
            }),
            json!({"kind": "refund", "sequence": 2, "request_id": "req_2", "replayed": true, "at": AT}),
        ),
        (
            PaymentEvent::OperationIdentified(OperationIdentified {
                kind: OperationKind::Refund,
                sequence: 2,
                provider_id: "re_2".into(),
                at: at(10),
            }),
            json!({"kind": "refund", "sequence": 2, "provider_id": "re_2", "at": AT}),
        ),
        (
            PaymentEvent::OperationRefused(OperationRefused {
                kind: OperationKind::Capture,
                sequence: 1,
                reason: "charge_expired".into(),
                at: at(10),
            }),
            json!({"kind": "capture", "sequence": 1, "reason": "charge_expired", "at": AT}),
        ),
        (
            PaymentEvent::RefundReversed(RefundReversed {
                sequence: 2,
                amount_minor: amt(2_500),
                refunded_total_minor: amt(2_500),
                fee_restored_minor: amt(75),
                reason: "expired_or_canceled_card".into(),
                at: at(10),
            }),
            json!({
                "sequence": 2, "amount_minor": 2500, "refunded_total_minor": 2500,
                "fee_restored_minor": 75, "reason": "expired_or_canceled_card", "at": AT
            }),
        ),
        (
            PaymentEvent::CaptureReversed(CaptureReversed {
                sequence: 1,
                amount_minor: amt(10_000),
                fee_minor: amt(300),
                reason: "capture_failed".into(),
                at: at(10),
            }),
            json!({
                "sequence": 1, "amount_minor": 10000, "fee_minor": 300,
                "reason": "capture_failed", "at": AT
            }),
        ),
        (
            e_dispute_opened("dp_1", 10_000).remove(0),
            json!({"dispute_id": "dp_1", "amount_minor": 10000, "at": AT}),
        ),
        (
            e_dispute_closed("dp_1", DisputeOutcome::Lost),
            json!({"dispute_id": "dp_1", "outcome": "lost", "at": AT}),
        ),
        (
            e_provider_fee("txn_1", 320).remove(0),
            json!({"transaction_id": "txn_1", "fee_minor": 320, "at": AT}),
        ),
        (
            e_flag(
                ReviewReason::ContradictingFact,
                "captured 10000 while failed (captured 0)",
            ),
            json!({"reason": "contradicting_fact", "detail": "captured 10000 while failed (captured 0)", "at": AT}),
        ),
        (e_capture_entry(10_000, 300), entry_json()),
    ]
}

fn transfer_fixtures() -> Vec<(TransferEvent, Value)> {
    let PaymentEvent::EntryPosted(posted) = e_capture_entry(10_000, 300) else {
        unreachable!()
    };
    let requested = TransferRequested {
        transfer_id: TransferId::from_uuid(uuid::Uuid::from_u128(5)),
        tenant: tenant(),
        from: customer(),
        to: AccountName::parse("customer:7:available").unwrap(),
        amount_minor: amt(500),
        currency: usd(),
        description: Some("rent".into()),
        pending: false,
        expires_at: None,
        at: at(10),
    };
    // A plain transfer has neither `pending` nor `expires_at`, as in events written before holds
    // existed (see `a_hold_request_carries_pending_and_its_expiry`).
    let requested_json = json!({
        "transfer_id": "tr_00000000000000000000000000000005", "tenant": "acme",
        "from": "customer:42:available", "to": "customer:7:available",
        "amount_minor": 500, "currency": "USD", "description": "rent", "at": AT
    });
    let mut posted_with_request = entry_json();
    posted_with_request["transfer"] = requested_json.clone();
    vec![
        (
            TransferEvent::TransferRequested(requested.clone()),
            requested_json,
        ),
        // A transfer's first event: its entry, carrying the request it posts (a hold's ending
        // posts one without, as a payment's is above).
        (
            TransferEvent::EntryPosted(EntryPosted {
                transfer: Some(requested),
                ..posted
            }),
            posted_with_request,
        ),
        (
            TransferEvent::HoldPosted(HoldPosted {
                amount_minor: amt(300),
                at: at(10),
            }),
            json!({"amount_minor": 300, "at": AT}),
        ),
        (
            TransferEvent::HoldVoided(HoldVoided {
                reason: VoidReason::Expired,
                at: at(10),
            }),
            json!({"reason": "expired", "at": AT}),
        ),
    ]
}

#[test]
fn an_authorization_written_before_holds_holds_nothing() {
    let old = json!({"charge_id": "ch_1", "amount_minor": 10000, "at": AT});
    let event = PaymentEvent::decode("ChargeAuthorized", 1, &old).unwrap();
    assert_eq!(
        event,
        PaymentEvent::ChargeAuthorized(ChargeAuthorized {
            charge_id: CHARGE.into(),
            amount_minor: amt(10_000),
            held: false,
            at: at(10),
        })
    );
}

#[test]
fn a_hold_request_carries_pending_and_its_expiry() {
    let event = TransferEvent::TransferRequested(TransferRequested {
        transfer_id: TransferId::from_uuid(uuid::Uuid::from_u128(5)),
        tenant: tenant(),
        from: customer(),
        to: AccountName::parse("merchant:7").unwrap(),
        amount_minor: amt(500),
        currency: usd(),
        description: None,
        pending: true,
        expires_at: Some(at(70)),
        at: at(10),
    });
    let expected = json!({
        "transfer_id": "tr_00000000000000000000000000000005", "tenant": "acme",
        "from": "customer:42:available", "to": "merchant:7", "amount_minor": 500,
        "currency": "USD", "description": null, "pending": true,
        "expires_at": "2025-11-24T16:01:10Z", "at": AT
    });
    assert_eq!(event.encode().unwrap(), expected);
    assert_eq!(
        TransferEvent::decode(event.event_type(), event.schema_version(), &expected).unwrap(),
        event
    );
}

fn guard_fixtures() -> Vec<(GuardEvent, Value)> {
    let entry_id = EntryId::from_uuid(uuid::Uuid::from_u128(6));
    vec![
        (
            GuardEvent::BalanceChanged(BalanceChanged {
                entry_id,
                delta_minor: amt(-500),
                balance_minor: amt(9_200),
                pending_debits_delta_minor: Amount::ZERO,
                pending_credits_delta_minor: Amount::ZERO,
                pending: Pending::default(),
                at: at(10),
                policy: None,
            }),
            json!({
                "entry_id": "je_00000000000000000000000000000006",
                "delta_minor": -500, "balance_minor": 9200, "at": AT
            }),
        ),
        (
            GuardEvent::OverdraftFlagged(OverdraftFlagged {
                entry_id,
                balance_minor: amt(-300),
                pending: Pending::default(),
                at: at(10),
                policy: Some(declared_policy()),
            }),
            // A declared policy travels with each guard event; without one (the BalanceChanged
            // above) the field is absent, as in events written before policies existed.
            json!({
                "entry_id": "je_00000000000000000000000000000006", "balance_minor": -300,
                "at": AT, "policy": declared_policy_json()
            }),
        ),
        (
            GuardEvent::AccountDeclared(AccountDeclared {
                policy: declared_policy(),
                metadata: json!({"team": "payouts"}).as_object().unwrap().clone(),
                balance_minor: amt(400),
                pending: Pending {
                    pending_debits_minor: amt(150),
                    pending_credits_minor: Amount::ZERO,
                },
                at: at(10),
            }),
            // What holds reserve travels with each guard event once it is not zero.
            json!({
                "policy": declared_policy_json(),
                "metadata": {"team": "payouts"}, "balance_minor": 400,
                "pending_debits_minor": 150, "at": AT
            }),
        ),
    ]
}

fn declared_policy() -> AccountPolicy {
    AccountPolicy {
        normal_balance: NormalBalance::Debit,
        overdraft: Overdraft::Limit {
            limit_minor: amt(1_000),
        },
        frozen: false,
    }
}

fn declared_policy_json() -> Value {
    json!({"normal_balance": "debit", "overdraft": {"policy": "limit", "limit_minor": 1000}, "frozen": false})
}

fn exception_fixtures() -> Vec<(ExceptionEvent, Value)> {
    let exception_id = ExceptionId::from_uuid(uuid::Uuid::from_u128(8));
    vec![
        (
            ExceptionEvent::ExceptionRecorded(ExceptionRecorded {
                exception_id,
                tenant: Some(tenant()),
                payment_id: Some(pid()),
                provider: ProviderName::parse("sim").unwrap(),
                charge_id: Some(CHARGE.into()),
                kind: ExceptionKind::AmountMismatch,
                local: json!({"status": "captured", "amount_minor": 10000}),
                provider_state: json!({"status": "succeeded", "amount_minor": 9999}),
                difference: json!({"amount_minor": -1}),
                resolution: Resolution::Manual,
                at: at(10),
            }),
            json!({
                "exception_id": "exc_00000000000000000000000000000008", "tenant": "acme",
                "payment_id": PAY, "provider": "sim", "charge_id": "ch_1",
                "kind": "amount_mismatch",
                "local": {"status": "captured", "amount_minor": 10000},
                "provider_state": {"status": "succeeded", "amount_minor": 9999},
                "difference": {"amount_minor": -1}, "resolution": "manual", "at": AT
            }),
        ),
        (
            ExceptionEvent::ExceptionResolved(ExceptionResolved {
                note: "refunded the difference by hand".into(),
                at: at(10),
            }),
            json!({"note": "refunded the difference by hand", "at": AT}),
        ),
    ]
}

fn payout_fixtures() -> Vec<(PayoutEvent, Value)> {
    use asiento_domain::payout::{
        PayoutFailed, PayoutPaid, PayoutShareMovedIn, PayoutShareMovedOut,
    };
    let stripe = ProviderName::parse("stripe").unwrap();
    let payout_id = PayoutId::parse("po_1").unwrap();
    let entry = JournalEntry::new(
        EntryId::derived("payout:stripe:po_1:acme"),
        tenant(),
        vec![
            Leg::new(
                AccountName::parse("psp:stripe:clearing").unwrap(),
                Currency::parse("USD").unwrap(),
                Amount::new(9_710),
            ),
            Leg::new(
                AccountName::parse("bank:stripe:payouts").unwrap(),
                Currency::parse("USD").unwrap(),
                Amount::new(-9_710),
            ),
        ],
        None,
    )
    .unwrap();
    let line = PayoutLine {
        payment: pid(),
        tenant: tenant(),
        net_minor: Amount::new(9_710),
        provider_net_minor: Amount::new(9_710),
        agreed_at_version: Some(4),
        transactions: vec!["txn_1".into()],
    };
    let line_json = json!({"payment": PAY, "tenant": "acme", "net_minor": 9710,
                           "provider_net_minor": 9710, "agreed_at_version": 4,
                           "transactions": ["txn_1"]});
    vec![
        (
            PayoutEvent::PayoutPaid(PayoutPaid {
                provider: stripe.clone(),
                payout_id: payout_id.clone(),
                currency: Currency::parse("USD").unwrap(),
                amount_minor: Amount::new(9_710),
                lines: vec![line.clone()],
                unattributed_minor: Amount::ZERO,
                elsewhere_minor: Amount::ZERO,
                created: at(10),
                at: at(10),
            }),
            json!({
                "provider": "stripe", "payout_id": "po_1", "currency": "USD",
                "amount_minor": 9710,
                "lines": [line_json],
                "unattributed_minor": 0, "created": AT, "at": AT
            }),
        ),
        (
            PayoutEvent::PayoutShareMovedIn(PayoutShareMovedIn {
                provider: stripe.clone(),
                payout_id: payout_id.clone(),
                tenant: tenant(),
                from_cell: "eu2".into(),
                currency: Currency::parse("USD").unwrap(),
                lines: vec![line],
                reversed: false,
                at: at(10),
            }),
            json!({
                "provider": "stripe", "payout_id": "po_1", "tenant": "acme", "from_cell": "eu2",
                "currency": "USD", "lines": [line_json], "reversed": false, "at": AT
            }),
        ),
        (
            PayoutEvent::PayoutShareMovedOut(PayoutShareMovedOut {
                provider: stripe.clone(),
                payout_id: payout_id.clone(),
                tenant: tenant(),
                to_cell: "eu1".into(),
                net_minor: Amount::new(9_710),
                at: at(10),
            }),
            json!({
                "provider": "stripe", "payout_id": "po_1", "tenant": "acme", "to_cell": "eu1",
                "net_minor": 9710, "at": AT
            }),
        ),
        (
            PayoutEvent::PayoutFailed(PayoutFailed {
                provider: stripe,
                payout_id,
                failure_code: Some("account_closed".into()),
                at: at(10),
            }),
            json!({"provider": "stripe", "payout_id": "po_1", "failure_code": "account_closed", "at": AT}),
        ),
        (
            PayoutEvent::EntryPosted(EntryPosted {
                entry,
                at: at(10),
                transfer: None,
            }),
            json!({
                "entry": {
                    "id": EntryId::derived("payout:stripe:po_1:acme").to_string(),
                    "tenant": "acme",
                    "legs": [
                        {"account": "psp:stripe:clearing", "currency": "USD", "amount_minor": 9710},
                        {"account": "bank:stripe:payouts", "currency": "USD", "amount_minor": -9710}
                    ],
                    "reverses": null
                },
                "at": AT
            }),
        ),
    ]
}

const MONITOR: &str = "bm_0123456789abcdef0123456789abcdef";

fn monitor_fixtures() -> Vec<(MonitorEvent, Value)> {
    vec![
        (
            MonitorEvent::MonitorCreated(MonitorCreated {
                monitor_id: MONITOR.to_owned(),
                tenant: tenant(),
                account: AccountName::parse("customer:42:available").unwrap(),
                currency: Currency::parse("USD").unwrap(),
                threshold: Threshold {
                    field: BalanceField::Available,
                    condition: Condition::Lt,
                    amount_minor: Amount::new(0),
                },
                description: Some("overdrawn".to_owned()),
                at: at(10),
            }),
            json!({
                "monitor_id": MONITOR, "tenant": "acme", "account": "customer:42:available",
                "currency": "USD",
                "threshold": {"field": "available", "condition": "lt", "amount_minor": 0},
                "description": "overdrawn", "at": AT,
            }),
        ),
        (
            MonitorEvent::MonitorDeleted(MonitorDeleted {
                monitor_id: MONITOR.to_owned(),
                tenant: tenant(),
                at: at(10),
            }),
            json!({"monitor_id": MONITOR, "tenant": "acme", "at": AT}),
        ),
    ]
}

/// Checks the fixtures of one family: exact JSON, round trip, and that every
/// type of the family has exactly one fixture.
macro_rules! check_family {
    ($family:ty, $fixtures:expr) => {{
        let fixtures = $fixtures;
        let mut covered = BTreeSet::new();
        for (event, expected) in fixtures {
            let data = event.encode().unwrap();
            assert_eq!(
                data,
                expected,
                "{} drifted from its golden JSON",
                event.event_type()
            );
            let decoded =
                <$family>::decode(event.event_type(), event.schema_version(), &expected).unwrap();
            assert_eq!(decoded, event);
            assert!(
                covered.insert(event.event_type()),
                "two fixtures for {}",
                event.event_type()
            );
        }
        let declared: BTreeSet<&str> = <$family>::TYPES.iter().map(|(t, _)| *t).collect();
        assert_eq!(covered, declared, "every event type needs a golden fixture");
    }};
}

#[test]
fn payment_events_match_their_golden_json() {
    check_family!(PaymentEvent, payment_fixtures());
}

#[test]
fn transfer_events_match_their_golden_json() {
    check_family!(TransferEvent, transfer_fixtures());
}

#[test]
fn guard_events_match_their_golden_json() {
    check_family!(GuardEvent, guard_fixtures());
}

#[test]
fn exception_events_match_their_golden_json() {
    check_family!(ExceptionEvent, exception_fixtures());
}

#[test]
fn payout_events_match_their_golden_json() {
    check_family!(PayoutEvent, payout_fixtures());
}

#[test]
fn monitor_events_match_their_golden_json() {
    check_family!(MonitorEvent, monitor_fixtures());
}

/// Type names and schema versions are part of the stored contract too.
#[test]
fn type_names_and_schemas_are_stable() {
    assert_eq!(
        PaymentEvent::TYPES,
        &[
            ("PaymentIntended", 2),
            ("ChargeRequested", 1),
            ("ActionRequired", 1),
            ("ChargeAuthorized", 1),
            ("CaptureRequested", 1),
            ("ChargeCaptured", 1),
            ("ChargeFailed", 1),
            ("AuthorizationEnded", 1),
            ("PaymentExpired", 1),
            ("CancelRequested", 1),
            ("CancelSucceeded", 1),
            ("PaymentCanceled", 1),
            ("RefundRequested", 1),
            ("RefundSettled", 1),
            ("OperationReceived", 1),
            ("OperationAnswered", 1),
            ("OperationIdentified", 1),
            ("OperationRefused", 1),
            ("RefundReversed", 1),
            ("CaptureReversed", 1),
            ("DisputeOpened", 1),
            ("DisputeClosed", 1),
            ("ProviderFeeCharged", 1),
            ("FlaggedForReview", 1),
            ("EntryPosted", 1),
        ]
    );
    assert_eq!(
        TransferEvent::TYPES,
        &[
            ("TransferRequested", 1),
            ("EntryPosted", 1),
            ("HoldPosted", 1),
            ("HoldVoided", 1),
        ]
    );
    assert_eq!(
        GuardEvent::TYPES,
        &[
            ("BalanceChanged", 1),
            ("OverdraftFlagged", 1),
            ("AccountDeclared", 1)
        ]
    );
    assert_eq!(
        ExceptionEvent::TYPES,
        &[("ExceptionRecorded", 1), ("ExceptionResolved", 1)]
    );
    assert_eq!(
        PayoutEvent::TYPES,
        &[
            ("PayoutPaid", 1),
            ("PayoutFailed", 1),
            ("EntryPosted", 1),
            ("PayoutShareMovedIn", 1),
            ("PayoutShareMovedOut", 1)
        ]
    );
    assert_eq!(
        MonitorEvent::TYPES,
        &[("MonitorCreated", 1), ("MonitorDeleted", 1)]
    );
}

#[test]
fn payment_intended_v1_is_upcast_to_v2() {
    // The shape written before providers and manual capture existed.
    let v1 = json!({
        "payment_id": PAY, "tenant": "acme", "amount": 10000, "currency": "USD",
        "customer": "42", "description": null, "metadata": {},
        "psp_key": "psp_01900000000070008000000000000042", "at": AT
    });
    let (schema, data) = upcast("PaymentIntended", 1, v1.clone()).unwrap();
    assert_eq!(schema, 2);
    assert_eq!(data["amount_minor"], json!(10000));
    assert!(data.get("amount").is_none());
    let decoded = PaymentEvent::decode("PaymentIntended", 1, &v1).unwrap();
    assert_eq!(
        PaymentEvent::decode_raw("PaymentIntended", 1, &v1.to_string()),
        Ok(decoded.clone()),
        "from the stored text, the same upcast"
    );
    let PaymentEvent::PaymentIntended(intended) = decoded else {
        panic!("wrong type")
    };
    assert_eq!(intended.amount_minor, amt(10_000));
    assert_eq!(intended.provider.as_str(), "sim");
    assert_eq!(intended.capture, CaptureMode::Automatic);
    // Current payloads pass through the upcaster untouched.
    let v2 = payment_fixtures().remove(0).1;
    assert_eq!(upcast("PaymentIntended", 2, v2.clone()).unwrap(), (2, v2));
    // A v1 payload that lacks the field it renames is an error, not a panic.
    assert!(matches!(
        PaymentEvent::decode("PaymentIntended", 1, &json!({"tenant": "acme"})),
        Err(DecodeError::Invalid { .. })
    ));
}

#[test]
fn unknown_types_schemas_and_bad_payloads_are_decode_errors() {
    assert!(matches!(
        PaymentEvent::decode("ChargeConfirmed", 1, &json!({})),
        Err(DecodeError::UnknownType { .. })
    ));
    assert!(matches!(
        PaymentEvent::decode("PaymentExpired", 7, &json!({"at": AT})),
        Err(DecodeError::UnknownSchema { schema: 7, .. })
    ));
    // An unbalanced entry cannot come back from the log as a JournalEntry.
    let mut bad = entry_json();
    bad["entry"]["legs"][0]["amount_minor"] = json!(-9999);
    assert!(matches!(
        PaymentEvent::decode("EntryPosted", 1, &bad),
        Err(DecodeError::Invalid { .. })
    ));
}

#[test]
fn any_event_decodes_by_its_stream() {
    let stream = payment_stream(pid());
    let event = Event::decode(&stream, "EntryPosted", 1, &entry_json()).unwrap();
    assert_eq!(event.entry().unwrap().legs().len(), 3);
    let guard = Event::decode(
        "account-acme:customer:42:available:USD",
        "OverdraftFlagged",
        1,
        &guard_fixtures()[1].1,
    );
    assert!(matches!(
        guard,
        Ok(Event::Guard(GuardEvent::OverdraftFlagged(_)))
    ));
    let exception = Event::decode(
        "exception-exc_00000000000000000000000000000008",
        "ExceptionResolved",
        1,
        &exception_fixtures()[1].1,
    );
    assert!(matches!(
        exception,
        Ok(Event::Exception(ExceptionEvent::ExceptionResolved(_)))
    ));
    let payout = Event::decode(
        "payout-stripe:po_1",
        "EntryPosted",
        1,
        &payout_fixtures()[4].1,
    )
    .unwrap();
    assert_eq!(payout.entry().unwrap().legs().len(), 2);
    assert!(matches!(
        Event::decode("webhook-1", "X", 1, &json!({})),
        Err(DecodeError::UnknownStream(_))
    ));
}
