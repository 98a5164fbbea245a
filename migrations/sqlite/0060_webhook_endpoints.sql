-- Merchants' webhook endpoints and the deliveries of merchant events to them (crates/outbound).
-- An endpoint is configuration, not a fact of money: it lives in tables, not in the log.
create table webhook_endpoints (
    id              text    primary key,          -- we_…
    tenant          text    not null,
    url             text    not null,
    -- JSON array of merchant event types, or ["*"] for every type.
    enabled_events  text    not null,
    description     text,
    status          text    not null check (status in ('enabled', 'disabled', 'deleted')),
    disabled_reason text,
    created_ms      integer  not null,
    -- Since when every attempt to this endpoint failed; null after a success.
    failing_since_ms integer,
    disabled_ms     integer
);
create index webhook_endpoints_tenant on webhook_endpoints (tenant, created_ms);

-- The signing secrets: the current one (expires_ms null) and, during a rotation, the previous
-- one until it expires. Stored as given: a delivery is signed with them.
create table webhook_endpoint_secrets (
    endpoint_id text   not null references webhook_endpoints (id),
    secret      text   not null,
    created_ms  integer not null,
    expires_ms  integer,
    primary key (endpoint_id, secret)
);

-- One row per (endpoint, event): at least once, retried with backoff until it succeeds or its
-- retry window ends.
create table webhook_deliveries (
    id               text    primary key,          -- wd_…
    endpoint_id      text    not null references webhook_endpoints (id),
    tenant           text    not null,
    event_id         text    not null,
    seq              integer  not null,
    status           text    not null check (status in ('pending', 'succeeded', 'failed')),
    attempts         integer not null default 0,
    next_attempt_ms  integer  not null,
    first_attempt_ms integer,
    -- A worker sending it holds it until then; two workers never send one attempt twice.
    lease_until_ms   integer  not null default 0,
    last_status      integer,
    last_error       text,
    created_ms       integer  not null,
    unique (endpoint_id, event_id)
);
create index webhook_deliveries_due on webhook_deliveries (next_attempt_ms) where status = 'pending';
create index webhook_deliveries_endpoint on webhook_deliveries (endpoint_id, seq);

create table webhook_delivery_attempts (
    delivery_id     text    not null references webhook_deliveries (id),
    attempt         integer not null,
    at_ms           integer  not null,
    latency_ms      integer  not null,
    response_status integer,
    error           text,
    primary key (delivery_id, attempt)
);

-- How far the dispatcher has turned the merchant events feed into deliveries.
create table webhook_dispatch (
    id  integer primary key check (id = 1),
    seq integer  not null
);
insert into webhook_dispatch (id, seq) values (1, 0);
