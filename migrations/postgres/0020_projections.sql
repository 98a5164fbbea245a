-- The projection registry: which generation of each read model is live, how far it has read the
-- log, and who may write it.
--
-- One row per projection. A projector batch writes its read-model rows and moves the checkpoint
-- here in ONE transaction, with a compare-and-set on (generation, lease_owner, old checkpoint):
-- a batch that lost its lease or whose generation was swapped by a rebuild updates 0 rows and
-- rolls back, so an event is never applied twice or skipped.
--
-- Lease times are milliseconds of the DATABASE clock (set by the statements themselves), so
-- runners on several machines compare against one clock and skew cannot hand a lease to two.
create table projections (
    name                text    primary key,
    -- Read-model tables are named after their generation (`balances_g3`); views point at this one.
    generation          bigint  not null check (generation >= 1),
    -- The projection code/schema version that built `generation`; a runner with other code refuses it.
    fingerprint         text    not null,
    -- The last event applied, in the log's gap-free (xact, position) order.
    checkpoint_xact     bigint  not null default 0,
    checkpoint_position bigint  not null default 0,
    -- When the last batch committed (database clock, unix ms); null before the first.
    applied_ms          bigint,
    lease_owner         text,
    lease_expires_ms    bigint  not null default 0,
    -- The highest generation number ever handed out, so a new one never reuses old tables.
    generations_made    bigint  not null check (generations_made >= generation)
);

-- A rebuild in progress: a fresh generation being filled from position zero beside the live one.
-- At most one per projection; its lease lets a crashed rebuild be taken over and resumed.
create table projection_rebuilds (
    name                text    primary key references projections (name),
    generation          bigint  not null,
    fingerprint         text    not null,
    checkpoint_xact     bigint  not null default 0,
    checkpoint_position bigint  not null default 0,
    owner               text    not null,
    lease_expires_ms    bigint  not null,
    started_ms          bigint  not null
);

-- Generations whose tables are no longer read (swapped out, or an abandoned rebuild) and wait to be
-- dropped. Dropping happens after the swap commits, never inside it, so the swap stays short.
create table projection_retired (
    name        text   not null references projections (name),
    generation  bigint not null,
    primary key (name, generation)
);
