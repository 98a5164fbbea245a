//! The merchant's cancel of an authorization, decided against every way the provider may answer:
//! its own outcome, the authorization's end told without it (Adyen's CANCELLATION), the charge
//! read as failed, a refusal, and a capture racing it in both orders. Whatever the path, a
//! canceled payment captured nothing, its hold is released by one entry, and its cancel ends
//! closed (so the operations sweep stops driving it).
// Test code: a failed unwrap is a failed test, which is what we want.
#![allow(clippy::unwrap_used)]

mod common;

use asiento_domain::account::PendingSide;
use asiento_domain::payment::*;
use asiento_domain::*;
use common::*;

/// Applies `commands` in order to an authorized manual payment of 10000.
fn authorized_then(commands: Vec<PaymentCommand>) -> (Payment, Vec<PaymentEvent>) {
    let mut all = vec![
        create_with(10_000, CaptureMode::Manual),
        f_authorized(10_000),
    ];
    all.extend(commands);
    let events = history(all);
    (Payment::replay(&events), events)
}

fn cancel() -> PaymentCommand {
    PaymentCommand::RequestCancel { at: at(20) }
}

fn capture() -> PaymentCommand {
    PaymentCommand::RequestCapture {
        amount: None,
        at: at(20),
    }
}

fn cancel_key(sequence: u32) -> String {
    psp_authorization_cancel_key(pid(), sequence)
}

fn cancel_outcome(sequence: u32, outcome: OperationOutcome) -> PaymentCommand {
    f_operation(
        OperationKind::Cancel,
        &cancel_key(sequence),
        10_000,
        outcome,
    )
}

fn capture_outcome(outcome: OperationOutcome) -> PaymentCommand {
    f_operation(
        OperationKind::Capture,
        &psp_capture_key(pid(), 1),
        10_000,
        outcome,
    )
}

fn refused(reason: &str) -> OperationOutcome {
    OperationOutcome::Failed {
        reason: reason.into(),
    }
}

/// What the customer's pending credits hold after `events`.
fn held(events: &[PaymentEvent]) -> i64 {
    let pending = customer().pending(PendingSide::Credits);
    events
        .iter()
        .filter_map(|event| match event {
            PaymentEvent::EntryPosted(posted) => Some(posted.entry.legs().to_vec()),
            _ => None,
        })
        .flatten()
        .filter(|leg| leg.account == pending)
        .map(|leg| leg.amount.minor())
        .sum()
}

fn record(payment: &Payment) -> &PaymentRecord {
    payment.record.as_ref().unwrap()
}

fn cancel_state(payment: &Payment, sequence: u32) -> OperationState {
    record(payment)
        .operation(OperationKind::Cancel, sequence)
        .unwrap()
        .state
}

/// The canceled end every path must reach: nothing captured, the hold released, the cancel done.
fn assert_canceled(payment: &Payment, events: &[PaymentEvent]) {
    let r = record(payment);
    assert_eq!(r.status, PaymentStatus::Canceled, "{events:#?}");
    assert!(r.captured.is_zero());
    assert!(r.authorization_held.is_zero());
    assert_eq!(held(events), 0, "the hold is released");
    let releases = events
        .iter()
        .filter(|e| matches!(e, PaymentEvent::EntryPosted(p) if p.entry.id() == EntryId::derived(&format!("{}:authorization:released", pid()))))
        .count();
    assert_eq!(releases, 1, "one release entry");
    assert!(r.operations.iter().all(|op| !op.state.is_open()), "{r:#?}");
}

#[test]
fn a_cancel_is_recorded_then_decided_by_the_provider() {
    let (payment, events) = authorized_then(vec![cancel()]);
    assert_eq!(record(&payment).status, PaymentStatus::Authorized);
    assert_eq!(
        held(&events),
        10_000,
        "the hold stands until the provider's word"
    );
    assert_eq!(
        record(&payment).open_cancel().unwrap().psp_key,
        cancel_key(1)
    );

    // Asked again while it is open: the same cancel, nothing new.
    assert_eq!(decide(&payment, cancel()), Ok(vec![]));

    let (payment, events) = authorized_then(vec![
        cancel(),
        cancel_outcome(1, OperationOutcome::Succeeded),
    ]);
    assert_canceled(&payment, &events);
    assert_eq!(cancel_state(&payment, 1), OperationState::Succeeded);
    // Once canceled there is nothing left to cancel or capture.
    for command in [cancel(), capture()] {
        assert!(matches!(
            decide(&payment, command),
            Err(PaymentRejection::InvalidTransition { .. })
        ));
    }
}

#[test]
fn the_authorization_s_end_or_a_failed_charge_is_the_cancel_s_outcome() {
    // Adyen tells a cancel by CANCELLATION alone; a charge read afterwards reads failed.
    for told in [
        f_authorization_ended("canceled"),
        f_failed(),
        cancel_outcome(1, OperationOutcome::Pending),
    ] {
        let pending = matches!(
            &told,
            PaymentCommand::Provider {
                fact: ProviderFact::Operation { .. },
                ..
            }
        );
        let mut commands = vec![cancel(), told];
        if pending {
            commands.push(f_authorization_ended("canceled"));
        }
        let (payment, events) = authorized_then(commands);
        assert_canceled(&payment, &events);
        // The cancel's own answer arriving afterwards is a repeat.
        assert_eq!(
            decide(&payment, cancel_outcome(1, OperationOutcome::Succeeded)),
            Ok(vec![])
        );
    }
}

#[test]
fn a_refused_cancel_changes_nothing_and_may_be_asked_again() {
    let (payment, events) =
        authorized_then(vec![cancel(), cancel_outcome(1, refused("not_cancelable"))]);
    let r = record(&payment);
    assert_eq!(r.status, PaymentStatus::Authorized);
    assert_eq!(held(&events), 10_000);
    assert_eq!(cancel_state(&payment, 1), OperationState::Refused);
    // A failure of the authorization after a refused cancel is a failure, not a cancel.
    let failed = events
        .iter()
        .cloned()
        .chain(decide(&payment, f_failed()).unwrap())
        .collect::<Vec<_>>();
    assert_eq!(
        record(&Payment::replay(&failed)).status,
        PaymentStatus::Failed
    );

    let (payment, events) = authorized_then(vec![
        cancel(),
        cancel_outcome(1, refused("not_cancelable")),
        cancel(),
        cancel_outcome(2, OperationOutcome::Succeeded),
    ]);
    assert_canceled(&payment, &events);
}

#[test]
fn a_capture_racing_a_cancel_ends_as_the_provider_decides() {
    // The capture was first at the provider: captured, and the cancel refused.
    let (payment, events) = authorized_then(vec![
        capture(),
        cancel(),
        capture_outcome(OperationOutcome::Succeeded),
        cancel_outcome(1, refused("already_captured")),
    ]);
    let r = record(&payment);
    assert_eq!(r.status, PaymentStatus::Captured);
    assert_eq!(r.captured.minor(), 10_000);
    assert_eq!(held(&events), 0);
    assert_eq!(cancel_state(&payment, 1), OperationState::Refused);
    assert!(r.flags.is_empty(), "{:?}", r.flags);

    // The cancel was first: canceled once the capture's refusal arrives, in either order.
    for (first, second) in [
        (
            cancel_outcome(1, OperationOutcome::Succeeded),
            capture_outcome(refused("canceled")),
        ),
        (
            capture_outcome(refused("canceled")),
            cancel_outcome(1, OperationOutcome::Succeeded),
        ),
    ] {
        let (payment, events) = authorized_then(vec![capture(), cancel(), first, second]);
        assert_canceled(&payment, &events);
        assert!(record(&payment).flags.is_empty());
    }

    // The cancel succeeded while the capture was open and the capture then succeeded too (a
    // provider that cancelled only a remainder): captured, nothing flagged.
    let (payment, _) = authorized_then(vec![
        capture(),
        cancel(),
        cancel_outcome(1, OperationOutcome::Succeeded),
        capture_outcome(OperationOutcome::Succeeded),
    ]);
    assert_eq!(record(&payment).status, PaymentStatus::Captured);
    assert!(record(&payment).flags.is_empty());

    // A capture the provider says succeeded after the payment was canceled is for a person.
    let (payment, _) = authorized_then(vec![
        capture(),
        cancel(),
        f_failed(),
        capture_outcome(OperationOutcome::Succeeded),
    ]);
    let r = record(&payment);
    assert_eq!(r.status, PaymentStatus::Canceled);
    assert_eq!(r.flags.len(), 1, "{:?}", r.flags);
}

#[test]
fn the_stale_sweep_s_cancel_is_not_the_merchant_s() {
    // An abandoned charge's cancel (its own key) says nothing of the payment's operations.
    let (payment, _) = authorized_then(vec![]);
    let sweep = f_operation(
        OperationKind::Cancel,
        &psp_cancel_key(pid()),
        10_000,
        OperationOutcome::Succeeded,
    );
    assert_eq!(decide(&payment, sweep), Ok(vec![]));
}
