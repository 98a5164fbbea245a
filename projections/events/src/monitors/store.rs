//! The monitors' tables per generation: the client accounts' running balances and the monitors
//! with whether each matches. Loaded before a batch (only the rows it touches), written after.

use std::collections::HashMap;

use asiento_domain::monitor::{Balances, MonitorCreated, Tracked};
use asiento_domain::NormalBalance;
use asiento_eventstore::Tx;
use asiento_projector::{on_tx, ProjectionError};
use chrono::{DateTime, Utc};

use super::{Key, Needed, Watch, Watched};

pub(crate) const ACCOUNTS_TABLE: &str = "merchant_event_accounts_g";
pub(crate) const MONITORS_TABLE: &str = "merchant_event_monitors_g";
/// The view readers list monitors from.
pub(crate) const MONITORS_VIEW: &str = "balance_monitors";
/// Every table of these, for a generation's drop.
pub(crate) const TABLES: [&str; 2] = [ACCOUNTS_TABLE, MONITORS_TABLE];

pub(crate) fn ddl(g: i64, postgres: bool) -> Vec<String> {
    let (boolean, rowid) = if postgres {
        ("BOOLEAN", "")
    } else {
        ("INTEGER", " WITHOUT ROWID")
    };
    vec![
        format!(
            "CREATE TABLE {ACCOUNTS_TABLE}{g} (
                tenant          TEXT NOT NULL,
                account         TEXT NOT NULL,
                currency        TEXT NOT NULL,
                balances        TEXT NOT NULL,
                declared_normal TEXT,
                PRIMARY KEY (tenant, account, currency)){rowid}"
        ),
        format!(
            "CREATE TABLE {MONITORS_TABLE}{g} (
                monitor_id TEXT PRIMARY KEY,
                tenant     TEXT  NOT NULL,
                account    TEXT  NOT NULL,
                currency   TEXT  NOT NULL,
                created    TEXT  NOT NULL,
                deleted_at TEXT,
                matching   {boolean} NOT NULL){rowid}"
        ),
        format!(
            "CREATE INDEX {MONITORS_TABLE}{g}_by_account ON {MONITORS_TABLE}{g} \
             (tenant, account, currency)"
        ),
        format!("CREATE INDEX {MONITORS_TABLE}{g}_by_tenant ON {MONITORS_TABLE}{g} (tenant, monitor_id)"),
    ]
}

/// Both backends keep the JSON as text, decoded here.
type AccountRow = (String, String, String, String, Option<String>);
type MonitorRow = (String, Option<String>, bool);

fn json_of<T: serde::de::DeserializeOwned>(text: &str) -> Result<T, ProjectionError> {
    serde_json::from_str(text).map_err(|e| malformed(format!("a stored monitor row: {e}")))
}

fn text_of<T: serde::Serialize>(value: &T) -> Result<String, ProjectionError> {
    serde_json::to_string(value).map_err(|e| malformed(e.to_string()))
}

fn malformed(reason: impl Into<String>) -> ProjectionError {
    ProjectionError::Malformed {
        position: 0,
        reason: reason.into(),
    }
}

fn normal_text(normal: NormalBalance) -> &'static str {
    match normal {
        NormalBalance::Credit => "credit",
        NormalBalance::Debit => "debit",
    }
}

fn normal_of(text: &str) -> Result<NormalBalance, ProjectionError> {
    match text {
        "credit" => Ok(NormalBalance::Credit),
        "debit" => Ok(NormalBalance::Debit),
        other => Err(malformed(format!("a stored normal balance {other:?}"))),
    }
}

fn time_of(text: &str) -> Result<DateTime<Utc>, ProjectionError> {
    DateTime::parse_from_rfc3339(text)
        .map(|t| t.with_timezone(&Utc))
        .map_err(|e| malformed(format!("a stored time {text:?}: {e}")))
}

/// The rows a batch touches: its accounts, the monitors on them and the monitors it names.
pub(crate) async fn load(tx: &mut Tx, g: i64, needed: Needed) -> Result<Watch, ProjectionError> {
    if needed.keys.is_empty() && needed.monitors.is_empty() {
        return Ok(Watch::of(HashMap::new(), Vec::new(), needed.decoded));
    }
    let select_account = format!(
        "SELECT tenant, account, currency, balances, declared_normal FROM {ACCOUNTS_TABLE}{g} \
         WHERE tenant = $1 AND account = $2 AND currency = $3"
    );
    let select_monitors = format!(
        "SELECT created, deleted_at, matching FROM {MONITORS_TABLE}{g} \
         WHERE tenant = $1 AND account = $2 AND currency = $3 AND deleted_at IS NULL"
    );
    let select_monitor = format!(
        "SELECT created, deleted_at, matching FROM {MONITORS_TABLE}{g} WHERE monitor_id = $1"
    );
    let keys: Vec<&Key> = needed.keys.iter().collect();
    let ids: Vec<&String> = needed.monitors.iter().collect();
    let (accounts, mut monitors): (Vec<AccountRow>, Vec<MonitorRow>) = match tx {
        Tx::Postgres(t) => {
            let columns = |k: fn(&Key) -> &str| keys.iter().map(|key| k(key)).collect::<Vec<_>>();
            let (tenants, accounts, currencies) =
                (columns(|k| &k.0), columns(|k| &k.1), columns(|k| &k.2));
            let of_keys = "(tenant, account, currency) IN \
                 (SELECT * FROM UNNEST($1::text[], $2::text[], $3::text[]))";
            let accounts_sql =
                select_account.replace("tenant = $1 AND account = $2 AND currency = $3", of_keys);
            let monitors_sql =
                select_monitors.replace("tenant = $1 AND account = $2 AND currency = $3", of_keys);
            let account_rows = sqlx::query_as(&accounts_sql)
                .bind(&tenants)
                .bind(&accounts)
                .bind(&currencies)
                .fetch_all(&mut **t)
                .await?;
            let mut monitor_rows: Vec<MonitorRow> = sqlx::query_as(&monitors_sql)
                .bind(&tenants)
                .bind(&accounts)
                .bind(&currencies)
                .fetch_all(&mut **t)
                .await?;
            monitor_rows.extend(
                sqlx::query_as::<_, MonitorRow>(&select_monitor.replace("= $1", "= ANY($1)"))
                    .bind(&ids)
                    .fetch_all(&mut **t)
                    .await?,
            );
            (account_rows, monitor_rows)
        }
        Tx::Sqlite(t) => {
            let (mut account_rows, mut monitor_rows) = (Vec::new(), Vec::new());
            for (tenant, account, currency) in &keys {
                account_rows.extend(
                    sqlx::query_as(&select_account)
                        .bind(tenant)
                        .bind(account)
                        .bind(currency)
                        .fetch_optional(&mut **t)
                        .await?,
                );
                monitor_rows.extend(
                    sqlx::query_as::<_, MonitorRow>(&select_monitors)
                        .bind(tenant)
                        .bind(account)
                        .bind(currency)
                        .fetch_all(&mut **t)
                        .await?,
                );
            }
            for id in &ids {
                monitor_rows.extend(
                    sqlx::query_as::<_, MonitorRow>(&select_monitor)
                        .bind(id)
                        .fetch_optional(&mut **t)
                        .await?,
                );
            }
            (account_rows, monitor_rows)
        }
    };
    let mut tracked = HashMap::with_capacity(accounts.len());
    for (tenant, account, currency, balances, declared) in accounts {
        let balances: Balances = json_of(&balances)?;
        let declared_normal = declared.as_deref().map(normal_of).transpose()?;
        tracked.insert(
            (tenant, account, currency),
            Tracked {
                balances,
                declared_normal,
            },
        );
    }
    let mut watched: Vec<Watched> = Vec::with_capacity(monitors.len());
    for (created, deleted_at, matching) in monitors.drain(..) {
        let created: MonitorCreated = json_of(&created)?;
        // A monitor named by the batch and on one of its accounts is read twice.
        if watched
            .iter()
            .any(|w| w.created.monitor_id == created.monitor_id)
        {
            continue;
        }
        watched.push(Watched {
            created,
            deleted_at: deleted_at.as_deref().map(time_of).transpose()?,
            matching,
        });
    }
    Ok(Watch::of(tracked, watched, needed.decoded))
}

/// Writes the accounts and monitors the batch changed.
pub(crate) async fn store(tx: &mut Tx, g: i64, watch: &Watch) -> Result<(), ProjectionError> {
    let upsert_account = format!(
        "INSERT INTO {ACCOUNTS_TABLE}{g} (tenant, account, currency, balances, declared_normal) \
         VALUES ($1, $2, $3, $4, $5) ON CONFLICT (tenant, account, currency) DO UPDATE SET \
         balances = excluded.balances, declared_normal = excluded.declared_normal"
    );
    let upsert_monitor = format!(
        "INSERT INTO {MONITORS_TABLE}{g} \
         (monitor_id, tenant, account, currency, created, deleted_at, matching) \
         VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (monitor_id) DO UPDATE SET \
         deleted_at = excluded.deleted_at, matching = excluded.matching"
    );
    let changed: Vec<(&Key, &Tracked)> = watch
        .changed_accounts
        .iter()
        .filter_map(|key| Some((key, watch.accounts.get(key)?)))
        .collect();
    match tx {
        // One round trip for the batch's accounts.
        Tx::Postgres(t) if !changed.is_empty() => {
            let statement = format!(
                "INSERT INTO {ACCOUNTS_TABLE}{g} \
                 (tenant, account, currency, balances, declared_normal) \
                 SELECT * FROM UNNEST($1::text[], $2::text[], $3::text[], $4::text[], $5::text[]) \
                 ON CONFLICT (tenant, account, currency) DO UPDATE SET \
                 balances = excluded.balances, declared_normal = excluded.declared_normal"
            );
            let balances = changed
                .iter()
                .map(|(_, t)| text_of(&t.balances))
                .collect::<Result<Vec<_>, _>>()?;
            sqlx::query(&statement)
                .bind(
                    changed
                        .iter()
                        .map(|(k, _)| k.0.as_str())
                        .collect::<Vec<_>>(),
                )
                .bind(
                    changed
                        .iter()
                        .map(|(k, _)| k.1.as_str())
                        .collect::<Vec<_>>(),
                )
                .bind(
                    changed
                        .iter()
                        .map(|(k, _)| k.2.as_str())
                        .collect::<Vec<_>>(),
                )
                .bind(balances)
                .bind(
                    changed
                        .iter()
                        .map(|(_, t)| t.declared_normal.map(normal_text))
                        .collect::<Vec<_>>(),
                )
                .execute(&mut **t)
                .await?;
        }
        Tx::Postgres(_) => {}
        Tx::Sqlite(t) => {
            for ((tenant, account, currency), tracked) in &changed {
                sqlx::query(&upsert_account)
                    .bind(tenant)
                    .bind(account)
                    .bind(currency)
                    .bind(text_of(&tracked.balances)?)
                    .bind(tracked.declared_normal.map(normal_text))
                    .execute(&mut **t)
                    .await?;
            }
        }
    }
    for id in &watch.changed_monitors {
        let Some(watched) = watch.monitors.get(id) else {
            continue;
        };
        let c = &watched.created;
        on_tx!(tx, conn => sqlx::query(&upsert_monitor)
            .bind(id)
            .bind(c.tenant.as_str())
            .bind(c.account.as_str())
            .bind(c.currency.code())
            .bind(text_of(c)?)
            .bind(watched.deleted_at.as_ref().map(asiento_objects::time))
            .bind(watched.matching)
            .execute(conn)
            .await?
            .rows_affected());
    }
    Ok(())
}
