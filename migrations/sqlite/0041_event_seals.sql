-- Tamper evidence: see the PostgreSQL migration of the same number.
create table event_seals (
    position    integer primary key,
    stream_id   text    not null,
    version     integer not null,
    hash        blob    not null,
    unique (stream_id, version)
);

create table event_seal_cursor (
    id          integer primary key check (id = 1),
    xact        integer not null,
    position    integer not null
);

create trigger event_seals_no_update before update on event_seals
begin
    select raise(abort, 'seals are immutable: UPDATE on event_seals is not allowed');
end;

create trigger event_seals_no_delete before delete on event_seals
begin
    select raise(abort, 'seals are immutable: DELETE on event_seals is not allowed');
end;
