-- Reconciliation tables. See the PostgreSQL migration of the same number for what each is for.
create table reconciliation_exceptions (
    id              text    primary key,
    tenant          text,
    payment_id      text,
    provider        text    not null,
    charge_id       text,
    kind            text    not null,
    resolution      text    not null check (resolution in ('auto', 'manual')),
    status          text    not null check (status in ('open', 'resolved')),
    local           text    not null,
    provider_state  text    not null,
    difference      text    not null,
    note            text,
    recorded_ms     integer not null,
    resolved_ms     integer,
    version         integer not null
) without rowid;
create index reconciliation_exceptions_tenant on reconciliation_exceptions (tenant, status, recorded_ms);

create table reconciliation_cursors (
    name            text    primary key,
    mark            integer not null
) without rowid;

create table reconciliation_watch (
    payment_id      text    primary key,
    created_ms      integer not null
) without rowid;
create index reconciliation_watch_created on reconciliation_watch (created_ms);

create table reconciliation_watch_cursor (
    id              integer primary key check (id = 1),
    xact            integer not null,
    position        integer not null
);

create table job_leases (
    job             text    primary key,
    owner           text    not null,
    expires_ms      integer not null
) without rowid;
