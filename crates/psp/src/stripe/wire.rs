//! Stripe's objects as the ledger reads them (API version [`API_VERSION`]): only the fields the
//! adapter uses, decoded tolerantly (unknown fields ignored, unknown enum values kept as
//! `Other`), because Stripe adds fields and values without asking. The simulator's Stripe
//! dialect renders the full shapes of `fixtures3.json`; a test parses both with these types.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The API version the adapter pins in `Stripe-Version` and the simulator answers in.
pub const API_VERSION: &str = "2026-06-24.dahlia";

/// A field Stripe sends either as an id or, when asked with `expand[]`, as the object.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Expandable<T> {
    Id(String),
    Object(Box<T>),
}

impl<T: HasId> Expandable<T> {
    pub fn id(&self) -> &str {
        match self {
            Expandable::Id(id) => id,
            Expandable::Object(object) => object.id(),
        }
    }

    pub fn object(&self) -> Option<&T> {
        match self {
            Expandable::Id(_) => None,
            Expandable::Object(object) => Some(object),
        }
    }
}

/// An object with a Stripe id.
pub trait HasId {
    fn id(&self) -> &str;
}

/// `payment_intent.status`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum IntentStatus {
    RequiresPaymentMethod,
    RequiresConfirmation,
    RequiresAction,
    Processing,
    RequiresCapture,
    Succeeded,
    Canceled,
    #[serde(other)]
    Other,
}

/// `payment_intent.capture_method`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CaptureMethod {
    Automatic,
    AutomaticAsync,
    Manual,
    #[serde(other)]
    Other,
}

impl CaptureMethod {
    pub fn as_str(self) -> &'static str {
        match self {
            CaptureMethod::Automatic => "automatic",
            CaptureMethod::AutomaticAsync => "automatic_async",
            CaptureMethod::Manual => "manual",
            CaptureMethod::Other => "other",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RedirectToUrl {
    pub url: Option<String>,
    #[serde(default)]
    pub return_url: Option<String>,
}

/// `payment_intent.next_action`: only `redirect_to_url` means something to a server-only flow;
/// any other type is "customer action pending".
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct IntentNextAction {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub redirect_to_url: Option<RedirectToUrl>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PaymentIntent {
    pub id: String,
    pub amount: i64,
    #[serde(default)]
    pub amount_capturable: i64,
    #[serde(default)]
    pub amount_received: i64,
    pub currency: String,
    pub status: IntentStatus,
    pub capture_method: CaptureMethod,
    #[serde(default)]
    pub metadata: BTreeMap<String, String>,
    #[serde(default)]
    pub latest_charge: Option<Expandable<Charge>>,
    #[serde(default)]
    pub next_action: Option<IntentNextAction>,
    #[serde(default)]
    pub last_payment_error: Option<ErrorObject>,
    #[serde(default)]
    pub cancellation_reason: Option<String>,
    #[serde(default)]
    pub payment_method: Option<Expandable<PaymentMethod>>,
    pub created: i64,
}

impl HasId for PaymentIntent {
    fn id(&self) -> &str {
        &self.id
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PaymentMethod {
    pub id: String,
}

impl HasId for PaymentMethod {
    fn id(&self) -> &str {
        &self.id
    }
}

/// `charge.status`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ChargeStatus {
    Succeeded,
    Pending,
    Failed,
    #[serde(other)]
    Other,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Charge {
    pub id: String,
    pub amount: i64,
    #[serde(default)]
    pub amount_captured: i64,
    /// Cumulative over succeeded refunds.
    #[serde(default)]
    pub amount_refunded: i64,
    pub currency: String,
    pub status: ChargeStatus,
    #[serde(default)]
    pub captured: bool,
    #[serde(default)]
    pub disputed: bool,
    #[serde(default)]
    pub payment_intent: Option<Expandable<PaymentIntent>>,
    #[serde(default)]
    pub balance_transaction: Option<Expandable<BalanceTransaction>>,
    #[serde(default)]
    pub failure_code: Option<String>,
    #[serde(default)]
    pub metadata: BTreeMap<String, String>,
    pub created: i64,
}

impl HasId for Charge {
    fn id(&self) -> &str {
        &self.id
    }
}

/// `refund.status`. A `succeeded` refund may still become `failed`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RefundStatus {
    Pending,
    RequiresAction,
    Succeeded,
    Failed,
    Canceled,
    #[serde(other)]
    Other,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Refund {
    pub id: String,
    pub amount: i64,
    #[serde(default)]
    pub charge: Option<Expandable<Charge>>,
    #[serde(default)]
    pub payment_intent: Option<Expandable<PaymentIntent>>,
    pub currency: String,
    pub status: RefundStatus,
    #[serde(default)]
    pub failure_reason: Option<String>,
    #[serde(default)]
    pub metadata: BTreeMap<String, String>,
    pub created: i64,
}

impl HasId for Refund {
    fn id(&self) -> &str {
        &self.id
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FeeDetail {
    pub amount: i64,
    pub currency: String,
    #[serde(rename = "type")]
    pub kind: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BalanceTransaction {
    pub id: String,
    /// Signed gross, minor units.
    pub amount: i64,
    pub fee: i64,
    #[serde(default)]
    pub fee_details: Vec<FeeDetail>,
    /// `amount - fee`.
    pub net: i64,
    pub currency: String,
    #[serde(rename = "type")]
    pub kind: String,
    pub reporting_category: String,
    /// The charge, refund, dispute or payout it stems from (expanded with
    /// `expand[]=data.source`).
    #[serde(default)]
    pub source: Option<Expandable<BalanceSource>>,
    pub status: String,
    pub created: i64,
    pub available_on: i64,
}

/// A balance transaction's source, expanded: a charge, refund or dispute names its
/// PaymentIntent (a payout names none).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BalanceSource {
    pub id: String,
    pub object: String,
    #[serde(default)]
    pub payment_intent: Option<Expandable<PaymentIntent>>,
}

impl HasId for BalanceSource {
    fn id(&self) -> &str {
        &self.id
    }
}

impl HasId for BalanceTransaction {
    fn id(&self) -> &str {
        &self.id
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Dispute {
    pub id: String,
    pub amount: i64,
    pub currency: String,
    pub charge: Expandable<Charge>,
    #[serde(default)]
    pub payment_intent: Option<Expandable<PaymentIntent>>,
    /// `warning_needs_response` … `won`, `lost`, `prevented`.
    pub status: String,
    #[serde(default)]
    pub balance_transactions: Vec<BalanceTransaction>,
    pub created: i64,
}

impl HasId for Dispute {
    fn id(&self) -> &str {
        &self.id
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Payout {
    pub id: String,
    pub amount: i64,
    pub currency: String,
    /// `pending`, `in_transit`, `paid`, `failed`, `canceled`.
    pub status: String,
    #[serde(default)]
    pub balance_transaction: Option<Expandable<BalanceTransaction>>,
    /// Why a failed payout failed (`account_closed`…).
    #[serde(default)]
    pub failure_code: Option<String>,
    pub arrival_date: i64,
    pub created: i64,
}

impl HasId for Payout {
    fn id(&self) -> &str {
        &self.id
    }
}

/// `{"object": "list", "data": […], "has_more": …, "url": …}`, newest first.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct List<T> {
    pub data: Vec<T>,
    pub has_more: bool,
    #[serde(default)]
    pub url: Option<String>,
}

/// `error.type`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorType {
    ApiError,
    CardError,
    IdempotencyError,
    InvalidRequestError,
    #[serde(other)]
    Other,
}

/// The error object of every non-2xx answer, and `payment_intent.last_payment_error`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorObject {
    #[serde(rename = "type")]
    pub kind: ErrorType,
    #[serde(default)]
    pub code: Option<String>,
    #[serde(default)]
    pub decline_code: Option<String>,
    #[serde(default)]
    pub message: Option<String>,
    #[serde(default)]
    pub param: Option<String>,
    /// A decline during a confirm carries the PaymentIntent it was made on: it exists.
    #[serde(default)]
    pub payment_intent: Option<Box<PaymentIntent>>,
    #[serde(default)]
    pub charge: Option<String>,
}

/// `{"error": {…}}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    pub error: ErrorObject,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EventRequest {
    #[serde(default)]
    pub id: Option<String>,
    #[serde(default)]
    pub idempotency_key: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EventData {
    /// The object as it was when the event happened; a hint, not the truth of now.
    pub object: serde_json::Value,
    #[serde(default)]
    pub previous_attributes: Option<serde_json::Value>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Event {
    pub id: String,
    #[serde(rename = "type")]
    pub kind: String,
    pub created: i64,
    #[serde(default)]
    pub api_version: Option<String>,
    pub data: EventData,
    #[serde(default)]
    pub request: Option<EventRequest>,
}

impl HasId for Event {
    fn id(&self) -> &str {
        &self.id
    }
}
