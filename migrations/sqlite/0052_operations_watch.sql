-- The stale sweep visits watched payments in rotation, least recently checked first, so that
-- payments nobody will ever finish (abandoned redirects) cannot keep newer ones from being
-- looked at; a payment flagged as a misfit is checked again only after a longer pause.
alter table reconciliation_watch add column next_check_ms integer not null default 0;
create index reconciliation_watch_next_check on reconciliation_watch (next_check_ms, created_ms desc);

-- Provider operations (captures, refunds) that the provider has not yet answered for good,
-- kept from the log like the payment watch: the sweep drives each to an outcome.
create table reconciliation_operations (
    payment_id      text    not null,
    kind            text    not null,
    sequence        integer not null,
    requested_ms    integer not null,
    next_check_ms   integer not null,
    primary key (payment_id, kind, sequence)
) without rowid;
create index reconciliation_operations_next_check on reconciliation_operations (next_check_ms);
