//! Payouts as the port shows them: the provider paying its balance out to our bank account, with
//! every balance transaction the payout covered and the charge whose money each one moved, so
//! that the ledger can tell whose money left the clearing account.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::provider::Charge;

/// Where a payout stands at the provider.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PayoutStatus {
    /// Created, not yet sent to the bank.
    Pending,
    /// Sent, not yet arrived.
    InTransit,
    /// Arrived (a bank may still return it: then `Failed`).
    Paid,
    /// Refused by the bank, before or after it was `Paid`; its money is back in the balance.
    Failed,
    /// Withdrawn before it was sent.
    Canceled,
    /// A status this version does not know: nothing is decided on it.
    #[serde(other)]
    Other,
}

/// One balance transaction a payout covered.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PayoutTransaction {
    /// The provider's id (`txn_…`).
    pub id: String,
    /// The provider's type (`charge`, `refund`, `refund_failure`, `adjustment`…).
    pub kind: String,
    /// Signed, net of the provider's fee, minor units.
    pub net_minor: i64,
    /// The charge whose money it moved (its id, as [`Charge::id`]), `None` when it moved money
    /// of no charge (a top-up, a fee on the account).
    pub charge_id: Option<String>,
}

/// A payout with what it covered.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Payout {
    /// The provider's id (`po_…`).
    pub id: String,
    pub status: PayoutStatus,
    pub amount_minor: i64,
    /// Upper case, as the ledger writes currencies.
    pub currency: String,
    pub created: DateTime<Utc>,
    #[serde(default)]
    pub failure_code: Option<String>,
    /// Every balance transaction the payout covered, read only for a paid payout (empty
    /// otherwise). A failed payout that a later one pays out again is in that one as the
    /// transactions it covered.
    #[serde(default)]
    pub transactions: Vec<PayoutTransaction>,
    /// The charges those transactions moved money of, each as it stands now.
    #[serde(default)]
    pub charges: Vec<Charge>,
}
