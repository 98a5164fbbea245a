//! API keys mapped to tenants, stored as SHA-256 digests so that a copy of the database holds no
//! usable key. `ASIENTO_API_KEYS` registers keys at start; without any, `serve` creates a `demo`
//! tenant with a fresh random key and prints it once.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use asiento_eventstore::Database;
use sha2::{Digest, Sha256};

/// How long a key found in the database is believed without asking again: a key deleted from
/// `api_keys` stops working within this time. Unknown keys are never remembered.
pub const KEY_CACHE_TTL: Duration = Duration::from_secs(30);
/// Keys remembered at most; when full, the memory starts over.
const KEY_CACHE_ENTRIES_MAX: usize = 10_000;

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

/// The tenant whose key has this digest, if any.
async fn tenant_by_digest(
    database: &Database,
    digest: &[u8],
) -> Result<Option<String>, ApiKeyError> {
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

/// The tenant a presented key belongs to, with the keys found in the last [`KEY_CACHE_TTL`]
/// remembered, so that a request with a known key costs no round trip. One per database (per
/// `AppState`).
#[derive(Debug, Default)]
pub struct KeyCache {
    found: Mutex<HashMap<Vec<u8>, (String, Instant)>>,
}

impl KeyCache {
    pub async fn tenant_for_key(
        &self,
        database: &Database,
        key: &str,
    ) -> Result<Option<String>, ApiKeyError> {
        let digest = digest(key);
        if let Some((tenant, at)) = self.lock().get(&digest) {
            if at.elapsed() < KEY_CACHE_TTL {
                return Ok(Some(tenant.clone()));
            }
        }
        let tenant = tenant_by_digest(database, &digest).await?;
        if let Some(tenant) = &tenant {
            let mut found = self.lock();
            if found.len() >= KEY_CACHE_ENTRIES_MAX {
                found.clear();
            }
            found.insert(digest, (tenant.clone(), Instant::now()));
        }
        Ok(tenant)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Vec<u8>, (String, Instant)>> {
        self.found.lock().unwrap_or_else(PoisonError::into_inner)
    }
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
    match tenant_by_digest(database, &digest).await? {
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

#[cfg(test)]
mod tests {
    use super::*;

    async fn delete_all(database: &Database) {
        if let Database::Sqlite(pool) = database {
            sqlx::query("delete from api_keys")
                .execute(pool)
                .await
                .unwrap();
        }
    }

    /// A found key is remembered (a deleted row keeps working until the TTL runs out, which is
    /// the documented revocation window); an unknown key is not, so registering it takes
    /// effect at once.
    #[tokio::test]
    async fn found_keys_are_remembered_unknown_ones_are_not() {
        let (_dir, url) = asiento_eventstore::scratch::temp_sqlite_url();
        let database = Database::connect(&url).await.unwrap();
        database.migrate().await.unwrap();
        let cache = KeyCache::default();
        register(&database, "acme", "sk_known", 0).await.unwrap();
        assert_eq!(
            cache.tenant_for_key(&database, "sk_known").await.unwrap(),
            Some("acme".to_owned())
        );
        assert_eq!(
            cache.tenant_for_key(&database, "sk_later").await.unwrap(),
            None
        );
        delete_all(&database).await;
        assert_eq!(
            cache.tenant_for_key(&database, "sk_known").await.unwrap(),
            Some("acme".to_owned()),
            "within the TTL the key is not looked up again"
        );
        assert_eq!(
            KeyCache::default()
                .tenant_for_key(&database, "sk_known")
                .await
                .unwrap(),
            None,
            "the database no longer knows it"
        );
        register(&database, "globex", "sk_later", 0).await.unwrap();
        assert_eq!(
            cache.tenant_for_key(&database, "sk_later").await.unwrap(),
            Some("globex".to_owned())
        );
    }
}
