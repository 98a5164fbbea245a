//! The transition table as data: every cell (status × command or fact) runs
//! through one `check(given, when, then)` helper, accepted and rejected.
//! The letter grid below is the specification written independently of the
//! code's `rule()`, and a test holds the two equal.
// Test code: a failed unwrap is a failed test, which is what we want.
#![allow(clippy::unwrap_used)]

mod common;

use asiento_domain::payment::table::{rule, Input, Outcome};
use asiento_domain::payment::*;
use asiento_domain::*;
use common::*;

/// Replays `given`, decides `when`, and compares with `then`. Accepted
/// events must also apply cleanly: the status stays inside the table and
/// `next_action` exists only while `requires_action`.
fn check(
    given: Vec<PaymentEvent>,
    when: PaymentCommand,
    then: Result<Vec<PaymentEvent>, PaymentRejection>,
) {
    let payment = Payment::replay(&given);
    let from = payment.record.as_ref().map(|r| r.status);
    let got = decide(&payment, when.clone());
    assert_eq!(got, then, "\nfrom {from:?}\nwhen {when:?}");
    if let Ok(events) = got {
        let after = events.iter().fold(payment, evolve);
        let record = after.record.expect("a payment after an accepted command");
        let r = rule(from, when.input());
        if r.outcome == Outcome::Apply {
            assert!(
                from == Some(record.status) || r.to.contains(&record.status),
                "{from:?} --{}--> {} is not in the table",
                when.input(),
                record.status
            );
        } else {
            assert_eq!(
                Some(record.status),
                from,
                "a {:?} cell changed the status",
                r.outcome
            );
        }
        assert_eq!(
            record.next_action.is_some(),
            record.status == PaymentStatus::RequiresAction
        );
    }
}

/// A = apply, I = ignore (no events), F = flag, R = InvalidTransition,
/// N = not found. Columns follow `Input::ALL`.
#[rustfmt::skip]
const GRID: [(Option<PaymentStatus>, &str); 11] = {
    use PaymentStatus::*;
    [
        //                          cre cap ref can exp flg act aut cpt fai end rfd dop dcl cop rop cno fee
        (None,                     "A   N   N   N   N   N   N   N   N   N   N   N   N   N   N   N   N   N"),
        (Some(Pending),            "R   R   R   R   A   F   A   A   A   A   A   A   A   A   F   F   I   F"),
        (Some(RequiresAction),     "R   R   R   R   A   F   A   A   A   A   A   A   A   A   F   F   I   F"),
        (Some(Authorized),         "R   A   R   A   R   F   I   I   A   A   A   A   A   A   A   F   A   F"),
        (Some(Captured),           "R   R   A   R   R   F   I   I   F   F   I   A   A   A   A   A   A   A"),
        (Some(PartiallyRefunded),  "R   R   A   R   R   F   I   I   F   F   I   A   A   A   A   A   A   A"),
        (Some(Refunded),           "R   R   R   R   R   F   I   I   F   F   I   F   F   F   A   A   A   A"),
        (Some(Failed),             "R   R   R   R   R   F   I   F   F   I   I   F   F   F   F   F   A   F"),
        (Some(Expired),            "R   R   R   R   I   F   I   F   F   I   I   F   F   F   F   F   A   F"),
        (Some(Disputed),           "R   R   R   R   R   F   I   I   F   F   I   F   F   A   A   A   A   A"),
        (Some(Canceled),           "R   R   R   R   R   F   I   I   F   I   I   F   F   F   A   F   A   F"),
    ]
};

const URL2: &str = "https://sim.example/redirect/2";

/// The command each column is exercised with.
fn when(input: Input) -> PaymentCommand {
    match input {
        Input::Create => create(),
        Input::RequestCapture => PaymentCommand::RequestCapture {
            amount: None,
            at: at(10),
        },
        Input::RequestRefund => PaymentCommand::RequestRefund {
            amount: amt(2_500),
            at: at(10),
        },
        Input::RequestCancel => PaymentCommand::RequestCancel { at: at(10) },
        Input::Expire => PaymentCommand::Expire { at: at(10) },
        Input::FlagForReview => PaymentCommand::FlagForReview {
            note: "looks odd".into(),
            at: at(10),
        },
        Input::FactActionRequired => f_action(URL2),
        Input::FactAuthorized => f_authorized(10_000),
        Input::FactCaptured => f_captured(10_000),
        Input::FactFailed => f_failed(),
        Input::FactAuthorizationEnded => f_authorization_ended("expired"),
        Input::FactRefunded => f_refunded(10_000),
        Input::FactDisputeOpened => f_dispute_opened("dp_2", 10_000),
        Input::FactDisputeClosed => f_dispute_closed("dp_1", 10_000, DisputeOutcome::Lost),
        Input::FactCaptureOutcome => f_operation(
            OperationKind::Capture,
            &psp_capture_key(pid(), 1),
            10_000,
            OperationOutcome::Succeeded,
        ),
        Input::FactRefundOutcome => f_operation(
            OperationKind::Refund,
            &psp_refund_key(pid(), 1),
            2_500,
            OperationOutcome::Succeeded,
        ),
        Input::FactCancelOutcome => f_operation(
            OperationKind::Cancel,
            &psp_authorization_cancel_key(pid(), 1),
            10_000,
            OperationOutcome::Succeeded,
        ),
        Input::FactProviderFee => f_provider_fee("txn_1", 320),
    }
}

fn implied_capture() -> Vec<PaymentEvent> {
    vec![e_captured(10_000, 300, true), e_capture_entry(10_000, 300)]
}

fn contradiction(detail: &str) -> Vec<PaymentEvent> {
    vec![e_flag(ReviewReason::ContradictingFact, detail)]
}

/// The expected answer of every A and F cell, written out.
fn expected(from: PaymentStatus, input: Input) -> Vec<PaymentEvent> {
    use DisputeOutcome::Lost;
    use Input::*;
    use PaymentStatus::*;
    let s = from.as_str();
    match (from, input) {
        (_, FlagForReview) => vec![e_flag(ReviewReason::Manual, "looks odd")],
        (Pending | RequiresAction, Expire) => {
            vec![PaymentEvent::PaymentExpired(PaymentExpired { at: at(10) })]
        }
        (Pending | RequiresAction, FactActionRequired) => {
            vec![PaymentEvent::ActionRequired(ActionRequired {
                charge_id: CHARGE.into(),
                redirect_url: URL2.into(),
                at: at(10),
            })]
        }
        (Pending | RequiresAction, FactAuthorized) => e_authorized(10_000),
        (Pending | RequiresAction | Authorized, FactCaptured) => {
            vec![e_captured(10_000, 300, false), e_capture_entry(10_000, 300)]
        }
        (Pending | RequiresAction | Authorized, FactFailed) => {
            vec![PaymentEvent::ChargeFailed(ChargeFailed {
                charge_id: Some(CHARGE.into()),
                reason: "card_declined".into(),
                at: at(10),
            })]
        }
        // Nothing captured and no capture open: the payment fails.
        (Pending | RequiresAction | Authorized, FactAuthorizationEnded) => {
            vec![PaymentEvent::ChargeFailed(ChargeFailed {
                charge_id: Some(CHARGE.into()),
                reason: "expired".into(),
                at: at(10),
            })]
        }
        (Pending | RequiresAction | Authorized, FactRefunded) => {
            [implied_capture(), e_refund(10_000, 10_000, 300)].concat()
        }
        (Pending | RequiresAction | Authorized, FactDisputeOpened) => {
            [implied_capture(), e_dispute_opened("dp_2", 10_000)].concat()
        }
        (Pending | RequiresAction | Authorized, FactDisputeClosed) => [
            implied_capture(),
            e_dispute_opened("dp_1", 10_000),
            vec![e_dispute_closed("dp_1", Lost), e_lost_entry("dp_1", 10_000)],
        ]
        .concat(),
        (Authorized, RequestCapture) => vec![PaymentEvent::CaptureRequested(CaptureRequested {
            sequence: 1,
            amount_minor: amt(10_000),
            psp_key: psp_capture_key(pid(), 1),
            at: at(10),
        })],
        (Authorized, RequestCancel) => vec![PaymentEvent::CancelRequested(CancelRequested {
            sequence: 1,
            amount_minor: amt(10_000),
            psp_key: psp_authorization_cancel_key(pid(), 1),
            at: at(10),
        })],
        // The canceled history asked for this cancel and heard it succeed: a repeat.
        (Canceled, FactCancelOutcome) => vec![],
        (
            Authorized | Captured | PartiallyRefunded | Refunded | Failed | Expired | Disputed,
            FactCancelOutcome,
        ) => contradiction(&format!(
            "cancel {} succeeded that we never asked for",
            psp_authorization_cancel_key(pid(), 1)
        )),
        (Captured | PartiallyRefunded, RequestRefund) => {
            let total = if from == Captured { 2_500 } else { 5_000 };
            vec![PaymentEvent::RefundRequested(RefundRequested {
                sequence: 1,
                amount_minor: amt(2_500),
                requested_total_minor: amt(total),
                psp_key: psp_refund_key(pid(), 1),
                at: at(10),
            })]
        }
        // The same capture again: nothing new, nothing to flag.
        (Captured | PartiallyRefunded | Refunded | Disputed, FactCaptured) => vec![],
        (Captured | PartiallyRefunded | Refunded | Disputed, FactFailed) => {
            contradiction(&format!("failed (card_declined) while {s}"))
        }
        (Captured, FactRefunded) => e_refund(10_000, 10_000, 300),
        // 2500 refunded before with fee(2500) = 75 reversed: the rest of the
        // fee is 300 - 75.
        (PartiallyRefunded, FactRefunded) => e_refund(7_500, 10_000, 225),
        (Captured, FactDisputeOpened) => e_dispute_opened("dp_2", 10_000),
        (Captured, FactDisputeClosed) => [
            e_dispute_opened("dp_1", 10_000),
            vec![e_dispute_closed("dp_1", Lost), e_lost_entry("dp_1", 10_000)],
        ]
        .concat(),
        (PartiallyRefunded, FactDisputeOpened) => [
            e_dispute_opened("dp_2", 10_000),
            vec![e_flag(
                ReviewReason::ContradictingFact,
                "dispute dp_2 of 10000 beyond the 7500 captured and not refunded",
            )],
        ]
        .concat(),
        (PartiallyRefunded, FactDisputeClosed) => [
            e_dispute_opened("dp_1", 10_000),
            vec![
                e_flag(
                    ReviewReason::ContradictingFact,
                    "dispute dp_1 of 10000 beyond the 7500 captured and not refunded",
                ),
                e_dispute_closed("dp_1", Lost),
                e_lost_entry("dp_1", 10_000),
            ],
        ]
        .concat(),
        // Everything refunded already: the same total again is a repeat.
        (Refunded, FactRefunded) => vec![],
        (Disputed, FactRefunded) => {
            contradiction("refunded total 10000 while disputed (refunded 0 of 10000)")
        }
        (Refunded | Failed | Expired | Disputed | Canceled, FactDisputeOpened) => {
            contradiction(&format!("dispute dp_2 opened while {s}"))
        }
        (Refunded | Failed | Expired | Canceled, FactDisputeClosed) => {
            contradiction(&format!("dispute dp_1 closed Lost while {s}"))
        }
        (Disputed, FactDisputeClosed) => {
            vec![e_dispute_closed("dp_1", Lost), e_lost_entry("dp_1", 10_000)]
        }
        (Failed | Expired, FactAuthorized) => contradiction(&format!("authorized 10000 while {s}")),
        (Failed | Expired | Canceled, FactCaptured) => {
            contradiction(&format!("captured 10000 while {s} (captured 0)"))
        }
        (Failed | Expired | Canceled, FactRefunded) => {
            contradiction(&format!("refunded total 10000 while {s} (refunded 0 of 0)"))
        }
        // None of the histories asked for an operation: an outcome of one is for a reviewer.
        (
            Authorized | Captured | PartiallyRefunded | Refunded | Disputed | Canceled,
            FactCaptureOutcome,
        ) => contradiction(&format!(
            "capture {} succeeded that we never asked for",
            psp_capture_key(pid(), 1)
        )),
        (Captured | PartiallyRefunded | Refunded | Disputed, FactRefundOutcome) => {
            contradiction(&format!(
                "refund {} succeeded that we never asked for",
                psp_refund_key(pid(), 1)
            ))
        }
        (Pending | RequiresAction | Failed | Expired, FactCaptureOutcome) => contradiction(
            &format!("capture {} succeeded while {s}", psp_capture_key(pid(), 1)),
        ),
        (
            Pending | RequiresAction | Authorized | Failed | Expired | Canceled,
            FactRefundOutcome,
        ) => contradiction(&format!(
            "refund {} succeeded while {s}",
            psp_refund_key(pid(), 1)
        )),
        (Captured | PartiallyRefunded | Refunded | Disputed, FactProviderFee) => {
            e_provider_fee("txn_1", 320)
        }
        (Pending | RequiresAction | Authorized | Failed | Expired | Canceled, FactProviderFee) => {
            contradiction(&format!("provider fee 320 for txn_1 while {s}"))
        }
        other => panic!("no expectation written for {other:?}"),
    }
}

#[test]
fn the_grid_is_the_table() {
    for (from, row) in GRID {
        let letters: Vec<&str> = row.split_whitespace().collect();
        assert_eq!(letters.len(), Input::ALL.len());
        for (input, letter) in Input::ALL.into_iter().zip(letters) {
            let outcome = match letter {
                "A" => Outcome::Apply,
                "I" => Outcome::Ignore,
                "F" => Outcome::Flag,
                "R" | "N" => Outcome::Reject,
                other => panic!("bad letter {other}"),
            };
            assert_eq!(rule(from, input).outcome, outcome, "{from:?} × {input}");
        }
    }
}

#[test]
fn every_cell_of_the_table() {
    let mut cells = 0;
    for (from, row) in GRID {
        for (input, letter) in Input::ALL.into_iter().zip(row.split_whitespace()) {
            cells += 1;
            let then = match (from, letter) {
                (_, "N") => Err(PaymentRejection::NotFound),
                (Some(from), "R") => Err(PaymentRejection::InvalidTransition { from, input }),
                (_, "I") => Ok(vec![]),
                (None, _) => Ok(vec![PaymentEvent::PaymentIntended(PaymentIntended {
                    payment_id: pid(),
                    tenant: tenant(),
                    amount_minor: amt(10_000),
                    currency: usd(),
                    customer: CustomerId::parse("42").unwrap(),
                    provider: ProviderName::parse("sim").unwrap(),
                    capture: CaptureMode::Automatic,
                    description: Some("order 1001".into()),
                    metadata: [("order".to_owned(), serde_json::json!("1001"))]
                        .into_iter()
                        .collect(),
                    psp_key: "psp_01900000000070008000000000000042".into(),
                    payment_method: None,
                    at: at(0),
                })]),
                // Leaving `authorized` releases the authorization's hold, last.
                (Some(PaymentStatus::Authorized), _) => {
                    let mut events = expected(PaymentStatus::Authorized, input);
                    let after = events.iter().fold(Payment::replay(&given(from)), evolve);
                    if after.record.map(|r| r.status) != Some(PaymentStatus::Authorized) {
                        events.push(e_released(10_000));
                    }
                    Ok(events)
                }
                (Some(from), _) => Ok(expected(from, input)),
            };
            check(given(from), when(input), then);
        }
    }
    assert_eq!(cells, 198);
}

// ------------------------------------------------------- rules within cells

fn manual_authorized() -> Vec<PaymentEvent> {
    given(Some(PaymentStatus::Authorized))
}

#[test]
fn capture_at_most_the_authorized_amount() {
    let capture = |amount: i64| PaymentCommand::RequestCapture {
        amount: Some(amt(amount)),
        at: at(10),
    };
    check(
        manual_authorized(),
        capture(10_001),
        Err(PaymentRejection::CaptureExceedsAuthorized {
            requested: amt(10_001),
            authorized: amt(10_000),
        }),
    );
    check(
        manual_authorized(),
        capture(0),
        Err(PaymentRejection::AmountMustBePositive),
    );
    let requested = [
        manual_authorized(),
        history_from(manual_authorized(), vec![capture(6_000)]),
    ]
    .concat();
    check(requested.clone(), capture(6_000), Ok(vec![]));
    check(
        requested.clone(),
        capture(5_000),
        Err(PaymentRejection::CaptureAlreadyRequested {
            requested: amt(6_000),
        }),
    );
    // The provider captures the partial amount: fee on 6000 only.
    // The whole hold of 10000 is released, whatever was captured.
    check(
        requested,
        f_captured(6_000),
        Ok(vec![
            e_captured(6_000, 180, false),
            e_capture_entry(6_000, 180),
            e_released(10_000),
        ]),
    );
    check(
        manual_authorized(),
        f_captured(10_001),
        Ok(contradiction(
            "captured 10001 beyond the 10000 capturable while authorized",
        )),
    );
}

/// Decides commands on top of an existing history, returning only the new
/// events.
fn history_from(given: Vec<PaymentEvent>, commands: Vec<PaymentCommand>) -> Vec<PaymentEvent> {
    let mut payment = Payment::replay(&given);
    let mut events = Vec::new();
    for command in commands {
        let new = decide(&payment, command).expect("accepted");
        payment = new.iter().fold(payment, evolve);
        events.extend(new);
    }
    events
}

#[test]
fn refund_requests_accumulate_and_cannot_exceed_the_capture() {
    let captured = given(Some(PaymentStatus::Captured));
    let refund = |amount: i64| PaymentCommand::RequestRefund {
        amount: amt(amount),
        at: at(10),
    };
    check(
        captured.clone(),
        refund(10_001),
        Err(PaymentRejection::RefundExceedsCaptured {
            requested: amt(10_001),
            refundable: amt(10_000),
        }),
    );
    check(
        captured.clone(),
        refund(-1),
        Err(PaymentRejection::AmountMustBePositive),
    );
    let after_two = [
        captured.clone(),
        history_from(captured, vec![refund(4_000), refund(5_000)]),
    ]
    .concat();
    check(
        after_two.clone(),
        refund(1_001),
        Err(PaymentRejection::RefundExceedsCaptured {
            requested: amt(1_001),
            refundable: amt(1_000),
        }),
    );
    let third = history_from(after_two, vec![refund(1_000)]);
    assert!(
        matches!(&third[0], PaymentEvent::RefundRequested(r) if r.sequence == 3 && r.psp_key == psp_refund_key(pid(), 3))
    );
}

#[test]
fn cumulative_refund_facts_post_only_the_difference() {
    let partially = given(Some(PaymentStatus::PartiallyRefunded)); // 2500 of 10000
    check(partially.clone(), f_refunded(2_500), Ok(vec![]));
    check(partially.clone(), f_refunded(1_000), Ok(vec![]));
    // fee(4000) = 120, fee(2500) = 75: 45 more of the fee goes back.
    check(
        partially.clone(),
        f_refunded(4_000),
        Ok(e_refund(1_500, 4_000, 45)),
    );
    check(
        partially,
        f_refunded(10_001),
        Ok(contradiction(
            "refunded total 10001 beyond the captured 10000",
        )),
    );
}

#[test]
fn captured_before_authorized_implies_it_and_the_late_authorization_changes_nothing() {
    let captured = history(vec![
        create_with(10_000, CaptureMode::Manual),
        f_captured(10_000),
    ]);
    let payment = Payment::replay(&captured);
    assert_eq!(payment.record.as_ref().unwrap().authorized, amt(10_000));
    check(captured, f_authorized(10_000), Ok(vec![]));
}

#[test]
fn a_contradicting_fact_is_flagged_once() {
    let failed = given(Some(PaymentStatus::Failed));
    let flagged = [
        failed.clone(),
        history_from(failed, vec![f_captured(10_000)]),
    ]
    .concat();
    check(flagged, f_captured(10_000), Ok(vec![]));
    // Captured after refunded, with another amount than the capture on record.
    check(
        given(Some(PaymentStatus::Refunded)),
        f_captured(9_000),
        Ok(contradiction(
            "captured 9000 while refunded (captured 10000)",
        )),
    );
}

#[test]
fn a_fact_about_another_charge_is_flagged() {
    let other = fact(ProviderFact::Captured {
        charge_id: "ch_other".into(),
        amount: amt(10_000),
    });
    check(
        given(Some(PaymentStatus::RequiresAction)),
        other,
        Ok(vec![e_flag(
            ReviewReason::ChargeMismatch,
            "fact about charge ch_other, payment is charge ch_1",
        )]),
    );
}

#[test]
fn disputes_won_return_the_payment_and_repeats_change_nothing() {
    let disputed = given(Some(PaymentStatus::Disputed));
    let won = f_dispute_closed("dp_1", 10_000, DisputeOutcome::Won);
    check(
        disputed.clone(),
        won.clone(),
        Ok(vec![
            e_dispute_closed("dp_1", DisputeOutcome::Won),
            e_reinstated_entry("dp_1", 10_000),
        ]),
    );
    let after = [disputed.clone(), history_from(disputed, vec![won.clone()])].concat();
    assert_eq!(
        Payment::replay(&after).record.unwrap().status,
        PaymentStatus::Captured
    );
    check(after.clone(), won, Ok(vec![]));
    check(after.clone(), f_dispute_opened("dp_1", 10_000), Ok(vec![]));
    // A first loss told after the win is the chargeback before it, delivered late.
    check(
        after,
        f_dispute_closed("dp_1", 10_000, DisputeOutcome::Lost),
        Ok(vec![]),
    );
}

/// A won dispute's money withdrawn again, and the customer's: a second chargeback.
fn e_lost_again_entry(id: &str, amount: i64) -> PaymentEvent {
    posted(
        &format!("dispute:{id}:lost_again"),
        vec![(clearing(), amount), (customer(), -amount)],
    )
}

/// Adyen's CHARGEBACK (lost), CHARGEBACK_REVERSED and SECOND_CHARGEBACK in order: the loss takes
/// the customer's money, the reversal gives it back (from what the provider owes us), and the
/// second chargeback withdraws it again and ends the payment as a lost dispute; every entry sums
/// to zero and repeats change nothing.
#[test]
fn a_dispute_lost_reinstated_and_lost_again_withdraws_the_money_again() {
    use DisputeOutcome::{Lost, Won};
    let captured = given(Some(PaymentStatus::Captured));
    let lost = [
        captured.clone(),
        history_from(captured, vec![f_dispute_closed("dp_1", 10_000, Lost)]),
    ]
    .concat();
    let reinstated = vec![
        e_dispute_closed("dp_1", Won),
        posted(
            "dispute:dp_1:reinstated",
            vec![(customer(), 10_000), (clearing(), -10_000)],
        ),
    ];
    check(
        lost.clone(),
        f_dispute_closed("dp_1", 10_000, Won),
        Ok(reinstated.clone()),
    );
    let won = [lost.clone(), reinstated].concat();
    let record = record_after(&won);
    assert_eq!(record.status, PaymentStatus::Captured);
    assert_eq!(record.dispute.as_ref().unwrap().stage(), DisputeStage::Won);
    assert_eq!(record.provider_holds().unwrap(), amt(10_000));
    let again = vec![
        e_dispute_closed("dp_1", Lost),
        e_lost_again_entry("dp_1", 10_000),
    ];
    check(
        won.clone(),
        f_dispute_lost_again("dp_1", 10_000),
        Ok(again.clone()),
    );
    let lost_again = [won, again].concat();
    let record = record_after(&lost_again);
    assert_eq!(record.status, PaymentStatus::Disputed);
    assert_eq!(
        record.dispute.as_ref().unwrap().stage(),
        DisputeStage::LostAgain
    );
    assert!(!record.needs_review());
    // The provider holds the capture less the dispute, as after the first loss.
    assert_eq!(record.provider_holds().unwrap(), amt(0));
    assert_eq!(balances(&lost_again), balances(&lost));
    assert_eq!(balance_of(&lost_again, &disputed()), 0);
    assert_eq!(balance_of(&lost_again, &customer()), 9_700 - 10_000);
    // Every report of the dispute told again changes nothing.
    for repeat in [
        f_dispute_opened("dp_1", 10_000),
        f_dispute_closed("dp_1", 10_000, Lost),
        f_dispute_closed("dp_1", 10_000, Won),
        f_dispute_lost_again("dp_1", 10_000),
    ] {
        check(lost_again.clone(), repeat, Ok(vec![]));
    }
}

/// What the postings in `events` leave `account` with.
fn balance_of(events: &[PaymentEvent], account: &asiento_domain::account::AccountName) -> i64 {
    balances(events)
        .get(&account.to_string())
        .copied()
        .unwrap_or_default()
}

/// A dispute's notifications arrive in any order (Adyen does not order them, and the later two
/// name the dispute only): every order of the chargeback (open or lost), its reversal and the
/// second chargeback ends the payment as the natural order does, with the same money moved and
/// nothing flagged; each step stays inside the table.
#[test]
fn a_dispute_s_notifications_in_any_order_end_it_as_in_order() {
    use DisputeOutcome::{Lost, Won};
    let captured = given(Some(PaymentStatus::Captured));
    for chargeback in [
        f_dispute_opened("dp_1", 10_000),
        f_dispute_closed("dp_1", 10_000, Lost),
    ] {
        let told = [
            chargeback,
            f_dispute_closed("dp_1", 10_000, Won),
            f_dispute_lost_again("dp_1", 10_000),
        ];
        let in_order = [
            captured.clone(),
            history_from(captured.clone(), told.to_vec()),
        ]
        .concat();
        let expected = record_after(&in_order);
        assert_eq!(
            expected.dispute.as_ref().unwrap().stage(),
            DisputeStage::LostAgain
        );
        for order in [
            [0, 1, 2],
            [0, 2, 1],
            [1, 0, 2],
            [1, 2, 0],
            [2, 0, 1],
            [2, 1, 0],
        ] {
            let mut events = captured.clone();
            for index in order {
                let payment = Payment::replay(&events);
                let decided = decide(&payment, told[index].clone());
                check(events.clone(), told[index].clone(), decided.clone());
                events.extend(decided.unwrap());
            }
            let record = record_after(&events);
            assert_eq!(record, expected, "{order:?}");
            assert_eq!(balances(&events), balances(&in_order), "{order:?}");
            assert!(!record.needs_review(), "{order:?}");
        }
    }
}

#[test]
fn a_disputed_payment_only_accepts_the_dispute_outcome() {
    let disputed = given(Some(PaymentStatus::Disputed));
    let from = PaymentStatus::Disputed;
    for command in [
        PaymentCommand::RequestRefund {
            amount: amt(1),
            at: at(10),
        },
        PaymentCommand::RequestCapture {
            amount: None,
            at: at(10),
        },
        PaymentCommand::Expire { at: at(10) },
    ] {
        let input = command.input();
        check(
            disputed.clone(),
            command,
            Err(PaymentRejection::InvalidTransition { from, input }),
        );
    }
}

#[test]
fn a_close_before_its_open_stands_for_both() {
    let captured = given(Some(PaymentStatus::Captured));
    let lost = f_dispute_closed("dp_9", 4_000, DisputeOutcome::Lost);
    let after = [captured.clone(), history_from(captured, vec![lost])].concat();
    check(after, f_dispute_opened("dp_9", 4_000), Ok(vec![]));
}

#[test]
fn next_action_disappears_once_the_payment_moves_on() {
    let requires_action = given(Some(PaymentStatus::RequiresAction));
    let payment = Payment::replay(&requires_action);
    assert_eq!(
        payment.record.as_ref().unwrap().next_action,
        Some(NextAction::Redirect {
            redirect_url: URL.into()
        })
    );
    let captured = [
        requires_action.clone(),
        history_from(requires_action, vec![f_captured(10_000)]),
    ]
    .concat();
    assert_eq!(Payment::replay(&captured).record.unwrap().next_action, None);
    // A late requires_action after the capture does not bring it back.
    check(captured, f_action(URL2), Ok(vec![]));
}

#[test]
fn malformed_commands_are_refused() {
    check(
        vec![],
        create_with(0, CaptureMode::Automatic),
        Err(PaymentRejection::AmountMustBePositive),
    );
    let PaymentCommand::Create(mut long) = create() else {
        unreachable!()
    };
    long.description = Some("x".repeat(DESCRIPTION_CHARS_MAX + 1));
    check(
        vec![],
        PaymentCommand::Create(long),
        Err(PaymentRejection::DescriptionTooLong),
    );
    let PaymentCommand::Create(mut big) = create() else {
        unreachable!()
    };
    big.metadata = (0..=METADATA_KEYS_MAX)
        .map(|i| (format!("k{i}"), serde_json::json!(i)))
        .collect();
    check(
        vec![],
        PaymentCommand::Create(big),
        Err(PaymentRejection::MetadataTooLarge),
    );
    check(
        given(Some(PaymentStatus::Pending)),
        f_captured(0),
        Err(PaymentRejection::AmountMustBePositive),
    );
    check(
        given(Some(PaymentStatus::Pending)),
        f_action(""),
        Err(PaymentRejection::InvalidText {
            field: "redirect_url",
        }),
    );
}

#[test]
fn rejection_codes_are_stable() {
    let from = PaymentStatus::Failed;
    let input = Input::RequestRefund;
    assert_eq!(
        PaymentRejection::InvalidTransition { from, input }.code(),
        "invalid_transition"
    );
    assert_eq!(
        PaymentRejection::RefundExceedsCaptured {
            requested: amt(1),
            refundable: amt(0)
        }
        .code(),
        "refund_exceeds_captured"
    );
    assert_eq!(PaymentRejection::NotFound.code(), "payment_not_found");
    assert_eq!(
        PaymentRejection::InvalidTransition { from, input }.to_string(),
        "request_refund is not allowed when the payment is failed"
    );
}

// ------------------------------------------------------- provider operations

fn refund_request(amount: i64) -> PaymentCommand {
    PaymentCommand::RequestRefund {
        amount: amt(amount),
        at: at(10),
    }
}

fn refund_outcome(sequence: u32, amount: i64, outcome: OperationOutcome) -> PaymentCommand {
    f_operation(
        OperationKind::Refund,
        &psp_refund_key(pid(), sequence),
        amount,
        outcome,
    )
}

fn failed(reason: &str) -> OperationOutcome {
    OperationOutcome::Failed {
        reason: reason.into(),
    }
}

fn record_after(events: &[PaymentEvent]) -> PaymentRecord {
    Payment::replay(events).record.unwrap()
}

#[test]
fn a_refused_refund_releases_its_amount() {
    let captured = given(Some(PaymentStatus::Captured));
    let asked = history_from(captured.clone(), vec![refund_request(10_000)]);
    let requested = [captured, asked].concat();
    // While it is at the provider, nothing more can be refunded.
    check(
        requested.clone(),
        refund_request(1),
        Err(PaymentRejection::RefundExceedsCaptured {
            requested: amt(1),
            refundable: amt(0),
        }),
    );
    let refused = vec![PaymentEvent::OperationRefused(OperationRefused {
        kind: OperationKind::Refund,
        sequence: 1,
        reason: "charge_disputed".into(),
        at: at(10),
    })];
    check(
        requested.clone(),
        refund_outcome(1, 10_000, failed("charge_disputed")),
        Ok(refused.clone()),
    );
    let after = [requested, refused].concat();
    let record = record_after(&after);
    assert_eq!(
        record.operation(OperationKind::Refund, 1).unwrap().state,
        OperationState::Refused
    );
    assert_eq!(record.status, PaymentStatus::Captured);
    // The whole amount is refundable again, under the next sequence's key.
    check(
        after,
        refund_request(10_000),
        Ok(vec![PaymentEvent::RefundRequested(RefundRequested {
            sequence: 2,
            amount_minor: amt(10_000),
            requested_total_minor: amt(10_000),
            psp_key: psp_refund_key(pid(), 2),
            at: at(10),
        })]),
    );
}

#[test]
fn a_refund_that_fails_after_it_settled_is_reversed_by_a_mirror_entry() {
    let captured = given(Some(PaymentStatus::Captured));
    let asked = history_from(captured.clone(), vec![refund_request(2_500)]);
    let requested = [captured, asked].concat();
    let succeeded = history_from(
        requested.clone(),
        vec![refund_outcome(1, 2_500, OperationOutcome::Succeeded)],
    );
    // fee(2500) = 75 given back.
    assert_eq!(
        succeeded.last().unwrap(),
        &posted(
            "refund:op:1",
            vec![
                (clearing(), 2_500),
                (customer(), 75 - 2_500),
                (revenue(), -75)
            ],
        )
    );
    let settled = [requested, succeeded].concat();
    assert_eq!(
        record_after(&settled).status,
        PaymentStatus::PartiallyRefunded
    );
    check(
        settled.clone(),
        refund_outcome(1, 2_500, failed("expired_or_canceled_card")),
        Ok(vec![
            PaymentEvent::RefundReversed(RefundReversed {
                sequence: 1,
                amount_minor: amt(2_500),
                refunded_total_minor: amt(0),
                fee_restored_minor: amt(75),
                reason: "expired_or_canceled_card".into(),
                at: at(10),
            }),
            posted(
                "refund:op:1:reversed",
                vec![
                    (clearing(), -2_500),
                    (customer(), 2_500 - 75),
                    (revenue(), 75),
                ],
            ),
        ]),
    );
    let reversed = [
        settled.clone(),
        history_from(
            settled,
            vec![refund_outcome(1, 2_500, failed("expired_or_canceled_card"))],
        ),
    ]
    .concat();
    let record = record_after(&reversed);
    assert_eq!(record.status, PaymentStatus::Captured);
    assert_eq!(record.refunded, amt(0));
    assert_eq!(record.fee_reversed, amt(0));
    // A late cumulative report that still counts the reversed refund settles nothing again.
    check(reversed.clone(), f_refunded(2_500), Ok(vec![]));
    // A repeated failure is the same fact, and so is the success it reversed, delivered late.
    check(
        reversed.clone(),
        refund_outcome(1, 2_500, failed("expired_or_canceled_card")),
        Ok(vec![]),
    );
    check(
        reversed.clone(),
        refund_outcome(1, 2_500, OperationOutcome::Succeeded),
        Ok(vec![]),
    );
    // A total read from the provider now counts what is refunded now: after the reversal a
    // refund of the whole capture made elsewhere settles all of it, not just what exceeds the
    // reversed refund.
    let read_now = fact(ProviderFact::Refunded {
        charge_id: CHARGE.into(),
        amount_refunded: amt(10_000),
        current: true,
    });
    let now_settled = history_from(reversed.clone(), vec![read_now]);
    let record = record_after(&[reversed.clone(), now_settled].concat());
    assert_eq!(record.refunded, amt(10_000));
    assert_eq!(record.status, PaymentStatus::Refunded);
    // The money is back with the merchant: it can be refunded again.
    let again = history_from(reversed, vec![refund_request(10_000)]);
    assert!(matches!(again[0], PaymentEvent::RefundRequested(_)));
}

#[test]
fn a_cumulative_report_before_the_answer_settles_the_refund_once() {
    let captured = given(Some(PaymentStatus::Captured));
    let asked = history_from(captured.clone(), vec![refund_request(2_500)]);
    let requested = [captured, asked].concat();
    let reported = history_from(requested.clone(), vec![f_refunded(2_500)]);
    let after_report = [requested, reported].concat();
    let record = record_after(&after_report);
    assert_eq!(record.refunded, amt(2_500));
    assert_eq!(
        record.operation(OperationKind::Refund, 1).unwrap().state,
        OperationState::Succeeded,
        "the report's refund is the one we asked for"
    );
    // The answer arriving afterwards changes nothing.
    check(
        after_report.clone(),
        refund_outcome(1, 2_500, OperationOutcome::Succeeded),
        Ok(vec![]),
    );
    // Had the provider failed it instead, it is reversed; if the report had counted a refund
    // made elsewhere, the next total read now settles that again.
    let failed_instead = history_from(
        after_report.clone(),
        vec![refund_outcome(1, 2_500, failed("declined"))],
    );
    assert!(matches!(failed_instead[0], PaymentEvent::RefundReversed(_)));
    let reversed = [after_report, failed_instead].concat();
    assert_eq!(record_after(&reversed).refunded, amt(0));
    let read_now = fact(ProviderFact::Refunded {
        charge_id: CHARGE.into(),
        amount_refunded: amt(2_500),
        current: true,
    });
    let resettled = history_from(reversed.clone(), vec![read_now]);
    assert_eq!(
        record_after(&[reversed, resettled].concat()).refunded,
        amt(2_500)
    );
}

#[test]
fn a_refused_capture_lets_another_be_asked_under_a_new_key() {
    let authorized = given(Some(PaymentStatus::Authorized));
    let capture = |amount: i64| PaymentCommand::RequestCapture {
        amount: Some(amt(amount)),
        at: at(10),
    };
    let requested = [
        authorized.clone(),
        history_from(authorized, vec![capture(6_000)]),
    ]
    .concat();
    let capture_outcome = |sequence: u32, amount: i64, outcome: OperationOutcome| {
        f_operation(
            OperationKind::Capture,
            &psp_capture_key(pid(), sequence),
            amount,
            outcome,
        )
    };
    // Received: decided later; the capture stays the one in flight.
    let received = history_from(
        requested.clone(),
        vec![capture_outcome(1, 6_000, OperationOutcome::Pending)],
    );
    assert_eq!(
        received,
        vec![PaymentEvent::OperationReceived(OperationReceived {
            kind: OperationKind::Capture,
            sequence: 1,
            provider_id: None,
            at: at(10),
        })]
    );
    let pending = [requested, received].concat();
    check(
        pending.clone(),
        capture(5_000),
        Err(PaymentRejection::CaptureAlreadyRequested {
            requested: amt(6_000),
        }),
    );
    let refused = history_from(
        pending.clone(),
        vec![capture_outcome(1, 6_000, failed("authorization_expired"))],
    );
    let after = [pending, refused].concat();
    assert_eq!(record_after(&after).status, PaymentStatus::Authorized);
    check(
        after.clone(),
        capture(5_000),
        Ok(vec![PaymentEvent::CaptureRequested(CaptureRequested {
            sequence: 2,
            amount_minor: amt(5_000),
            psp_key: psp_capture_key(pid(), 2),
            at: at(10),
        })]),
    );
    // The second capture's success captures its amount.
    let second = [after.clone(), history_from(after, vec![capture(5_000)])].concat();
    check(
        second,
        capture_outcome(2, 5_000, OperationOutcome::Succeeded),
        Ok(vec![
            e_captured(5_000, 150, false),
            e_capture_entry(5_000, 150),
            e_released(10_000),
        ]),
    );
}

#[test]
fn a_capture_that_fails_after_it_succeeded_is_reversed_and_the_payment_fails() {
    let authorized = given(Some(PaymentStatus::Authorized));
    let requested = [
        authorized.clone(),
        history_from(
            authorized,
            vec![PaymentCommand::RequestCapture {
                amount: None,
                at: at(10),
            }],
        ),
    ]
    .concat();
    let outcome = |outcome: OperationOutcome| {
        f_operation(
            OperationKind::Capture,
            &psp_capture_key(pid(), 1),
            10_000,
            outcome,
        )
    };
    let captured = [
        requested.clone(),
        history_from(requested, vec![outcome(OperationOutcome::Succeeded)]),
    ]
    .concat();
    assert_eq!(record_after(&captured).status, PaymentStatus::Captured);
    // fee(10000) = 300: the capture's posting, mirrored.
    check(
        captured.clone(),
        outcome(failed("capture_failed")),
        Ok(vec![
            PaymentEvent::CaptureReversed(CaptureReversed {
                sequence: 1,
                amount_minor: amt(10_000),
                fee_minor: amt(300),
                reason: "capture_failed".into(),
                at: at(10),
            }),
            posted(
                "capture:op:1:reversed",
                vec![
                    (clearing(), 10_000),
                    (customer(), 300 - 10_000),
                    (revenue(), -300),
                ],
            ),
        ]),
    );
    let reversed = [
        captured.clone(),
        history_from(captured.clone(), vec![outcome(failed("capture_failed"))]),
    ]
    .concat();
    let record = record_after(&reversed);
    assert_eq!(record.status, PaymentStatus::Failed);
    assert_eq!(record.captured, amt(0));
    assert_eq!(record.fee, amt(0));
    assert_eq!(record.failure_reason.as_deref(), Some("capture_failed"));
    // Repeated, the failure changes nothing more; a late success is the earlier state.
    check(
        reversed.clone(),
        outcome(failed("capture_failed")),
        Ok(vec![]),
    );
    check(
        reversed.clone(),
        outcome(OperationOutcome::Succeeded),
        Ok(vec![]),
    );
    check(
        reversed,
        refund_request(1_000),
        Err(PaymentRejection::InvalidTransition {
            from: PaymentStatus::Failed,
            input: Input::RequestRefund,
        }),
    );

    // Refunded since: the failure is flagged for a person, nothing is reversed.
    let refunded = [
        captured.clone(),
        history_from(captured, vec![refund_request(2_500)]),
    ]
    .concat();
    let refunded = [
        refunded.clone(),
        history_from(
            refunded,
            vec![refund_outcome(1, 2_500, OperationOutcome::Succeeded)],
        ),
    ]
    .concat();
    check(
        refunded,
        outcome(failed("capture_failed")),
        Ok(contradiction(&format!(
            "capture {} failed (capture_failed) after it succeeded, with the payment partially_refunded",
            psp_capture_key(pid(), 1)
        ))),
    );
}

/// A reversal (Adyen's CAPTURE_FAILED, REFUND_FAILED) may be delivered before the success it
/// reverses: the operation then ends as if both had arrived in order, and the late success
/// changes nothing.
#[test]
fn a_reversal_told_before_its_success_ends_the_operation_as_both_in_order_do() {
    let reversed = |reason: &str| OperationOutcome::Reversed {
        reason: reason.into(),
    };
    let after = |given: &[PaymentEvent], commands: Vec<PaymentCommand>| {
        [given.to_vec(), history_from(given.to_vec(), commands)].concat()
    };
    // A capture, from an authorized payment.
    let authorized = given(Some(PaymentStatus::Authorized));
    let capture = |outcome: OperationOutcome| {
        f_operation(
            OperationKind::Capture,
            &psp_capture_key(pid(), 1),
            10_000,
            outcome,
        )
    };
    let requested = after(
        &authorized,
        vec![PaymentCommand::RequestCapture {
            amount: None,
            at: at(10),
        }],
    );
    let in_order = after(
        &requested,
        vec![
            capture(OperationOutcome::Succeeded),
            capture(failed("capture_failed")),
        ],
    );
    let told_first = after(&requested, vec![capture(reversed("capture_failed"))]);
    // From authorized straight to failed: a move the table allows.
    let decided = decide(
        &Payment::replay(&requested),
        capture(reversed("capture_failed")),
    );
    check(
        requested.clone(),
        capture(reversed("capture_failed")),
        decided,
    );
    let record = record_after(&told_first);
    assert_eq!(record, record_after(&in_order));
    assert_eq!(record.status, PaymentStatus::Failed);
    assert_eq!(record.captured, amt(0));
    assert_eq!(record.operations[0].state, OperationState::Reversed);
    assert_eq!(
        balances(&told_first),
        balances(&in_order),
        "the same money moved"
    );
    check(
        told_first.clone(),
        capture(OperationOutcome::Succeeded),
        Ok(vec![]),
    );
    check(
        told_first.clone(),
        capture(reversed("capture_failed")),
        Ok(vec![]),
    );
    // Told after the success, it is the failure alone.
    let captured = after(&requested, vec![capture(OperationOutcome::Succeeded)]);
    let failed_after = after(&captured, vec![capture(failed("capture_failed"))]);
    let reversed_after = after(&captured, vec![capture(reversed("capture_failed"))]);
    assert_eq!(reversed_after, failed_after);

    // A refund, from a captured payment.
    let captured = given(Some(PaymentStatus::Captured));
    let requested = after(&captured, vec![refund_request(2_500)]);
    let in_order = after(
        &requested,
        vec![
            refund_outcome(1, 2_500, OperationOutcome::Succeeded),
            refund_outcome(1, 2_500, failed("refund_failed")),
        ],
    );
    let told_first = after(
        &requested,
        vec![refund_outcome(1, 2_500, reversed("refund_failed"))],
    );
    let record = record_after(&told_first);
    assert_eq!(record, record_after(&in_order));
    assert_eq!(record.refunded, amt(0));
    assert_eq!(record.operations[0].state, OperationState::Reversed);
    assert_eq!(balances(&told_first), balances(&in_order));
    check(
        told_first,
        refund_outcome(1, 2_500, OperationOutcome::Succeeded),
        Ok(vec![]),
    );
}

/// The entries `events` post, by id.
fn entries(events: &[PaymentEvent]) -> std::collections::BTreeMap<String, JournalEntry> {
    events
        .iter()
        .filter_map(|event| match event {
            PaymentEvent::EntryPosted(posted) => {
                Some((posted.entry.id().to_string(), posted.entry.clone()))
            }
            _ => None,
        })
        .collect()
}

/// The provider ends an authorization (Adyen's EXPIRE, CANCELLATION) while our capture of it is
/// open, and the notifications arrive in either order: told before the capture's success, the
/// end waits for it and the capture is posted as in the natural order (where the end, after the
/// capture, is the uncaptured remainder's and changes nothing); told before its refusal, the
/// payment fails with the end's reason as in the natural order. Nothing is flagged, whether the
/// capture took all of the authorization or part of it.
#[test]
fn an_authorization_ended_before_its_capture_s_outcome_ends_as_in_order() {
    let authorized = given(Some(PaymentStatus::Authorized));
    for (captured, fee) in [(10_000, 300), (6_000, 180)] {
        let requested = [
            authorized.clone(),
            history_from(
                authorized.clone(),
                vec![PaymentCommand::RequestCapture {
                    amount: Some(amt(captured)),
                    at: at(10),
                }],
            ),
        ]
        .concat();
        let capture = |outcome: OperationOutcome| {
            f_operation(
                OperationKind::Capture,
                &psp_capture_key(pid(), 1),
                captured,
                outcome,
            )
        };
        let ended = f_authorization_ended("expired");
        for (outcome, status) in [
            (OperationOutcome::Succeeded, PaymentStatus::Captured),
            (failed("authorisation_expired"), PaymentStatus::Failed),
        ] {
            let orders = [
                vec![capture(outcome.clone()), ended.clone()],
                vec![ended.clone(), capture(outcome.clone())],
            ];
            let mut ends = Vec::new();
            for order in orders {
                let mut events = requested.clone();
                for command in order {
                    let payment = Payment::replay(&events);
                    let decided = decide(&payment, command.clone());
                    check(events.clone(), command, decided.clone());
                    events.extend(decided.unwrap());
                }
                ends.push(events);
            }
            let (in_order, ended_first) = (&ends[0], &ends[1]);
            let record = record_after(ended_first);
            assert_eq!(record, record_after(in_order), "{captured} {outcome:?}");
            assert_eq!(record.status, status);
            assert!(!record.needs_review(), "{record:?}");
            assert_eq!(record.authorization_ended, None);
            assert_eq!(entries(ended_first), entries(in_order), "the same postings");
            if status == PaymentStatus::Captured {
                assert_eq!(record.captured, amt(captured));
                assert_eq!(
                    entries(ended_first)
                        .get(&EntryId::derived(&format!("{}:capture", pid())).to_string()),
                    Some(match &e_capture_entry(captured, fee) {
                        PaymentEvent::EntryPosted(posted) => &posted.entry,
                        _ => unreachable!(),
                    })
                );
            } else {
                assert_eq!(record.failure_reason.as_deref(), Some("expired"));
                assert_eq!(record.operations[0].state, OperationState::Refused);
            }
            // Either notification told again changes nothing.
            check(ended_first.clone(), capture(outcome.clone()), Ok(vec![]));
            check(ended_first.clone(), ended.clone(), Ok(vec![]));
        }
        // While the capture is open, the end is only recorded, once.
        check(
            requested.clone(),
            ended.clone(),
            Ok(vec![PaymentEvent::AuthorizationEnded(AuthorizationEnded {
                charge_id: CHARGE.into(),
                reason: "expired".into(),
                at: at(10),
            })]),
        );
        let waiting = [
            requested.clone(),
            history_from(requested, vec![ended.clone()]),
        ]
        .concat();
        assert_eq!(record_after(&waiting).status, PaymentStatus::Authorized);
        check(waiting, f_authorization_ended("canceled"), Ok(vec![]));
    }
}

/// What the postings in `events` leave each account with.
fn balances(events: &[PaymentEvent]) -> std::collections::BTreeMap<String, i64> {
    let mut balances = std::collections::BTreeMap::new();
    for event in events {
        if let PaymentEvent::EntryPosted(posted) = event {
            for leg in posted.entry.legs() {
                *balances.entry(leg.account.to_string()).or_default() += leg.amount.minor();
            }
        }
    }
    balances
}

#[test]
fn an_outcome_of_another_amount_is_flagged_not_applied() {
    let captured = given(Some(PaymentStatus::Captured));
    let requested = [
        captured.clone(),
        history_from(captured, vec![refund_request(2_500)]),
    ]
    .concat();
    check(
        requested,
        refund_outcome(1, 2_600, OperationOutcome::Succeeded),
        Ok(contradiction(&format!(
            "refund {} reported for 2600 succeeded, we asked refund 2500",
            psp_refund_key(pid(), 1)
        ))),
    );
}

#[test]
fn the_request_that_answered_an_operation_is_recorded_once() {
    let mut given = given(Some(PaymentStatus::Captured));
    let refund = PaymentCommand::RequestRefund {
        amount: amt(2_500),
        at: at(10),
    };
    given.extend(decide(&Payment::replay(&given), refund).unwrap());
    let answer = |id: &str, replayed: bool, outcome: OperationOutcome| {
        fact(ProviderFact::Operation {
            kind: OperationKind::Refund,
            charge_id: CHARGE.into(),
            psp_key: psp_refund_key(pid(), 1),
            provider_id: Some("re_1".into()),
            amount: amt(2_500),
            outcome,
            request: Some(ProviderRequest {
                id: id.into(),
                replayed,
            }),
        })
    };
    let pending = decide(
        &Payment::replay(&given),
        answer("req_1", false, OperationOutcome::Pending),
    )
    .unwrap();
    assert!(matches!(
        pending.as_slice(),
        [
            PaymentEvent::OperationAnswered(OperationAnswered { request_id, replayed: false, .. }),
            PaymentEvent::OperationReceived(_),
        ] if request_id == "req_1"
    ));
    given.extend(pending);
    // The same answer replayed by the provider under the same request: nothing new.
    let again = answer("req_1", true, OperationOutcome::Pending);
    assert_eq!(decide(&Payment::replay(&given), again), Ok(vec![]));
    // A later answer from another request is recorded beside the first, with its outcome.
    let settled = decide(
        &Payment::replay(&given),
        answer("req_2", true, OperationOutcome::Succeeded),
    )
    .unwrap();
    assert!(matches!(
        settled.first(),
        Some(PaymentEvent::OperationAnswered(_))
    ));
    given.extend(settled);
    let record = Payment::replay(&given).record.unwrap();
    let requests: Vec<(&str, bool)> = record.operations[0]
        .requests
        .iter()
        .map(|request| (request.id.as_str(), request.replayed))
        .collect();
    assert_eq!(requests, [("req_1", false), ("req_2", true)]);
}

/// A log written before a dispute's opening posted the provider's withdrawal: its close moves
/// the money as the rule then was (a lost one from clearing to the customer, a won one nothing).
#[test]
fn a_dispute_opened_without_a_withdrawal_closes_as_it_was_opened() {
    let captured = given(Some(PaymentStatus::Captured));
    let opened = [captured, vec![e_dispute_opened("dp_1", 10_000).remove(0)]].concat();
    check(
        opened.clone(),
        f_dispute_closed("dp_1", 10_000, DisputeOutcome::Lost),
        Ok(vec![
            e_dispute_closed("dp_1", DisputeOutcome::Lost),
            posted(
                "dispute:dp_1:lost",
                vec![(clearing(), 10_000), (customer(), -10_000)],
            ),
        ]),
    );
    check(
        opened,
        f_dispute_closed("dp_1", 10_000, DisputeOutcome::Won),
        Ok(vec![e_dispute_closed("dp_1", DisputeOutcome::Won)]),
    );
}

/// A refund settled by a cumulative total before its own answer named it (Stripe's
/// `charge.refunded` ahead of the refund's answer) learns its provider id from that answer, once.
#[test]
fn a_refund_settled_by_a_total_learns_its_id_from_its_answer() {
    let captured = given(Some(PaymentStatus::Captured));
    let asked = history_from(captured.clone(), vec![refund_request(2_500)]);
    let requested = [captured, asked].concat();
    let settled = history_from(requested.clone(), vec![f_refunded(2_500)]);
    let before = [requested, settled].concat();
    assert_eq!(record_after(&before).operations[0].provider_id, None);
    let PaymentCommand::Provider {
        fact,
        fees,
        at: answered_at,
    } = refund_outcome(1, 2_500, OperationOutcome::Succeeded)
    else {
        unreachable!("refund_outcome builds a provider fact")
    };
    let ProviderFact::Operation {
        kind,
        charge_id,
        psp_key,
        amount,
        outcome,
        request,
        ..
    } = fact
    else {
        unreachable!("refund_outcome builds an operation fact")
    };
    let named = PaymentCommand::Provider {
        fact: ProviderFact::Operation {
            kind,
            charge_id,
            psp_key,
            provider_id: Some("re_1".into()),
            amount,
            outcome,
            request,
        },
        fees,
        at: answered_at,
    };
    let identified = vec![PaymentEvent::OperationIdentified(OperationIdentified {
        kind: OperationKind::Refund,
        sequence: 1,
        provider_id: "re_1".into(),
        at: at(10),
    })];
    check(before.clone(), named.clone(), Ok(identified.clone()));
    let after = [before, identified].concat();
    assert_eq!(
        record_after(&after).operations[0].provider_id.as_deref(),
        Some("re_1")
    );
    check(after, named, Ok(vec![]));
}

/// The chaos campaign's seed 333414799: a refund settled, then reversed at the provider while a
/// second refund of ours was open, and the reversal's webhook carried a snapshot of the charge
/// counting the second refund alone (the provider had succeeded it for a moment before failing
/// it). The snapshot's excess over every refund ever settled (7,636 - 545) is no refund of ours:
/// settling it would refund 7,091 that nobody asked for, which the second refund's failure then
/// leaves with the customer.
#[test]
fn a_snapshot_its_open_refunds_do_not_explain_settles_nothing() {
    let captured = history(vec![create(), f_captured(8_233)]);
    let steps = vec![
        refund_request(545),
        refund_outcome(1, 545, OperationOutcome::Succeeded),
        refund_request(7_636),
        refund_outcome(1, 545, failed("expired_or_canceled_card")),
    ];
    let before = [captured.clone(), history_from(captured, steps)].concat();
    assert_eq!(record_after(&before).refunded, amt(0));
    check(before.clone(), f_refunded(7_636), Ok(vec![]));

    // The second refund's own outcome settles it, or fails it, as without the snapshot.
    let failed_after = history_from(
        before.clone(),
        vec![
            f_refunded(7_636),
            refund_outcome(2, 7_636, failed("declined")),
        ],
    );
    let record = record_after(&[before.clone(), failed_after].concat());
    assert_eq!(record.refunded, amt(0));
    assert_eq!(
        record.operation(OperationKind::Refund, 2).unwrap().state,
        OperationState::Refused
    );
    let succeeded_after = history_from(
        before.clone(),
        vec![
            f_refunded(7_636),
            refund_outcome(2, 7_636, OperationOutcome::Succeeded),
        ],
    );
    assert_eq!(
        record_after(&[before.clone(), succeeded_after].concat()).refunded,
        amt(7_636)
    );

    // A snapshot that still counts the reversed refund and counts the open one too is explained
    // by it: the open refund settles.
    let settled = history_from(before.clone(), vec![f_refunded(545 + 7_636)]);
    let record = record_after(&[before, settled].concat());
    assert_eq!(record.refunded, amt(7_636));
    assert_eq!(
        record.operation(OperationKind::Refund, 2).unwrap().state,
        OperationState::Succeeded
    );
}
