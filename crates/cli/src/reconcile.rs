//! `asiento reconcile`: one reconciliation sweep of every kind, now, and its summary; with
//! `--list`, every open exception of every scope (the platform scope included: charges and
//! webhooks that name no payment of ours, which no tenant's API key can see).
//!
//! The sweep takes the same job lease as the reconciler inside `serve`, so running this while a
//! server sweeps is safe: one of the two finds the lease busy and says so.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use asiento_app::clock::SystemClock;
use asiento_app::exceptions::{self, Scope, EXCEPTIONS_PAGE_MAX};
use asiento_app::payments::PaymentFlow;
use asiento_app::reconcile::{Reconciler, ReconcilerConfig, SWEEP_LEASE_MS_MIN};
use asiento_domain::exception::ExceptionStatus;
use asiento_psp::ClientConfig;

use crate::providers::{parse_fees, parse_providers, Fees, ProviderSpecs, DEFAULT_PROVIDER};
use crate::DatabaseArgs;

/// How long `reconcile` waits for a sweep running elsewhere to release the lease.
const LEASE_WAIT_MS_MAX: u64 = 120_000;
/// How often it looks again meanwhile.
const LEASE_WAIT_POLL_MS: u64 = 250;

/// Where a default `asiento serve` mounts its in-process simulator.
const IN_PROCESS_SIM_URL_DEFAULT: &str = "http://127.0.0.1:8080/sim";

#[derive(clap::Args, Debug)]
pub struct ReconcileArgs {
    #[command(flatten)]
    pub database: DatabaseArgs,

    /// Base URL of provider `sim`; unset (and without `--providers`), the simulator mounted by a
    /// default `asiento serve` at 127.0.0.1:8080/sim.
    #[arg(long, env = "ASIENTO_PSP_URL")]
    pub psp_url: Option<String>,

    /// Several providers at once: `name=kind:url,…` (see `serve --providers`).
    #[arg(long, env = "ASIENTO_PROVIDERS", value_parser = parse_providers, conflicts_with = "psp_url")]
    pub providers: Option<ProviderSpecs>,

    /// Platform fees: `300` basis points for every provider, or `name:bps[+fixed],…`.
    #[arg(long, env = "ASIENTO_FEES", value_parser = parse_fees, default_value = "300")]
    pub fees: Fees,

    /// Payments pending longer than this whose provider never got the charge expire. The
    /// reconciler looks pending payments up (or, at a provider without a lookup, sends their
    /// request again) from the operation timeout on.
    #[arg(long, env = "ASIENTO_PENDING_TIMEOUT", value_parser = humantime::parse_duration, default_value = "15m")]
    pub pending_timeout: Duration,

    #[command(flatten)]
    pub settle: ReportSettle,

    #[command(flatten)]
    pub operations: OperationTimings,

    /// After the sweep, print every open exception of every scope.
    #[arg(long)]
    pub list: bool,

    /// A sweep in each cell of a directory (or those `--cell` names) instead of
    /// `--database-url`: each compares its own payments and posts its own part of each payout.
    #[command(flatten)]
    pub cells: crate::cells::CellsArgs,
}

/// The settle delay of settlement-report windows, one definition for `serve` and `reconcile`
/// (same flag, env var, parser and default), so that a sweep run by hand compares the same
/// windows as the one inside `serve`.
#[derive(clap::Args, Debug, Clone)]
pub struct ReportSettle {
    /// Report windows end this long before now: answers and webhooks still on their way would
    /// otherwise show as differences.
    #[arg(
        long = "report-settle",
        visible_alias = "settle",
        env = "ASIENTO_RECONCILE_SETTLE",
        value_parser = humantime::parse_duration,
        default_value = "1m"
    )]
    pub report_settle: Duration,
}

/// How long the reconciler lets captures, refunds and redirects run before it acts, one
/// definition for `serve` and `reconcile` (same flags, env vars, parsers and defaults).
#[derive(clap::Args, Debug, Clone)]
pub struct OperationTimings {
    /// How long after its request a capture or refund without an outcome is driven by the
    /// reconciler (looked up, or sent again under its key).
    #[arg(long, env = "ASIENTO_OPERATION_TIMEOUT", value_parser = humantime::parse_duration, default_value = "1m")]
    pub operation_timeout: Duration,

    /// How long a customer may take to finish a redirect (3-D Secure) before the payment is
    /// cancelled at the provider and expires.
    #[arg(long, env = "ASIENTO_REQUIRES_ACTION_TIMEOUT", value_parser = humantime::parse_duration, default_value = "24h")]
    pub requires_action_timeout: Duration,

    /// How long a capture or refund the provider received may wait for its decision before it
    /// is a manual reconciliation exception.
    #[arg(long, env = "ASIENTO_OPERATION_PENDING_DEADLINE", value_parser = humantime::parse_duration, default_value = "3d")]
    pub operation_pending_deadline: Duration,
}

impl OperationTimings {
    /// `config` with these timings.
    pub fn apply(&self, config: ReconcilerConfig) -> ReconcilerConfig {
        ReconcilerConfig {
            operation_timeout_ms: millis(self.operation_timeout),
            operation_pending_deadline_ms: millis(self.operation_pending_deadline),
            requires_action_timeout_ms: millis(self.requires_action_timeout),
            ..config
        }
    }
}

impl ReportSettle {
    /// As `ReconcilerConfig::report_settle_ms`.
    pub fn ms(&self) -> i64 {
        millis(self.report_settle)
    }
}

fn millis(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

pub async fn run(args: ReconcileArgs) -> anyhow::Result<()> {
    let Some(selected) = args.cells.selected()? else {
        let database = crate::serve::connect(&args.database.database_url).await?;
        return sweep(&args, &database, None).await;
    };
    for cell in &selected.cells {
        println!("cell {} (number {})", cell.name, cell.number);
        let database = crate::serve::connect(&cell.database_url)
            .await
            .with_context(|| format!("cell {}", cell.name))?;
        sweep(&args, &database, Some(selected.place(cell)))
            .await
            .with_context(|| format!("cell {}", cell.name))?;
    }
    Ok(())
}

/// One sweep on one database, its summary and open exceptions printed.
async fn sweep(
    args: &ReconcileArgs,
    database: &asiento_eventstore::Database,
    cell: Option<asiento_app::payments::CellPlace>,
) -> anyhow::Result<()> {
    let urls = match (&args.providers, &args.psp_url) {
        (Some(urls), _) => urls.clone(),
        (None, url) => ProviderSpecs::sim(
            asiento_domain::ProviderName::parse(DEFAULT_PROVIDER)
                .context("the default provider name")?,
            url.clone()
                .unwrap_or_else(|| IN_PROCESS_SIM_URL_DEFAULT.to_owned()),
        ),
    };
    let env = |variable: &str| std::env::var(variable).ok();
    let providers = crate::providers::build(&urls, &args.fees, &ClientConfig::default(), &env)?;
    let mut flow = PaymentFlow::new(
        database.clone(),
        asiento_app::commit::Writer::new(database.event_store()),
        providers,
        Arc::new(SystemClock),
        Arc::new(asiento_api::render::JsonRender),
    );
    if let Some(cell) = cell {
        flow = flow.in_cell(cell);
    }
    let reconciler = Reconciler::new(
        flow,
        args.operations.apply(ReconcilerConfig {
            pending_timeout_ms: millis(args.pending_timeout),
            report_settle_ms: args.settle.ms(),
            // Killed mid-sweep (by an operator's Ctrl-C, a job timeout), it must not keep every
            // other sweeper out for the default ten minutes.
            sweep_lease_ms: SWEEP_LEASE_MS_MIN,
            ..ReconcilerConfig::default()
        }),
    );
    // A sweep running elsewhere (a `serve` worker) holds the lease; wait for it to finish rather
    // than report "nothing done" to an operator who asked for a sweep now.
    let deadline = std::time::Instant::now() + Duration::from_millis(LEASE_WAIT_MS_MAX);
    let summary = loop {
        let summary = reconciler
            .sweep_once()
            .await
            .context("running the reconciliation sweep")?;
        if !summary.lease_busy || std::time::Instant::now() >= deadline {
            break summary;
        }
        tokio::time::sleep(Duration::from_millis(LEASE_WAIT_POLL_MS)).await;
    };
    println!("{summary}");
    if summary.lease_busy {
        anyhow::bail!("another sweep kept the lease for {LEASE_WAIT_MS_MAX} ms; try again later");
    }
    let open = exceptions::open_count(database)
        .await
        .context("counting open exceptions")?;
    println!("open exceptions: {open}");
    if args.list {
        let listed = exceptions::list(
            database,
            &Scope::All,
            Some(ExceptionStatus::Open),
            EXCEPTIONS_PAGE_MAX,
        )
        .await
        .context("listing open exceptions")?;
        for e in listed {
            println!(
                "{} {} tenant={} payment={} charge={} difference={}",
                e.id,
                e.kind,
                e.tenant.as_deref().unwrap_or("(platform)"),
                e.payment_id.as_deref().unwrap_or("-"),
                e.charge_id.as_deref().unwrap_or("-"),
                e.difference
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use clap::Parser as _;

    #[derive(clap::Parser)]
    struct Command {
        #[command(flatten)]
        settle: super::ReportSettle,
    }

    /// The flag's default is the reconciler's own, so that a setting left alone changes nothing.
    #[test]
    fn report_settle_defaults_to_the_reconcilers_default() {
        let parsed = Command::try_parse_from(["asiento"]).expect("no flag");
        assert_eq!(
            parsed.settle.ms(),
            asiento_app::reconcile::REPORT_SETTLE_MS_DEFAULT
        );
        for flag in ["--report-settle", "--settle"] {
            let parsed = Command::try_parse_from(["asiento", flag, "90s"]).expect(flag);
            assert_eq!(parsed.settle.ms(), 90_000, "{flag}");
        }
        assert!(Command::try_parse_from(["asiento", "--report-settle", "soon"]).is_err());
    }
}
