//! The database's clock, as SQL. Leases are compared against one clock (the database's), never
//! against each runner's own, so that runners on machines with skewed clocks cannot both believe
//! they hold a lease. Safety never depends on it anyway (see the checkpoint compare-and-set);
//! this keeps failover timely and fair.

use asiento_eventstore::Backend;
use chrono::{DateTime, Utc};

/// Token in statement templates replaced by [`now_ms_sql`] of the backend.
pub(crate) const NOW_MS: &str = "NOW_MS";

/// An SQL expression for the database's current time in unix milliseconds.
///
/// PostgreSQL: `clock_timestamp()` (not `now()`, which is frozen at the start of the
/// transaction and would make a lease renewed late in a long transaction expire early).
pub fn now_ms_sql(backend: Backend) -> &'static str {
    match backend {
        Backend::Postgres => "(extract(epoch from clock_timestamp()) * 1000)::bigint",
        Backend::Sqlite => "CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)",
    }
}

/// A statement template with `NOW_MS` replaced by the backend's clock.
pub(crate) fn sql(backend: Backend, template: &str) -> String {
    template.replace(NOW_MS, now_ms_sql(backend))
}

/// Unix milliseconds as a timestamp (None if out of range).
pub(crate) fn datetime_of_ms(ms: i64) -> Option<DateTime<Utc>> {
    DateTime::from_timestamp_millis(ms)
}
