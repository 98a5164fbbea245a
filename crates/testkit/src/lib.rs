//! The test kit: what every test crate of the workspace shares, defined once. A dev-dependency
//! only; nothing the binary is built from depends on it.
//!
//! - [`Backend`] and [`both_backends!`]: each test of a module run once on SQLite and once on
//!   PostgreSQL (the eventstore's conformance suite is the model).
//! - [`TestDatabase`]: a database of the test's own, on either backend.
//! - [`Rng`]: the one seeded generator, so that a seed replays.
//! - [`whole_log`]: the log in its order, for a test's model of it.

mod database;
mod rng;

pub use database::TestDatabase;
pub use rng::Rng;

/// Which database a test runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
}

/// Runs each named `async fn` of the calling module as two tests, `sqlite::name` and
/// `postgres::name`, on a multi-threaded runtime (4 worker threads unless `threads = N`).
///
/// Without `fixture`, each test takes the [`Backend`]. With `fixture = f`, it takes what
/// `async fn f(Backend) -> T` (a function of the calling module) makes, held for the whole test.
/// With `fixture = &f`, it borrows it, and the fixture's `async fn finish(self)` runs after it
/// (a test that panics leaves its PostgreSQL database for the next run to drop).
///
/// ```ignore
/// asiento_testkit::both_backends!(fixture = harness; first_test, second_test);
/// asiento_testkit::both_backends!(fixture = &harness; a_test_borrowing_it);
/// asiento_testkit::both_backends!(threads = 2; a_test_of_the_binary);
/// ```
#[macro_export]
macro_rules! both_backends {
    (fixture = &$fixture:ident; $($test:ident),* $(,)?) => {
        $crate::both_backends!(@borrowed sqlite, Sqlite, 4, $fixture; $($test),*);
        $crate::both_backends!(@borrowed postgres, Postgres, 4, $fixture; $($test),*);
    };
    (@borrowed $module:ident, $backend:ident, $threads:literal, $fixture:ident; $($test:ident),*) => {
        mod $module {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = $threads)]
                async fn $test() {
                    let fixture = super::$fixture($crate::Backend::$backend).await;
                    super::$test(&fixture).await;
                    fixture.finish().await;
                }
            )*
        }
    };
    (fixture = $fixture:ident, threads = $threads:literal; $($test:ident),* $(,)?) => {
        $crate::both_backends!(@module sqlite, Sqlite, $threads, $fixture; $($test),*);
        $crate::both_backends!(@module postgres, Postgres, $threads, $fixture; $($test),*);
    };
    (fixture = $fixture:ident; $($test:ident),* $(,)?) => {
        $crate::both_backends!(fixture = $fixture, threads = 4; $($test),*);
    };
    (threads = $threads:literal; $($test:ident),* $(,)?) => {
        $crate::both_backends!(@module sqlite, Sqlite, $threads; $($test),*);
        $crate::both_backends!(@module postgres, Postgres, $threads; $($test),*);
    };
    (@module $module:ident, $backend:ident, $threads:literal, $fixture:ident; $($test:ident),*) => {
        mod $module {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = $threads)]
                async fn $test() {
                    super::$test(super::$fixture($crate::Backend::$backend).await).await;
                }
            )*
        }
    };
    (@module $module:ident, $backend:ident, $threads:literal; $($test:ident),*) => {
        mod $module {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = $threads)]
                async fn $test() {
                    super::$test($crate::Backend::$backend).await;
                }
            )*
        }
    };
    ($($test:ident),* $(,)?) => {
        $crate::both_backends!(threads = 4; $($test),*);
    };
}

/// Every event of the log in its own gap-free order: what a test's model of the log reads,
/// one event at a time, to compare with what a read model or an API made of it.
pub async fn whole_log(
    store: &dyn asiento_eventstore::EventStore,
) -> Vec<asiento_eventstore::RecordedEvent> {
    const PAGE: usize = 1_000;
    let mut events = Vec::new();
    let mut reached = asiento_eventstore::Cursor::START;
    loop {
        let page = store
            .read_all(reached, PAGE)
            .await
            .unwrap_or_else(|error| panic!("reading the log: {error}"));
        // A page may be short while more follows (a process's tail cache answers from the
        // events it holds): only an empty one is the end.
        let Some(last) = page.last() else {
            return events;
        };
        reached = last.cursor;
        events.extend(page);
    }
}
