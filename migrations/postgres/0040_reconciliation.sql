-- Reconciliation: the exceptions' read table, the report windows, the reconciler's watch list of
-- unsettled payments, and the per-job leases.
--
-- Exceptions are events (`exception-exc_…` streams); this table is their read side, written in
-- the same transaction as the events it reflects (by the reconciler and the resolve route), so it
-- is never behind them. Times are unix milliseconds of the application clock, as the other leases.
create table reconciliation_exceptions (
    id              text    primary key,            -- exc_…, derived from the finding
    -- The payment's tenant; null for a charge or event naming no payment of ours (platform scope:
    -- operators see those with `asiento reconcile --list`).
    tenant          text,
    payment_id      text,
    provider        text    not null,
    charge_id       text,
    kind            text    not null,
    resolution      text    not null check (resolution in ('auto', 'manual')),
    status          text    not null check (status in ('open', 'resolved')),
    local           jsonb   not null,
    provider_state  jsonb   not null,
    difference      jsonb   not null,
    note            text,
    recorded_ms     bigint  not null,
    resolved_ms     bigint,
    -- The exception stream's version this row reflects.
    version         bigint  not null
);
create index reconciliation_exceptions_tenant on reconciliation_exceptions (tenant, status, recorded_ms);

-- Where each incremental part of the sweep got to. `report:{provider}`: the end of the last
-- settlement-report window compared (ms; the next sweep asks for [mark - overlap, now - settle));
-- `dead_letters`: the last webhook-inbox id turned into an exception.
create table reconciliation_cursors (
    name            text    primary key,
    mark            bigint  not null
);

-- Payments that may need a provider lookup (pending or requiring action), kept by the reconciler
-- from the log itself (its cursor below), so the stale sweep depends on no read model's lag.
create table reconciliation_watch (
    payment_id      text    primary key,
    created_ms      bigint  not null
);
create index reconciliation_watch_created on reconciliation_watch (created_ms);

create table reconciliation_watch_cursor (
    id              integer primary key check (id = 1),
    xact            bigint  not null,
    position        bigint  not null
);

-- One holder at a time per background job (`reconciler`, `sealer`) across processes: a
-- compare-and-set on (owner, expiry) like the payment leases.
create table job_leases (
    job             text    primary key,
    owner           uuid    not null,
    expires_ms      bigint  not null
);
