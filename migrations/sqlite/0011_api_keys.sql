-- API keys, stored as SHA-256 digests (see the PostgreSQL migration of the same number).
create table api_keys (
    key_sha256  blob    primary key,
    tenant      text    not null,
    created_ms  integer not null
) without rowid;
create index api_keys_tenant on api_keys (tenant);
