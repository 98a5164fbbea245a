//! A database of a test's own, on either backend: a SQLite file in a temporary directory, or a
//! fresh PostgreSQL database on the server of `ASIENTO_TEST_PG_URL` (the eventstore's scratch
//! databases, which `asiento bench` uses too), dropped when the test finishes.

use asiento_eventstore::{scratch, Database};

use crate::Backend;

/// A test's database. [`TestDatabase::new`] leaves it empty, for the binary under test to migrate;
/// [`TestDatabase::open`] also connects a pool and migrates it.
pub struct TestDatabase {
    /// `sqlite://…/asiento.db`, or `postgres://…/asiento_test_…`.
    pub url: String,
    pub backend: Backend,
    database: Option<Database>,
    _dir: Option<tempfile::TempDir>,
}

impl TestDatabase {
    /// An empty database.
    pub async fn new(backend: Backend) -> TestDatabase {
        let (url, dir) = match backend {
            Backend::Sqlite => {
                let (dir, url) = scratch::temp_sqlite_url();
                (url, Some(dir))
            }
            Backend::Postgres => (scratch::fresh_postgres_url().await, None),
        };
        TestDatabase {
            url,
            backend,
            database: None,
            _dir: dir,
        }
    }

    /// A migrated database, with a pool of the store's default size open on it.
    pub async fn open(backend: Backend) -> TestDatabase {
        let mut db = TestDatabase::new(backend).await;
        let database = Database::connect(&db.url)
            .await
            .unwrap_or_else(|error| panic!("cannot connect to {}: {error}", db.url));
        database
            .migrate()
            .await
            .unwrap_or_else(|error| panic!("cannot migrate {}: {error}", db.url));
        db.database = Some(database);
        db
    }

    /// The pool [`TestDatabase::open`] opened.
    pub fn database(&self) -> &Database {
        self.database
            .as_ref()
            .expect("a database made by TestDatabase::open, not ::new")
    }

    /// Closes the pool, if one is open (the connections the test still holds elsewhere stay).
    pub async fn close(&self) {
        if let Some(Database::Postgres(pool)) = &self.database {
            pool.close().await;
        }
    }

    /// Closes the pool and drops a PostgreSQL database (a SQLite file goes with its directory).
    /// A test that panics leaves its PostgreSQL database behind, for the next run to drop once
    /// it is stale.
    pub async fn finish(self) {
        self.close().await;
        if self.backend == Backend::Postgres {
            scratch::drop_postgres_database(&self.url).await;
        }
    }
}
