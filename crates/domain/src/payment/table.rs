//! The payment transition table, as data.
//!
//! [`rule`] says, for every status and every command or provider fact, what
//! may happen. `decide` is written against it and the tests check every
//! decision against it, so the table cannot drift from the code; the table
//! in `docs/payment-states.md` is generated from it by [`markdown`] and a
//! test keeps the document in sync.

use serde::{Deserialize, Serialize};

use super::PaymentStatus::{self, *};

/// What arrives at a payment: a merchant or system command, or a provider
/// fact.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Input {
    Create,
    RequestCapture,
    RequestRefund,
    RequestCancel,
    Expire,
    FlagForReview,
    FactActionRequired,
    FactAuthorized,
    FactCaptured,
    FactFailed,
    FactAuthorizationEnded,
    FactRefunded,
    FactDisputeOpened,
    FactDisputeClosed,
    FactCaptureOutcome,
    FactRefundOutcome,
    FactCancelOutcome,
    FactProviderFee,
}

impl Input {
    pub const ALL: [Input; 18] = [
        Input::Create,
        Input::RequestCapture,
        Input::RequestRefund,
        Input::RequestCancel,
        Input::Expire,
        Input::FlagForReview,
        Input::FactActionRequired,
        Input::FactAuthorized,
        Input::FactCaptured,
        Input::FactFailed,
        Input::FactAuthorizationEnded,
        Input::FactRefunded,
        Input::FactDisputeOpened,
        Input::FactDisputeClosed,
        Input::FactCaptureOutcome,
        Input::FactRefundOutcome,
        Input::FactCancelOutcome,
        Input::FactProviderFee,
    ];

    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Input::Create => "create",
            Input::RequestCapture => "request_capture",
            Input::RequestRefund => "request_refund",
            Input::RequestCancel => "request_cancel",
            Input::Expire => "expire",
            Input::FlagForReview => "flag_for_review",
            Input::FactActionRequired => "fact_action_required",
            Input::FactAuthorized => "fact_authorized",
            Input::FactCaptured => "fact_captured",
            Input::FactFailed => "fact_failed",
            Input::FactAuthorizationEnded => "fact_authorization_ended",
            Input::FactRefunded => "fact_refunded",
            Input::FactDisputeOpened => "fact_dispute_opened",
            Input::FactDisputeClosed => "fact_dispute_closed",
            Input::FactCaptureOutcome => "fact_capture_outcome",
            Input::FactRefundOutcome => "fact_refund_outcome",
            Input::FactCancelOutcome => "fact_cancel_outcome",
            Input::FactProviderFee => "fact_provider_fee",
        }
    }

    #[must_use]
    pub const fn is_provider_fact(self) -> bool {
        matches!(
            self,
            Input::FactActionRequired
                | Input::FactAuthorized
                | Input::FactCaptured
                | Input::FactFailed
                | Input::FactAuthorizationEnded
                | Input::FactRefunded
                | Input::FactDisputeOpened
                | Input::FactDisputeClosed
                | Input::FactCaptureOutcome
                | Input::FactRefundOutcome
                | Input::FactCancelOutcome
                | Input::FactProviderFee
        )
    }
}

impl std::fmt::Display for Input {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The kind of answer a cell of the table gives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Accepted: events are recorded and the status ends in one of the
    /// cell's targets. A repeat of something already recorded yields no
    /// events, and a fact inconsistent in its details (an amount beyond the
    /// capture) yields `FlaggedForReview`, never another status.
    Apply,
    /// Already true or superseded (a late `requires_action` after capture):
    /// `Ok(vec![])`.
    Ignore,
    /// A provider fact contradicting the payment's history: recorded as
    /// `FlaggedForReview` (once), the status does not change. A fact that
    /// repeats what is already recorded yields nothing.
    Flag,
    /// A command the state machine forbids: `InvalidTransition`.
    Reject,
}

/// One cell: the outcome and the statuses the payment may end in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rule {
    pub outcome: Outcome,
    pub to: &'static [PaymentStatus],
}

const fn apply(to: &'static [PaymentStatus]) -> Rule {
    Rule {
        outcome: Outcome::Apply,
        to,
    }
}
const IGNORE: Rule = Rule {
    outcome: Outcome::Ignore,
    to: &[],
};
const FLAG: Rule = Rule {
    outcome: Outcome::Flag,
    to: &[],
};
const REJECT: Rule = Rule {
    outcome: Outcome::Reject,
    to: &[],
};

/// The transition table. `from` is `None` before the payment exists, where
/// only `create` is accepted (anything else is `NotFound`).
#[must_use]
pub const fn rule(from: Option<PaymentStatus>, input: Input) -> Rule {
    let Some(from) = from else {
        return match input {
            Input::Create => apply(&[Pending]),
            _ => REJECT,
        };
    };
    match (input, from) {
        (Input::Create, _) => REJECT,

        (Input::RequestCapture, Authorized) => apply(&[Authorized]),
        (Input::RequestCapture, _) => REJECT,

        (Input::RequestRefund, Captured | PartiallyRefunded) => apply(one(from)),
        (Input::RequestRefund, _) => REJECT,

        // The merchant's cancel of an authorization: recorded, and the provider decides (a
        // capture sent before it may still win). Once canceled there is nothing left to cancel.
        (Input::RequestCancel, Authorized) => apply(&[Authorized]),
        (Input::RequestCancel, _) => REJECT,

        (Input::Expire, Pending | RequiresAction) => apply(&[Expired]),
        (Input::Expire, Expired) => IGNORE,
        (Input::Expire, _) => REJECT,

        (Input::FlagForReview, _) => FLAG,

        (Input::FactActionRequired, Pending | RequiresAction) => apply(&[RequiresAction]),
        (Input::FactActionRequired, _) => IGNORE,

        (Input::FactAuthorized, Pending | RequiresAction) => apply(&[Authorized]),
        (Input::FactAuthorized, Failed | Expired) => FLAG,
        (Input::FactAuthorized, _) => IGNORE,

        (Input::FactCaptured, Pending | RequiresAction | Authorized) => apply(&[Captured]),
        (Input::FactCaptured, _) => FLAG,

        // A failure of an authorization the merchant asked to cancel is the cancel's doing.
        (Input::FactFailed, Pending | RequiresAction) => apply(&[Failed]),
        (Input::FactFailed, Authorized) => apply(&[Failed, Canceled]),
        (Input::FactFailed, Failed | Expired | Canceled) => IGNORE,
        (Input::FactFailed, _) => FLAG,

        // The provider ended what was left of the authorization: before a capture the payment
        // fails; with a capture still open it stays authorized until the capture's outcome; once
        // captured (in part or whole) it is the uncaptured remainder's end and changes nothing.
        (Input::FactAuthorizationEnded, Pending | RequiresAction) => apply(&[Failed]),
        (Input::FactAuthorizationEnded, Authorized) => apply(&[Authorized, Failed, Canceled]),
        (Input::FactAuthorizationEnded, _) => IGNORE,

        (
            Input::FactRefunded,
            Pending | RequiresAction | Authorized | Captured | PartiallyRefunded,
        ) => apply(&[PartiallyRefunded, Refunded]),
        (Input::FactRefunded, _) => FLAG,

        (
            Input::FactDisputeOpened,
            Pending | RequiresAction | Authorized | Captured | PartiallyRefunded,
        ) => apply(&[Disputed]),
        (Input::FactDisputeOpened, _) => FLAG,

        (Input::FactDisputeClosed, Pending | RequiresAction | Authorized) => {
            apply(&[Disputed, Captured])
        }
        (Input::FactDisputeClosed, Captured) => apply(&[Disputed, Captured]),
        (Input::FactDisputeClosed, PartiallyRefunded) => apply(&[Disputed, PartiallyRefunded]),
        (Input::FactDisputeClosed, Disputed) => apply(&[Disputed, Captured, PartiallyRefunded]),
        (Input::FactDisputeClosed, _) => FLAG,

        // The outcome of a capture we asked for: a success captures, a refusal frees the
        // authorization for another capture (or fails the payment, if the provider ended the
        // authorization while the capture was open). A failure after the capture reverses it and the
        // payment fails (at once, from authorized, when the reversal arrives before the success);
        // once refunded or disputed, a late answer changes nothing (a failure is flagged).
        (Input::FactCaptureOutcome, Authorized) => apply(&[Authorized, Captured, Failed, Canceled]),
        // The capture lost to a cancel: its refusal is recorded (a success is flagged).
        (Input::FactCaptureOutcome, Canceled) => apply(&[Canceled]),
        (Input::FactCaptureOutcome, Captured) => apply(&[Captured, Failed]),
        (Input::FactCaptureOutcome, PartiallyRefunded | Refunded | Disputed) => apply(one(from)),
        (Input::FactCaptureOutcome, _) => FLAG,

        // The outcome of a refund we asked for: settled, refused (its amount is refundable
        // again) or reversed after it settled (the refunded total goes back down).
        (Input::FactRefundOutcome, Captured | PartiallyRefunded | Refunded) => {
            apply(&[Captured, PartiallyRefunded, Refunded])
        }
        (Input::FactRefundOutcome, Disputed) => apply(&[Disputed]),
        (Input::FactRefundOutcome, _) => FLAG,

        // The outcome of a cancel we asked for: a success cancels an authorization with nothing
        // captured (or, with a capture open, waits for that capture's outcome); a refusal leaves
        // the payment as it is. Where a capture won the race, the outcome is only recorded.
        // Before an authorization it can only be the stale sweep's cancel of an abandoned charge,
        // whose effect the charge itself tells.
        (Input::FactCancelOutcome, Authorized) => apply(&[Authorized, Canceled]),
        (Input::FactCancelOutcome, Pending | RequiresAction) => IGNORE,
        (Input::FactCancelOutcome, _) => apply(one(from)),

        // The provider's own fee on money it holds for us: only once money has moved.
        (Input::FactProviderFee, Captured | PartiallyRefunded | Refunded | Disputed) => {
            apply(one(from))
        }
        (Input::FactProviderFee, _) => FLAG,
    }
}

/// `&[status]` as a `'static` slice, for the cells that keep the status.
const fn one(status: PaymentStatus) -> &'static [PaymentStatus] {
    match status {
        Pending => &[Pending],
        RequiresAction => &[RequiresAction],
        Authorized => &[Authorized],
        Captured => &[Captured],
        PartiallyRefunded => &[PartiallyRefunded],
        Refunded => &[Refunded],
        Failed => &[Failed],
        Expired => &[Expired],
        Disputed => &[Disputed],
        Canceled => &[Canceled],
    }
}

/// The table as markdown: one row per status (plus "none"), one column per
/// input. `docs/payment-states.md` embeds this text verbatim.
#[must_use]
pub fn markdown() -> String {
    let mut out = String::from("| from \\ input |");
    for input in Input::ALL {
        out.push_str(&format!(" `{input}` |"));
    }
    out.push_str("\n|---|");
    for _ in Input::ALL {
        out.push_str("---|");
    }
    out.push('\n');
    let froms = std::iter::once(None).chain(PaymentStatus::ALL.into_iter().map(Some));
    for from in froms {
        match from {
            None => out.push_str("| *(none)* |"),
            Some(status) => out.push_str(&format!("| `{status}` |")),
        }
        for input in Input::ALL {
            let cell = match (from, rule(from, input).outcome) {
                (None, Outcome::Reject) => "not found".to_owned(),
                (_, Outcome::Apply) => {
                    let to: Vec<&str> = rule(from, input).to.iter().map(|s| s.as_str()).collect();
                    format!("→ {}", to.join(" / "))
                }
                (_, Outcome::Ignore) => "ignore".to_owned(),
                (_, Outcome::Flag) => "flag".to_owned(),
                (_, Outcome::Reject) => "**reject**".to_owned(),
            };
            out.push_str(&format!(" {cell} |"));
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn docs_embed_the_generated_table() {
        let docs = include_str!("../../../../docs/payment-states.md");
        assert!(
            docs.contains(&markdown()),
            "docs/payment-states.md is out of date; paste this table:\n{}",
            markdown()
        );
    }

    #[test]
    fn every_apply_cell_names_a_target_and_no_other_cell_does() {
        let froms = std::iter::once(None).chain(PaymentStatus::ALL.into_iter().map(Some));
        for from in froms {
            for input in Input::ALL {
                let r = rule(from, input);
                assert_eq!(
                    r.outcome == Outcome::Apply,
                    !r.to.is_empty(),
                    "{from:?} {input}"
                );
            }
        }
    }

    #[test]
    fn only_provider_facts_and_review_flags_are_never_rejected() {
        for from in PaymentStatus::ALL {
            for input in Input::ALL {
                if input.is_provider_fact() || input == Input::FlagForReview {
                    assert_ne!(
                        rule(Some(from), input).outcome,
                        Outcome::Reject,
                        "{from} {input}"
                    );
                }
            }
        }
    }

    #[test]
    fn one_is_total() {
        for status in PaymentStatus::ALL {
            assert_eq!(one(status), &[status]);
        }
    }
}
