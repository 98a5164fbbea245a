-- Idempotency records: one per (tenant, method, route, client key). See the PostgreSQL migration
-- of the same number for what each column is for.
create table idempotency_keys (
    tenant           text    not null,
    method           text    not null,
    route            text    not null,
    key              text    not null,
    body_sha256      blob    not null,
    resource_id      text    not null,
    state            text    not null check (state in ('in_flight', 'completed')),
    lease_owner      text    not null,
    lease_expires_ms integer not null,
    response_status  integer,
    response_body    blob,
    created_ms       integer not null,
    completed_ms     integer,
    primary key (tenant, method, route, key),
    check ((state = 'completed') = (response_status is not null and response_body is not null))
) without rowid;
create index idempotency_keys_created on idempotency_keys (created_ms);
create index idempotency_keys_in_flight on idempotency_keys (lease_expires_ms) where state = 'in_flight';
