-- Tamper evidence: a hash chain over each stream's events, written by the sealer off the append
-- path. hash = SHA-256(previous hash of the stream ‖ canonical bytes of the event); `asiento
-- verify` recomputes every chain from `events` and compares. A seal is written once and never
-- rebuilt: seals only ever follow new events, so a tampered log cannot re-seal itself.
create table event_seals (
    position    bigint  primary key,
    stream_id   text    not null,
    version     bigint  not null,
    hash        bytea   not null,
    unique (stream_id, version)
);

-- How far the sealer got in the gap-free global order.
create table event_seal_cursor (
    id          integer primary key check (id = 1),
    xact        bigint  not null,
    position    bigint  not null
);

-- Seals are facts too.
create function event_seals_reject_change() returns trigger
language plpgsql as $$
begin
    raise exception 'seals are immutable: % on event_seals is not allowed', tg_op
        using errcode = 'restrict_violation';
end
$$;

create trigger event_seals_immutable
    before update or delete or truncate on event_seals
    for each statement execute function event_seals_reject_change();
