//! The `asiento` binary: parses flags (every flag also reads an environment variable), wires the
//! crates together and runs one subcommand. Errors here are `anyhow` with context; the library
//! crates keep typed errors.

mod bench;
mod cells;
mod projections;
mod providers;
mod psp_sim;
mod reconcile;
mod serve;
mod verify;

use clap::{Parser, Subcommand};

/// mimalloc instead of the system allocator: decoding the log allocates a few dozen small
/// objects per event, often freed on another thread than the one that made them.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The SQLite file used when no database URL is given: the embedded default.
const DATABASE_URL_DEFAULT: &str = "sqlite://data/asiento.db";

#[derive(Parser, Debug)]
#[command(
    name = "asiento",
    version,
    about = "A payments ledger that never moves money twice"
)]
struct Cli {
    /// Log format: `text` for people, `json` for log pipelines.
    #[arg(
        long,
        env = "ASIENTO_LOG_FORMAT",
        default_value = "text",
        global = true
    )]
    log_format: LogFormat,

    #[command(subcommand)]
    command: Command,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the service. Boxed: its flags outweigh every other subcommand's.
    Serve(Box<serve::ServeArgs>),
    /// Apply the database migrations and exit.
    Migrate(DatabaseArgs),
    /// Run the payment provider simulator as its own server.
    PspSim(psp_sim::PspSimArgs),
    /// Read models: status, and rebuild without downtime.
    #[command(subcommand)]
    Projections(projections::ProjectionsCommand),
    /// Run one reconciliation sweep now and print its summary.
    Reconcile(reconcile::ReconcileArgs),
    /// Check every ledger invariant: exit 0 when all hold, 1 with one line per violation.
    Verify(verify::VerifyArgs),
    /// Tenant cells: move a tenant between cells.
    #[command(subcommand)]
    Cells(cells::CellsCommand),
    /// Benchmark workloads.
    #[command(subcommand)]
    Bench(bench::BenchCommand),
}

/// The database to use: `sqlite://path` (embedded default) or `postgres://…`.
#[derive(clap::Args, Debug, Clone)]
pub struct DatabaseArgs {
    #[arg(long, env = "ASIENTO_DATABASE_URL", default_value = DATABASE_URL_DEFAULT)]
    pub database_url: String,
}

fn init_tracing(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("ASIENTO_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,sqlx=warn"));
    // Colour codes only for a person at a terminal, never in a file or a log collector.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    init_tracing(cli.log_format);
    match cli.command {
        Command::Serve(args) => serve::run(*args).await,
        Command::Migrate(args) => {
            let database = serve::connect(&args.database_url).await?;
            println!("migrations applied ({:?})", database.backend());
            Ok(())
        }
        Command::PspSim(args) => psp_sim::run(args).await,
        Command::Projections(command) => projections::run(command).await,
        Command::Bench(command) => bench::run(command).await,
        Command::Reconcile(args) => reconcile::run(args).await,
        Command::Cells(command) => cells::run(command).await,
        Command::Verify(args) => {
            if verify::run(args).await? {
                Ok(())
            } else {
                std::process::exit(1)
            }
        }
    }
}
