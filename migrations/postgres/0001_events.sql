-- The append-only event log (PostgreSQL).
--
-- `position` is an identity: unique and increasing in the order values are
-- *taken*, which is not the order transactions *commit*. A reader that tails
-- by `position` alone can pass over an event whose transaction commits late.
-- `xact` records the writing transaction's id so readers can order by
-- (xact, position) and read only transactions older than the oldest one still
-- running (`pg_snapshot_xmin`): nothing can ever appear behind such a cursor.
create table events (
    position    bigint      generated always as identity primary key,
    xact        bigint      not null default (pg_current_xact_id()::text::bigint),
    stream_id   text        not null,
    version     bigint      not null check (version >= 1),  -- 1, 2, 3 … within the stream
    event_id    uuid        not null unique,                 -- a re-sent append is recognised, never copied
    event_type  text        not null,
    schema      int         not null,                        -- payload version, for upcasting on read
    data        jsonb       not null,
    metadata    jsonb       not null,                        -- tenant, correlation/causation ids, idempotency key
    recorded_at timestamptz not null default now(),
    -- The guard of optimistic concurrency: two writers cannot both take version n.
    unique (stream_id, version)
);

-- The gap-free global order ($all reads and subscriptions).
create index events_xact_position on events (xact, position);

-- Events are facts: a mistake is fixed by a reversing event, never by an edit.
create function events_reject_change() returns trigger
language plpgsql as $$
begin
    raise exception 'events are immutable: % on events is not allowed', tg_op
        using errcode = 'restrict_violation';
end
$$;

create trigger events_immutable
    before update or delete or truncate on events
    for each statement execute function events_reject_change();
