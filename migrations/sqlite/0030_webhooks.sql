-- The webhook inbox and the per-payment lease. See the PostgreSQL migration of the same number for
-- what each column is for. SQLite has no `skip locked`: claimers run in `BEGIN IMMEDIATE`
-- transactions, and the one write lock serialises them.
create table webhook_inbox (
    id                integer primary key autoincrement,
    provider          text    not null,
    event_id          text    not null,
    event_type        text    not null,
    payment_ref       text,
    payload           blob    not null,
    status            text    not null default 'pending'
                      check (status in ('pending', 'processed', 'dead')),
    attempts          integer not null default 0,
    next_attempt_ms   integer not null,
    lease_owner       text,
    lease_expires_ms  integer,
    last_error        text,
    dead_reason       text,
    outcome           text,
    received_ms       integer not null,
    finished_ms       integer,
    unique (provider, event_id),
    check ((status = 'dead') = (dead_reason is not null))
);
create index webhook_inbox_pending on webhook_inbox (next_attempt_ms, id) where status = 'pending';
create index webhook_inbox_dead on webhook_inbox (dead_reason, id) where status = 'dead';
create index webhook_inbox_payment on webhook_inbox (payment_ref);

create table payment_leases (
    payment_id  text    primary key,
    owner       text    not null,
    expires_ms  integer not null
) without rowid;
