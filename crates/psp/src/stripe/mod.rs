//! Stripe's wire contract (`docs/providers.md`, from Stripe's published fixtures, libraries and
//! docs): its form encoding, its objects and its error envelope, shared by the adapter that
//! talks to Stripe and the simulator's dialect that answers as Stripe does, so that the two
//! read and write one contract.

pub mod form;
pub mod wire;

pub use form::{Form, FormError, FormValue};
pub use wire::API_VERSION;
