-- API keys, stored as SHA-256 digests: the database never holds a usable key. Keys are random
-- 32-byte secrets, so a fast hash is enough (there is nothing to brute-force).
create table api_keys (
    key_sha256  bytea  primary key,
    tenant      text   not null,
    created_ms  bigint not null
);
create index api_keys_tenant on api_keys (tenant);
