//! Stripe's wire contract (`docs/providers.md`, from Stripe's published fixtures, libraries and
//! docs): its form encoding, its objects and its error envelope, shared by the adapter that
//! talks to Stripe and the simulator's dialect that answers as Stripe does, so that the two
//! read and write one contract.

pub mod form;
pub mod wire;

/// The header of Stripe's webhook signature. Its scheme, `t=<unix>,v1=<hex HMAC-SHA256(secret,
/// "<t>.<raw body>")>` with one `v1` per active secret, is [`crate::signature`]'s.
pub const SIGNATURE_HEADER: &str = "Stripe-Signature";

pub use form::{Form, FormError, FormValue};
pub use wire::API_VERSION;
