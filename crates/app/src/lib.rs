//! Use cases of the ledger: what happens between an HTTP request (or a webhook, or a sweep) and the
//! event log. This crate owns the rules that span systems sharing no transaction: idempotency
//! keys, the payment flow and its one `finalize`, the webhook worker, reconciliation, invariants.
//! It reaches the log only through `asiento_eventstore` (the log and its unit of work).
//!
//! Beside the log, `app` keeps tables of its own and queries them directly with sqlx, one
//! statement per backend matched on `Tx`/`Database`: idempotency keys, API keys, the webhook
//! inbox, payment leases, the reconciler's watch lists and cursors, exceptions, job leases, hold
//! expiries, event seals and verify runs. The events table it reaches through `EventStore` only,
//! except in the group-commit statement (`commit::statement`, which embeds `EachAppend`) and the
//! checker's proof that UPDATE and DELETE on `events` are refused. It reads no projection: what it
//! needs from the log it keeps itself (the watch lists, the hold expiries), so it depends on no
//! read model's lag or rebuild.

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
