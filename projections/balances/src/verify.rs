//! The checker: balances recomputed from the whole log, compared with the snapshot rows.
//!
//! A snapshot that disagrees with the recomputation at the same checkpoint is corrupt (a bug,
//! or a hand edit); `asiento projections rebuild balances` replaces it with a fresh copy.

use std::collections::BTreeMap;

use asiento_eventstore::{Cursor, Database, EventStore};
use asiento_projector::on_db;
use asiento_projector::snapshot::CHECK_PAGE_EVENTS;

use asiento_domain::{Amount, Balance};

use crate::decode::{balance as balance_of, entry_posted};
use crate::{BalanceError, BalanceKey, NAME};

/// A balance whose snapshot disagrees with the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BalanceMismatch {
    pub key: BalanceKey,
    pub snapshot_minor: Balance,
    pub recomputed_minor: Balance,
}

/// Every balance computed from the log alone, up to and including `upto` (the whole log when
/// None), with the cursor actually reached. Memory grows with the number of balances, not with
/// the log.
pub async fn recompute_all(
    store: &dyn EventStore,
    upto: Option<Cursor>,
) -> Result<(Cursor, BTreeMap<BalanceKey, Balance>), BalanceError> {
    let mut balances: BTreeMap<BalanceKey, Balance> = BTreeMap::new();
    let mut reached = Cursor::START;
    'pages: loop {
        let page = store.read_all(reached, CHECK_PAGE_EVENTS).await?;
        for event in &page {
            if upto.is_some_and(|u| event.cursor > u) {
                break 'pages;
            }
            reached = event.cursor;
            let Some(posted) = entry_posted(event)? else {
                continue;
            };
            for leg in posted.legs {
                let key = BalanceKey {
                    tenant: posted.tenant.clone(),
                    account: leg.account,
                    currency: leg.currency,
                };
                let slot = balances.entry(key).or_default();
                *slot = slot
                    .checked_add(Amount::new(leg.amount_minor))
                    .map_err(|_| asiento_projector::ProjectionError::Malformed {
                        position: event.position,
                        reason: "a balance overflows i128".to_owned(),
                    })?;
            }
        }
        if page.is_empty() {
            break;
        }
    }
    Ok((reached, balances))
}

/// Every snapshot row with the checkpoint they are exact at, read in one statement.
pub async fn snapshot_all(
    db: &Database,
) -> Result<(Cursor, BTreeMap<BalanceKey, Balance>), BalanceError> {
    type Row = (
        i64,
        i64,
        Option<String>,
        Option<String>,
        Option<String>,
        Option<String>,
    );
    let rows: Vec<Row> = on_db!(db, pool => {
        sqlx::query_as(
            "SELECT p.checkpoint_xact, p.checkpoint_position, \
                    b.tenant, b.account, b.currency, CAST(b.balance_minor AS TEXT) \
             FROM projections p LEFT JOIN balances b ON 1 = 1 WHERE p.name = $1",
        )
        .bind(NAME)
        .fetch_all(pool)
        .await?
    });
    let Some(&(x, p, ..)) = rows.first() else {
        return Err(BalanceError::NotInstalled);
    };
    let mut balances = BTreeMap::new();
    for (_, _, tenant, account, currency, balance) in rows {
        if let (Some(tenant), Some(account), Some(currency), Some(balance)) =
            (tenant, account, currency, balance)
        {
            balances.insert(
                BalanceKey {
                    tenant,
                    account,
                    currency,
                },
                balance_of(&balance)?,
            );
        }
    }
    Ok((Cursor::new(x, p), balances))
}

/// Compares every snapshot row with the log recomputed up to the snapshot's checkpoint. Empty:
/// the snapshot is right. (A balance missing on one side counts as 0.)
pub async fn verify(
    db: &Database,
    store: &dyn EventStore,
) -> Result<Vec<BalanceMismatch>, BalanceError> {
    let (checkpoint, snapshot) = snapshot_all(db).await?;
    let (_, recomputed) = recompute_all(store, Some(checkpoint)).await?;
    let mut keys: Vec<&BalanceKey> = snapshot.keys().chain(recomputed.keys()).collect();
    keys.sort();
    keys.dedup();
    Ok(keys
        .into_iter()
        .filter_map(|key| {
            let snapshot_minor = snapshot.get(key).copied().unwrap_or_default();
            let recomputed_minor = recomputed.get(key).copied().unwrap_or_default();
            (snapshot_minor != recomputed_minor).then(|| BalanceMismatch {
                key: key.clone(),
                snapshot_minor,
                recomputed_minor,
            })
        })
        .collect())
}
