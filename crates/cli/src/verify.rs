//! `asiento verify`: every ledger invariant, once. Exit 0 when all hold; exit 1 with one line per
//! violation (check, then the entry id, stream id, snapshot key, payment or key it is about).
//!
//! The checks of the log live in `asiento_app::invariants`; the four that need a read model
//! (balance snapshots, the payment list, the merchant events feed, the payment search index)
//! are passed in from here, where the projections are known, so that `app` does not depend on
//! projections. `serve` builds the same [`checker`] and runs it on a schedule (`Checker::run`),
//! exporting `asiento_invariant_violations{check}`.

use std::sync::Arc;

use anyhow::Context as _;
use asiento_app::clock::SystemClock;
use asiento_app::invariants::{Check, Checker, ExtraCheck, ExtraFuture, Violation};
use asiento_eventstore::Database;

use crate::DatabaseArgs;

#[derive(clap::Args, Debug)]
pub struct VerifyArgs {
    #[command(flatten)]
    pub database: DatabaseArgs,
    /// Every cell of a directory (or those `--cell` names) instead of `--database-url`, and with
    /// every cell the checks across them (`crate::cells::verify`).
    #[command(flatten)]
    pub cells: crate::cells::CellsArgs,
}

/// Balance snapshots equal the recomputation from the entries up to their checkpoint, the legs'
/// marks (the running sums of balances in the past) equal the legs, each account's legs sum to
/// what the log's entries give it, and the spans that place a position in log order equal the
/// log.
struct Snapshots;

impl ExtraCheck for Snapshots {
    fn check(&self) -> Check {
        Check::Snapshot
    }

    fn violations<'a>(&'a self, database: &'a Database) -> ExtraFuture<'a> {
        Box::pin(async move {
            let store = database.event_store();
            let mismatches = asiento_balances::verify(database, store.as_ref())
                .await
                .map_err(|error| error.to_string())?;
            let marks = asiento_balances::verify_marks(database, store.as_ref())
                .await
                .map_err(|error| error.to_string())?;
            let spans = asiento_balances::verify_spans(database, store.as_ref())
                .await
                .map_err(|error| error.to_string())?;
            Ok(mismatches
                .into_iter()
                .map(|m| Violation {
                    check: Check::Snapshot,
                    subject: format!("{}:{}:{}", m.key.tenant, m.key.account, m.key.currency),
                    detail: format!(
                        "snapshot says {}, the entries say {}",
                        m.snapshot_minor, m.recomputed_minor
                    ),
                })
                .chain(marks.into_iter().map(|m| Violation {
                    check: Check::Snapshot,
                    subject: format!("{}:{}:{}", m.tenant, m.account, m.currency),
                    detail: m.detail,
                }))
                .chain(spans.into_iter().map(|m| Violation {
                    check: Check::Snapshot,
                    subject: format!("position {}", m.position),
                    detail: m.detail,
                }))
                .collect())
        })
    }
}

/// Every payment's read-model row, and the folded state it keeps, equal the fold of its stream.
struct PaymentRows;

impl ExtraCheck for PaymentRows {
    fn check(&self) -> Check {
        Check::PaymentReadModel
    }

    fn violations<'a>(&'a self, database: &'a Database) -> ExtraFuture<'a> {
        Box::pin(async move {
            let store = database.event_store();
            let mismatches = asiento_payments_view::verify(database, store.as_ref())
                .await
                .map_err(|error| error.to_string())?;
            Ok(mismatches
                .into_iter()
                .map(|m| Violation {
                    check: Check::PaymentReadModel,
                    subject: m.payment_id.clone(),
                    detail: format!(
                        "read model {:?}, fold of the stream {:?}{}",
                        m.stored,
                        m.recomputed,
                        state_note(m.state_differs)
                    ),
                })
                .collect())
        })
    }
}

/// What a list read model's mismatch adds when the folded state it keeps differs from the log's.
fn state_note(differs: bool) -> &'static str {
    if differs {
        "; its stored folded state differs from the stream's"
    } else {
        ""
    }
}

/// Every transfer's read-model row, and the folded state it keeps, equal the fold of its stream.
struct TransferRows;

impl ExtraCheck for TransferRows {
    fn check(&self) -> Check {
        Check::TransferReadModel
    }

    fn violations<'a>(&'a self, database: &'a Database) -> ExtraFuture<'a> {
        Box::pin(async move {
            let store = database.event_store();
            let mismatches = asiento_transfer_list::verify(database, store.as_ref())
                .await
                .map_err(|error| error.to_string())?;
            Ok(mismatches
                .into_iter()
                .map(|m| Violation {
                    check: Check::TransferReadModel,
                    subject: m.transfer_id.clone(),
                    detail: format!(
                        "read model {:?}, fold of the stream {:?}{}",
                        m.stored,
                        m.recomputed,
                        state_note(m.state_differs)
                    ),
                })
                .collect())
        })
    }
}

/// The merchant events feed equals its derivation from the log, row for row and byte for byte.
struct MerchantEventRows;

impl ExtraCheck for MerchantEventRows {
    fn check(&self) -> Check {
        Check::MerchantEvents
    }

    fn violations<'a>(&'a self, database: &'a Database) -> ExtraFuture<'a> {
        Box::pin(async move {
            let store = database.event_store();
            let mismatches = asiento_merchant_events::verify(database, store.as_ref())
                .await
                .map_err(|error| error.to_string())?;
            let states = asiento_merchant_events::verify_states(database, store.as_ref())
                .await
                .map_err(|error| error.to_string())?;
            Ok(mismatches
                .into_iter()
                .map(|m| Violation {
                    check: Check::MerchantEvents,
                    subject: format!("seq {}", m.seq),
                    detail: format!("feed {:?}, derived from the log {:?}", m.stored, m.derived),
                })
                .chain(states.into_iter().map(|m| Violation {
                    check: Check::MerchantEvents,
                    subject: m.stream_id,
                    detail: m.detail,
                }))
                .collect())
        })
    }
}

/// The payment search index equals its derivation from the log, row for row.
struct PaymentSearchRows;

impl ExtraCheck for PaymentSearchRows {
    fn check(&self) -> Check {
        Check::PaymentSearch
    }

    fn violations<'a>(&'a self, database: &'a Database) -> ExtraFuture<'a> {
        Box::pin(async move {
            let store = database.event_store();
            let mismatches = asiento_payment_search::verify(database, store.as_ref())
                .await
                .map_err(|error| error.to_string())?;
            Ok(mismatches
                .into_iter()
                .map(|m| Violation {
                    check: Check::PaymentSearch,
                    subject: m.payment_id,
                    detail: format!(
                        "{} {:?}: the index has {}, the log gives {}",
                        m.kind,
                        m.term,
                        search_row(m.stored.as_ref()),
                        search_row(m.derived.as_ref())
                    ),
                })
                .collect())
        })
    }
}

/// A search row's place as a violation tells it.
fn search_row(place: Option<&Option<(String, i64)>>) -> String {
    match place {
        None => "no row".to_owned(),
        Some(None) => "a term waiting for its PaymentIntended".to_owned(),
        Some(Some((tenant, created_ms))) => format!("tenant {tenant}, created_ms {created_ms}"),
    }
}

/// The checker with every check, as `verify` and `serve` run it.
pub fn checker(database: &Database) -> Checker {
    Checker::new(database.clone(), Arc::new(SystemClock))
        .with(Arc::new(Snapshots))
        .with(Arc::new(PaymentRows))
        .with(Arc::new(TransferRows))
        .with(Arc::new(MerchantEventRows))
        .with(Arc::new(PaymentSearchRows))
}

/// Runs every check and stores the run (`verify_runs`); `Ok(true)` when all hold.
pub async fn run(args: VerifyArgs) -> anyhow::Result<bool> {
    let Some(selected) = args.cells.selected()? else {
        let database = crate::serve::connect(&args.database.database_url).await?;
        return verify_one(&database, "").await;
    };
    let mut ok = true;
    let mut cells = Vec::with_capacity(selected.cells.len());
    for cell in &selected.cells {
        let database = crate::serve::connect(&cell.database_url)
            .await
            .with_context(|| format!("cell {}", cell.name))?;
        ok &= verify_one(&database, &format!("cell {}: ", cell.name)).await?;
        cells.push((cell.clone(), database));
    }
    if !selected.whole() {
        println!("checks across cells skipped: not every cell is selected");
        return Ok(ok);
    }
    let (violations, pending) = crate::cells::verify::across(&selected.directory, &cells)
        .await
        .context("checking across cells")?;
    for violation in &violations {
        println!("{violation}");
    }
    for payout in &pending {
        println!("payout pending in some cells: {payout}");
    }
    println!(
        "{} cells checked; {} violations across cells",
        cells.len(),
        violations.len()
    );
    Ok(ok && violations.is_empty())
}

/// One database's checks, each line after `prefix`.
async fn verify_one(database: &Database, prefix: &str) -> anyhow::Result<bool> {
    let report = checker(database)
        .check_and_record()
        .await
        .context("running the invariant checks")?;
    for violation in &report.violations {
        println!("{prefix}{violation}");
    }
    for (check, count) in &report.omitted {
        println!("{prefix}{check}: {count} more violations not listed");
    }
    println!(
        "{prefix}{} events in {} streams checked; {} not sealed yet; {} violations",
        report.events_checked,
        report.streams_checked,
        report.unsealed,
        report.violations.len() + report.omitted.values().sum::<usize>()
    );
    Ok(report.is_ok())
}
