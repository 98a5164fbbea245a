//! Scratch databases: a fresh database to run something against and throw away, a new
//! PostgreSQL database per caller or a SQLite file in a temporary directory. `asiento bench` runs
//! on one, and the test kit (`crates/testkit`, `TestDatabase`) gives one to every test.
//!
//! These helpers panic on failure: they run only in tests and benchmarks, where a missing
//! database server is a setup error to show loudly.

use std::time::{SystemTime, UNIX_EPOCH};

use sqlx::Connection;

/// The server (and maintenance database) used to create test databases.
pub const TEST_PG_URL_ENV: &str = "ASIENTO_TEST_PG_URL";
pub const TEST_PG_URL_DEFAULT: &str = "postgres://postgres@127.0.0.1:5432/postgres";
/// Test databases older than this are dropped when a new one is created, so
/// repeated runs do not fill the disk (each is a copy of template1).
pub const STALE_TEST_DATABASE_AGE_SECS: u64 = 2 * 3600;
const TEST_DATABASE_PREFIX: &str = "asiento_test_";

/// Creates an empty database `asiento_test_<unix secs>_<random>` on the
/// server of `ASIENTO_TEST_PG_URL` (default [`TEST_PG_URL_DEFAULT`]) and
/// returns its URL. Migrations are not applied.
pub async fn fresh_postgres_url() -> String {
    let base = std::env::var(TEST_PG_URL_ENV).unwrap_or_else(|_| TEST_PG_URL_DEFAULT.to_owned());
    let now_secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let name = format!(
        "{TEST_DATABASE_PREFIX}{now_secs}_{}",
        uuid::Uuid::new_v4().simple()
    );
    let mut conn = sqlx::PgConnection::connect(&base)
        .await
        .unwrap_or_else(|e| panic!("cannot connect to {base} to create a test database: {e}"));
    drop_stale_databases(&mut conn, now_secs).await;
    sqlx::query(&format!("CREATE DATABASE {name}"))
        .execute(&mut conn)
        .await
        .unwrap_or_else(|e| panic!("cannot create test database {name}: {e}"));
    let _ = conn.close().await;
    with_database(&base, &name)
}

/// Drops a database made by [`fresh_postgres_url`] (best effort, closing
/// its remaining connections); for tests that want to leave nothing behind.
pub async fn drop_postgres_database(url: &str) {
    let base = std::env::var(TEST_PG_URL_ENV).unwrap_or_else(|_| TEST_PG_URL_DEFAULT.to_owned());
    let Some(name) = url
        .rsplit('/')
        .next()
        .map(|last| last.split('?').next().unwrap_or(last))
        .filter(|name| name.starts_with(TEST_DATABASE_PREFIX))
    else {
        return;
    };
    if let Ok(mut conn) = sqlx::PgConnection::connect(&base).await {
        let _ = sqlx::query(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
            .execute(&mut conn)
            .await;
        let _ = conn.close().await;
    }
}

/// A SQLite URL for a file in a new temporary directory. Keep the directory
/// alive as long as the database is used; dropping it deletes the file.
pub fn temp_sqlite_url() -> (tempfile::TempDir, String) {
    let dir =
        tempfile::tempdir().unwrap_or_else(|e| panic!("cannot create a temporary directory: {e}"));
    let url = format!("sqlite://{}", dir.path().join("asiento.db").display());
    (dir, url)
}

/// Replaces the database name (the URL path) of a PostgreSQL URL.
fn with_database(url: &str, name: &str) -> String {
    let (scheme, rest) = url.split_once("://").unwrap_or(("postgres", url));
    let (authority, query) = match rest.split_once('?') {
        Some((before, query)) => (before, Some(query)),
        None => (rest, None),
    };
    let host = authority.split_once('/').map_or(authority, |(h, _)| h);
    match query {
        Some(q) => format!("{scheme}://{host}/{name}?{q}"),
        None => format!("{scheme}://{host}/{name}"),
    }
}

/// Best effort: a failure here must not fail the test that asked for a database.
async fn drop_stale_databases(conn: &mut sqlx::PgConnection, now_secs: u64) {
    let names: Vec<String> = sqlx::query_scalar(
        "SELECT datname FROM pg_database WHERE datname LIKE 'asiento\\_test\\_%'",
    )
    .fetch_all(&mut *conn)
    .await
    .unwrap_or_default();
    for name in names {
        let created_secs = name
            .strip_prefix(TEST_DATABASE_PREFIX)
            .and_then(|rest| rest.split('_').next())
            .and_then(|secs| secs.parse::<u64>().ok());
        let Some(created_secs) = created_secs else {
            continue;
        };
        if now_secs.saturating_sub(created_secs) > STALE_TEST_DATABASE_AGE_SECS {
            let _ = sqlx::query(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                .execute(&mut *conn)
                .await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::with_database;

    #[test]
    fn database_name_is_replaced_and_query_kept() {
        assert_eq!(
            with_database("postgres://postgres@127.0.0.1:5432/postgres", "x"),
            "postgres://postgres@127.0.0.1:5432/x"
        );
        assert_eq!(
            with_database("postgres://u:p@h/db?sslmode=disable", "x"),
            "postgres://u:p@h/x?sslmode=disable"
        );
        assert_eq!(
            with_database("postgres://h:5432", "x"),
            "postgres://h:5432/x"
        );
    }
}
