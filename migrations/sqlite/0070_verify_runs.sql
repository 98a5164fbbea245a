-- The invariant checker's completed runs (serve's scheduled checks and `asiento verify`), for
-- someone who was not watching the logs when they ran. The insert of a run deletes all but the
-- newest 100 in its transaction. violations is JSON text:
-- {"violations": [{"check", "subject", "detail"} …], "omitted": {"<check>": <count> …}}.
create table verify_runs (
    id               integer primary key,
    started_ms       integer not null,
    finished_ms      integer not null,
    events_checked   integer not null,
    streams_checked  integer not null,
    unsealed         integer not null,
    ok               integer not null check (ok in (0, 1)),
    violations       text    not null
);
