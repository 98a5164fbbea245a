-- Idempotency records: one per (tenant, method, route, client key).
-- The primary key is the lock: the first request inserts, every later one finds the row.
create table idempotency_keys (
    tenant           text    not null,
    method           text    not null,
    route            text    not null,
    key              text    not null,
    -- SHA-256 of the canonical request body (JSON with sorted keys): same key + other body = 422.
    body_sha256      bytea   not null,
    -- What the first request created (a payment id), so that a retry after a crash resumes it.
    resource_id      text    not null,
    state            text    not null check (state in ('in_flight', 'completed')),
    -- The in-flight owner and until when it holds the key; past that a retry may take over.
    lease_owner      uuid    not null,
    lease_expires_ms bigint  not null,
    -- The stored answer, replayed byte for byte.
    response_status  integer,
    response_body    bytea,
    created_ms       bigint  not null,
    completed_ms     bigint,
    primary key (tenant, method, route, key),
    check ((state = 'completed') = (response_status is not null and response_body is not null))
);
create index idempotency_keys_created on idempotency_keys (created_ms);
create index idempotency_keys_in_flight on idempotency_keys (lease_expires_ms) where state = 'in_flight';
