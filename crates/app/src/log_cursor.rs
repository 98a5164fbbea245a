//! What the lists kept from the log itself (the reconciler's watch lists, the holds awaiting
//! expiry) share: where their follower has read to (a single-row cursor table each, `(id = 1,
//! xact, position)`), and statements over their rows, which hold only text and integers.

use asiento_eventstore::{Cursor, Database, Tx};

/// The cursor stored in `table`; the log's start when none is.
pub(crate) async fn read(database: &Database, table: &'static str) -> Result<Cursor, sqlx::Error> {
    let sql = format!("select xact, position from {table} where id = 1");
    let row: Option<(i64, i64)> = match database {
        Database::Postgres(pool) => sqlx::query_as(&sql).fetch_optional(pool).await?,
        Database::Sqlite(pool) => sqlx::query_as(&sql).fetch_optional(pool).await?,
    };
    Ok(row.map_or(Cursor::START, |(xact, position)| {
        Cursor::new(xact, position)
    }))
}

/// Stores `next` in `table`, inside `tx` (with what the follower wrote up to it).
pub(crate) async fn write(
    tx: &mut Tx,
    table: &'static str,
    next: Cursor,
) -> Result<(), sqlx::Error> {
    let sql = format!(
        "insert into {table} (id, xact, position) values (1, $1, $2) on conflict (id) do update \
         set xact = excluded.xact, position = excluded.position"
    );
    match tx {
        Tx::Postgres(tx) => {
            sqlx::query(&sql)
                .bind(next.xact())
                .bind(next.position())
                .execute(&mut **tx)
                .await?;
        }
        Tx::Sqlite(tx) => {
            sqlx::query(&sql)
                .bind(next.xact())
                .bind(next.position())
                .execute(&mut **tx)
                .await?;
        }
    }
    Ok(())
}

/// A statement argument: the followers' tables hold only text and integers.
pub(crate) enum Bind<'a> {
    Text(&'a str),
    Int(i64),
}

/// Runs `sql` (with `$n` placeholders, in order) with `binds`, inside `tx`.
pub(crate) async fn execute(tx: &mut Tx, sql: &str, binds: &[Bind<'_>]) -> Result<(), sqlx::Error> {
    match tx {
        Tx::Postgres(tx) => {
            let mut query = sqlx::query(sql);
            for bind in binds {
                query = match bind {
                    Bind::Text(text) => query.bind(*text),
                    Bind::Int(value) => query.bind(*value),
                };
            }
            query.execute(&mut **tx).await?;
        }
        Tx::Sqlite(tx) => {
            let sql = sql.replace('$', "?");
            let mut query = sqlx::query(&sql);
            for bind in binds {
                query = match bind {
                    Bind::Text(text) => query.bind(*text),
                    Bind::Int(value) => query.bind(*value),
                };
            }
            query.execute(&mut **tx).await?;
        }
    }
    Ok(())
}
