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

use crate::event::WebhookEvent;
use crate::payout::Payout;

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
    /// The provider's id of the dispute, where every report of it carries one but no common
    /// creation time (Adyen's dispute `pspReference`: each of its notifications has its own
    /// date). Without it a dispute is named by its charge and creation time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// Whether the provider won it once and gave the money back (a reversal: Adyen's
    /// CHARGEBACK_REVERSED) before the status it is in: a `Lost` dispute that was reinstated is
    /// a second chargeback, which withdrew the money again.
    #[serde(default, skip_serializing_if = "is_false")]
    pub reinstated: bool,
}

fn is_false(value: &bool) -> bool {
    !*value
}

impl Dispute {
    /// How far it went, in the order a dispute's money moves: open, lost, won (after a loss
    /// too), lost again.
    fn stage(status: DisputeStatus, reinstated: bool) -> u8 {
        match (status, reinstated) {
            (DisputeStatus::Open, _) => 0,
            (DisputeStatus::Lost, false) => 1,
            (DisputeStatus::Won, _) => 2,
            (DisputeStatus::Lost, true) => 3,
        }
    }

    /// Takes one of the provider's records of this dispute's money, whatever order they are
    /// read in (a report's rows): only a later stage moves it on, closed `at`.
    pub fn advance(&mut self, status: DisputeStatus, reinstated: bool, at: DateTime<Utc>) {
        if Self::stage(status, reinstated) > Self::stage(self.status, self.reinstated) {
            self.status = status;
            self.reinstated = reinstated;
            self.closed = (status != DisputeStatus::Open).then_some(at);
        }
    }
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
    /// Cumulative over every refund whose status is `Succeeded`, including
    /// ones made outside our API; a pending, failed or reversed refund does
    /// not count.
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
    /// The fees the provider keeps out of this charge's money, one per balance transaction that
    /// carries one (its processing fee, a dispute fee). Empty where the provider reports none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub provider_fees: Vec<ProviderFee>,
    pub created: DateTime<Utc>,
    pub updated: DateTime<Utc>,
}

/// A fee the provider kept, named by its balance transaction (`txn_…`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProviderFee {
    pub transaction_id: String,
    /// Negative when the provider gives a fee back.
    pub fee_minor: i64,
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
    /// Our customer's id, for a provider that keeps payment methods per shopper (Adyen's
    /// `shopperReference`).
    pub customer: Option<String>,
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

/// What an operation on an existing charge does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OperationKind {
    /// Captures (part of) an authorisation.
    Capture,
    /// Gives back (part of) the captured amount.
    Refund,
    /// Voids an uncaptured authorisation or an abandoned `requires_action`
    /// charge.
    Cancel,
}

/// Where an operation stands at the provider. `Pending` is an answer, not
/// an unknown: the provider holds the operation and decides it later (an
/// asynchronous provider's "received"), announcing the outcome with an
/// `operation.updated` webhook.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OperationStatus {
    Pending,
    Succeeded,
    /// Decided against; for a refund this may come after `Succeeded` (a
    /// late reversal), and the refunded amount counts no more.
    Failed,
    /// Decided for and then against, told as one outcome (Adyen's
    /// CAPTURE_FAILED, REFUND_FAILED, REFUNDED_REVERSED): whether or not its
    /// success was seen first, what the operation did is undone.
    Reversed,
}

/// An operation on a charge (capture, refund, cancel) as the provider
/// records it. Operations are records of their own, not just a new state of
/// the charge, because real providers decide them asynchronously and may
/// reverse them later: the operation's status is what tells.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Operation {
    /// The provider's id (`cap_…`, `re_…`, `cnl_…`).
    pub id: String,
    pub kind: OperationKind,
    /// The charge id.
    pub charge: String,
    /// The key the operation was requested with; a lookup by key finds it.
    pub idempotency_key: String,
    /// The amount the operation moves (the captured or refunded amount; for
    /// a cancel, what was left uncaptured).
    pub amount_minor: i64,
    pub currency: String,
    pub status: OperationStatus,
    /// Why a failed operation failed (`expired_or_canceled_card`…).
    #[serde(default)]
    pub failure_reason: Option<String>,
    pub created: DateTime<Utc>,
    pub updated: DateTime<Utc>,
}

/// The answer to an operation request: the operation, and the charge as it
/// stands after it when the provider says (the simulator always does; a
/// provider that answers only "received" does not).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OperationAnswer {
    pub operation: Operation,
    #[serde(default)]
    pub charge: Option<Charge>,
    /// The provider's request that answered, when it names one (Stripe's `Request-Id`, and
    /// whether `Idempotent-Replayed` said it replayed an earlier answer).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request: Option<ProviderRequest>,
}

/// The provider's own name for the request that answered us.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProviderRequest {
    pub id: String,
    pub replayed: bool,
}

/// What a provider can do, so that the reconciler picks a strategy the
/// provider allows instead of assuming the simulator's conveniences.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Capabilities {
    /// A charge or an operation can be found by our idempotency key. When
    /// `true` the reconciler settles a write whose answer was lost by
    /// looking it up by key; when `false` the lookups answer
    /// [`ProviderError::Unsupported`] and the reconciler re-sends the write
    /// with the same key (safe while the key lives) or waits for the
    /// webhook or the report.
    pub lookup_by_key: bool,
    /// A charge or an operation can be read by the provider's own id. When
    /// `true` the reconciler refreshes what it knows the id of (a pending
    /// operation, a charge) by reading it; when `false` it waits for the
    /// webhook or the report.
    pub lookup_by_id: bool,
    /// Captures, refunds and cancels may answer `Pending` and be decided
    /// later by an `operation.updated` webhook. When `true` the reconciler
    /// treats a pending operation as normal until a timeout, then looks it
    /// up (or raises an exception); when `false` a pending answer is itself
    /// a misfit worth flagging.
    pub async_modifications: bool,
    /// How long the provider remembers an idempotency key. The reconciler
    /// re-sends a write with its key only within this lifetime (after it,
    /// a re-send could repeat the effect) and raises a manual exception
    /// past it.
    pub key_lifetime: std::time::Duration,
    /// How long past a payment's expiry the settlement report must have been compared before a
    /// charge whose creation was never answered is concluded absent, for a provider without a
    /// lookup by key. Zero where the report lists every charge of its window; Adyen's webhook
    /// window and two daily reports where a payment may surface a day late.
    pub absence_confirmed_after: std::time::Duration,
    /// How much of a report window the reconciler asks for at once: a request's lines are held in
    /// memory together, so a busy window (or a first one, a day long) is compared a slice at a
    /// time. `None` where the report comes in units of the provider's own that every request
    /// reads whole (Adyen's daily files).
    pub report_slice: Option<std::time::Duration>,
}

impl Capabilities {
    /// The simulator's protocol: every lookup, synchronous answers, keys
    /// kept for 24 hours (as Stripe keeps them).
    pub const SIM: Capabilities = Capabilities {
        lookup_by_key: true,
        lookup_by_id: true,
        async_modifications: false,
        key_lifetime: std::time::Duration::from_secs(24 * 60 * 60),
        absence_confirmed_after: std::time::Duration::ZERO,
        report_slice: Some(REPORT_SLICE),
    };
}

/// [`Capabilities::report_slice`] of the providers whose reports are lists by time (the
/// simulator, Stripe): at 1,000 payments a second, 10,000 lines at once.
pub const REPORT_SLICE: std::time::Duration = std::time::Duration::from_secs(10);

impl Default for Capabilities {
    fn default() -> Self {
        Capabilities::SIM
    }
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
    /// The fees the provider kept on this charge, per balance transaction (as on [`Charge`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub provider_fees: Vec<ProviderFee>,
    pub currency: String,
    #[serde(default)]
    pub reference: Option<String>,
    pub idempotency_key: String,
    #[serde(default)]
    pub dispute_status: Option<DisputeStatus>,
    /// The charge's dispute as it stands, so that a dispute whose webhooks never arrived can be
    /// posted from the report alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dispute: Option<Dispute>,
    /// The charge's movements of money inside the window, where the provider reports them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub movements: Vec<Movement>,
    /// The last time the charge was touched inside the window.
    pub last_touched: DateTime<Utc>,
}

/// What a movement of money on the provider's account was.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MovementKind {
    /// A capture's money in.
    Charge,
    /// A refund's money out.
    Refund,
    /// A refund that failed after it succeeded: its money back in.
    RefundFailure,
    /// A dispute's amount withdrawn as it opened.
    DisputeWithdrawal,
    /// A won dispute's amount reinstated.
    DisputeReinstatement,
    /// Anything else (the ledger compares nothing of it).
    #[serde(other)]
    Other,
}

/// One movement of a charge's money on the provider's account (Stripe: a balance transaction),
/// so that reconciliation compares each with what we posted for it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Movement {
    /// The provider's id (`txn_…`).
    pub id: String,
    pub kind: MovementKind,
    /// Signed gross, minor units.
    pub amount_minor: i64,
    /// The provider's fee on it.
    pub fee_minor: i64,
    /// What it changed the provider's balance by: `amount - fee`.
    pub net_minor: i64,
    /// The object it stems from: the charge, the refund (`re_…`), the dispute.
    pub source: String,
}

/// The settlement report for `[from, to)`: every charge touched in it.
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
    /// The provider has no such route (a lookup it cannot do): asked
    /// without a network call, so the caller picks another strategy.
    #[error("the provider cannot {what}")]
    Unsupported { what: String },
}

/// What the ledger needs from any payment provider.
///
/// Every write carries our idempotency key, so calling it again (after a
/// crash, a timeout, a retry) never repeats the effect.
#[async_trait]
pub trait Provider: Send + Sync {
    /// The provider's configured name (`sim`, `acme`…).
    fn name(&self) -> &str;

    /// What this provider can do; fixed for the adapter's life.
    fn capabilities(&self) -> Capabilities;

    /// Creates (or, for a key already used with the same request, returns)
    /// the charge.
    async fn create_charge(&self, req: &CreateCharge) -> ChargeOutcome;

    /// Captures an authorized charge; `None` captures the whole amount. `currency` is the
    /// charge's (a provider that wants the amount spelled out, as Adyen does, sends it).
    async fn capture(
        &self,
        charge_id: &str,
        amount_minor: Option<i64>,
        currency: &str,
        idempotency_key: &str,
    ) -> Result<OperationAnswer, ProviderError>;

    /// Refunds part or all of the captured amount, in the charge's `currency`. The charge's
    /// `amount_refunded` counts the refund only once it has succeeded.
    async fn refund(
        &self,
        charge_id: &str,
        amount_minor: i64,
        currency: &str,
        idempotency_key: &str,
    ) -> Result<OperationAnswer, ProviderError>;

    /// Cancels an uncaptured authorisation or an abandoned
    /// `requires_action` charge; the charge becomes `Failed` with
    /// `failure_code` `"canceled"`.
    async fn cancel(
        &self,
        charge_id: &str,
        idempotency_key: &str,
    ) -> Result<OperationAnswer, ProviderError>;

    /// Cancels whatever the charge request named by `reference` (our payment id) created, for a
    /// payment whose creation was never answered and is no longer wanted; the provider tells the
    /// outcome by webhook. Answers the provider's id of the cancel request. `Err(Unsupported)`
    /// without a network call where the provider cannot find a payment by our reference (the
    /// default).
    async fn cancel_by_reference(
        &self,
        reference: &str,
        _idempotency_key: &str,
    ) -> Result<String, ProviderError> {
        Err(ProviderError::Unsupported {
            what: format!("cancel by reference {reference}"),
        })
    }

    /// The charge with the provider's id, or `None` when the provider has
    /// none.
    async fn get_charge(&self, charge_id: &str) -> Result<Option<Charge>, ProviderError>;

    /// The charge created with our idempotency key, or `None` when the
    /// provider never received (or never acted on) that key.
    /// `Err(Unsupported)` without a network call when
    /// `capabilities().lookup_by_key` is false.
    async fn find_charge_by_key(
        &self,
        idempotency_key: &str,
    ) -> Result<Option<Charge>, ProviderError>;

    /// A cross-check before a charge is concluded absent, for a provider without a lookup by
    /// key: the charge whose creation or confirmation a request under `idempotency_key` caused,
    /// found in the provider's own record of the requests it acted on in `[from, to)` (Stripe's
    /// events list, whose `request.idempotency_key` names each event's request). `None` when
    /// that record names none with money moved; `Err(Unsupported)` without a network call when
    /// the provider keeps no such record (the default).
    async fn find_charge_in_events(
        &self,
        idempotency_key: &str,
        _from: DateTime<Utc>,
        _to: DateTime<Utc>,
    ) -> Result<Option<Charge>, ProviderError> {
        Err(ProviderError::Unsupported {
            what: format!("search its events for key {idempotency_key}"),
        })
    }

    /// The operation requested with our idempotency key, or `None` when the
    /// provider never received (or never acted on) that key.
    /// `Err(Unsupported)` without a network call when
    /// `capabilities().lookup_by_key` is false.
    async fn find_operation_by_key(
        &self,
        idempotency_key: &str,
    ) -> Result<Option<Operation>, ProviderError>;

    /// The operation with the provider's id, or `None` when the provider
    /// has none.
    async fn get_operation(&self, id: &str) -> Result<Option<Operation>, ProviderError>;

    /// Every charge touched in `[from, report.to)`, where `report.to` is `to`, or earlier when
    /// the provider has not yet made the report of the window's end (Adyen's daily files: the
    /// days before today are there, today's is not): the reconciler takes the window as compared
    /// only that far. `Err(Unknown)` when not even the window's start is covered yet.
    async fn settlement_report(
        &self,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
    ) -> Result<SettlementReport, ProviderError>;

    /// What a verified webhook body stands for. The simulator's body is the event itself, the
    /// charge as it stood (the default). A provider whose events are hints (Stripe: events
    /// arrive in any order, and a refund's event does not carry its payment) reads the objects
    /// the event names instead. `Ok(None)`: a type the ledger does not use, acknowledged and
    /// ignored; `Err(Protocol)`: a body that is no event; any other error: asked again later.
    async fn read_event(&self, body: &[u8]) -> Result<Option<WebhookEvent>, ProviderError> {
        crate::event::read(body).map(Some)
    }

    /// The payout a verified webhook body announces (`payout.paid`, `payout.failed`…), by the
    /// provider's id; `None` for any other body. The event is a hint: the payout is read with
    /// [`Provider::get_payout`]. The simulator's protocol has no payouts (the default).
    fn payout_of_event(&self, _body: &[u8]) -> Option<String> {
        None
    }

    /// The payout with the provider's id, with what it covered when it is paid; `None` when the
    /// provider has none.
    async fn get_payout(&self, id: &str) -> Result<Option<Payout>, ProviderError> {
        Err(ProviderError::Unsupported {
            what: format!("read payout {id}"),
        })
    }

    /// The ids of the payouts created in `[from, to)`, for the sweep to post those whose events
    /// were lost. None for a provider without payouts (the default).
    async fn payouts_created(
        &self,
        _from: DateTime<Utc>,
        _to: DateTime<Utc>,
    ) -> Result<Vec<String>, ProviderError> {
        Ok(Vec::new())
    }
}
