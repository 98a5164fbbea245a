//! Payment providers, seen from the ledger.
//!
//! - [`provider`]: the port, [`Provider`], in the provider's plain terms (i64
//!   minor units, currency codes), with an outcome type that keeps "unknown"
//!   apart from "declined" because a timed-out charge may exist.
//! - [`client`]: [`HttpProvider`], the adapter for the simulator's protocol
//!   (kind `sim`): timeouts, bounded retries with full jitter on transient
//!   failures only, the same idempotency key on every attempt.
//! - [`transport`]: the HTTP transport every adapter sends through: timeouts,
//!   bounded retries with full jitter, the same idempotency key on every
//!   attempt, and "unknown", never "failed", for a write that may have
//!   reached the provider.
//! - [`stripe`], [`adyen`]: the adapters for Stripe's API and Adyen's Checkout
//!   v71 (`docs/providers.md`).
//! - [`payout`]: payouts as the port shows them.
//! - [`signature`]: the `Psp-Signature` scheme of webhooks, shared by the
//!   simulator (signs) and the ledger's webhook endpoint (verifies).
//! - [`event`]: the webhook event body.
//!
//! The provider simulator the tests and demos run against is a crate of its
//! own (`asiento-psp-sim`), which depends on this one for the wire types; the
//! ledger never depends on it.
//!
//! This crate does not know the ledger's domain: the adapters speak the
//! providers' protocols. It uses
//! `asiento_domain` for one thing only: the one conversion of major units,
//! which Adyen's reports need.

// `json!` literals of Stripe's objects (every field of its fixtures) nest past the default.
#![recursion_limit = "256"]

pub mod adyen;
pub mod client;
pub mod event;
pub mod payout;
pub mod provider;
pub mod signature;
pub mod stripe;
pub mod transport;

pub use client::{ClientConfig, ClientInitError, HttpProvider, RetrySleeper, TokioSleeper};
pub use event::{Envelope, EventData, EventFormat, EventType, WebhookEvent};
pub use payout::{Payout, PayoutStatus, PayoutTransaction};
pub use provider::{
    Capabilities, Charge, ChargeOutcome, ChargeStatus, CreateCharge, Dispute, DisputeStatus,
    Movement, MovementKind, NextAction, Operation, OperationAnswer, OperationKind, OperationStatus,
    Provider, ProviderError, ProviderFee, ProviderRequest, Rejection, ReportLine, SettlementReport,
};
pub use signature::{sign, verify, SignatureError, SIGNATURE_HEADER, TOLERANCE_S_DEFAULT};
