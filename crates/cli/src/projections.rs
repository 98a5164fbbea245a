//! The read models this binary knows, and `asiento projections status | rebuild NAME`.

use std::sync::Arc;

use anyhow::Context as _;
use asiento_projector::Projection;

use crate::DatabaseArgs;

/// Every projection, in the order they are installed and run.
pub fn all() -> Vec<Arc<dyn Projection>> {
    vec![
        asiento_balances::projection(),
        asiento_balances::entries_projection(),
        asiento_payments_view::projection(),
        asiento_transfer_list::projection(),
        asiento_merchant_events::projection(),
        asiento_payment_search::projection(),
    ]
}

#[derive(clap::Subcommand, Debug)]
pub enum ProjectionsCommand {
    /// Each projection's checkpoint, lag, owner and fingerprint.
    Status(StatusArgs),
    /// Rebuild a read model from position zero beside the live one, then swap (no downtime).
    Rebuild {
        /// The projection to rebuild (see `status`).
        name: String,
        /// Events per rebuild batch (one transaction each; up to 10,000).
        #[arg(long, env = "ASIENTO_REBUILD_BATCH_SIZE", default_value_t = asiento_projector::REBUILD_BATCH_SIZE_MAX_DEFAULT)]
        batch_size: usize,
        #[command(flatten)]
        database: DatabaseArgs,
    },
}

#[derive(clap::Args, Debug)]
pub struct StatusArgs {
    #[command(flatten)]
    database: DatabaseArgs,
    /// Each cell of a directory (or those `--cell` names) instead of `--database-url`.
    #[command(flatten)]
    cells: crate::cells::CellsArgs,
}

pub async fn run(command: ProjectionsCommand) -> anyhow::Result<()> {
    match command {
        ProjectionsCommand::Status(args) => match args.cells.selected()? {
            None => status(&args.database.database_url).await,
            Some(selected) => {
                for cell in &selected.cells {
                    println!("cell {} (number {})", cell.name, cell.number);
                    status(&cell.database_url)
                        .await
                        .with_context(|| format!("cell {}", cell.name))?;
                }
                Ok(())
            }
        },
        ProjectionsCommand::Rebuild {
            name,
            batch_size,
            database,
        } => rebuild(&name, batch_size, &database).await,
    }
}

async fn status(database_url: &str) -> anyhow::Result<()> {
    let database = crate::serve::connect(database_url).await?;
    let store = database.event_store();
    let projections = all();
    let refs: Vec<&dyn Projection> = projections.iter().map(AsRef::as_ref).collect();
    let statuses = asiento_projector::status(&database, store.as_ref(), &refs)
        .await
        .context("reading projection status")?;
    println!(
        "{:<12} {:>4} {:<16} {:>22} {:>10} {:>10}  owner",
        "projection", "gen", "fingerprint", "checkpoint", "lag_events", "lag_ms"
    );
    for status in statuses {
        let owner = match (&status.owner, status.lease_live) {
            (Some(owner), true) => owner.clone(),
            (Some(owner), false) => format!("{owner} (lease expired)"),
            (None, _) => "-".to_owned(),
        };
        let fingerprint = if status.rebuild_needed {
            format!("{} (rebuild needed)", status.fingerprint)
        } else {
            status.fingerprint.clone()
        };
        println!(
            "{:<12} {:>4} {:<16} {:>22} {:>10} {:>10}  {}",
            status.name,
            status.generation,
            fingerprint,
            status.checkpoint.to_string(),
            status.lag_events,
            status.lag_ms,
            owner
        );
        if let Some(rebuild) = status.rebuild {
            println!(
                "  rebuild in progress: generation {} at {} by {}",
                rebuild.generation, rebuild.checkpoint, rebuild.owner
            );
        }
    }
    Ok(())
}

async fn rebuild(name: &str, batch_size: usize, args: &DatabaseArgs) -> anyhow::Result<()> {
    if !(1..=asiento_eventstore::READ_BATCH_MAX).contains(&batch_size) {
        anyhow::bail!(
            "--batch-size must be between 1 and {}",
            asiento_eventstore::READ_BATCH_MAX
        );
    }
    let projection = all()
        .into_iter()
        .find(|projection| projection.name() == name)
        .with_context(|| {
            let names: Vec<_> = all().iter().map(|p| p.name().to_owned()).collect();
            format!("no projection named {name:?}; known: {}", names.join(", "))
        })?;
    let database = crate::serve::connect(&args.database_url).await?;
    let store = database.event_store();
    let owner = crate::serve::lease_owner("rebuild");
    let report = asiento_projector::rebuild(
        &database,
        &store,
        projection.as_ref(),
        &asiento_projector::RebuildConfig {
            batch_size_max: batch_size,
            ..asiento_projector::RebuildConfig::new(owner)
        },
        crate::serve::shutdown_signal(),
    )
    .await
    .with_context(|| format!("rebuilding {name}"))?;
    println!(
        "rebuilt {}: generation {} replaces {} at {} ({} events applied{})",
        report.name,
        report.generation,
        report.previous_generation,
        report.checkpoint,
        report.events_applied,
        if report.resumed { ", resumed" } else { "" }
    );
    Ok(())
}
