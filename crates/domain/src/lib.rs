//! The rules of money for asiento: amounts and currencies, fees, account
//! names, journal entries, the payment state machine, transfers and the
//! debit guard, and the events they record.
//!
//! This crate is pure on purpose: no IO, no async, no clock, no randomness.
//! Time and ids come in as arguments and every decision is a function of its
//! inputs, so any stream can be replayed and every rule tested as data.
//! The event store, the PSP and HTTP live in other crates and call in here.
//!
//! Map:
//! - [`money`], [`fee`]: `Amount` (i64 minor units), `Currency` (ISO 4217),
//!   the one fee function and its half-up rounding.
//! - [`account`], [`ids`], [`stream`]: validated names and stream ids.
//! - [`entry`]: zero-sum journal entries and reversals.
//! - [`payment`]: `decide`/`evolve`, the transition table (`docs/payment-states.md`)
//!   and the posting rules (`docs/ledger.md`).
//! - [`transfer`], [`guard`]: transfers and the per-account debit guard.
//! - [`payout`]: a provider's payouts, moved from clearing to the bank.
//! - [`exception`]: reconciliation exceptions (findings against a provider's truth).
//! - [`event`]: type names, schema versions, encode/decode, upcasting.
//! - [`hold`]: ending a hold (post, void, expiry); [`policy`]: an account's normal balance,
//!   overdraft policy and freeze.
//! - [`major_units`]: the one conversion between minor units and decimal text.
//! - [`endpoint`]: what the log knows of a merchant's webhook endpoint (its disabling).

pub mod account;
pub mod cell;
pub mod endpoint;
pub mod entry;
pub mod event;
pub mod exception;
pub mod fee;
pub mod guard;
pub mod hold;
pub mod ids;
pub mod major_units;
pub mod money;
pub mod monitor;
pub mod payment;
pub mod payout;
pub mod policy;
pub mod stream;
pub mod transfer;
pub mod transfer_batch;

pub use account::{AccountError, AccountName};
pub use cell::{payment_of_reference, CellNumber, CellNumberError, CELL_NUMBER_MAX};
pub use entry::{EntryError, JournalEntry, Leg};
pub use event::{upcast, DecodeError, EncodeError, Event};
pub use exception::{ExceptionEvent, ExceptionId, ExceptionKind};
pub use fee::{fee, FeeError, FeeSchedule};
pub use guard::{DebitGuard, GuardAppend, GuardEvent, GuardKey, GuardRejection, Origin};
pub use hold::{HoldAction, HoldRejection, SettleHold};
pub use ids::{
    payment_of_psp_key, psp_authorization_cancel_key, psp_cancel_key, psp_capture_key,
    psp_charge_key, psp_refund_key, CustomerId, EntryId, IdError, PaymentId, ProviderName,
    TenantId, TransferId,
};
pub use major_units::{format_major, parse_major, MajorUnitsError};
pub use money::{
    Amount, AmountError, AmountLimit, AmountLimitError, Balance, Currency, CurrencyError,
    AMOUNT_MAX_CEILING, AMOUNT_MAX_DEFAULT,
};
pub use monitor::MonitorEvent;
pub use payment::{
    decide as decide_payment, evolve as evolve_payment, CaptureMode, CreatePayment, Operation,
    OperationKind, OperationOutcome, OperationState, Payment, PaymentCommand, PaymentEvent,
    PaymentRecord, PaymentRejection, PaymentStatus, ProviderFact,
};
pub use payout::{PayoutEvent, PayoutFact, PayoutId, PayoutLine, PayoutRejection};
pub use policy::{AccountPolicy, NormalBalance, Overdraft};
pub use stream::{
    endpoint_stream, exception_stream, guard_stream, monitor_stream, payment_stream, payout_stream,
    transfer_stream, StreamKind,
};
pub use transfer::{RequestTransfer, Transfer, TransferEvent, TransferRejection, TransferStatus};
