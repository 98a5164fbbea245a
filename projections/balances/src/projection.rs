//! Two projections of the log's journal entries, each with its own tables per generation:
//!
//! - [`Balances`]: `balances_g{n}`, one row per (tenant, account, currency) with the balance and
//!   the position of the last event that changed it, and `account_policies_g{n}`, the declared
//!   accounts' policies and metadata (a declared account has a balance row from its declaration);
//! - [`LedgerEntries`]: `balance_legs_g{n}`, every leg per (tenant, account, currency) in log
//!   order, and `journal_entries_g{n}`, every entry by id with all its legs.
//!
//! A balance is a sum of bounded amounts held in `i128` ([`asiento_domain::Balance`]): `NUMERIC`
//! on PostgreSQL, a decimal `TEXT` on SQLite (whose integers are 64-bit), added up in Rust. So no
//! accepted command can overflow it and stop the projection for every tenant.
//!
//! They are separate read models so that each rebuilds on its own: a balances rebuild maintains a
//! few thousand sums instead of writing four indexed rows per event. Readers use the views
//! `balances`, `balance_legs` and `journal_entries`, which point at each projection's active
//! generation.

use std::collections::BTreeMap;

use asiento_domain::{Balance, JournalEntry};
use asiento_eventstore::{Cursor, RecordedEvent, Tx};
use asiento_projector::{on_tx, Projection, ProjectionError};
use chrono::{DateTime, Utc};

use crate::decode::{self, Declared};
use crate::{BalanceKey, LegView};

/// The registry name, and the argument of `asiento projections rebuild balances`.
pub const NAME: &str = "balances";
/// Bump when the tables or the way they are filled change: runners then refuse the old data
/// until `asiento projections rebuild balances`.
pub const FINGERPRINT: &str = "balances-v3";
/// The registry name of the legs and journal entries (`asiento projections rebuild ledger_entries`).
pub const ENTRIES_NAME: &str = "ledger_entries";
pub const ENTRIES_FINGERPRINT: &str = "ledger-entries-v4";

/// The balances read model. Stateless: everything lives in the database.
#[derive(Debug, Clone, Copy, Default)]
pub struct Balances;

/// The legs and journal entries read model.
#[derive(Debug, Clone, Copy, Default)]
pub struct LedgerEntries;

/// Which read model a statement, view or write belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Part {
    Balances,
    Entries,
}

const VIEWS: [(Part, &str, &str); 7] = [
    (Part::Balances, "balances", "balances_g"),
    (Part::Balances, "account_policies", "account_policies_g"),
    (Part::Entries, "balance_legs", "balance_legs_g"),
    (Part::Entries, "journal_entries", "journal_entries_g"),
    (Part::Entries, "balance_runs", "balance_runs_g"),
    (Part::Entries, "balance_marks", "balance_marks_g"),
    (Part::Entries, "log_spans", "log_spans_g"),
];

/// The declared accounts (`POST /v1/accounts`): the policy and metadata as JSON text, the same on
/// both backends; read only beside their balance rows.
fn account_policies_ddl(g: i64, time: &str, suffix: &str) -> String {
    format!(
        "CREATE TABLE account_policies_g{g} (
        tenant        TEXT NOT NULL,
        account       TEXT NOT NULL,
        currency      TEXT NOT NULL,
        policy        TEXT NOT NULL,
        metadata      TEXT NOT NULL,
        declared_at   {time} NOT NULL,
        PRIMARY KEY (tenant, account, currency)){suffix}"
    )
}

fn ddl_postgres(g: i64) -> Vec<(Part, String)> {
    vec![
        (
            Part::Balances,
            format!(
                "CREATE TABLE balances_g{g} (
                tenant        TEXT   NOT NULL,
                account       TEXT   NOT NULL,
                currency      TEXT   NOT NULL,
                balance_minor NUMERIC NOT NULL,
                last_position BIGINT  NOT NULL,
                PRIMARY KEY (tenant, account, currency))"
            ),
        ),
        (Part::Balances, account_policies_ddl(g, "TIMESTAMPTZ", "")),
        // Keyed in log order (xact, position) so that pages by `after` never miss a leg that
        // committed late: rows are only ever added after every existing one.
        (
            Part::Entries,
            format!(
                "CREATE TABLE balance_legs_g{g} (
                tenant       TEXT        NOT NULL,
                account      TEXT        NOT NULL,
                currency     TEXT        NOT NULL,
                xact         BIGINT      NOT NULL,
                position     BIGINT      NOT NULL,
                leg          INTEGER     NOT NULL,
                entry_id     TEXT        NOT NULL,
                amount_minor BIGINT      NOT NULL,
                recorded_at  TIMESTAMPTZ NOT NULL,
                PRIMARY KEY (tenant, account, currency, xact, position, leg))"
            ),
        ),
        (
            Part::Entries,
            format!(
                "CREATE TABLE journal_entries_g{g} (
                tenant      TEXT        NOT NULL,
                entry_id    TEXT        NOT NULL,
                xact        BIGINT      NOT NULL,
                position    BIGINT      NOT NULL,
                reverses    TEXT,
                legs        JSONB       NOT NULL,
                recorded_at TIMESTAMPTZ NOT NULL,
                source      TEXT        NOT NULL,
                description TEXT,
                PRIMARY KEY (tenant, entry_id))"
            ),
        ),
    ]
}

fn ddl_sqlite(g: i64) -> Vec<(Part, String)> {
    vec![
        // A decimal string of an i128, written and added up by `write_sqlite` (SQLite's integers
        // are 64-bit and turn an overflow into a float).
        (
            Part::Balances,
            format!(
                "CREATE TABLE balances_g{g} (
                tenant        TEXT    NOT NULL,
                account       TEXT    NOT NULL,
                currency      TEXT    NOT NULL,
                balance_minor TEXT    NOT NULL CHECK (typeof(balance_minor) = 'text'),
                last_position INTEGER NOT NULL,
                PRIMARY KEY (tenant, account, currency)) WITHOUT ROWID"
            ),
        ),
        (
            Part::Balances,
            account_policies_ddl(g, "TEXT", " WITHOUT ROWID"),
        ),
        (
            Part::Entries,
            format!(
                "CREATE TABLE balance_legs_g{g} (
                tenant       TEXT    NOT NULL,
                account      TEXT    NOT NULL,
                currency     TEXT    NOT NULL,
                xact         INTEGER NOT NULL,
                position     INTEGER NOT NULL,
                leg          INTEGER NOT NULL,
                entry_id     TEXT    NOT NULL,
                amount_minor INTEGER NOT NULL,
                recorded_at  TEXT    NOT NULL,
                PRIMARY KEY (tenant, account, currency, xact, position, leg)) WITHOUT ROWID"
            ),
        ),
        (
            Part::Entries,
            format!(
                "CREATE TABLE journal_entries_g{g} (
                tenant      TEXT    NOT NULL,
                entry_id    TEXT    NOT NULL,
                xact        INTEGER NOT NULL,
                position    INTEGER NOT NULL,
                reverses    TEXT,
                legs        TEXT    NOT NULL,
                recorded_at TEXT    NOT NULL,
                source      TEXT    NOT NULL,
                description TEXT,
                PRIMARY KEY (tenant, entry_id)) WITHOUT ROWID"
            ),
        ),
    ]
}

/// The writes of one batch, gathered first so that each table gets one statement per batch on
/// PostgreSQL (UNNEST) and each balance row is touched once.
#[derive(Default)]
struct BatchWrites {
    deltas: Deltas,
    /// The last declaration of each account in the batch.
    declarations: BTreeMap<BalanceKey, DeclarationRow>,
    legs: Vec<LegRow>,
    entries: Vec<EntryRow>,
}

struct DeclarationRow {
    policy: String,
    metadata: String,
    declared_at: DateTime<Utc>,
}

pub(crate) struct LegRow {
    pub tenant: String,
    pub account: String,
    pub currency: String,
    pub cursor: Cursor,
    pub leg: i32,
    pub entry_id: String,
    pub amount_minor: i64,
    pub recorded_at: DateTime<Utc>,
}

struct EntryRow {
    tenant: String,
    entry_id: String,
    cursor: Cursor,
    reverses: Option<String>,
    legs: sqlx::types::Json<Vec<crate::LegView>>,
    recorded_at: DateTime<Utc>,
    /// The stream whose event posted it (`payment-pay_…`, `transfer-tr_…`, `payout-…`).
    source: String,
    /// What the merchant wrote of the transfer it posts, if anything.
    description: Option<String>,
}

/// Per (tenant, account, currency), nested so that a lookup borrows the names and only a
/// balance new to the batch allocates: (change, position of the last event changing it).
#[derive(Default)]
struct Deltas(BTreeMap<String, AccountDeltas>);
/// Account -> currency -> (change, position).
type AccountDeltas = BTreeMap<String, BTreeMap<String, (Balance, i64)>>;

impl Deltas {
    fn slot(&mut self, tenant: &str, account: &str, currency: &str) -> &mut (Balance, i64) {
        fn level<'a, V: Default>(map: &'a mut BTreeMap<String, V>, key: &str) -> &'a mut V {
            if !map.contains_key(key) {
                map.insert(key.to_owned(), V::default());
            }
            map.get_mut(key).expect("inserted just above")
        }
        let accounts = level(&mut self.0, tenant);
        let currencies = level(accounts, account);
        level(currencies, currency)
    }

    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// (tenant, account, currency, change, position) in key order.
    fn into_rows(self) -> impl Iterator<Item = (String, String, String, Balance, i64)> {
        self.0.into_iter().flat_map(|(tenant, accounts)| {
            accounts.into_iter().flat_map(move |(account, currencies)| {
                let tenant = tenant.clone();
                currencies
                    .into_iter()
                    .map(move |(currency, (change, position))| {
                        (tenant.clone(), account.clone(), currency, change, position)
                    })
            })
        })
    }
}

impl BatchWrites {
    /// A declaration: its row, and a balance row (a change of 0) so that a declared account is
    /// listed before its first posting.
    fn declare(
        &mut self,
        event: &RecordedEvent,
        declared: Declared,
    ) -> Result<(), ProjectionError> {
        let encode = |value: serde_json::Result<String>| {
            value.map_err(|error| ProjectionError::Malformed {
                position: event.position,
                reason: error.to_string(),
            })
        };
        let key = declared.key;
        self.deltas.slot(&key.tenant, &key.account, &key.currency).1 = event.position;
        self.declarations.insert(
            key,
            DeclarationRow {
                policy: encode(serde_json::to_string(&declared.declared.policy))?,
                metadata: encode(serde_json::to_string(&declared.declared.metadata))?,
                declared_at: declared.declared.at,
            },
        );
        Ok(())
    }

    fn add(
        &mut self,
        part: Part,
        event: &RecordedEvent,
        entry: JournalEntry,
        description: Option<String>,
    ) -> Result<(), ProjectionError> {
        let overflow = || ProjectionError::Malformed {
            position: event.position,
            reason: "a balance overflows i128".to_owned(),
        };
        let tenant = entry.tenant().as_str();
        if part == Part::Balances {
            for leg in entry.legs() {
                let slot = self
                    .deltas
                    .slot(tenant, leg.account.as_str(), leg.currency.code());
                slot.0 = slot.0.checked_add(leg.amount).map_err(|_| overflow())?;
                slot.1 = event.position;
                // A reservation gives its account a balance row (a change of 0), so that an
                // account with only pending amounts is listed.
                if let Some((_, of)) = leg.account.pending_of() {
                    self.deltas.slot(tenant, of.as_str(), leg.currency.code()).1 = event.position;
                }
            }
            return Ok(());
        }
        let entry_id = entry.id().to_string();
        let mut views = Vec::with_capacity(entry.legs().len());
        for (index, leg) in entry.legs().iter().enumerate() {
            let view = LegView {
                account: leg.account.as_str().to_owned(),
                currency: leg.currency.code().to_owned(),
                amount_minor: leg.amount.minor(),
            };
            self.legs.push(LegRow {
                tenant: tenant.to_owned(),
                account: view.account.clone(),
                currency: view.currency.clone(),
                cursor: event.cursor,
                leg: i32::try_from(index).map_err(|_| overflow())?,
                entry_id: entry_id.clone(),
                amount_minor: view.amount_minor,
                recorded_at: event.recorded_at,
            });
            views.push(view);
        }
        self.entries.push(EntryRow {
            tenant: tenant.to_owned(),
            entry_id,
            cursor: event.cursor,
            reverses: entry.reverses().map(|id| id.to_string()),
            legs: sqlx::types::Json(views),
            recorded_at: event.recorded_at,
            source: event.stream_id.clone(),
            description,
        });
        Ok(())
    }
}

async fn create_tables(tx: &mut Tx, part: Part, g: i64) -> Result<(), ProjectionError> {
    let postgres = matches!(tx, Tx::Postgres(_));
    let mut statements = if postgres {
        ddl_postgres(g)
    } else {
        ddl_sqlite(g)
    };
    // After the legs' and entries' tables: the marks follow the legs, and an index the entries.
    statements.extend(
        crate::marks::ddl(g, postgres)
            .into_iter()
            .chain([crate::journal::ddl(g), crate::spans::ddl(g, postgres)])
            .map(|statement| (Part::Entries, statement)),
    );
    for (of, statement) in statements {
        if of == part {
            on_tx!(tx, conn => sqlx::query(&statement).execute(conn).await?.rows_affected());
        }
    }
    Ok(())
}

async fn point_views(tx: &mut Tx, part: Part, g: i64) -> Result<(), ProjectionError> {
    for (of, view, table) in VIEWS {
        if of == part {
            asiento_projector::point_view(tx, view, &format!("{table}{g}")).await?;
        }
    }
    Ok(())
}

async fn drop_tables(tx: &mut Tx, part: Part, g: i64) -> Result<(), ProjectionError> {
    for (of, _, table) in VIEWS {
        if of == part {
            let statement = format!("DROP TABLE IF EXISTS {table}{g}");
            on_tx!(tx, conn => sqlx::query(&statement).execute(conn).await?.rows_affected());
        }
    }
    Ok(())
}

async fn apply_part(
    tx: &mut Tx,
    part: Part,
    g: i64,
    events: &[RecordedEvent],
) -> Result<(), ProjectionError> {
    if part == Part::Entries {
        crate::spans::write(tx, g, events).await?;
    }
    let mut writes = BatchWrites::default();
    let mut any = false;
    for event in events {
        if let Some((entry, description)) = decode::journal_entry(event)? {
            writes.add(part, event, entry, description)?;
            any = true;
        } else if part == Part::Balances {
            if let Some(declared) = decode::account_declared(event)? {
                writes.declare(event, declared)?;
                any = true;
            }
        }
    }
    if !any {
        return Ok(());
    }
    crate::marks::write(tx, g, &writes.legs).await?;
    match tx {
        Tx::Postgres(t) => write_postgres(t, g, writes).await?,
        Tx::Sqlite(t) => write_sqlite(t, g, writes).await?,
    }
    Ok(())
}

/// One `Projection` impl per part, all by delegation.
macro_rules! projection_part {
    ($type:ty, $part:expr, $name:expr, $fingerprint:expr) => {
        #[async_trait::async_trait]
        impl Projection for $type {
            fn name(&self) -> &'static str {
                $name
            }

            fn fingerprint(&self) -> &'static str {
                $fingerprint
            }

            async fn create_generation(&self, tx: &mut Tx, g: i64) -> Result<(), ProjectionError> {
                create_tables(tx, $part, g).await
            }

            async fn point_views(&self, tx: &mut Tx, g: i64) -> Result<(), ProjectionError> {
                point_views(tx, $part, g).await
            }

            async fn drop_generation(&self, tx: &mut Tx, g: i64) -> Result<(), ProjectionError> {
                drop_tables(tx, $part, g).await
            }

            async fn apply(
                &self,
                tx: &mut Tx,
                g: i64,
                events: &[RecordedEvent],
            ) -> Result<(), ProjectionError> {
                apply_part(tx, $part, g, events).await
            }
        }
    };
}

projection_part!(Balances, Part::Balances, NAME, FINGERPRINT);
projection_part!(
    LedgerEntries,
    Part::Entries,
    ENTRIES_NAME,
    ENTRIES_FINGERPRINT
);

async fn write_postgres(
    conn: &mut sqlx::PgConnection,
    g: i64,
    w: BatchWrites,
) -> Result<(), sqlx::Error> {
    // Each projection fills only its own part of the batch; an empty part costs nothing.
    if !w.deltas.is_empty() {
        write_pg_balances(conn, g, w.deltas).await?;
    }
    if !w.declarations.is_empty() {
        write_pg_declarations(conn, g, w.declarations).await?;
    }
    if !w.legs.is_empty() {
        write_pg_legs(conn, g, w.legs).await?;
    }
    if !w.entries.is_empty() {
        write_pg_entries(conn, g, w.entries).await?;
    }
    Ok(())
}

async fn write_pg_balances(
    conn: &mut sqlx::PgConnection,
    g: i64,
    deltas: Deltas,
) -> Result<(), sqlx::Error> {
    let (mut tenants, mut accounts, mut currencies, mut changes, mut positions) =
        (vec![], vec![], vec![], vec![], vec![]);
    for (tenant, account, currency, change, position) in deltas.into_rows() {
        tenants.push(tenant);
        accounts.push(account);
        currencies.push(currency);
        changes.push(change.to_string());
        positions.push(position);
    }
    // Keys are unique within the batch (gathered above), as ON CONFLICT DO UPDATE requires. The
    // changes travel as decimal text: sqlx has no i128 and NUMERIC takes any integer.
    sqlx::query(&format!(
        "INSERT INTO balances_g{g} AS b (tenant, account, currency, balance_minor, last_position)
         SELECT t, a, c, d::numeric, p
         FROM UNNEST($1::text[], $2::text[], $3::text[], $4::text[], $5::int8[]) AS u(t, a, c, d, p)
         ON CONFLICT (tenant, account, currency) DO UPDATE
         SET balance_minor = b.balance_minor + excluded.balance_minor,
             last_position = excluded.last_position"
    ))
    .bind(tenants)
    .bind(accounts)
    .bind(currencies)
    .bind(changes)
    .bind(positions)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

async fn write_pg_declarations(
    conn: &mut sqlx::PgConnection,
    g: i64,
    rows: BTreeMap<BalanceKey, DeclarationRow>,
) -> Result<(), sqlx::Error> {
    let (mut tenants, mut accounts, mut currencies, mut policies, mut metadata, mut at) =
        (vec![], vec![], vec![], vec![], vec![], vec![]);
    for (key, row) in rows {
        tenants.push(key.tenant);
        accounts.push(key.account);
        currencies.push(key.currency);
        policies.push(row.policy);
        metadata.push(row.metadata);
        at.push(row.declared_at);
    }
    sqlx::query(&format!(
        "INSERT INTO account_policies_g{g} AS p
             (tenant, account, currency, policy, metadata, declared_at)
         SELECT * FROM UNNEST($1::text[], $2::text[], $3::text[], $4::text[], $5::text[],
                              $6::timestamptz[])
         ON CONFLICT (tenant, account, currency) DO UPDATE
         SET policy = excluded.policy, metadata = excluded.metadata,
             declared_at = excluded.declared_at"
    ))
    .bind(tenants)
    .bind(accounts)
    .bind(currencies)
    .bind(policies)
    .bind(metadata)
    .bind(at)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

async fn write_pg_legs(
    conn: &mut sqlx::PgConnection,
    g: i64,
    rows: Vec<LegRow>,
) -> Result<(), sqlx::Error> {
    let mut legs = PgLegColumns::default();
    for l in rows {
        legs.push(l);
    }
    sqlx::query(&format!(
        "INSERT INTO balance_legs_g{g}
             (tenant, account, currency, xact, position, leg, entry_id, amount_minor, recorded_at)
         SELECT * FROM UNNEST($1::text[], $2::text[], $3::text[], $4::int8[], $5::int8[],
                              $6::int4[], $7::text[], $8::int8[], $9::timestamptz[])"
    ))
    .bind(legs.tenant)
    .bind(legs.account)
    .bind(legs.currency)
    .bind(legs.xact)
    .bind(legs.position)
    .bind(legs.leg)
    .bind(legs.entry_id)
    .bind(legs.amount_minor)
    .bind(legs.recorded_at)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

async fn write_pg_entries(
    conn: &mut sqlx::PgConnection,
    g: i64,
    rows: Vec<EntryRow>,
) -> Result<(), sqlx::Error> {
    // An entry id is derived from what caused it, so a second EntryPosted with the same id is
    // a bug upstream; its legs still count (the log is the truth) but the lookup keeps the first.
    // One statement for the whole batch: a round trip per entry made rebuilds ten times slower.
    let mut entries = PgEntryColumns::default();
    for e in rows {
        entries.push(e)?;
    }
    sqlx::query(&format!(
        "INSERT INTO journal_entries_g{g}
             (tenant, entry_id, xact, position, reverses, legs, recorded_at, source, description)
         SELECT * FROM UNNEST($1::text[], $2::text[], $3::int8[], $4::int8[], $5::text[],
                              $6::jsonb[], $7::timestamptz[], $8::text[], $9::text[])
         ON CONFLICT (tenant, entry_id) DO NOTHING"
    ))
    .bind(entries.tenant)
    .bind(entries.entry_id)
    .bind(entries.xact)
    .bind(entries.position)
    .bind(entries.reverses)
    .bind(entries.legs)
    .bind(entries.recorded_at)
    .bind(entries.source)
    .bind(entries.description)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// Journal entries as columns, for one UNNEST insert.
#[derive(Default)]
struct PgEntryColumns {
    tenant: Vec<String>,
    entry_id: Vec<String>,
    xact: Vec<i64>,
    position: Vec<i64>,
    reverses: Vec<Option<String>>,
    legs: Vec<serde_json::Value>,
    recorded_at: Vec<DateTime<Utc>>,
    source: Vec<String>,
    description: Vec<Option<String>>,
}

impl PgEntryColumns {
    fn push(&mut self, e: EntryRow) -> Result<(), sqlx::Error> {
        self.tenant.push(e.tenant);
        self.entry_id.push(e.entry_id);
        self.xact.push(e.cursor.xact());
        self.position.push(e.cursor.position());
        self.reverses.push(e.reverses);
        self.legs.push(
            serde_json::to_value(&e.legs.0)
                .map_err(|error| sqlx::Error::Encode(Box::new(error)))?,
        );
        self.recorded_at.push(e.recorded_at);
        self.source.push(e.source);
        self.description.push(e.description);
        Ok(())
    }
}

#[derive(Default)]
struct PgLegColumns {
    tenant: Vec<String>,
    account: Vec<String>,
    currency: Vec<String>,
    xact: Vec<i64>,
    position: Vec<i64>,
    leg: Vec<i32>,
    entry_id: Vec<String>,
    amount_minor: Vec<i64>,
    recorded_at: Vec<DateTime<Utc>>,
}

impl PgLegColumns {
    fn push(&mut self, l: LegRow) {
        self.tenant.push(l.tenant);
        self.account.push(l.account);
        self.currency.push(l.currency);
        self.xact.push(l.cursor.xact());
        self.position.push(l.cursor.position());
        self.leg.push(l.leg);
        self.entry_id.push(l.entry_id);
        self.amount_minor.push(l.amount_minor);
        self.recorded_at.push(l.recorded_at);
    }
}

/// SQLite is in-process: a statement per row costs no round trip. A balance is read, added to
/// in Rust and written back (the batch's transaction is SQLite's only writer).
async fn write_sqlite(
    conn: &mut sqlx::SqliteConnection,
    g: i64,
    w: BatchWrites,
) -> Result<(), sqlx::Error> {
    let current = format!(
        "SELECT balance_minor FROM balances_g{g} WHERE tenant = $1 AND account = $2 AND currency = $3"
    );
    let upsert = format!(
        "INSERT INTO balances_g{g} (tenant, account, currency, balance_minor, last_position)
         VALUES ($1, $2, $3, $4, $5)
         ON CONFLICT (tenant, account, currency) DO UPDATE
         SET balance_minor = excluded.balance_minor, last_position = excluded.last_position"
    );
    for (tenant, account, currency, change, position) in w.deltas.into_rows() {
        let before: Option<String> = sqlx::query_scalar(&current)
            .bind(&tenant)
            .bind(&account)
            .bind(&currency)
            .fetch_optional(&mut *conn)
            .await?;
        let before = before.as_deref().map(decode::balance).transpose()?;
        let after = before
            .unwrap_or(Balance::ZERO)
            .checked_sum(change)
            .map_err(|error| sqlx::Error::Decode(Box::new(error)))?;
        sqlx::query(&upsert)
            .bind(tenant)
            .bind(account)
            .bind(currency)
            .bind(after.to_string())
            .bind(position)
            .execute(&mut *conn)
            .await?;
    }
    let declare = format!(
        "INSERT INTO account_policies_g{g} (tenant, account, currency, policy, metadata, declared_at)
         VALUES ($1, $2, $3, $4, $5, $6)
         ON CONFLICT (tenant, account, currency) DO UPDATE
         SET policy = excluded.policy, metadata = excluded.metadata,
             declared_at = excluded.declared_at"
    );
    for (key, row) in w.declarations {
        sqlx::query(&declare)
            .bind(key.tenant)
            .bind(key.account)
            .bind(key.currency)
            .bind(row.policy)
            .bind(row.metadata)
            .bind(row.declared_at)
            .execute(&mut *conn)
            .await?;
    }
    let insert_leg = format!(
        "INSERT INTO balance_legs_g{g}
             (tenant, account, currency, xact, position, leg, entry_id, amount_minor, recorded_at)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)"
    );
    for l in w.legs {
        sqlx::query(&insert_leg)
            .bind(l.tenant)
            .bind(l.account)
            .bind(l.currency)
            .bind(l.cursor.xact())
            .bind(l.cursor.position())
            .bind(l.leg)
            .bind(l.entry_id)
            .bind(l.amount_minor)
            .bind(l.recorded_at)
            .execute(&mut *conn)
            .await?;
    }
    let insert_entry = format!(
        "INSERT INTO journal_entries_g{g}
             (tenant, entry_id, xact, position, reverses, legs, recorded_at, source, description)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) ON CONFLICT (tenant, entry_id) DO NOTHING"
    );
    for e in w.entries {
        sqlx::query(&insert_entry)
            .bind(e.tenant)
            .bind(e.entry_id)
            .bind(e.cursor.xact())
            .bind(e.cursor.position())
            .bind(e.reverses)
            .bind(e.legs)
            .bind(e.recorded_at)
            .bind(e.source)
            .bind(e.description)
            .execute(&mut *conn)
            .await?;
    }
    Ok(())
}
