//! `asiento cells move`: copies a paused tenant from its cell to another (PostgreSQL cells).
//!
//! What moves: the tenant's events (every event whose metadata names it, in log order, with
//! their stream ids, versions, event ids and payloads, at new positions in the new cell's log)
//! and the rows of its mutable state: API keys, idempotency records, reconciliation exceptions,
//! merchant webhook endpoints with their secrets, deliveries and attempts, and the console's
//! audit trail. The copy is one transaction in the new cell and is idempotent (a row or event
//! there already is kept), so a move cut short is run again. Then the old cell's mutable rows of
//! the tenant (and its console sessions and hold expiries) are deleted there; its events stay,
//! since the log keeps every event, frozen: the directory lists the tenant under the old cell's
//! `moved_out`, which routes its payments' webhooks to its new cell, keeps the old cell's
//! reconciler off them and lets `asiento verify --cells` prove the copy whole and unchanged.
//!
//! The new cell's read models, hold expiries and merchant events follow its log as for any new
//! event; a merchant webhook already delivered is not delivered again (deliveries are kept per
//! endpoint and event id, and moved with the endpoint).
//!
//! The tenant's shares of payouts posted in the old cell move too (`asiento_domain::payout`):
//! each such payout's stream in the new cell records the share moved in with its lines and
//! entries, then the old cell's stream records it moved out, so that the tenant's books in the
//! new cell hold what was paid out of its money, a later failure of the payout reverses the share
//! there, and the cells' parts of the payout still add up once.
//!
//! Refused: a tenant not paused, one with requests or provider events still in flight in its
//! cell (run again once the workers there finished them), one moving back to a cell its payout
//! shares moved out of when it left, and a move while a payout is posted in the new cell but not
//! in the old one. While a tenant is paused no cell posts a payout
//! (`asiento_app::payouts`), so every payout is posted by every cell on the same side of the
//! move: before it (the old cell's share carried) or after it (the new cell's own lines).

use std::path::PathBuf;

use anyhow::Context as _;
use asiento_app::payouts::{self, CellLog};
use asiento_domain::{PayoutId, ProviderName, StreamKind, TenantId};
use asiento_eventstore::Database;
use futures::StreamExt as _;
use sqlx::{PgPool, Postgres, Transaction};

use super::Directory;

#[derive(clap::Args, Debug)]
pub struct MoveArgs {
    /// The cells directory; the tenant must be listed under `paused` (and the processes that
    /// serve it restarted with that file), so that nothing writes for it during the move.
    #[arg(long = "cells", env = "ASIENTO_CELLS")]
    pub directory: PathBuf,
    /// The tenant to move.
    #[arg(long)]
    pub tenant: String,
    /// The cell to move it to.
    #[arg(long)]
    pub to: String,
}

/// A table of tenant state the move copies: which rows, in which order.
struct Moved {
    table: &'static str,
    /// The rows of tenant `$1`… written with the tenant inlined as a literal (COPY takes no
    /// parameters); the tenant is a validated name segment, which holds no quote.
    rows: &'static str,
    order: &'static str,
}

/// The tenant's tables in the order their references need.
const MOVED: &[Moved] = &[
    Moved {
        table: "events",
        rows: "metadata->>'tenant' = '{tenant}'",
        order: "position",
    },
    Moved {
        table: "api_keys",
        rows: "tenant = '{tenant}'",
        order: "created_ms",
    },
    Moved {
        table: "idempotency_keys",
        rows: "tenant = '{tenant}'",
        order: "created_ms",
    },
    Moved {
        table: "reconciliation_exceptions",
        rows: "tenant = '{tenant}'",
        order: "recorded_ms",
    },
    Moved {
        table: "webhook_endpoints",
        rows: "tenant = '{tenant}'",
        order: "created_ms",
    },
    Moved {
        table: "webhook_endpoint_secrets",
        rows: "endpoint_id in (select id from webhook_endpoints where tenant = '{tenant}')",
        order: "created_ms",
    },
    Moved {
        table: "webhook_deliveries",
        rows: "tenant = '{tenant}'",
        order: "seq",
    },
    Moved {
        table: "webhook_delivery_attempts",
        rows: "delivery_id in (select id from webhook_deliveries where tenant = '{tenant}')",
        order: "at_ms",
    },
    Moved {
        table: "console_audit",
        rows: "tenant = '{tenant}'",
        order: "id",
    },
];

/// What the old cell deletes once the copy committed: the tenant's mutable rows, children first.
const DELETED: &[&str] = &[
    "delete from webhook_delivery_attempts where delivery_id in \
     (select id from webhook_deliveries where tenant = $1)",
    "delete from webhook_deliveries where tenant = $1",
    "delete from webhook_endpoint_secrets where endpoint_id in \
     (select id from webhook_endpoints where tenant = $1)",
    "delete from webhook_endpoints where tenant = $1",
    "delete from idempotency_keys where tenant = $1",
    "delete from reconciliation_exceptions where tenant = $1",
    "delete from console_audit where tenant = $1",
    "delete from console_sessions where tenant = $1",
    "delete from hold_expiries where tenant = $1",
    "delete from api_keys where tenant = $1",
];

pub async fn run(args: MoveArgs) -> anyhow::Result<()> {
    let directory = Directory::load(&args.directory)?;
    let tenant = TenantId::parse(&args.tenant).context("--tenant")?;
    let from = directory
        .cell_of_tenant(&tenant)
        .with_context(|| format!("tenant {tenant} is in no cell of the directory"))?;
    let to = directory
        .cells()
        .iter()
        .find(|cell| cell.name == args.to)
        .with_context(|| format!("--to {:?} is not a cell of the directory", args.to))?;
    anyhow::ensure!(
        from.name != to.name,
        "tenant {tenant} is in {} already",
        to.name
    );
    anyhow::ensure!(
        directory.is_paused(&tenant),
        "tenant {tenant} is not paused: list it under \"paused\" in the directory and restart the \
         processes that serve it first"
    );
    let source_database = crate::serve::connect(&from.database_url)
        .await
        .with_context(|| format!("cell {}", from.name))?;
    let target_database = crate::serve::connect(&to.database_url)
        .await
        .with_context(|| format!("cell {}", to.name))?;
    let (Database::Postgres(source), Database::Postgres(target)) =
        (&source_database, &target_database)
    else {
        anyhow::bail!("moving a tenant needs PostgreSQL cells");
    };
    let in_flight = in_flight(source, &tenant).await?;
    anyhow::ensure!(
        in_flight == 0,
        "tenant {tenant} has {in_flight} requests or provider events in flight in {}; wait until \
         they finish (the workers there finish them) and run the move again",
        from.name
    );

    // A move cut short is run again with the copy already in the new cell; a tenant moving back
    // to a cell it left finds its shares there moved out, which cannot be undone.
    let left_shares: i64 = sqlx::query_scalar(
        "select count(*) from events where stream_id like 'payout-%' \
         and event_type = 'PayoutShareMovedOut' and data->>'tenant' = $1",
    )
    .bind(tenant.as_str())
    .fetch_one(target)
    .await?;
    anyhow::ensure!(
        left_shares == 0,
        "tenant {tenant} left {} before, and its shares of {left_shares} payouts moved out of it \
         then: moving a tenant back to a cell where its payout shares moved out is not supported",
        to.name
    );
    let unposted = posted_only_in(target, source).await?;
    anyhow::ensure!(
        unposted.is_empty(),
        "payouts {unposted:?} are posted in {} but not yet in {}: the tenant's share of them would \
         be posted in neither. Take the tenant off \"paused\", wait until `asiento verify --cells` \
         lists no payout pending, then pause it and run the move again",
        to.name,
        from.name
    );

    let mut copy = target.begin().await?;
    for moved in MOVED {
        let rows = copy_rows(source, &mut copy, moved, &tenant)
            .await
            .with_context(|| format!("copying {}", moved.table))?;
        println!("{}: {rows} rows copied", moved.table);
    }
    copy.commit().await.context("committing the copy")?;

    let (source_log, target_log) = (source_database.event_store(), target_database.event_store());
    let (from_log, to_log) = (
        CellLog {
            store: source_log.as_ref(),
            cell: &from.name,
        },
        CellLog {
            store: target_log.as_ref(),
            cell: &to.name,
        },
    );
    let at = chrono::Utc::now();
    let mut shares = 0;
    for (provider, payout) in payouts_shared(source, &tenant).await? {
        if payouts::move_share(&from_log, &to_log, &provider, &payout, &tenant, at)
            .await
            .with_context(|| format!("moving the share of payout {provider}:{payout}"))?
        {
            shares += 1;
        }
    }
    println!("payout shares: {shares} moved");

    let mut clear = source.begin().await?;
    for statement in DELETED {
        sqlx::query(statement)
            .bind(tenant.as_str())
            .execute(&mut *clear)
            .await
            .with_context(|| format!("in {}: {statement}", from.name))?;
    }
    clear.commit().await?;
    println!(
        "tenant {tenant} copied from {} to {}. Now, in the directory: place {tenant} in {}, list it \
         under {}'s \"moved_out\", take it off \"paused\"; restart the processes with that file; \
         then `asiento verify --cells` checks the copy.",
        from.name, to.name, to.name, from.name
    );
    Ok(())
}

/// Payout streams `one` has posted (paid or failed) that `other` has not: each cell records the
/// rest of a payout as other cells' part, so a payout the new cell posted before the tenant
/// moved in and the old cell posts after it moved out would count the tenant's share in neither.
async fn posted_only_in(one: &PgPool, other: &PgPool) -> anyhow::Result<Vec<String>> {
    let posted = "select distinct stream_id from events where stream_id like 'payout-%' \
                  and event_type in ('PayoutPaid', 'PayoutFailed')";
    let one: Vec<String> = sqlx::query_scalar(posted).fetch_all(one).await?;
    let other: std::collections::HashSet<String> = sqlx::query_scalar(posted)
        .fetch_all(other)
        .await?
        .into_iter()
        .collect();
    Ok(one
        .into_iter()
        .filter(|stream_id| !other.contains(stream_id))
        .collect())
}

/// The payouts whose stream in the old cell holds a share of the tenant: lines posted there or a
/// share moved in.
async fn payouts_shared(
    source: &PgPool,
    tenant: &TenantId,
) -> anyhow::Result<Vec<(ProviderName, PayoutId)>> {
    let streams: Vec<String> = sqlx::query_scalar(
        "select distinct stream_id from events where stream_id like 'payout-%' and ( \
           (event_type = 'PayoutPaid' \
            and data->'lines' @> jsonb_build_array(jsonb_build_object('tenant', $1::text))) \
           or (event_type = 'PayoutShareMovedIn' and data->>'tenant' = $1)) \
         order by stream_id",
    )
    .bind(tenant.as_str())
    .fetch_all(source)
    .await?;
    streams
        .iter()
        .map(|stream_id| match StreamKind::parse(stream_id) {
            Some(StreamKind::Payout { provider, payout }) => Ok((provider, payout)),
            _ => anyhow::bail!("{stream_id:?} is not a payout stream's name"),
        })
        .collect()
}

/// Requests of the tenant holding an idempotency key, and provider events stored but not applied
/// for its payments: either could still write for it in the old cell.
async fn in_flight(source: &PgPool, tenant: &TenantId) -> anyhow::Result<i64> {
    let keys: i64 = sqlx::query_scalar(
        "select count(*) from idempotency_keys where tenant = $1 and state = 'in_flight'",
    )
    .bind(tenant.as_str())
    .fetch_one(source)
    .await?;
    let events: i64 = sqlx::query_scalar(
        "select count(*) from webhook_inbox i join events e \
         on e.stream_id = 'payment-' || i.payment_ref and e.version = 1 \
         where i.status = 'pending' and e.metadata->>'tenant' = $1",
    )
    .bind(tenant.as_str())
    .fetch_one(source)
    .await?;
    Ok(keys + events)
}

/// Streams the tenant's rows of one table from the old cell into the copy: through a scratch
/// table (COPY in the source's order), then inserted in that order, keeping what is there.
async fn copy_rows(
    source: &PgPool,
    copy: &mut Transaction<'_, Postgres>,
    moved: &Moved,
    tenant: &TenantId,
) -> anyhow::Result<u64> {
    // Columns the table computes itself (log positions, audit ids, the writing transaction) are
    // the new cell's own.
    let columns: Vec<String> = sqlx::query_scalar(
        "select column_name::text from information_schema.columns \
         where table_schema = current_schema() and table_name = $1 \
           and is_identity = 'NO' and is_generated = 'NEVER' and column_name <> 'xact' \
         order by ordinal_position",
    )
    .bind(moved.table)
    .fetch_all(&mut **copy)
    .await?;
    anyhow::ensure!(!columns.is_empty(), "table {} has no columns", moved.table);
    let columns = columns.join(", ");
    let scratch = format!("moving_{}", moved.table);
    sqlx::query(&format!(
        "create temporary table {scratch} on commit drop as \
         select {columns} from {} with no data",
        moved.table
    ))
    .execute(&mut **copy)
    .await?;
    sqlx::query(&format!(
        "alter table {scratch} add column moving_order bigint generated always as identity"
    ))
    .execute(&mut **copy)
    .await?;

    let rows = moved.rows.replace("{tenant}", tenant.as_str());
    let mut from = source.acquire().await?;
    let mut out = from
        .copy_out_raw(&format!(
            "copy (select {columns} from {} where {rows} order by {}) to stdout",
            moved.table, moved.order
        ))
        .await?;
    let mut into = copy
        .copy_in_raw(&format!("copy {scratch} ({columns}) from stdin"))
        .await?;
    while let Some(chunk) = out.next().await {
        into.send(chunk?).await?;
    }
    into.finish().await?;
    drop(out);
    let inserted = sqlx::query(&format!(
        "insert into {} ({columns}) select {columns} from {scratch} order by moving_order \
         on conflict do nothing",
        moved.table
    ))
    .execute(&mut **copy)
    .await?;
    Ok(inserted.rows_affected())
}
