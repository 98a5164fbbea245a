-- The projection registry: which generation of each read model is live, how far it has read the
-- log, and who may write it. See the PostgreSQL migration of the same number for the reasoning;
-- the shape is the same. Lease times are unix ms of the database clock.
CREATE TABLE projections (
    name                TEXT    PRIMARY KEY,
    generation          INTEGER NOT NULL CHECK (generation >= 1),
    fingerprint         TEXT    NOT NULL,
    checkpoint_xact     INTEGER NOT NULL DEFAULT 0,
    checkpoint_position INTEGER NOT NULL DEFAULT 0,
    applied_ms          INTEGER,
    lease_owner         TEXT,
    lease_expires_ms    INTEGER NOT NULL DEFAULT 0,
    generations_made    INTEGER NOT NULL CHECK (generations_made >= generation)
);

CREATE TABLE projection_rebuilds (
    name                TEXT    PRIMARY KEY REFERENCES projections (name),
    generation          INTEGER NOT NULL,
    fingerprint         TEXT    NOT NULL,
    checkpoint_xact     INTEGER NOT NULL DEFAULT 0,
    checkpoint_position INTEGER NOT NULL DEFAULT 0,
    owner               TEXT    NOT NULL,
    lease_expires_ms    INTEGER NOT NULL,
    started_ms          INTEGER NOT NULL
);

CREATE TABLE projection_retired (
    name        TEXT    NOT NULL REFERENCES projections (name),
    generation  INTEGER NOT NULL,
    PRIMARY KEY (name, generation)
);
