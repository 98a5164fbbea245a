//! Adyen (`docs/providers.md`; the wire contract with its sources in `docs/adyen-wire.md`):
//! Checkout v71 and its standard notifications, signed item by item. The simulator's Adyen
//! dialect answers with the same contract, and tests check both against Adyen's published
//! OpenAPI schemas.

pub mod adapter;
pub mod hmac;
pub mod notifications;
pub mod reading;
pub mod reports;
pub mod wire;

pub use adapter::{AdyenAccount, AdyenInitError, AdyenProvider};
pub use hmac::{HmacError, HmacKey};
pub use notifications::{verify_batch, BasicCredentials, BatchError, VerifiedItem};
pub use reports::{ReportsAccess, ReportsInitError};
pub use wire::API_VERSION;
