//! Fixtures shared by the integration tests: one payment of 10000 USD for
//! customer 42 via `sim`, and builders for its commands and events.
// Each test binary uses a different subset; a failed unwrap is a failed test.
#![allow(dead_code, clippy::unwrap_used)]

use asiento_domain::account::{AccountName, PendingSide};
use asiento_domain::payment::*;
use asiento_domain::*;
use chrono::{DateTime, Utc};
use serde_json::Map;
use uuid::Uuid;

pub const CHARGE: &str = "ch_1";
pub const URL: &str = "https://sim.example/redirect/1";

pub fn at(seconds: i64) -> DateTime<Utc> {
    DateTime::from_timestamp(1_764_000_000 + seconds, 0).expect("valid timestamp")
}

pub fn pid() -> PaymentId {
    PaymentId::from_uuid(Uuid::from_u128(0x0190_0000_0000_7000_8000_0000_0000_0042))
}

pub fn usd() -> Currency {
    Currency::parse("USD").unwrap()
}

pub fn tenant() -> TenantId {
    TenantId::parse("acme").unwrap()
}

pub fn fees() -> FeeSchedule {
    FeeSchedule::default()
}

pub fn amt(minor: i64) -> Amount {
    Amount::new(minor)
}

pub fn create_with(amount: i64, mode: CaptureMode) -> PaymentCommand {
    let mut metadata = Map::new();
    metadata.insert("order".into(), "1001".into());
    PaymentCommand::Create(CreatePayment {
        id: pid(),
        tenant: tenant(),
        amount: amt(amount),
        currency: usd(),
        customer: CustomerId::parse("42").unwrap(),
        provider: ProviderName::parse("sim").unwrap(),
        capture_mode: mode,
        description: Some("order 1001".into()),
        metadata,
        payment_method: None,
        at: at(0),
    })
}

pub fn create() -> PaymentCommand {
    create_with(10_000, CaptureMode::Automatic)
}

pub fn fact(fact: ProviderFact) -> PaymentCommand {
    PaymentCommand::Provider {
        fact,
        fees: fees(),
        at: at(10),
    }
}

pub fn f_authorized(amount: i64) -> PaymentCommand {
    fact(ProviderFact::Authorized {
        charge_id: CHARGE.into(),
        amount: amt(amount),
    })
}
pub fn f_captured(amount: i64) -> PaymentCommand {
    fact(ProviderFact::Captured {
        charge_id: CHARGE.into(),
        amount: amt(amount),
    })
}
pub fn f_failed() -> PaymentCommand {
    fact(ProviderFact::Failed {
        charge_id: Some(CHARGE.into()),
        reason: "card_declined".into(),
    })
}
pub fn f_action(url: &str) -> PaymentCommand {
    fact(ProviderFact::ActionRequired {
        charge_id: CHARGE.into(),
        redirect_url: url.into(),
    })
}
pub fn f_refunded(total: i64) -> PaymentCommand {
    fact(ProviderFact::Refunded {
        charge_id: CHARGE.into(),
        amount_refunded: amt(total),
        current: false,
    })
}
pub fn f_operation(
    kind: OperationKind,
    psp_key: &str,
    amount: i64,
    outcome: OperationOutcome,
) -> PaymentCommand {
    fact(ProviderFact::Operation {
        kind,
        charge_id: CHARGE.into(),
        psp_key: psp_key.into(),
        provider_id: None,
        amount: amt(amount),
        outcome,
        request: None,
    })
}
pub fn f_provider_fee(transaction_id: &str, fee: i64) -> PaymentCommand {
    fact(ProviderFact::ProviderFeeCharged {
        charge_id: CHARGE.into(),
        transaction_id: transaction_id.into(),
        fee: amt(fee),
    })
}
pub fn f_dispute_opened(id: &str, amount: i64) -> PaymentCommand {
    fact(ProviderFact::DisputeOpened {
        charge_id: CHARGE.into(),
        dispute_id: id.into(),
        amount: amt(amount),
    })
}
pub fn f_dispute_closed(id: &str, amount: i64, outcome: DisputeOutcome) -> PaymentCommand {
    fact(ProviderFact::DisputeClosed {
        charge_id: CHARGE.into(),
        dispute_id: id.into(),
        amount: amt(amount),
        outcome,
        reinstated: false,
    })
}
/// A second chargeback: the dispute lost after the provider had reinstated its money.
pub fn f_dispute_lost_again(id: &str, amount: i64) -> PaymentCommand {
    fact(ProviderFact::DisputeClosed {
        charge_id: CHARGE.into(),
        dispute_id: id.into(),
        amount: amt(amount),
        outcome: DisputeOutcome::Lost,
        reinstated: true,
    })
}
pub fn f_authorization_ended(reason: &str) -> PaymentCommand {
    fact(ProviderFact::AuthorizationEnded {
        charge_id: CHARGE.into(),
        reason: reason.into(),
    })
}

/// Applies commands in order, panicking on a rejection: builds histories.
pub fn history(commands: Vec<PaymentCommand>) -> Vec<PaymentEvent> {
    let mut payment = Payment::default();
    let mut events = Vec::new();
    for command in commands {
        let new = decide(&payment, command.clone())
            .unwrap_or_else(|r| panic!("{command:?} rejected in fixture: {r}"));
        for event in &new {
            payment = evolve(payment, event);
        }
        events.extend(new);
    }
    events
}

/// A history that leaves the payment in `status`.
pub fn given(status: Option<PaymentStatus>) -> Vec<PaymentEvent> {
    use PaymentStatus::*;
    let Some(status) = status else { return vec![] };
    let commands = match status {
        Pending => vec![create()],
        RequiresAction => vec![create(), f_action(URL)],
        Authorized => vec![
            create_with(10_000, CaptureMode::Manual),
            f_authorized(10_000),
        ],
        Captured => vec![create(), f_captured(10_000)],
        PartiallyRefunded => vec![create(), f_captured(10_000), f_refunded(2_500)],
        Refunded => vec![create(), f_captured(10_000), f_refunded(10_000)],
        Failed => vec![create(), f_failed()],
        Expired => vec![create(), PaymentCommand::Expire { at: at(5) }],
        Disputed => vec![
            create(),
            f_captured(10_000),
            f_dispute_opened("dp_1", 10_000),
        ],
        Canceled => vec![
            create_with(10_000, CaptureMode::Manual),
            f_authorized(10_000),
            PaymentCommand::RequestCancel { at: at(5) },
            f_operation(
                OperationKind::Cancel,
                &psp_authorization_cancel_key(pid(), 1),
                10_000,
                OperationOutcome::Succeeded,
            ),
        ],
    };
    history(commands)
}

pub fn clearing() -> AccountName {
    AccountName::parse("psp:sim:clearing").unwrap()
}
pub fn disputed() -> AccountName {
    AccountName::parse("psp:sim:disputed").unwrap()
}
pub fn customer() -> AccountName {
    AccountName::parse("customer:42:available").unwrap()
}
pub fn provider_expense() -> AccountName {
    AccountName::parse("expense:provider_fees:sim").unwrap()
}
pub fn revenue() -> AccountName {
    AccountName::parse("revenue:fees").unwrap()
}

pub fn posted(cause: &str, legs: Vec<(AccountName, i64)>) -> PaymentEvent {
    let entry = JournalEntry::in_one_currency(
        EntryId::derived(&format!("{}:{cause}", pid())),
        tenant(),
        usd(),
        legs.into_iter().map(|(a, n)| (a, amt(n))),
    )
    .unwrap();
    PaymentEvent::EntryPosted(EntryPosted {
        entry,
        at: at(10),
        transfer: None,
    })
}

/// An authorization and its hold: a pending credit to the customer from the clearing account.
pub fn e_authorized(amount: i64) -> Vec<PaymentEvent> {
    vec![
        PaymentEvent::ChargeAuthorized(ChargeAuthorized {
            charge_id: CHARGE.into(),
            amount_minor: amt(amount),
            held: true,
            at: at(10),
        }),
        posted(
            "authorization",
            vec![
                (customer().pending(PendingSide::Credits), amount),
                (clearing().pending(PendingSide::Debits), -amount),
            ],
        ),
    ]
}

/// The release of an authorization's hold of `amount`, once the payment left `authorized`.
pub fn e_released(amount: i64) -> PaymentEvent {
    posted(
        "authorization:released",
        vec![
            (customer().pending(PendingSide::Credits), -amount),
            (clearing().pending(PendingSide::Debits), amount),
        ],
    )
}

pub fn e_captured(amount: i64, fee: i64, implied: bool) -> PaymentEvent {
    PaymentEvent::ChargeCaptured(ChargeCaptured {
        charge_id: CHARGE.into(),
        amount_minor: amt(amount),
        fee_minor: amt(fee),
        fees: fees(),
        implied,
        at: at(10),
    })
}

pub fn e_capture_entry(amount: i64, fee: i64) -> PaymentEvent {
    posted(
        "capture",
        vec![
            (clearing(), -amount),
            (customer(), amount - fee),
            (revenue(), fee),
        ],
    )
}

pub fn e_refund(delta: i64, total: i64, fee_delta: i64) -> Vec<PaymentEvent> {
    vec![
        PaymentEvent::RefundSettled(RefundSettled {
            sequence: None,
            refund_id: None,
            charge_id: CHARGE.into(),
            amount_minor: amt(delta),
            refunded_total_minor: amt(total),
            fee_reversed_minor: amt(fee_delta),
            at: at(10),
        }),
        posted(
            &format!("refund:{total}"),
            vec![
                (clearing(), delta),
                (customer(), fee_delta - delta),
                (revenue(), -fee_delta),
            ],
        ),
    ]
}

pub fn e_flag(reason: ReviewReason, detail: &str) -> PaymentEvent {
    PaymentEvent::FlaggedForReview(FlaggedForReview {
        reason,
        detail: detail.into(),
        at: at(10),
    })
}

/// A dispute's opening and the provider's withdrawal of its amount.
pub fn e_dispute_opened(id: &str, amount: i64) -> Vec<PaymentEvent> {
    vec![
        PaymentEvent::DisputeOpened(DisputeOpened {
            dispute_id: id.into(),
            amount_minor: amt(amount),
            at: at(10),
        }),
        posted(
            &format!("dispute:{id}:withdrawn"),
            vec![(clearing(), amount), (disputed(), -amount)],
        ),
    ]
}

pub fn e_dispute_closed(id: &str, outcome: DisputeOutcome) -> PaymentEvent {
    PaymentEvent::DisputeClosed(DisputeClosed {
        dispute_id: id.into(),
        outcome,
        at: at(10),
    })
}

/// The provider's fee and its entry: the clearing account comes up, the provider's expense
/// account takes it.
pub fn e_provider_fee(transaction_id: &str, fee: i64) -> Vec<PaymentEvent> {
    vec![
        PaymentEvent::ProviderFeeCharged(ProviderFeeCharged {
            transaction_id: transaction_id.into(),
            fee_minor: amt(fee),
            at: at(10),
        }),
        posted(
            &format!("provider_fee:{transaction_id}"),
            vec![(clearing(), fee), (provider_expense(), -fee)],
        ),
    ]
}

/// A lost dispute's withdrawal was the customer's money.
pub fn e_lost_entry(id: &str, amount: i64) -> PaymentEvent {
    posted(
        &format!("dispute:{id}:lost"),
        vec![(disputed(), amount), (customer(), -amount)],
    )
}

/// A won dispute's withdrawal comes back to what the provider owes us.
pub fn e_reinstated_entry(id: &str, amount: i64) -> PaymentEvent {
    posted(
        &format!("dispute:{id}:reinstated"),
        vec![(disputed(), amount), (clearing(), -amount)],
    )
}
