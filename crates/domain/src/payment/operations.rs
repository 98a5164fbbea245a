//! Provider operations: every modification we send to the provider for a payment (a capture, a
//! refund, a cancel) is a record of its own, with its sequence, its PSP key and the state of its outcome.
//!
//! A provider answers an operation late, asynchronously or not at all, and may turn a success
//! into a failure days later (a refund that bounces). So an operation's state is folded from the
//! payment's events like everything else, and what the merchant reserved by asking (a refund's
//! amount, the one capture in flight) is released only by an event that says the provider
//! refused it. Nothing is changed in place: a reversed refund keeps its `Succeeded` history in
//! the log and adds `RefundReversed` with its reversing entry.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::money::Amount;

/// What an operation asks of the provider.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OperationKind {
    Capture,
    Refund,
    /// Ends what is left of an authorization: the merchant no longer wants it captured.
    Cancel,
}

impl OperationKind {
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            OperationKind::Capture => "capture",
            OperationKind::Refund => "refund",
            OperationKind::Cancel => "cancel",
        }
    }
}

/// Where an operation stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OperationState {
    /// Recorded and (perhaps) sent; no answer yet, or an answer we could not trust. The
    /// reconciler drives it to an outcome.
    Requested,
    /// The provider received it and decides later (asynchronous modifications, pending refunds).
    Pending,
    Succeeded,
    /// The provider refused it: what it reserved is released.
    Refused,
    /// It succeeded, then failed at the provider (a refund returned days later, a capture the
    /// scheme refused): a reversing entry undid its posting.
    Reversed,
}

impl OperationState {
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            OperationState::Requested => "requested",
            OperationState::Pending => "pending",
            OperationState::Succeeded => "succeeded",
            OperationState::Refused => "refused",
            OperationState::Reversed => "reversed",
        }
    }

    /// Still waiting for the provider's final word.
    #[must_use]
    pub const fn is_open(self) -> bool {
        matches!(self, OperationState::Requested | OperationState::Pending)
    }
}

/// One operation of a payment, as its events leave it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Operation {
    pub kind: OperationKind,
    /// 1-based within its kind; names the operation at the provider (its PSP key).
    pub sequence: u32,
    pub amount: Amount,
    pub psp_key: String,
    pub state: OperationState,
    /// The provider's id of the operation (`re_…`), once it said one.
    pub provider_id: Option<String>,
    /// Why it was refused or reversed.
    pub reason: Option<String>,
    /// The provider's requests that answered it (Stripe's `Request-Id`), in the order heard,
    /// each once: what to search the provider's logs for.
    pub requests: Vec<ProviderRequest>,
    pub requested_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

/// One of the provider's requests that answered an operation: its id, and whether the provider
/// said it replayed an earlier answer under the same key (`Idempotent-Replayed`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProviderRequest {
    pub id: String,
    pub replayed: bool,
}

impl Operation {
    /// It succeeded at some point (it may have been reversed since).
    #[must_use]
    pub const fn settled_ever(&self) -> bool {
        matches!(
            self.state,
            OperationState::Succeeded | OperationState::Reversed
        )
    }

    /// An operation just asked for: no answer yet.
    #[must_use]
    pub fn requested(
        kind: OperationKind,
        sequence: u32,
        amount: Amount,
        psp_key: &str,
        at: DateTime<Utc>,
    ) -> Operation {
        Operation {
            kind,
            sequence,
            amount,
            psp_key: psp_key.to_owned(),
            state: OperationState::Requested,
            provider_id: None,
            reason: None,
            requests: Vec::new(),
            requested_at: at,
            updated_at: at,
        }
    }
}

/// What the provider says of one of our operations.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OperationOutcome {
    /// Received; decided later.
    Pending,
    Succeeded,
    Failed {
        reason: String,
    },
    /// Decided for and then against (a capture the card scheme rejected after it was done, a
    /// refund returned): a success and its reversal in one fact, so that notifications arriving
    /// in either order end the operation the same way.
    Reversed {
        reason: String,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_requested_and_pending_are_open() {
        use OperationState::*;
        for (state, open) in [
            (Requested, true),
            (Pending, true),
            (Succeeded, false),
            (Refused, false),
            (Reversed, false),
        ] {
            assert_eq!(state.is_open(), open, "{state:?}");
        }
    }
}
