-- The webhook inbox and the per-payment lease.
--
-- A verified provider event is stored here, raw, before it is processed: the HTTP handler only
-- inserts (deduplicated by the provider's event id) and answers 200, so a slow or failing worker
-- never makes a provider redeliver or give up. Workers claim pending rows under a lease
-- (`for update skip locked`), apply each through the payment flow's one `finalize`, and mark the
-- row processed in the same transaction as the events it appends.
--
-- Times are unix milliseconds of the application clock (as the idempotency leases are), so that
-- tests move them by hand; leases are long enough that clock skew between hosts does not matter.
create table webhook_inbox (
    id                bigint  generated always as identity primary key,
    provider          text    not null,
    -- The provider's event id (`evt_…`): a redelivery carries the same one and is not stored twice.
    event_id          text    not null,
    event_type        text    not null,
    -- `data.charge.reference` (our payment id) as sent, for finding a payment's events; may be null.
    payment_ref       text,
    -- The exact bytes the signature covered, so a row can be re-verified or replayed as received.
    payload           bytea   not null,
    -- pending: waiting or being worked on; processed: applied (or acknowledged and ignored);
    -- dead: given up after attempts_max failures or a permanent problem (see dead_reason).
    status            text    not null default 'pending'
                      check (status in ('pending', 'processed', 'dead')),
    attempts          integer not null default 0,
    -- The row is not claimed again before this (backoff after a failure).
    next_attempt_ms   bigint  not null,
    -- The worker holding the row, until when; past it another worker may claim it.
    lease_owner       uuid,
    lease_expires_ms  bigint,
    last_error        text,
    -- Why a dead row died: attempts_exhausted, unknown_payment (a reconciliation exception),
    -- provider_mismatch, no_payment_reference.
    dead_reason       text,
    -- How a processed row ended: applied (the fact was finalized) or ignored (an unknown type).
    outcome           text,
    received_ms       bigint  not null,
    finished_ms       bigint,
    unique (provider, event_id),
    check ((status = 'dead') = (dead_reason is not null))
);
-- What workers scan: pending rows in arrival order.
create index webhook_inbox_pending on webhook_inbox (next_attempt_ms, id) where status = 'pending';
-- Dead letters by reason (unknown_payment rows are the reconciliation exceptions of a later issue).
create index webhook_inbox_dead on webhook_inbox (dead_reason, id) where status = 'dead';
create index webhook_inbox_payment on webhook_inbox (payment_ref);

-- One holder at a time per payment, across the webhook worker, the synchronous path's recovery
-- and the reconciler. Acquire is a compare-and-set (insert, or take over an expired row); the
-- version check on the payment stream stays, because a lease can expire under a slow holder.
create table payment_leases (
    payment_id  text   primary key,
    owner       uuid   not null,
    expires_ms  bigint not null
);
