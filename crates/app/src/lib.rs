//! Use cases of the ledger: what happens between an HTTP request (or a webhook, or a sweep) and the
//! event log. This crate owns the rules that span systems sharing no transaction: idempotency
//! keys, the payment flow and its one `finalize`, the webhook worker, reconciliation, invariants.
//! It speaks to the database only through `asiento_eventstore` (the log and its unit of work).

pub mod api_keys;
pub mod clock;
pub mod commit;
pub mod exceptions;
pub mod facts;
pub mod gauges;
pub mod hold_expiry;
pub mod idempotency;
pub mod invariants;
pub mod leases;
pub mod ledger;
pub mod log;
mod log_cursor;
pub mod metered;
pub mod payments;
pub mod payouts;
pub mod providers;
pub mod reconcile;
pub mod replay;
pub mod reply;
pub mod watch;
pub mod webhooks;
