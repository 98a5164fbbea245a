//! The provider port: what the ledger needs from any payment provider, in the
//! provider's own plain terms (i64 minor units, currency codes as strings).
//!
//! The types double as the wire format of the simulator's Stripe-like
//! protocol, so the simulator and the HTTP client cannot drift apart.
//! Decoding is tolerant (unknown fields are ignored) because a real provider
//! adds fields without asking us.

use std::collections::BTreeMap;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// Where a charge stands at the provider.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ChargeStatus {
    /// Captured (fully or partially); refunds do not change this status,
    /// `amount_refunded` does.
    Succeeded,
    /// Authorized, waiting for a capture.
    RequiresCapture,
    /// Waiting for the customer (a redirect, 3-D Secure).
    RequiresAction,
    /// Declined or abandoned; nothing was or will be charged.
    Failed,
}

/// What the customer must do before a `requires_action` charge can go on.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NextAction {
    /// Always `"redirect"` today; kept as a string so a new kind does not
    /// break decoding.
    #[serde(rename = "type")]
    pub kind: String,
    pub redirect_url: String,
}

/// Where a dispute (chargeback) stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DisputeStatus {
    Open,
    /// Closed in the merchant's favour: the money stays with us.
    Won,
    /// Closed in the cardholder's favour: the disputed amount is gone.
    Lost,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Dispute {
    pub status: DisputeStatus,
    pub amount_minor: i64,
    pub created: DateTime<Utc>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub closed: Option<DateTime<Utc>>,
}

/// A charge as the provider holds it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Charge {
    /// The provider's id (`ch_…`).
    pub id: String,
    pub status: ChargeStatus,
    /// The amount asked for (authorized), in minor units.
    pub amount_minor: i64,
    pub currency: String,
    #[serde(default)]
    pub amount_captured: i64,
    /// Cumulative over every refund, including ones made outside our API.
    #[serde(default)]
    pub amount_refunded: i64,
    /// The caller's reference (our payment id), so that a settlement report
    /// can be matched without the provider's id.
    #[serde(default)]
    pub reference: Option<String>,
    /// The key the charge was created with; a lookup by key finds it.
    pub idempotency_key: String,
    #[serde(default)]
    pub payment_method: String,
    /// Whether the charge captures as soon as it is authorized.
    #[serde(default = "default_true")]
    pub capture: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_code: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_action: Option<NextAction>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dispute: Option<Dispute>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub metadata: BTreeMap<String, String>,
    pub created: DateTime<Utc>,
    pub updated: DateTime<Utc>,
}

fn default_true() -> bool {
    true
}

/// A request to create a charge.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CreateCharge {
    /// Ours, derived from the payment so that every retry (and every process
    /// that resumes the payment) sends the same one.
    pub idempotency_key: String,
    pub amount_minor: i64,
    pub currency: String,
    pub payment_method: String,
    /// `true`: capture at once; `false`: authorize only.
    pub capture: bool,
    /// Our payment id, echoed in the charge and the settlement report.
    pub reference: Option<String>,
    pub metadata: BTreeMap<String, String>,
}

/// What became of a charge request. `Unknown` is not `Declined`: the
/// provider may hold a charge we have not heard of, so the payment must stay
/// pending until a lookup by key, a webhook or the report settles it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ChargeOutcome {
    /// Authorized and captured.
    Succeeded(Charge),
    /// Authorized; waits for a capture.
    Authorized(Charge),
    /// Waits for the customer (`next_action`).
    RequiresAction(Charge),
    /// The provider created the charge and declined it.
    Declined(Charge),
    /// The provider refused the request itself (4xx): no charge exists for
    /// it and sending it again cannot help.
    Rejected(Rejection),
    /// We do not know whether a charge exists: the answer timed out after
    /// the request was sent, or every attempt met a transient failure.
    Unknown { reason: String },
}

impl ChargeOutcome {
    /// Maps a charge the provider answered with to the outcome it means.
    pub fn from_charge(charge: Charge) -> ChargeOutcome {
        match charge.status {
            ChargeStatus::Succeeded => ChargeOutcome::Succeeded(charge),
            ChargeStatus::RequiresCapture => ChargeOutcome::Authorized(charge),
            ChargeStatus::RequiresAction => ChargeOutcome::RequiresAction(charge),
            ChargeStatus::Failed => ChargeOutcome::Declined(charge),
        }
    }
}

/// A permanent refusal by the provider, with its stable code.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rejection {
    pub status: u16,
    /// The provider's error code (`refund_exceeds_captured`…), or
    /// `http_<status>` when the body carried none.
    pub code: String,
    pub message: String,
}

/// A refund as the provider records it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Refund {
    /// The provider's id (`re_…`).
    pub id: String,
    /// The charge id.
    pub charge: String,
    pub amount_minor: i64,
    pub currency: String,
    /// The charge's cumulative refunded amount after this refund.
    pub charge_amount_refunded: i64,
    pub created: DateTime<Utc>,
}

/// One charge in a settlement report: every charge touched (created,
/// captured, refunded, disputed, completed…) inside the window, as it stands
/// when the report is made.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReportLine {
    pub charge_id: String,
    pub status: ChargeStatus,
    pub amount_minor: i64,
    pub amount_captured: i64,
    pub amount_refunded: i64,
    /// The provider's own processing fee on the captured amount.
    pub fee_minor: i64,
    pub currency: String,
    #[serde(default)]
    pub reference: Option<String>,
    pub idempotency_key: String,
    #[serde(default)]
    pub dispute_status: Option<DisputeStatus>,
    /// The last time the charge was touched inside the window.
    pub last_touched: DateTime<Utc>,
}

/// The settlement report for `[from, to)`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SettlementReport {
    pub from: DateTime<Utc>,
    pub to: DateTime<Utc>,
    pub data: Vec<ReportLine>,
}

/// Why a provider call other than a charge creation did not give an answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProviderError {
    /// The provider refused the request (4xx). Permanent: nothing happened
    /// and a retry cannot help.
    #[error("rejected by the provider: {} {} ({})", .0.status, .0.code, .0.message)]
    Rejected(Rejection),
    /// We do not know whether the effect happened: the answer timed out after
    /// sending, or the retries on transient failures ran out. Resolve it by
    /// looking the charge up; never treat it as a failure.
    #[error("outcome unknown: {reason}")]
    Unknown { reason: String },
    /// The provider answered 2xx with a body we cannot read. The effect
    /// happened (for a write) but we cannot tell its result.
    #[error("unreadable answer from the provider: {reason}")]
    Protocol { reason: String },
}

/// What the ledger needs from any payment provider.
///
/// Every write carries our idempotency key, so calling it again (after a
/// crash, a timeout, a retry) never repeats the effect.
#[async_trait]
pub trait Provider: Send + Sync {
    /// The provider's configured name (`sim`, `acme`…).
    fn name(&self) -> &str;

    /// Creates (or, for a key already used with the same request, returns)
    /// the charge.
    async fn create_charge(&self, req: &CreateCharge) -> ChargeOutcome;

    /// Captures an authorized charge; `None` captures the whole amount.
    async fn capture(
        &self,
        charge_id: &str,
        amount_minor: Option<i64>,
        idempotency_key: &str,
    ) -> Result<Charge, ProviderError>;

    /// Refunds part or all of the captured amount.
    async fn refund(
        &self,
        charge_id: &str,
        amount_minor: i64,
        idempotency_key: &str,
    ) -> Result<Refund, ProviderError>;

    /// The charge with the provider's id, or `None` when the provider has
    /// none.
    async fn get_charge(&self, charge_id: &str) -> Result<Option<Charge>, ProviderError>;

    /// The charge created with our idempotency key, or `None` when the
    /// provider never received (or never acted on) that key.
    async fn find_charge_by_key(
        &self,
        idempotency_key: &str,
    ) -> Result<Option<Charge>, ProviderError>;

    /// Every charge touched in `[from, to)`.
    async fn settlement_report(
        &self,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
    ) -> Result<Vec<ReportLine>, ProviderError>;
}
