//! Webhooks from providers: an inbox written by the HTTP handler and drained by a worker.
//!
//! Why the split: a provider waits a few seconds for our answer and redelivers (or gives up) on
//! anything but a 2xx, so the handler only does what must happen before the 200: verify the
//! signature over the raw bytes, parse the body, and store it, deduplicated by (provider, event
//! id), in one statement. All processing happens later in [`Worker`], which may fail and retry
//! without the provider noticing.
//!
//! The worker claims pending rows under a row lease (`for update skip locked` on PostgreSQL; on
//! SQLite the single write lock serialises claimers), takes the payment's lease
//! ([`crate::leases`]) so that no other worker, recovery or reconciler works on the same payment at
//! once, and applies the event through
//! [`PaymentFlow::finalize`](crate::payments::PaymentFlow::finalize) (with [`Finalize::also`](crate::payments::Finalize::also)), the one path
//! every provider fact takes. The row is marked processed in the same transaction as the events
//! it appends, and only if this worker still holds the row: a row is processed exactly when its
//! effect is recorded.
//!
//! Failures retry with exponential backoff (persisted as the row's `next_attempt_ms`, so a retry
//! survives a restart: that is why this is not a `backon` loop); after `attempts_max` the row is
//! dead-lettered and the payment flagged for review. An event for a payment we do not know is
//! retried for `unknown_payment_retry_ms` (the webhook may beat our own commit) and then
//! dead-lettered with reason `unknown_payment`: the reconciliation issue turns those rows
//! ([`dead_letters`]) into exceptions.
//!
//! **The payload is trusted as the fact, not fetched again.** Each event carries the charge as it
//! stood right after the change, and the domain already takes facts in any order: a capture before
//! its authorization, a cumulative refund total that posts only the difference, a dispute close
//! that stands for its open. Fetching the charge would add a provider round trip (and a provider
//! outage) to every event for no gain in correctness; the reconciler compares against the
//! provider's report anyway. Where one event implies an earlier one (a refund or a dispute implies
//! a capture of `amount_captured`), the implied facts are applied first, so a partial capture is
//! never guessed from the authorization.
//!
//! One file per job: `secrets.rs` holds each provider's signing secret, `receive.rs` verifies and
//! stores a delivery (the inbox's one insert, shared with group commit), `batch.rs` does so for a
//! batch of items signed one by one (Adyen's), `worker.rs` drains the inbox, and `queries.rs`
//! reads it (depth, counts, dead letters).
//!
//! What a row stands for is its provider adapter's reading (`Provider::read_event`). The
//! simulator's body is the fact itself, as above. A Stripe event names objects without the
//! payment they belong to, so it is a hint: the adapter reads the PaymentIntent and the refund it
//! names as they stand (a read that fails is retried like any other failure). An Adyen item is the
//! one change it reports; a dispute item that names no charge (no `originalReference`) is about
//! the charge of the payment its reference names. A charge that is not its payment's
//! (`facts::charge_misfit`) is dead-lettered as `charge_mismatch` and the payment flagged.

mod batch;
mod queries;
mod receive;
mod secrets;
mod worker;

/// The headers carrying a webhook's signature (ours, and Stripe's with the same scheme),
/// re-exported for the HTTP layer.
pub use asiento_psp::stripe::SIGNATURE_HEADER as STRIPE_SIGNATURE_HEADER;
pub use asiento_psp::{EventFormat, SIGNATURE_HEADER, TOLERANCE_S_DEFAULT};
pub use batch::BatchReceived;
pub use queries::{
    dead_letters, inbox_counts, of_payment, pending_count, DeadLetter, InboxCounts, InboxEvent,
    DEAD_LETTERS_PAGE_MAX, PAYMENT_EVENTS_MAX,
};
pub(crate) use receive::{add_inbox, inbox_cte, stored_each};
pub use receive::{
    insert_inbox_each, InboxRow, ReceiveError, Received, WebhookReceiver, EVENT_ID_LEN_MAX,
    PAYMENT_REF_LEN_MAX,
};
pub use secrets::{SecretsError, WebhookSecrets};
pub use worker::{
    facts_from_event, DeadReason, DrainReport, Worker, WorkerConfig, WorkerError,
    ERROR_TEXT_CHARS_MAX,
};

/// One SQL text for both backends: PostgreSQL's `$n` placeholders become SQLite's `?n` (both are
/// positional by number). Only for statements without `$` anywhere else.
fn sqlite(sql: &str) -> String {
    sql.replace('$', "?")
}

fn truncate(text: &str, chars_max: usize) -> String {
    text.chars().take(chars_max).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sqlite_placeholders_are_numbered_the_same() {
        assert_eq!(sqlite("a = $1 and b = $12"), "a = ?1 and b = ?12");
    }
}
