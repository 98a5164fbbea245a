//! Stripe (`docs/providers.md`): its wire contract (form encoding, objects, error envelope),
//! read from Stripe's published fixtures, libraries and docs, the one reading of its objects in
//! the port's terms, and the adapter. The simulator's Stripe dialect answers with the same
//! contract, so the two cannot drift apart.

pub mod adapter;
pub mod form;
mod payouts;
pub mod reading;
pub mod wire;

/// The header of Stripe's webhook signature. Its scheme, `t=<unix>,v1=<hex HMAC-SHA256(secret,
/// "<t>.<raw body>")>` with one `v1` per active secret, is [`crate::signature`]'s.
pub const SIGNATURE_HEADER: &str = "Stripe-Signature";

pub use adapter::{StripeInitError, StripeProvider};
pub use form::{Form, FormError, FormValue};
pub use wire::API_VERSION;
