-- The operator console (crates/console): its sign-in sessions and its audit trail.
--
-- A session is what a signed-in browser holds: a random token in an HttpOnly cookie, stored
-- here only as its SHA-256, so the table never holds a usable credential. tenant is null for the
-- platform operator's key. Every form the session renders carries csrf, and a POST without it
-- changes nothing.
create table console_sessions (
    token_sha256     blob    primary key,
    tenant           text,
    -- Who signed in (the name typed at sign-in) and which key (the first 12 hex digits of its
    -- SHA-256): an API key is shared by a tenant's people, so the name says who acted.
    operator         text    not null,
    key_fingerprint  text    not null,
    csrf             text    not null,
    created_ms       integer  not null,
    expires_ms       integer  not null
);
create index console_sessions_expires on console_sessions (expires_ms);

-- Every action taken in the console, with who took it: sign-in and sign-out, captures, refunds
-- and resolved exceptions, with what the command answered. Appended, never changed.
create table console_audit (
    id               integer primary key autoincrement,
    at_ms            integer  not null,
    tenant           text,
    operator         text    not null,
    key_fingerprint  text    not null,
    action           text    not null,
    subject          text,
    detail           text    not null,
    outcome          text    not null
);
create index console_audit_tenant on console_audit (tenant, id);

-- A payment's page lists its exceptions (few rows, rarely written).
create index reconciliation_exceptions_payment on reconciliation_exceptions (payment_id);
