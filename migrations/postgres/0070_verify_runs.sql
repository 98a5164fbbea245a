-- The invariant checker's completed runs (serve's scheduled checks and `asiento verify`), for
-- someone who was not watching the logs when they ran. The insert of a run deletes all but the
-- newest 100 in its transaction. violations is JSON text:
-- {"violations": [{"check", "subject", "detail"} …], "omitted": {"<check>": <count> …}}.
create table verify_runs (
    id               bigint  generated always as identity primary key,
    started_ms       bigint  not null,
    finished_ms      bigint  not null,
    events_checked   bigint  not null,
    streams_checked  bigint  not null,
    unsealed         bigint  not null,
    ok               boolean not null,
    violations       text    not null
);
