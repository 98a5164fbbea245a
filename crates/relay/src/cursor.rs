//! The relay's durable cursor: per relay name, the feed `seq` of the last event JetStream
//! acknowledged (table `events_relay_cursors`, migration 0080). It only moves forward, by
//! compare-and-set from the value the mover read, so two relays that both believe they hold
//! the lease (one of them past its expiry) never move it backwards or skip what neither
//! published.

use asiento_eventstore::Database;

macro_rules! on_db {
    ($db:expr, $pool:ident => $body:expr) => {
        match $db {
            Database::Postgres($pool) => $body,
            Database::Sqlite($pool) => $body,
        }
    };
}

/// The relay's cursor: 0 (before every event) for a relay that never published.
pub async fn load(db: &Database, relay: &str, now_ms: i64) -> Result<i64, sqlx::Error> {
    on_db!(db, pool => {
        sqlx::query(
            "insert into events_relay_cursors (relay, seq, updated_ms) values ($1, 0, $2) \
             on conflict (relay) do nothing",
        )
        .bind(relay)
        .bind(now_ms)
        .execute(pool)
        .await?;
        sqlx::query_scalar("select seq from events_relay_cursors where relay = $1")
            .bind(relay)
            .fetch_one(pool)
            .await
    })
}

/// Moves the cursor from `from` to `to` (`to > from`); false when it no longer stands at `from`
/// (another relay moved it).
pub async fn advance(
    db: &Database,
    relay: &str,
    from: i64,
    to: i64,
    now_ms: i64,
) -> Result<bool, sqlx::Error> {
    let moved = on_db!(db, pool => sqlx::query(
        "update events_relay_cursors set seq = $3, updated_ms = $4 \
         where relay = $1 and seq = $2 and $3 > $2",
    )
    .bind(relay)
    .bind(from)
    .bind(to)
    .bind(now_ms)
    .execute(pool)
    .await?
    .rows_affected());
    Ok(moved == 1)
}

/// The feed's newest `seq` (0 for an empty feed): the relay's lag is this minus its cursor.
pub async fn feed_head(db: &Database) -> Result<i64, sqlx::Error> {
    on_db!(db, pool => sqlx::query_scalar(
        "select coalesce(max(seq), 0) from merchant_events"
    )
    .fetch_one(pool)
    .await)
}
