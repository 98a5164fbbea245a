//! The payment aggregate: its state, the commands and provider facts it
//! accepts, the events it records, and the pure `decide`/`evolve` pair.
//!
//! A payment's stream (`payment-pay_…`) holds every event of this module,
//! including the [`EntryPosted`] of each money movement, appended in the same
//! decision as the fact that moves the money: there is no path that moves
//! money without posting it. The transition table lives in [`table`] and is
//! documented in `docs/payment-states.md`; the postings in `docs/ledger.md`.

mod decide;
pub mod operations;
pub mod table;
pub mod window;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::entry::JournalEntry;
use crate::fee::FeeSchedule;
use crate::ids::{CustomerId, EntryId, PaymentId, ProviderName, TenantId};
use crate::money::{Amount, AmountError, AmountLimitError, Currency};
use crate::transfer::TransferRequested;

pub use decide::decide;
pub use operations::{Operation, OperationKind, OperationOutcome, OperationState, ProviderRequest};
pub use table::{rule, Input, Outcome, Rule};
pub use window::{
    evolve_without_operations, ArchiveNeed, ArchivedOperation, OperationsRead, PaymentWindow,
    RECENT_OPERATIONS,
};

/// The longest description a merchant may attach, in characters.
pub const DESCRIPTION_CHARS_MAX: usize = 1_000;
/// The most keys a payment's metadata may have.
pub const METADATA_KEYS_MAX: usize = 50;
/// The largest serialized metadata object, in bytes.
pub const METADATA_BYTES_MAX: usize = 8_192;

/// Whether a metadata object (a payment's, an account's) is within [`METADATA_KEYS_MAX`] keys
/// and [`METADATA_BYTES_MAX`] bytes.
#[must_use]
pub fn metadata_fits(metadata: &Map<String, Value>) -> bool {
    let bytes = serde_json::to_string(metadata).map_or(usize::MAX, |s| s.len());
    metadata.len() <= METADATA_KEYS_MAX && bytes <= METADATA_BYTES_MAX
}
/// The longest free text a fact or command may carry (charge ids, reasons,
/// redirect URLs, review notes), in characters.
pub const TEXT_CHARS_MAX: usize = 2_048;

/// What a sum in `evolve` stands at if it ever overflowed: `decide` checks every sum it writes,
/// so reaching it means an event no decision of ours made.
const SATURATED: Amount = Amount::new(i64::MAX);

/// The statuses of API.md. `Failed`, `Expired`, `Canceled`, `Refunded` and a dispute lost
/// again after a win are terminal (a first loss may still be reversed).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PaymentStatus {
    Pending,
    RequiresAction,
    Authorized,
    Captured,
    PartiallyRefunded,
    Refunded,
    Failed,
    Expired,
    Disputed,
    /// The merchant canceled the authorization and the provider ended it: nothing was captured.
    Canceled,
}

impl PaymentStatus {
    pub const ALL: [PaymentStatus; 10] = [
        PaymentStatus::Pending,
        PaymentStatus::RequiresAction,
        PaymentStatus::Authorized,
        PaymentStatus::Captured,
        PaymentStatus::PartiallyRefunded,
        PaymentStatus::Refunded,
        PaymentStatus::Failed,
        PaymentStatus::Expired,
        PaymentStatus::Disputed,
        PaymentStatus::Canceled,
    ];

    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            PaymentStatus::Pending => "pending",
            PaymentStatus::RequiresAction => "requires_action",
            PaymentStatus::Authorized => "authorized",
            PaymentStatus::Captured => "captured",
            PaymentStatus::PartiallyRefunded => "partially_refunded",
            PaymentStatus::Refunded => "refunded",
            PaymentStatus::Failed => "failed",
            PaymentStatus::Expired => "expired",
            PaymentStatus::Disputed => "disputed",
            PaymentStatus::Canceled => "canceled",
        }
    }

    /// Before the provider has captured anything.
    #[must_use]
    pub const fn is_before_capture(self) -> bool {
        matches!(
            self,
            PaymentStatus::Pending | PaymentStatus::RequiresAction | PaymentStatus::Authorized
        )
    }
}

impl std::fmt::Display for PaymentStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CaptureMode {
    #[default]
    Automatic,
    Manual,
}

/// What the customer must do next; exists only while `requires_action`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum NextAction {
    Redirect { redirect_url: String },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DisputeOutcome {
    Won,
    Lost,
}

/// The payment's current or last dispute.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Dispute {
    pub id: String,
    pub amount: Amount,
    /// `None` while the dispute is open.
    pub outcome: Option<DisputeOutcome>,
    /// Where a won dispute returns the payment to.
    pub status_before: PaymentStatus,
    /// Whether its opening posted the provider's withdrawal (`{payment}:dispute:{id}:withdrawn`):
    /// then its close moves that money on, a won one back to clearing and a lost one from the
    /// customer. A dispute opened in a log written before withdrawals were posted has none.
    pub withdrawn: bool,
    /// Whether it was won once (the provider reinstated the money: Adyen's
    /// CHARGEBACK_REVERSED): a loss after that is a second chargeback.
    pub reinstated: bool,
}

/// How far a dispute went, in the order its money moves: withdrawn while open, lost (the
/// customer's money), won (reinstated, after a loss too), lost again (a second chargeback after
/// a win: Adyen's SECOND_CHARGEBACK, PREARBITRATION_LOST). Notifications of one dispute arrive
/// in any order: a report of a stage the dispute has reached or passed changes nothing, and a
/// report of a later stage implies every stage before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum DisputeStage {
    Open,
    Lost,
    Won,
    LostAgain,
}

impl DisputeStage {
    /// The stage a close with `outcome` reports; `reinstated` says the provider had won it once
    /// before (then a loss is a second chargeback).
    #[must_use]
    pub const fn closed(outcome: DisputeOutcome, reinstated: bool) -> DisputeStage {
        match (outcome, reinstated) {
            (DisputeOutcome::Won, _) => DisputeStage::Won,
            (DisputeOutcome::Lost, false) => DisputeStage::Lost,
            (DisputeOutcome::Lost, true) => DisputeStage::LostAgain,
        }
    }

    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            DisputeStage::Open => "open",
            DisputeStage::Lost => "lost",
            DisputeStage::Won => "won",
            DisputeStage::LostAgain => "lost_again",
        }
    }
}

impl Dispute {
    /// The stage its events left it at.
    #[must_use]
    pub const fn stage(&self) -> DisputeStage {
        match self.outcome {
            None => DisputeStage::Open,
            Some(outcome) => DisputeStage::closed(outcome, self.reinstated),
        }
    }

    /// The entry that posts the provider's withdrawal of the disputed amount.
    #[must_use]
    pub fn withdrawal_entry(payment: PaymentId, dispute_id: &str) -> EntryId {
        EntryId::derived(&format!("{payment}:dispute:{dispute_id}:withdrawn"))
    }
}

/// Why a payment needs a person to look at it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReviewReason {
    /// A provider fact that the payment's history says cannot be true
    /// (captured after failed, refunded beyond the capture…). Facts are never
    /// refused, so they are kept here instead of changing the state.
    ContradictingFact,
    /// A fact about a different provider charge than the one on record.
    ChargeMismatch,
    /// Flagged by a person or by reconciliation.
    Manual,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReviewFlag {
    pub reason: ReviewReason,
    pub detail: String,
    pub at: DateTime<Utc>,
}

/// Everything known about a payment that exists.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PaymentRecord {
    pub id: PaymentId,
    pub tenant: TenantId,
    pub amount: Amount,
    pub currency: Currency,
    pub customer: CustomerId,
    pub provider: ProviderName,
    pub capture_mode: CaptureMode,
    pub description: Option<String>,
    pub metadata: Map<String, Value>,
    /// The idempotency key of the charge at the provider (`psp_<uuid>`).
    pub psp_key: String,
    /// What the charge was requested with, where the intent recorded it.
    pub payment_method: Option<String>,
    pub provider_charge_id: Option<String>,
    pub status: PaymentStatus,
    pub authorized: Amount,
    /// Why the provider ended the authorization while a capture of it was still open (expired,
    /// cancelled): the capture keeps what it takes, and a refusal of it fails the payment with
    /// this reason. Exists only while `authorized`.
    pub authorization_ended: Option<String>,
    /// What the authorization holds as a pending credit to the customer while `authorized`
    /// (zero otherwise, and for authorizations recorded before they were held).
    pub authorization_held: Amount,
    pub captured: Amount,
    /// The fee charged at capture, and the schedule it was computed with:
    /// refunds reverse fee shares with the same schedule.
    pub fee: Amount,
    pub fee_schedule: Option<FeeSchedule>,
    /// Every capture and refund we asked the provider for, in the order asked.
    pub operations: Vec<Operation>,
    /// The amounts of our refund operations that ever settled (reversed ones included): what
    /// `operations` says, kept as a sum so that a read model folding a window of them
    /// (`window::PaymentWindow`) has it too.
    #[serde(default)]
    pub operations_refunded: Amount,
    /// Refunds the provider has settled and not reversed, cumulative.
    pub refunded: Amount,
    /// Refunds that settled and were later reversed, cumulative: `refunded + refund_reversed`
    /// is every refund ever settled, which only grows, so a provider's cumulative report (which
    /// may still count a refund that has since failed) never settles a reversed refund again.
    pub refund_reversed: Amount,
    /// The part of `fee` given back by refunds so far.
    pub fee_reversed: Amount,
    /// The provider's own fees posted so far, one per balance transaction, in the order posted.
    pub provider_fees: Vec<ProviderFee>,
    pub next_action: Option<NextAction>,
    pub failure_reason: Option<String>,
    pub dispute: Option<Dispute>,
    pub flags: Vec<ReviewFlag>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

/// A fee the provider kept, named by the balance transaction that carries it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProviderFee {
    pub transaction_id: String,
    pub fee: Amount,
}

impl PaymentRecord {
    /// The provider's fee posted for `transaction_id`, if any.
    #[must_use]
    pub fn provider_fee(&self, transaction_id: &str) -> Option<Amount> {
        self.provider_fees
            .iter()
            .find(|fee| fee.transaction_id == transaction_id)
            .map(|fee| fee.fee)
    }

    /// What the provider holds for this payment by our books, all its movements together:
    /// captured, less refunded, less a disputed amount it took (withdrawn while open, or lost),
    /// less its fees. The payment's `psp:{provider}:clearing` legs sum to its negation.
    pub fn provider_holds(&self) -> Result<Amount, AmountError> {
        let disputed = match &self.dispute {
            Some(d) if d.withdrawn && d.outcome != Some(DisputeOutcome::Won) => d.amount,
            Some(d) if !d.withdrawn && d.outcome == Some(DisputeOutcome::Lost) => d.amount,
            _ => Amount::ZERO,
        };
        let mut holds = self
            .captured
            .checked_sub(self.refunded)?
            .checked_sub(disputed)?;
        for fee in &self.provider_fees {
            holds = holds.checked_sub(fee.fee)?;
        }
        Ok(holds)
    }

    /// The fee the platform keeps after refunds: `fee_minor` of API.md.
    pub fn fee_net(&self) -> Result<Amount, AmountError> {
        self.fee.checked_sub(self.fee_reversed)
    }

    /// The customer's flag is up: someone must look at this payment.
    #[must_use]
    pub fn needs_review(&self) -> bool {
        !self.flags.is_empty()
    }

    /// The operation of `kind` numbered `sequence`.
    #[must_use]
    pub fn operation(&self, kind: OperationKind, sequence: u32) -> Option<&Operation> {
        self.operations
            .iter()
            .find(|op| op.kind == kind && op.sequence == sequence)
    }

    /// The operation sent under `psp_key`.
    #[must_use]
    pub fn operation_by_key(&self, psp_key: &str) -> Option<&Operation> {
        self.operations.iter().find(|op| op.psp_key == psp_key)
    }

    /// How many operations of `kind` were asked for: the last one's sequence.
    #[must_use]
    pub fn operations_of(&self, kind: OperationKind) -> u32 {
        let count = self.operations.iter().filter(|op| op.kind == kind).count();
        u32::try_from(count).unwrap_or(u32::MAX)
    }

    /// The capture awaiting the provider's word, if any: at most one is open at a time.
    #[must_use]
    pub fn open_capture(&self) -> Option<&Operation> {
        self.open(OperationKind::Capture)
    }

    /// The cancel awaiting the provider's word, if any: at most one is open at a time.
    #[must_use]
    pub fn open_cancel(&self) -> Option<&Operation> {
        self.open(OperationKind::Cancel)
    }

    fn open(&self, kind: OperationKind) -> Option<&Operation> {
        self.operations
            .iter()
            .find(|op| op.kind == kind && op.state.is_open())
    }

    /// The merchant asked to cancel and the provider has not refused it: an end of the
    /// authorization is then the cancel's.
    #[must_use]
    pub fn cancel_asked(&self) -> bool {
        self.operations.iter().any(|op| {
            op.kind == OperationKind::Cancel
                && (op.state.is_open() || op.state == OperationState::Succeeded)
        })
    }

    /// What refunds hold of the capture: settled ones, and requested ones still at the provider
    /// (so two quick requests cannot together exceed the capture). A refused or reversed refund
    /// holds nothing.
    pub fn refund_committed(&self) -> Result<Amount, AmountError> {
        self.operations
            .iter()
            .filter(|op| op.kind == OperationKind::Refund && op.state.is_open())
            .try_fold(self.refunded, |total, op| total.checked_add(op.amount))
    }

    /// Every refund ever settled, including ones reversed since.
    fn refund_settled_ever(&self) -> Amount {
        self.refunded
            .checked_add(self.refund_reversed)
            .unwrap_or(SATURATED)
    }

    fn operation_mut(&mut self, kind: OperationKind, sequence: u32) -> Option<&mut Operation> {
        self.operations
            .iter_mut()
            .find(|op| op.kind == kind && op.sequence == sequence)
    }

    /// A cumulative refund settlement names no operation: the refunds it covers that we asked
    /// for are those still open, oldest first, that fit in what no succeeded operation accounts
    /// for yet. So a report or webhook that arrives before the refund's own answer settles it
    /// once, and the answer arriving later finds it already succeeded.
    fn attribute_settled_refunds(&mut self, at: DateTime<Utc>) {
        let accounted = self.operations_refunded;
        let mut unattributed = self
            .refund_settled_ever()
            .checked_sub(accounted)
            .unwrap_or(Amount::ZERO);
        for op in &mut self.operations {
            if op.kind == OperationKind::Refund && op.state.is_open() && op.amount <= unattributed {
                unattributed = unattributed.checked_sub(op.amount).unwrap_or(Amount::ZERO);
                op.state = OperationState::Succeeded;
                op.updated_at = at;
                self.operations_refunded = self
                    .operations_refunded
                    .checked_add(op.amount)
                    .unwrap_or(SATURATED);
            }
        }
    }

    /// The status that the refunds settled so far leave a captured payment in.
    fn status_after_refunds(&self) -> PaymentStatus {
        if self.status == PaymentStatus::Disputed {
            PaymentStatus::Disputed
        } else if self.refunded >= self.captured && self.refunded.is_positive() {
            PaymentStatus::Refunded
        } else if self.refunded.is_positive() {
            PaymentStatus::PartiallyRefunded
        } else {
            PaymentStatus::Captured
        }
    }
}

/// The aggregate: `record` is `None` until `PaymentIntended`. `version` counts
/// the events applied, which is the stream version to expect when appending. Serialisable so
/// that a read model can keep it folded between batches (a stored shape: a change to it is a
/// rebuild of the read models that store it).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Payment {
    pub version: u64,
    pub record: Option<PaymentRecord>,
}

impl Payment {
    /// Replays a stream from the start.
    #[must_use]
    pub fn replay<'a>(events: impl IntoIterator<Item = &'a PaymentEvent>) -> Payment {
        events.into_iter().fold(Payment::default(), evolve)
    }
}

// ---------------------------------------------------------------- commands

/// The merchant's intent to be paid; becomes `PaymentIntended`.
#[derive(Debug, Clone, PartialEq)]
pub struct CreatePayment {
    pub id: PaymentId,
    pub tenant: TenantId,
    pub amount: Amount,
    pub currency: Currency,
    pub customer: CustomerId,
    pub provider: ProviderName,
    pub capture_mode: CaptureMode,
    pub description: Option<String>,
    pub metadata: Map<String, Value>,
    /// What the charge is made with (a card token, a stored payment method): kept so that a
    /// request whose answer was lost can be sent again, identical, to a provider without a lookup.
    pub payment_method: Option<String>,
    pub at: DateTime<Utc>,
}

/// What the provider says happened. Facts may arrive late, twice or out of
/// order; they are never refused for being inconvenient.
#[derive(Debug, Clone, PartialEq)]
pub enum ProviderFact {
    /// The charge is authorized, awaiting capture (`requires_capture`).
    Authorized { charge_id: String, amount: Amount },
    /// The charge is captured (`succeeded`, `charge.captured`).
    Captured { charge_id: String, amount: Amount },
    Failed {
        charge_id: Option<String>,
        reason: String,
    },
    ActionRequired {
        charge_id: String,
        redirect_url: String,
    },
    /// `amount_refunded` is cumulative, as providers report it: a late or
    /// repeated report posts only what is new.
    Refunded {
        charge_id: String,
        amount_refunded: Amount,
        /// Read from the provider just now (a lookup, the settlement report): it counts what is
        /// refunded now, after any reversal. Otherwise (a webhook's snapshot of the charge) it
        /// may predate a reversal, and counts against every refund ever settled.
        current: bool,
    },
    DisputeOpened {
        charge_id: String,
        dispute_id: String,
        amount: Amount,
    },
    /// Carries the amount so that a close arriving before its open can
    /// stand for both.
    DisputeClosed {
        charge_id: String,
        dispute_id: String,
        amount: Amount,
        outcome: DisputeOutcome,
        /// The provider had won the dispute once before this outcome (a reversal came first):
        /// told with `Lost`, a second chargeback, which withdraws the money again.
        reinstated: bool,
    },
    /// The provider ended what was left of the authorization (Adyen's EXPIRE, CANCELLATION,
    /// TECHNICAL_CANCEL): nothing more can be captured, and what a capture took stays captured.
    /// Before a capture it fails the payment; with a capture still open it waits for that
    /// capture's outcome.
    AuthorizationEnded { charge_id: String, reason: String },
    /// The outcome of one of our operations, named by the PSP key we sent it with. A refund that
    /// fails after it succeeded is reversed; one that fails before is refused.
    Operation {
        kind: OperationKind,
        charge_id: String,
        psp_key: String,
        /// The provider's id of the operation (`re_…`).
        provider_id: Option<String>,
        amount: Amount,
        outcome: OperationOutcome,
        /// The provider's request that answered, when this is an answer to our request.
        request: Option<ProviderRequest>,
    },
    /// The provider kept `fee` out of the money it owes us for one of its balance transactions
    /// (a charge's processing fee, a dispute fee). Negative when it gives a fee back.
    ProviderFeeCharged {
        charge_id: String,
        transaction_id: String,
        fee: Amount,
    },
}

impl ProviderFact {
    /// The dispute a dispute fact is about, and the stage it tells.
    #[must_use]
    pub fn dispute_stage(&self) -> Option<(&str, DisputeStage)> {
        match self {
            ProviderFact::DisputeOpened { dispute_id, .. } => {
                Some((dispute_id, DisputeStage::Open))
            }
            ProviderFact::DisputeClosed {
                dispute_id,
                outcome,
                reinstated,
                ..
            } => Some((dispute_id, DisputeStage::closed(*outcome, *reinstated))),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum PaymentCommand {
    Create(CreatePayment),
    /// The merchant captures an authorized payment; `None` captures all.
    RequestCapture {
        amount: Option<Amount>,
        at: DateTime<Utc>,
    },
    RequestRefund {
        amount: Amount,
        at: DateTime<Utc>,
    },
    /// The merchant no longer wants an authorized payment captured: the provider is asked to end
    /// the authorization, which releases the customer's funds.
    RequestCancel {
        at: DateTime<Utc>,
    },
    /// The provider has no trace of the charge past its expiry.
    Expire {
        at: DateTime<Utc>,
    },
    FlagForReview {
        note: String,
        at: DateTime<Utc>,
    },
    /// `fees` is the provider's schedule, used if this fact captures money.
    Provider {
        fact: ProviderFact,
        fees: FeeSchedule,
        at: DateTime<Utc>,
    },
}

impl PaymentCommand {
    /// When the command was issued.
    #[must_use]
    pub fn at(&self) -> DateTime<Utc> {
        match self {
            PaymentCommand::Create(create) => create.at,
            PaymentCommand::RequestCapture { at, .. }
            | PaymentCommand::RequestRefund { at, .. }
            | PaymentCommand::RequestCancel { at }
            | PaymentCommand::Expire { at }
            | PaymentCommand::FlagForReview { at, .. }
            | PaymentCommand::Provider { at, .. } => *at,
        }
    }

    /// The row of the transition table this command belongs to.
    #[must_use]
    pub fn input(&self) -> Input {
        match self {
            PaymentCommand::Create(_) => Input::Create,
            PaymentCommand::RequestCapture { .. } => Input::RequestCapture,
            PaymentCommand::RequestRefund { .. } => Input::RequestRefund,
            PaymentCommand::RequestCancel { .. } => Input::RequestCancel,
            PaymentCommand::Expire { .. } => Input::Expire,
            PaymentCommand::FlagForReview { .. } => Input::FlagForReview,
            PaymentCommand::Provider { fact, .. } => match fact {
                ProviderFact::Authorized { .. } => Input::FactAuthorized,
                ProviderFact::Captured { .. } => Input::FactCaptured,
                ProviderFact::Failed { .. } => Input::FactFailed,
                ProviderFact::ActionRequired { .. } => Input::FactActionRequired,
                ProviderFact::Refunded { .. } => Input::FactRefunded,
                ProviderFact::DisputeOpened { .. } => Input::FactDisputeOpened,
                ProviderFact::DisputeClosed { .. } => Input::FactDisputeClosed,
                ProviderFact::AuthorizationEnded { .. } => Input::FactAuthorizationEnded,
                ProviderFact::Operation {
                    kind: OperationKind::Capture,
                    ..
                } => Input::FactCaptureOutcome,
                ProviderFact::Operation {
                    kind: OperationKind::Refund,
                    ..
                } => Input::FactRefundOutcome,
                ProviderFact::Operation {
                    kind: OperationKind::Cancel,
                    ..
                } => Input::FactCancelOutcome,
                ProviderFact::ProviderFeeCharged { .. } => Input::FactProviderFee,
            },
        }
    }
}

/// Why a payment command was refused. Provider facts are only refused when
/// malformed (a negative amount): a well-formed fact is always recorded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PaymentRejection {
    #[error("payment not found")]
    NotFound,
    #[error("{input} is not allowed when the payment is {from}")]
    InvalidTransition { from: PaymentStatus, input: Input },
    #[error("amount must be positive")]
    AmountMustBePositive,
    #[error("capture of {requested} exceeds the authorized {authorized}")]
    CaptureExceedsAuthorized {
        requested: Amount,
        authorized: Amount,
    },
    #[error("a capture of {requested} is already in progress")]
    CaptureAlreadyRequested { requested: Amount },
    #[error("refund of {requested} exceeds what is left to refund ({refundable})")]
    RefundExceedsCaptured {
        requested: Amount,
        refundable: Amount,
    },
    #[error("description is longer than {DESCRIPTION_CHARS_MAX} characters")]
    DescriptionTooLong,
    #[error("metadata has more than {METADATA_KEYS_MAX} keys or {METADATA_BYTES_MAX} bytes")]
    MetadataTooLarge,
    #[error("{field} is empty or longer than {TEXT_CHARS_MAX} characters")]
    InvalidText { field: &'static str },
    #[error("amount arithmetic overflowed")]
    AmountOverflow,
    #[error(transparent)]
    AmountTooLarge(#[from] AmountLimitError),
    /// A posting rule produced an invalid entry: a bug, reported as a value.
    #[error("posting rule produced an invalid entry: {0}")]
    InvalidEntry(String),
}

impl PaymentRejection {
    /// The stable code the HTTP layer answers with.
    #[must_use]
    pub fn code(&self) -> &'static str {
        match self {
            PaymentRejection::NotFound => "payment_not_found",
            PaymentRejection::InvalidTransition { .. } => "invalid_transition",
            PaymentRejection::AmountMustBePositive => "amount_must_be_positive",
            PaymentRejection::CaptureExceedsAuthorized { .. } => "capture_exceeds_authorized",
            PaymentRejection::CaptureAlreadyRequested { .. } => "capture_already_requested",
            PaymentRejection::RefundExceedsCaptured { .. } => "refund_exceeds_captured",
            PaymentRejection::DescriptionTooLong => "description_too_long",
            PaymentRejection::MetadataTooLarge => "metadata_too_large",
            PaymentRejection::InvalidText { .. } => "invalid_text",
            PaymentRejection::AmountOverflow => "amount_overflow",
            PaymentRejection::AmountTooLarge(_) => "amount_too_large",
            PaymentRejection::InvalidEntry(_) => "invalid_entry",
        }
    }
}

impl From<AmountError> for PaymentRejection {
    fn from(_: AmountError) -> Self {
        PaymentRejection::AmountOverflow
    }
}

// ------------------------------------------------------------------ events

/// The merchant's intent, recorded before the provider is called: it names the key (`psp_key`)
/// the charge is requested under, so it is also the record that the request may have been sent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PaymentIntended {
    pub payment_id: PaymentId,
    pub tenant: TenantId,
    pub amount_minor: Amount,
    pub currency: Currency,
    pub customer: CustomerId,
    pub provider: ProviderName,
    pub capture: CaptureMode,
    pub description: Option<String>,
    pub metadata: Map<String, Value>,
    pub psp_key: String,
    /// What the charge is requested with, so that the request can be sent again identical
    /// (absent in intents written before it was recorded: those are never sent again).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payment_method: Option<String>,
    pub at: DateTime<Utc>,
}

/// Written by earlier versions right after `PaymentIntended`, in the same transaction; it
/// repeated the intent's `psp_key` and `at`. Kept so that their streams still decode; nothing
/// writes it any more.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChargeRequested {
    pub psp_key: String,
    pub at: DateTime<Utc>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ActionRequired {
    pub charge_id: String,
    pub redirect_url: String,
    pub at: DateTime<Utc>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChargeAuthorized {
    pub charge_id: String,
    pub amount_minor: Amount,
    /// The entry after it holds the amount as a pending credit to the customer until the payment
    /// leaves `authorized` (absent in events written before authorizations were held, which
    /// hold nothing).
    #[serde(default, skip_serializing_if = "is_false")]
    pub held: bool,
    pub at: DateTime<Utc>,
}

fn is_false(value: &bool) -> bool {
    !*value
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CaptureRequested {
    /// 1-based; names the capture at the provider (`psp_…_capture[_{sequence}]`). Logs written
    /// before captures were numbered hold one capture per payment: the first.
    #[serde(default = "first_sequence")]
    pub sequence: u32,
    pub amount_minor: Amount,
    pub psp_key: String,
    pub at: DateTime<Utc>,
}

fn first_sequence() -> u32 {
    1
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChargeCaptured {
    pub charge_id: String,
    pub amount_minor: Amount,
    pub fee_minor: Amount,
    pub fees: FeeSchedule,
    /// Recorded because a later fact (refund, dispute) implied the capture
    /// before the capture fact itself arrived.
    pub implied: bool,
    pub at: DateTime<Utc>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChargeFailed {
    pub charge_id: Option<String>,
    pub reason: String,
    pub at: DateTime<Utc>,
}

/// The provider ended the authorization while a capture of it was still open (an expiry or a
/// cancel told before the capture's outcome): the payment stays `authorized` until that outcome,
/// captured by a success, failed with `reason` by a refusal.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AuthorizationEnded {
    pub charge_id: String,
    pub reason: String,
    pub at: DateTime<Utc>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PaymentExpired {
    pub at: DateTime<Utc>,
}

/// The merchant asked the provider to end the authorization (`psp_…_cancel_{sequence}`). The
/// payment stays `authorized` until the provider's word: a capture sent before it may still win.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CancelRequested {
    /// 1-based; a refused cancel may be asked again under the next.
    pub sequence: u32,
    /// What the authorization held when asked: what the cancel releases.
    pub amount_minor: Amount,
    pub psp_key: String,
    pub at: DateTime<Utc>,
}

/// The provider says it did our cancel.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CancelSucceeded {
    pub sequence: u32,
    /// The provider's id of the cancel, when it said one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider_id: Option<String>,
    pub at: DateTime<Utc>,
}

/// The authorization ended after the merchant asked to cancel it, with nothing captured: the
/// payment is `canceled`, and the entry posted beside this event releases its hold.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PaymentCanceled {
    pub at: DateTime<Utc>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RefundRequested {
    /// 1-based; names the refund at the provider (`psp_…_refund_{sequence}`).
    pub sequence: u32,
    pub amount_minor: Amount,
    /// Cumulative requested after this one.
    pub requested_total_minor: Amount,
    pub psp_key: String,
    pub at: DateTime<Utc>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RefundSettled {
    /// The refund operation this settles; `None` for a cumulative report that names none (a
    /// webhook about the charge, the settlement report, a refund made outside our API).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sequence: Option<u32>,
    /// The provider's id of the refund, when the fact named one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refund_id: Option<String>,
    pub charge_id: String,
    /// What this event refunds: the new cumulative minus the old.
    pub amount_minor: Amount,
    /// The provider's cumulative refunded amount after this event.
    pub refunded_total_minor: Amount,
    /// The fee share given back by this event.
    pub fee_reversed_minor: Amount,
    pub at: DateTime<Utc>,
}

/// The provider received an operation and will decide it later.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OperationReceived {
    pub kind: OperationKind,
    pub sequence: u32,
    pub provider_id: Option<String>,
    pub at: DateTime<Utc>,
}

/// The provider answered one of our operations from its request `request_id` (replaying an
/// earlier answer when `replayed`): recorded beside the outcome, once per request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OperationAnswered {
    pub kind: OperationKind,
    pub sequence: u32,
    pub request_id: String,
    pub replayed: bool,
    pub at: DateTime<Utc>,
}

/// The provider's id of an operation whose outcome was recorded before anything named it (a
/// cumulative refund total settled the refund first): learnt from a later answer, so that the
/// operation can be found at the provider by it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OperationIdentified {
    pub kind: OperationKind,
    pub sequence: u32,
    pub provider_id: String,
    pub at: DateTime<Utc>,
}

/// The provider refused an operation: what it reserved is free again (a refund's amount is
/// refundable, another capture may be asked for).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OperationRefused {
    pub kind: OperationKind,
    pub sequence: u32,
    pub reason: String,
    pub at: DateTime<Utc>,
}

/// A refund that had settled failed at the provider: the money is back with the merchant, and
/// the entry posted beside this event reverses the refund's posting.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RefundReversed {
    pub sequence: u32,
    pub amount_minor: Amount,
    /// The refunded total after the reversal.
    pub refunded_total_minor: Amount,
    /// The fee share that the refund gave back and the reversal takes again.
    pub fee_restored_minor: Amount,
    pub reason: String,
    pub at: DateTime<Utc>,
}

/// A capture that had succeeded failed at the provider (Adyen's `CAPTURE_FAILED`: the scheme
/// refused it after it was reported done): the money never arrives, the payment fails with the
/// provider's reason, and the entry posted beside this event reverses the capture's posting.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CaptureReversed {
    pub sequence: u32,
    pub amount_minor: Amount,
    /// The fee the capture charged, given back.
    pub fee_minor: Amount,
    pub reason: String,
    pub at: DateTime<Utc>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DisputeOpened {
    pub dispute_id: String,
    pub amount_minor: Amount,
    pub at: DateTime<Utc>,
}

/// A dispute's outcome. A `Lost` after a `Won` of the same dispute is a second chargeback: the
/// provider withdrew the reinstated money again.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DisputeClosed {
    pub dispute_id: String,
    pub outcome: DisputeOutcome,
    pub at: DateTime<Utc>,
}

/// The provider kept `fee_minor` for balance transaction `transaction_id`; posted beside it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProviderFeeCharged {
    pub transaction_id: String,
    pub fee_minor: Amount,
    pub at: DateTime<Utc>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FlaggedForReview {
    pub reason: ReviewReason,
    pub detail: String,
    pub at: DateTime<Utc>,
}

/// A journal entry, posted in the stream of the aggregate whose decision
/// moved the money (payment, transfer or payout).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EntryPosted {
    pub entry: JournalEntry,
    pub at: DateTime<Utc>,
    /// The request a transfer's first event posts: a transfer (or a hold) is requested and its
    /// entry posted in one append, so one event records both. Absent everywhere else, and in the
    /// transfers of logs written while a `TransferRequested` came first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transfer: Option<TransferRequested>,
}

crate::event::event_family! {
    /// Events of a `payment-…` stream.
    PaymentEvent {
        PaymentIntended = 2,
        ChargeRequested = 1,
        ActionRequired = 1,
        ChargeAuthorized = 1,
        CaptureRequested = 1,
        ChargeCaptured = 1,
        ChargeFailed = 1,
        AuthorizationEnded = 1,
        PaymentExpired = 1,
        CancelRequested = 1,
        CancelSucceeded = 1,
        PaymentCanceled = 1,
        RefundRequested = 1,
        RefundSettled = 1,
        OperationReceived = 1,
        OperationAnswered = 1,
        OperationIdentified = 1,
        OperationRefused = 1,
        RefundReversed = 1,
        CaptureReversed = 1,
        DisputeOpened = 1,
        DisputeClosed = 1,
        ProviderFeeCharged = 1,
        FlaggedForReview = 1,
        EntryPosted = 1,
    }
}

impl PaymentEvent {
    #[must_use]
    pub fn at(&self) -> DateTime<Utc> {
        match self {
            PaymentEvent::PaymentIntended(e) => e.at,
            PaymentEvent::ChargeRequested(e) => e.at,
            PaymentEvent::ActionRequired(e) => e.at,
            PaymentEvent::ChargeAuthorized(e) => e.at,
            PaymentEvent::CaptureRequested(e) => e.at,
            PaymentEvent::ChargeCaptured(e) => e.at,
            PaymentEvent::ChargeFailed(e) => e.at,
            PaymentEvent::AuthorizationEnded(e) => e.at,
            PaymentEvent::PaymentExpired(e) => e.at,
            PaymentEvent::CancelRequested(e) => e.at,
            PaymentEvent::CancelSucceeded(e) => e.at,
            PaymentEvent::PaymentCanceled(e) => e.at,
            PaymentEvent::RefundRequested(e) => e.at,
            PaymentEvent::RefundSettled(e) => e.at,
            PaymentEvent::OperationReceived(e) => e.at,
            PaymentEvent::OperationAnswered(e) => e.at,
            PaymentEvent::OperationIdentified(e) => e.at,
            PaymentEvent::OperationRefused(e) => e.at,
            PaymentEvent::RefundReversed(e) => e.at,
            PaymentEvent::CaptureReversed(e) => e.at,
            PaymentEvent::DisputeOpened(e) => e.at,
            PaymentEvent::DisputeClosed(e) => e.at,
            PaymentEvent::ProviderFeeCharged(e) => e.at,
            PaymentEvent::FlaggedForReview(e) => e.at,
            PaymentEvent::EntryPosted(e) => e.at,
        }
    }
}

// ------------------------------------------------------------------ evolve

/// Applies one recorded event. Never fails: events are facts already
/// decided; an event that cannot apply (nothing before `PaymentIntended`) is
/// a bug in whoever appended it and is asserted in debug builds.
#[must_use]
pub fn evolve(mut payment: Payment, event: &PaymentEvent) -> Payment {
    payment.version += 1;
    if let PaymentEvent::PaymentIntended(e) = event {
        debug_assert!(payment.record.is_none(), "PaymentIntended twice");
        payment.record = Some(PaymentRecord {
            id: e.payment_id,
            tenant: e.tenant.clone(),
            amount: e.amount_minor,
            currency: e.currency,
            customer: e.customer.clone(),
            provider: e.provider.clone(),
            capture_mode: e.capture,
            description: e.description.clone(),
            metadata: e.metadata.clone(),
            psp_key: e.psp_key.clone(),
            payment_method: e.payment_method.clone(),
            provider_charge_id: None,
            status: PaymentStatus::Pending,
            authorized: Amount::ZERO,
            authorization_ended: None,
            authorization_held: Amount::ZERO,
            captured: Amount::ZERO,
            fee: Amount::ZERO,
            fee_schedule: None,
            operations: Vec::new(),
            operations_refunded: Amount::ZERO,
            refunded: Amount::ZERO,
            refund_reversed: Amount::ZERO,
            fee_reversed: Amount::ZERO,
            provider_fees: Vec::new(),
            next_action: None,
            failure_reason: None,
            dispute: None,
            flags: Vec::new(),
            created_at: e.at,
            updated_at: e.at,
        });
        return payment;
    }
    let Some(record) = payment.record.as_mut() else {
        debug_assert!(false, "{} before PaymentIntended", event.event_type());
        return payment;
    };
    apply(record, event);
    payment
}

/// Applies an event to an existing record; shared by `evolve` and by the
/// draft `decide` builds its events on.
fn apply(record: &mut PaymentRecord, event: &PaymentEvent) {
    // A refund operation the event names counts in `operations_refunded` while it is settled.
    let named_refund = match event.operations_read() {
        window::OperationsRead::One(OperationKind::Refund, sequence) => Some(sequence),
        _ => None,
    };
    let counted = |record: &PaymentRecord, sequence: u32| {
        record
            .operation(OperationKind::Refund, sequence)
            .filter(|op| op.settled_ever())
            .map_or(Amount::ZERO, |op| op.amount)
    };
    let before = named_refund.map(|sequence| counted(record, sequence));
    apply_fields(record, event);
    if let (Some(sequence), Some(before)) = (named_refund, before) {
        record.operations_refunded = record
            .operations_refunded
            .checked_sub(before)
            .and_then(|sum| sum.checked_add(counted(record, sequence)))
            .unwrap_or(SATURATED);
    }
    record.updated_at = event.at();
    // Leaving `authorized` ends the hold (its release is posted by the decision that left), and
    // an ended authorization waits for nothing any more.
    if record.status != PaymentStatus::Authorized {
        record.authorization_held = Amount::ZERO;
        record.authorization_ended = None;
    }
    // API.md: next_action exists only while requires_action, whatever order
    // the facts came in.
    if record.status != PaymentStatus::RequiresAction {
        record.next_action = None;
    }
}

fn apply_fields(record: &mut PaymentRecord, event: &PaymentEvent) {
    match event {
        PaymentEvent::PaymentIntended(_) => {}
        // Streams written before the intent recorded the request too; nothing to change.
        PaymentEvent::ChargeRequested(_) => {}
        PaymentEvent::ActionRequired(e) => {
            record.provider_charge_id = Some(e.charge_id.clone());
            record.status = PaymentStatus::RequiresAction;
            record.next_action = Some(NextAction::Redirect {
                redirect_url: e.redirect_url.clone(),
            });
        }
        PaymentEvent::ChargeAuthorized(e) => {
            record.provider_charge_id = Some(e.charge_id.clone());
            record.status = PaymentStatus::Authorized;
            record.authorized = e.amount_minor;
            record.authorization_held = if e.held { e.amount_minor } else { Amount::ZERO };
        }
        PaymentEvent::CaptureRequested(e) => record.operations.push(Operation::requested(
            OperationKind::Capture,
            e.sequence,
            e.amount_minor,
            &e.psp_key,
            e.at,
        )),
        PaymentEvent::ChargeCaptured(e) => {
            record.provider_charge_id = Some(e.charge_id.clone());
            record.status = PaymentStatus::Captured;
            // A capture implies the authorization it consumed, and ends the capture asked for.
            record.authorized = record.authorized.max(e.amount_minor);
            for op in &mut record.operations {
                if op.kind == OperationKind::Capture && op.state.is_open() {
                    op.state = OperationState::Succeeded;
                    op.updated_at = e.at;
                }
            }
            record.captured = e.amount_minor;
            record.fee = e.fee_minor;
            record.fee_schedule = Some(e.fees);
        }
        PaymentEvent::ChargeFailed(e) => {
            if e.charge_id.is_some() {
                record.provider_charge_id = e.charge_id.clone();
            }
            record.status = PaymentStatus::Failed;
            record.failure_reason = Some(e.reason.clone());
        }
        PaymentEvent::AuthorizationEnded(e) => {
            record.provider_charge_id = Some(e.charge_id.clone());
            record.authorization_ended = Some(e.reason.clone());
        }
        PaymentEvent::PaymentExpired(_) => record.status = PaymentStatus::Expired,
        PaymentEvent::CancelRequested(e) => record.operations.push(Operation::requested(
            OperationKind::Cancel,
            e.sequence,
            e.amount_minor,
            &e.psp_key,
            e.at,
        )),
        PaymentEvent::CancelSucceeded(e) => {
            if let Some(op) = record.operation_mut(OperationKind::Cancel, e.sequence) {
                op.state = OperationState::Succeeded;
                op.updated_at = e.at;
                if e.provider_id.is_some() {
                    op.provider_id = e.provider_id.clone();
                }
            }
        }
        PaymentEvent::PaymentCanceled(_) => record.status = PaymentStatus::Canceled,
        PaymentEvent::RefundRequested(e) => record.operations.push(Operation::requested(
            OperationKind::Refund,
            e.sequence,
            e.amount_minor,
            &e.psp_key,
            e.at,
        )),
        PaymentEvent::RefundSettled(e) => {
            record.refunded = e.refunded_total_minor;
            record.fee_reversed = record
                .fee_reversed
                .checked_add(e.fee_reversed_minor)
                .unwrap_or(record.fee);
            record.status = record.status_after_refunds();
            match e.sequence {
                Some(sequence) => {
                    if let Some(op) = record.operation_mut(OperationKind::Refund, sequence) {
                        op.state = OperationState::Succeeded;
                        op.updated_at = e.at;
                        if e.refund_id.is_some() {
                            op.provider_id = e.refund_id.clone();
                        }
                    }
                }
                None => record.attribute_settled_refunds(e.at),
            }
        }
        PaymentEvent::OperationReceived(e) => {
            if let Some(op) = record.operation_mut(e.kind, e.sequence) {
                op.state = OperationState::Pending;
                op.updated_at = e.at;
                if e.provider_id.is_some() {
                    op.provider_id = e.provider_id.clone();
                }
            }
        }
        PaymentEvent::OperationAnswered(e) => {
            if let Some(op) = record.operation_mut(e.kind, e.sequence) {
                if !op.requests.iter().any(|known| known.id == e.request_id) {
                    op.requests.push(ProviderRequest {
                        id: e.request_id.clone(),
                        replayed: e.replayed,
                    });
                }
            }
        }
        PaymentEvent::OperationIdentified(e) => {
            if let Some(op) = record.operation_mut(e.kind, e.sequence) {
                op.provider_id = Some(e.provider_id.clone());
            }
        }
        PaymentEvent::OperationRefused(e) => {
            if let Some(op) = record.operation_mut(e.kind, e.sequence) {
                op.state = OperationState::Refused;
                op.reason = Some(e.reason.clone());
                op.updated_at = e.at;
            }
        }
        PaymentEvent::CaptureReversed(e) => {
            if let Some(op) = record.operation_mut(OperationKind::Capture, e.sequence) {
                op.state = OperationState::Reversed;
                op.reason = Some(e.reason.clone());
                op.updated_at = e.at;
            }
            record.captured = record
                .captured
                .checked_sub(e.amount_minor)
                .unwrap_or(Amount::ZERO);
            record.fee = record.fee.checked_sub(e.fee_minor).unwrap_or(Amount::ZERO);
            record.status = PaymentStatus::Failed;
            record.failure_reason = Some(e.reason.clone());
        }
        PaymentEvent::RefundReversed(e) => {
            if let Some(op) = record.operation_mut(OperationKind::Refund, e.sequence) {
                op.state = OperationState::Reversed;
                op.reason = Some(e.reason.clone());
                op.updated_at = e.at;
            }
            record.refunded = e.refunded_total_minor;
            record.refund_reversed = record
                .refund_reversed
                .checked_add(e.amount_minor)
                .unwrap_or(SATURATED);
            record.fee_reversed = record
                .fee_reversed
                .checked_sub(e.fee_restored_minor)
                .unwrap_or(Amount::ZERO);
            record.status = record.status_after_refunds();
        }
        PaymentEvent::DisputeOpened(e) => {
            record.dispute = Some(Dispute {
                id: e.dispute_id.clone(),
                amount: e.amount_minor,
                outcome: None,
                status_before: record.status,
                withdrawn: false,
                reinstated: false,
            });
            record.status = PaymentStatus::Disputed;
        }
        PaymentEvent::DisputeClosed(e) => {
            if let Some(dispute) = record.dispute.as_mut() {
                dispute.outcome = Some(e.outcome);
                record.status = match e.outcome {
                    DisputeOutcome::Won => {
                        dispute.reinstated = true;
                        dispute.status_before
                    }
                    DisputeOutcome::Lost => PaymentStatus::Disputed,
                };
            }
        }
        PaymentEvent::ProviderFeeCharged(e) => record.provider_fees.push(ProviderFee {
            transaction_id: e.transaction_id.clone(),
            fee: e.fee_minor,
        }),
        PaymentEvent::FlaggedForReview(e) => record.flags.push(ReviewFlag {
            reason: e.reason,
            detail: e.detail.clone(),
            at: e.at,
        }),
        // The entry is the ledger's business; the payment's amounts were already moved by the
        // fact posted alongside it. Only a dispute's withdrawal is remembered, for its close.
        PaymentEvent::EntryPosted(e) => {
            let id = record.id;
            if let Some(dispute) = record.dispute.as_mut().filter(|d| !d.withdrawn) {
                dispute.withdrawn = e.entry.id() == Dispute::withdrawal_entry(id, &dispute.id);
            }
        }
    }
}
