-- The append-only event log (SQLite, the embedded default).
--
-- SQLite runs one write transaction at a time, so `position` (the rowid)
-- is handed out in commit order and is gap-free by itself: no commit-order
-- column is needed here (cursors carry xact = 0 on this backend).
-- Rowids of deleted rows could be reused, but rows are never deleted (see the
-- triggers below), so AUTOINCREMENT's extra bookkeeping is not needed.
CREATE TABLE events (
    position    INTEGER PRIMARY KEY,
    stream_id   TEXT    NOT NULL,
    version     INTEGER NOT NULL CHECK (version >= 1),  -- 1, 2, 3 … within the stream
    event_id    BLOB    NOT NULL UNIQUE,                -- a re-sent append is recognised, never copied
    event_type  TEXT    NOT NULL,
    schema      INTEGER NOT NULL,                       -- payload version, for upcasting on read
    data        TEXT    NOT NULL,                       -- JSON
    metadata    TEXT    NOT NULL,                       -- JSON: tenant, correlation/causation ids, idempotency key
    recorded_at TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    -- The guard of optimistic concurrency: two writers cannot both take version n.
    UNIQUE (stream_id, version)
);

-- Events are facts: a mistake is fixed by a reversing event, never by an edit.
CREATE TRIGGER events_no_update BEFORE UPDATE ON events
BEGIN
    SELECT RAISE(ABORT, 'events are immutable: UPDATE on events is not allowed');
END;

CREATE TRIGGER events_no_delete BEFORE DELETE ON events
BEGIN
    SELECT RAISE(ABORT, 'events are immutable: DELETE on events is not allowed');
END;
