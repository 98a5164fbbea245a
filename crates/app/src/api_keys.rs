//! API keys mapped to tenants, stored as SHA-256 digests so that a copy of the database holds no
//! usable key. `ASIENTO_API_KEYS` registers keys at start; without any, `serve` creates a `demo`
//! tenant with a fresh random key and prints it once.

use asiento_eventstore::Database;
use sha2::{Digest, Sha256};

#[derive(Debug, thiserror::Error)]
pub enum ApiKeyError {
    #[error("this key is already registered for tenant {0}")]
    KeyTaken(String),
    #[error(transparent)]
    Database(#[from] sqlx::Error),
}

fn digest(key: &str) -> Vec<u8> {
    Sha256::digest(key.as_bytes()).to_vec()
}

/// The tenant a presented key belongs to, if any.
pub async fn tenant_for_key(database: &Database, key: &str) -> Result<Option<String>, ApiKeyError> {
    let digest = digest(key);
    let tenant = match database {
        Database::Postgres(pool) => {
            sqlx::query_scalar("select tenant from api_keys where key_sha256 = $1")
                .bind(digest)
                .fetch_optional(pool)
                .await?
        }
        Database::Sqlite(pool) => {
            sqlx::query_scalar("select tenant from api_keys where key_sha256 = ?1")
                .bind(digest)
                .fetch_optional(pool)
                .await?
        }
    };
    Ok(tenant)
}

/// Registers `key` for `tenant`; registering the same pair again is a no-op, the same key for
/// another tenant is refused.
pub async fn register(
    database: &Database,
    tenant: &str,
    key: &str,
    now_ms: i64,
) -> Result<(), ApiKeyError> {
    let digest = digest(key);
    match database {
        Database::Postgres(pool) => {
            sqlx::query(
                "insert into api_keys (key_sha256, tenant, created_ms) values ($1, $2, $3) \
                 on conflict do nothing",
            )
            .bind(&digest)
            .bind(tenant)
            .bind(now_ms)
            .execute(pool)
            .await?;
        }
        Database::Sqlite(pool) => {
            sqlx::query(
                "insert into api_keys (key_sha256, tenant, created_ms) values (?1, ?2, ?3) \
                 on conflict do nothing",
            )
            .bind(&digest)
            .bind(tenant)
            .bind(now_ms)
            .execute(pool)
            .await?;
        }
    }
    match tenant_for_key(database, key).await? {
        Some(owner) if owner == tenant => Ok(()),
        Some(owner) => Err(ApiKeyError::KeyTaken(owner)),
        None => Err(ApiKeyError::Database(sqlx::Error::RowNotFound)),
    }
}

/// Whether any key is registered at all (a fresh database gets a demo tenant).
pub async fn any_registered(database: &Database) -> Result<bool, ApiKeyError> {
    let count: i64 = match database {
        Database::Postgres(pool) => {
            sqlx::query_scalar("select count(*) from api_keys")
                .fetch_one(pool)
                .await?
        }
        Database::Sqlite(pool) => {
            sqlx::query_scalar("select count(*) from api_keys")
                .fetch_one(pool)
                .await?
        }
    };
    Ok(count > 0)
}
