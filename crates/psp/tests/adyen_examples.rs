//! The adapter reads Adyen's own examples of the notifications whose shape the ledger depends on
//! (`components.examples` of `Webhooks-v1.json`, copied with its licence under
//! `tests/fixtures/adyen/`) as Adyen sends them: a dispute's later items without
//! `originalReference`, named by the dispute's pspReference with the payment by
//! `merchantReference`, and an expiry or a cancel as the end of the authorisation, not as a
//! failed charge.
#![allow(clippy::unwrap_used)]

use asiento_psp::adyen::reading::item_event;
use asiento_psp::adyen::wire::NotificationItem;
use asiento_psp::event::AuthorizationEnd;
use asiento_psp::{DisputeStatus, EventType, WebhookEvent};
use serde_json::Value;

/// The one item of Adyen's example `name` (`post-<EVENT_CODE>-<event_code>`).
fn example(name: &str) -> NotificationItem {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/adyen/Webhooks-v1.json"
    );
    let text =
        std::fs::read_to_string(path).expect("the OpenAPI document is part of the repository");
    let document: Value = serde_json::from_str(&text).expect("the document is JSON");
    let items = &document["components"]["examples"][name]["value"]["notificationItems"];
    let [item] = items.as_array().expect("an example batch").as_slice() else {
        panic!("{name}: one item: {items}");
    };
    serde_json::from_value(item["NotificationRequestItem"].clone())
        .unwrap_or_else(|error| panic!("{name}: {error}"))
}

fn read(name: &str) -> WebhookEvent {
    item_event(&example(name)).unwrap_or_else(|| panic!("{name} was dropped"))
}

#[test]
fn a_dispute_s_later_items_name_the_dispute_and_our_reference_only() {
    let chargeback = read("post-CHARGEBACK-chargeback");
    let opened = chargeback.data.dispute.unwrap();
    assert_eq!(opened.charge.as_deref(), Some("9913140798220028"));
    assert_eq!(opened.dispute.id.as_deref(), Some("QFQTPCQ8HXSKGK82"));

    for (name, status, reinstated) in [
        (
            "post-CHARGEBACK_REVERSED-chargeback_reversed",
            DisputeStatus::Won,
            false,
        ),
        (
            "post-SECOND_CHARGEBACK-second_chargeback",
            DisputeStatus::Lost,
            true,
        ),
        (
            "post-PREARBITRATION_LOST-prearbitration_lost",
            DisputeStatus::Lost,
            true,
        ),
    ] {
        let item = example(name);
        assert_eq!(item.original_reference, None, "{name}");
        let event = read(name);
        assert_eq!(event.kind, EventType::ChargeDisputeClosed, "{name}");
        assert_eq!(
            event.data.payment_ref(),
            Some("YOUR_MERCHANT_REFERENCE"),
            "{name}"
        );
        let disputed = event.data.dispute.unwrap();
        assert_eq!(disputed.charge, None, "{name}: named by the payment");
        assert_eq!(
            disputed.dispute.id.as_deref(),
            Some(item.psp_reference.as_str())
        );
        assert_eq!(
            (disputed.dispute.status, disputed.dispute.reinstated),
            (status, reinstated),
            "{name}"
        );
        assert_eq!(disputed.dispute.amount_minor, 1000);
    }
}

#[test]
fn an_expiry_and_a_cancel_end_the_authorisation() {
    let expired = read("post-EXPIRE-expire");
    assert!(expired.data.charge.is_none());
    assert_eq!(
        expired.data.authorization_end,
        Some(AuthorizationEnd {
            charge: "QFQTPCQ8HXSKGK82".to_owned(),
            reason: "expired".to_owned(),
        })
    );
    assert_eq!(expired.data.payment_ref(), Some("YOUR_MERCHANT_REFERENCE"));
    let cancelled = read("post-CANCELLATION-cancellation");
    assert!(cancelled.data.charge.is_none());
    assert_eq!(
        cancelled.data.authorization_end,
        Some(AuthorizationEnd {
            charge: "9913140798220028".to_owned(),
            reason: "canceled".to_owned(),
        })
    );
}
