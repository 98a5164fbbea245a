//! What `asiento verify --cells` checks across cells, beyond each cell's own invariants:
//!
//! - `cell_placement`: a cell's log holds only streams of tenants the directory places in it
//!   (or lists as moved out of it, whose copy stays behind, frozen);
//! - `moved_tenant`: a tenant moved out of a cell has every event the old cell holds of it in
//!   its new cell, the same stream, version, type and payload: the copy is whole and unchanged;
//! - `payout_cells`: a provider's payout posted by several cells has the same amount in each,
//!   and the cells' parts (each cell's lines and unattributed part, with the shares moved in and
//!   without those moved out) add up to it once every cell has posted it; a share moved out of a
//!   cell with its tenant is in the tenant's cell, the same amount, and no cell keeps a share of a
//!   tenant that moved out of it. A payout some cells have not posted yet is listed as pending,
//!   not a violation: their worker or sweep posts it.

use std::collections::{BTreeMap, BTreeSet};

use asiento_domain::payout::{self, Payout, PayoutEvent};
use asiento_domain::{Amount, AmountError, TenantId};
use asiento_eventstore::Database;

use super::{Cell, Directory};

/// One cell's view of one payout.
struct PayoutPart {
    /// The amount, once the cell posted the payout.
    amount: Option<i64>,
    posted_here: i64,
    failed: bool,
    /// Shares moved out with their tenants: tenant, amount.
    moved_out: Vec<(TenantId, i64)>,
    /// Shares moved in: tenant, amount.
    moved_in: Vec<(TenantId, i64)>,
    /// Tenants with a share here that did not move out.
    held: BTreeSet<TenantId>,
}

impl PayoutPart {
    fn of(payout: &Payout) -> Result<Self, AmountError> {
        let moved_out = payout
            .moved_out
            .iter()
            .map(|(tenant, share)| (tenant.clone(), share.minor()))
            .collect();
        let moved_in = payout
            .moved_in
            .iter()
            .map(|moved| {
                let net = moved
                    .lines
                    .iter()
                    .try_fold(Amount::ZERO, |net, line| net.checked_add(line.net_minor))?;
                Ok((moved.tenant.clone(), net.minor()))
            })
            .collect::<Result<_, AmountError>>()?;
        let held = payout
            .paid
            .iter()
            .flat_map(|paid| &paid.lines)
            .map(|line| &line.tenant)
            .chain(payout.moved_in.iter().map(|moved| &moved.tenant))
            .filter(|tenant| !payout.moved_out.contains_key(*tenant))
            .cloned()
            .collect();
        Ok(PayoutPart {
            held,
            amount: payout.paid.as_ref().map(|paid| paid.amount_minor.minor()),
            posted_here: payout.posted_here()?.minor(),
            failed: payout.failed,
            moved_out,
            moved_in,
        })
    }
}

/// What one cell's log says: the tenants it holds events of and the payouts it posted.
struct CellContents {
    tenants: Vec<Option<String>>,
    payouts: BTreeMap<String, PayoutPart>,
}

/// A payout stream's event as stored: stream id, type, schema, payload.
type StoredEvent = (String, String, i32, String);

async fn read_cell(database: &Database) -> Result<CellContents, sqlx::Error> {
    let (tenants, payout_events): (Vec<Option<String>>, Vec<StoredEvent>) = match database {
        Database::Postgres(pool) => (
            sqlx::query_scalar("select distinct metadata->>'tenant' from events")
                .fetch_all(pool)
                .await?,
            sqlx::query_as(
                "select stream_id, event_type, schema, data::text from events \
                     where stream_id like 'payout-%' order by position",
            )
            .fetch_all(pool)
            .await?,
        ),
        Database::Sqlite(pool) => (
            sqlx::query_scalar("select distinct json_extract(metadata, '$.tenant') from events")
                .fetch_all(pool)
                .await?,
            sqlx::query_as(
                "select stream_id, event_type, schema, data from events \
                     where stream_id like 'payout-%' order by position",
            )
            .fetch_all(pool)
            .await?,
        ),
    };
    let decode_error = |error: Box<dyn std::error::Error + Send + Sync>| sqlx::Error::Decode(error);
    let mut folded: BTreeMap<String, Payout> = BTreeMap::new();
    for (stream_id, event_type, schema, data) in payout_events {
        let event = PayoutEvent::decode_raw(&event_type, schema, &data)
            .map_err(|error| decode_error(Box::new(error)))?;
        let payout = folded.entry(stream_id).or_default();
        *payout = payout::evolve(std::mem::take(payout), &event);
    }
    let mut payouts = BTreeMap::new();
    for (stream_id, payout) in folded {
        let part = PayoutPart::of(&payout).map_err(|error| decode_error(Box::new(error)))?;
        payouts.insert(stream_id, part);
    }
    Ok(CellContents { tenants, payouts })
}

/// One event as the copy of a moved tenant must keep it: stream, version, type, schema, payload.
type CopiedEvent = (String, i64, String, i32, String);

/// A tenant's events in one cell's log, by event id.
async fn tenant_events(
    database: &Database,
    tenant: &str,
) -> Result<BTreeMap<String, CopiedEvent>, sqlx::Error> {
    let rows: Vec<(String, String, i64, String, i32, String)> = match database {
        Database::Postgres(pool) => {
            sqlx::query_as(
                "select event_id::text, stream_id, version, event_type, schema, data::text \
                 from events where metadata->>'tenant' = $1",
            )
            .bind(tenant)
            .fetch_all(pool)
            .await?
        }
        Database::Sqlite(pool) => {
            sqlx::query_as(
                "select lower(hex(event_id)), stream_id, version, event_type, schema, data \
                 from events where json_extract(metadata, '$.tenant') = ?1",
            )
            .bind(tenant)
            .fetch_all(pool)
            .await?
        }
    };
    Ok(rows
        .into_iter()
        .map(|(id, stream, version, kind, schema, data)| {
            (id.replace('-', ""), (stream, version, kind, schema, data))
        })
        .collect())
}

/// Violations listed per moved tenant at most; the rest are counted.
const MOVED_VIOLATIONS_LISTED_MAX: usize = 10;

/// The moved tenants' copies: every event the old cell holds is in the new cell, unchanged.
async fn moved_tenants(
    directory: &Directory,
    cells: &[(Cell, Database)],
    violations: &mut Vec<String>,
) -> anyhow::Result<()> {
    for (cell, database) in cells {
        for tenant in &cell.moved_out {
            let now = TenantId::parse(tenant)
                .ok()
                .and_then(|id| directory.cell_of_tenant(&id))
                .and_then(|placed| cells.iter().find(|(c, _)| c.name == placed.name));
            let Some((target, target_database)) = now else {
                violations.push(format!(
                    "moved_tenant: tenant {tenant}, moved out of {}, is in no cell checked",
                    cell.name
                ));
                continue;
            };
            let old = tenant_events(database, tenant).await?;
            let new = tenant_events(target_database, tenant).await?;
            let mut wrong = old.iter().filter_map(|(id, event)| match new.get(id) {
                None => Some(format!(
                    "event {id} ({} v{}) is not there",
                    event.0, event.1
                )),
                Some(copy) if copy != event => Some(format!(
                    "event {id} ({} v{}) differs in the copy",
                    event.0, event.1
                )),
                Some(_) => None,
            });
            for detail in wrong.by_ref().take(MOVED_VIOLATIONS_LISTED_MAX) {
                violations.push(format!(
                    "moved_tenant: tenant {tenant} from {} to {}: {detail}",
                    cell.name, target.name
                ));
            }
            let more = wrong.count();
            if more > 0 {
                violations.push(format!(
                    "moved_tenant: tenant {tenant} from {} to {}: {more} more events missing or different",
                    cell.name, target.name
                ));
            }
        }
    }
    Ok(())
}

/// A share moved out of a cell is in the cell its tenant is placed in now, for the same amount.
fn moved_shares(
    directory: &Directory,
    stream_id: &str,
    parts: &[(&str, PayoutPart)],
    violations: &mut Vec<String>,
) {
    for (from, part) in parts {
        for (tenant, share) in &part.moved_out {
            let placed = directory
                .cell_of_tenant(tenant)
                .map(|cell| cell.name.as_str());
            let moved_in: Vec<(&str, i64)> = parts
                .iter()
                .flat_map(|(name, part)| {
                    part.moved_in
                        .iter()
                        .filter(|(moved, _)| moved == tenant)
                        .map(|(_, net)| (*name, *net))
                })
                .collect();
            let held = moved_in
                .iter()
                .any(|(name, net)| Some(*name) == placed && net == share);
            if !held {
                violations.push(format!(
                    "payout_cells: {stream_id}: the share of {tenant} ({share}) moved out of {from} is not in its cell {} (moved in: {moved_in:?})",
                    placed.unwrap_or("(none)")
                ));
            }
        }
    }
}

/// The violations across `cells` (every cell of `directory`), one line each, and the payouts
/// still pending in some cells.
pub async fn across(
    directory: &Directory,
    cells: &[(Cell, Database)],
) -> anyhow::Result<(Vec<String>, Vec<String>)> {
    let mut violations = Vec::new();
    let mut payouts: BTreeMap<String, Vec<(&str, PayoutPart)>> = BTreeMap::new();
    for (cell, database) in cells {
        let log = read_cell(database).await?;
        for tenant in log.tenants.into_iter().flatten() {
            let placed = TenantId::parse(&tenant)
                .ok()
                .and_then(|id| directory.cell_of_tenant(&id));
            let moved_out = cell.moved_out.iter().any(|moved| moved == &tenant);
            if placed.is_none_or(|placed| placed.name != cell.name) && !moved_out {
                violations.push(format!(
                    "cell_placement: cell {} holds events of tenant {tenant}, which the directory places in {}",
                    cell.name,
                    placed.map_or("no cell", |placed| placed.name.as_str())
                ));
            }
        }
        for (stream_id, part) in log.payouts {
            for tenant in part
                .held
                .iter()
                .filter(|tenant| cell.moved_out.iter().any(|moved| moved == tenant.as_str()))
            {
                violations.push(format!(
                    "payout_cells: {stream_id}: cell {} holds a share of {tenant}, which moved out of it (the move did not carry it)",
                    cell.name
                ));
            }
            payouts
                .entry(stream_id)
                .or_default()
                .push((cell.name.as_str(), part));
        }
    }
    moved_tenants(directory, cells, &mut violations).await?;
    let mut pending = Vec::new();
    for (stream_id, parts) in payouts {
        moved_shares(directory, &stream_id, &parts, &mut violations);
        let posted_in: Vec<(&str, i64)> = parts
            .iter()
            .filter_map(|(name, part)| Some((*name, part.amount?)))
            .collect();
        let Some(&(first, amount)) = posted_in.first() else {
            // Shares moved in where no cell posted the payout yet: judged once one has.
            continue;
        };
        if let Some((name, other)) = posted_in.iter().find(|(_, other)| *other != amount) {
            violations.push(format!(
                "payout_cells: {stream_id}: cell {first} says its amount is {amount}, cell {name} {other}"
            ));
            continue;
        }
        // A failed payout reverses every cell's part; what stands is judged only while paid.
        if parts.iter().any(|(_, part)| part.failed) {
            continue;
        }
        let posted: i64 = parts.iter().map(|(_, part)| part.posted_here).sum();
        if posted_in.len() == cells.len() && posted != amount || posted > amount {
            violations.push(format!(
                "payout_cells: {stream_id}: the cells' parts add up to {posted}, the payout is {amount}"
            ));
        } else if posted_in.len() < cells.len() {
            let missing: Vec<&str> = cells
                .iter()
                .map(|(cell, _)| cell.name.as_str())
                .filter(|name| !posted_in.iter().any(|(posted, _)| posted == name))
                .collect();
            pending.push(format!(
                "{stream_id}: {posted} of {amount} posted; not yet posted in {}",
                missing.join(", ")
            ));
        }
    }
    Ok((violations, pending))
}
