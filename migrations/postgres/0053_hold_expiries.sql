-- Open holds with an expiry, kept from the log (one cursor): a hold enters at its
-- TransferRequested and leaves at its HoldPosted or HoldVoided; the worker voids each one whose
-- expires_at has passed.
create table hold_expiries (
    transfer_id     text    primary key,
    tenant          text    not null,
    expires_ms      bigint  not null
);
create index hold_expiries_due on hold_expiries (expires_ms);

create table hold_expiry_cursor (
    id              integer primary key check (id = 1),
    xact            bigint  not null,
    position        bigint  not null
);
