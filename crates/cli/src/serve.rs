//! `asiento serve`: one process that answers HTTP until it is told to stop.
//!
//! It connects, migrates, registers API keys, configures the providers (by default a simulator
//! mounted in process under `/sim`) and serves the API until Ctrl-C or SIGTERM.
//!
//! For each database it serves (one, or with `--cells` one per tenant cell, behind the front of
//! `crate::cells::front`) it builds one store, the database's one `Writer` and the flows that share
//! it (`PaymentFlow::new`, `LedgerFlow::new`), and runs what its role asks. Every role answers
//! `/healthz`, `/readyz` and `/metrics`; `api` adds `/v1`, `/webhooks`, `/openapi.json` and
//! `/console` (and the simulator under `/sim` when no provider URL is given); `projector` runs the
//! projection runners; `worker` runs the webhook worker, the reconciler, the sealer, the invariant
//! checker, the idempotency-key purger, the hold expiry worker, the merchant webhooks' dispatcher
//! and deliverer, the gauges and, with `--events-relay`, the events relay to NATS JetStream. Every
//! long-running part takes a shutdown future.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use asiento_api::reads::{ReadSide, Reads};
use asiento_app::clock::SystemClock;
use asiento_app::invariants::Sealer;
use asiento_app::ledger::LedgerFlow;
use asiento_app::payments::PaymentFlow;
use asiento_app::reconcile::{Reconciler, ReconcilerConfig, SWEEP_LEASE_MS_MIN};
use asiento_app::webhooks::{WebhookReceiver, WebhookSecrets, Worker, WorkerConfig};
use asiento_domain::ProviderName;
use asiento_eventstore::{Database, EventStore};
use asiento_psp::ClientConfig;
use asiento_psp_sim::{SimConfig, Simulator};
use tokio::sync::watch;

use crate::providers::{
    parse_fees, parse_providers, webhook_auth, Fees, ProviderSpecs, WebhookAuth, DEFAULT_PROVIDER,
};
use crate::DatabaseArgs;

/// Which parts of the system this process runs. Several processes with different roles may share
/// one PostgreSQL database; every role answers `/healthz`, `/readyz` and `/metrics`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Everything in one process (the embedded default).
    All,
    /// The command and query API (and the in-process simulator, if no provider URL is given).
    Api,
    /// The projectors that build the read models.
    Projector,
    /// The background workers.
    Worker,
}

impl Role {
    fn serves_api(self) -> bool {
        matches!(self, Role::All | Role::Api)
    }

    fn runs_projectors(self) -> bool {
        matches!(self, Role::All | Role::Projector)
    }

    fn runs_workers(self) -> bool {
        matches!(self, Role::All | Role::Worker)
    }
}

#[derive(clap::Args, Debug)]
pub struct ServeArgs {
    #[command(flatten)]
    pub database: DatabaseArgs,

    /// What this process runs.
    #[arg(long, env = "ASIENTO_ROLE", value_enum, default_value = "all")]
    pub role: Role,

    /// Address to listen on for HTTP.
    #[arg(long, env = "ASIENTO_LISTEN", default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,

    /// API keys as `tenant:key,tenant:key`. Without any key registered, a `demo` tenant is created
    /// and its key printed once.
    #[arg(long, env = "ASIENTO_API_KEYS", value_parser = parse_api_keys, hide_env_values = true)]
    pub api_keys: Option<ApiKeys>,

    /// Base URL of provider `sim` (e.g. a separate `asiento psp-sim`). Unset, and without
    /// `--providers`: a simulator is mounted in process under `/sim` and serves as `sim`.
    #[arg(long, env = "ASIENTO_PSP_URL")]
    pub psp_url: Option<String>,

    /// Several providers at once: `name=kind:url,…`, kind `sim` (our simulator's protocol, the
    /// default: `name=url`) or `stripe` (e.g. `stripe=stripe:https://api.stripe.com`). Secrets
    /// come from the environment: `ASIENTO_PROVIDER_<NAME>_API_KEY` and `…_WEBHOOK_SECRET`.
    #[arg(long, env = "ASIENTO_PROVIDERS", value_parser = parse_providers, conflicts_with = "psp_url")]
    pub providers: Option<ProviderSpecs>,

    /// Platform fees: `300` basis points for every provider, or `name:bps[+fixed],…`.
    #[arg(long, env = "ASIENTO_FEES", value_parser = parse_fees, default_value = "300")]
    pub fees: Fees,

    /// The largest amount one request may carry, in minor units (1 to 10^18): above it a payment,
    /// capture, refund or transfer is 422 `amount_too_large`.
    #[arg(long, env = "ASIENTO_AMOUNT_MAX", value_parser = parse_amount_limit, default_value_t = asiento_domain::AMOUNT_MAX_DEFAULT)]
    pub amount_max: i64,

    /// How long one provider request may take before its outcome counts as unknown.
    #[arg(long, env = "ASIENTO_PSP_TIMEOUT", value_parser = humantime::parse_duration, default_value = "10s")]
    pub psp_timeout: Duration,

    /// How long an in-flight Idempotency-Key is held before a retry may take it over and resume
    /// the work (after a crash). Must exceed the provider client's worst case.
    #[arg(long, env = "ASIENTO_IDEMPOTENCY_LEASE", value_parser = humantime::parse_duration, default_value = "60s")]
    pub idempotency_lease: Duration,

    /// How long completed Idempotency-Key records are kept (and replayed) before they are purged.
    #[arg(long, env = "ASIENTO_IDEMPOTENCY_RETENTION", value_parser = parse_retention, default_value = "24h")]
    pub idempotency_retention: Duration,

    /// Webhook signing secrets per provider: `name:secret,…`.
    #[arg(long, env = "ASIENTO_WEBHOOK_SECRETS", hide_env_values = true)]
    pub webhook_secrets: Option<WebhookSecrets>,

    /// The webhook signing secret of provider `sim` (random for the in-process simulator).
    #[arg(long, env = "ASIENTO_WEBHOOK_SECRET", hide_env_values = true)]
    pub webhook_secret: Option<String>,

    /// How long the webhook worker (and the reconciler) hold a payment while finalising it; longer
    /// than the slowest finalisation, so that two of them never work on one payment at once.
    #[arg(long, env = "ASIENTO_PAYMENT_LEASE", value_parser = humantime::parse_duration, default_value = "30s")]
    pub payment_lease: Duration,

    /// Payments pending longer than this whose provider never got the charge expire. The
    /// reconciler looks pending payments up (or, at a provider without a lookup, sends their
    /// request again) from the operation timeout on.
    #[arg(long, env = "ASIENTO_PENDING_TIMEOUT", value_parser = humantime::parse_duration, default_value = "15m")]
    pub pending_timeout: Duration,

    /// How often the reconciler sweeps (stale payments, stuck keys, the settlement report).
    #[arg(long, env = "ASIENTO_RECONCILE_INTERVAL", value_parser = humantime::parse_duration, default_value = "1m")]
    pub reconcile_interval: Duration,

    #[command(flatten)]
    pub report_settle: crate::reconcile::ReportSettle,

    #[command(flatten)]
    pub operations: crate::reconcile::OperationTimings,

    /// How often the invariant checker runs inside serve (exported as metrics).
    #[arg(long, env = "ASIENTO_VERIFY_INTERVAL", value_parser = humantime::parse_duration, default_value = "10m")]
    pub verify_interval: Duration,

    /// How often the worker counts what is open (exceptions, keys in flight, pending provider
    /// operations) for its gauges.
    #[arg(long, env = "ASIENTO_GAUGES_INTERVAL", value_parser = humantime::parse_duration, default_value = "15s")]
    pub gauges_interval: Duration,

    #[command(flatten)]
    pub outbound: OutboundArgs,

    #[command(flatten)]
    pub events_relay: EventsRelayArgs,

    #[command(flatten)]
    pub standbys: StandbyArgs,

    /// Tenant cells (`crate::cells`): `--cells cells.json` serves the cells of the directory
    /// instead of `--database-url`, `--cell` only some of them.
    #[command(flatten)]
    pub cells: crate::cells::CellsArgs,

    /// The platform operator's key for the console (`/console`): signing in with it shows the
    /// reconciliation exceptions that name no tenant's payment. At least 16 characters.
    #[arg(long, env = "ASIENTO_OPERATOR_KEY", hide_env_values = true, value_parser = parse_operator_key)]
    pub operator_key: Option<String>,

    /// Token buckets per API key (and per tenant across its keys, 4 times as large):
    /// `default=200/s,burst=400;acme=1000/s,burst=2000`, units s, m or h; also `address=…` (requests
    /// without a known key, per client address) and `console=…` (console sign-ins per address,
    /// 10/m by default). Unset: no `/v1` request is limited.
    #[arg(long, env = "ASIENTO_RATE_LIMIT", value_parser = parse_rate_limit)]
    pub rate_limit: Option<asiento_api::rate_limit::RateLimitConfig>,
}

fn parse_rate_limit(raw: &str) -> Result<asiento_api::rate_limit::RateLimitConfig, String> {
    raw.parse::<asiento_api::rate_limit::RateLimitConfig>()
        .map_err(|error| error.to_string())
}

fn parse_operator_key(raw: &str) -> Result<String, String> {
    if raw.trim().chars().count() < API_KEY_CHARS_MIN {
        return Err(format!(
            "the operator key needs at least {API_KEY_CHARS_MIN} characters"
        ));
    }
    Ok(raw.trim().to_owned())
}

/// API.md promises keys are kept at least 24 hours.
fn parse_amount_limit(raw: &str) -> Result<i64, String> {
    let minor: i64 = raw
        .parse()
        .map_err(|_| format!("{raw:?} is not an integer count of minor units"))?;
    asiento_domain::AmountLimit::new(minor)
        .map(|limit| limit.max().minor())
        .map_err(|error| error.to_string())
}

fn parse_retention(raw: &str) -> Result<Duration, String> {
    let duration = humantime::parse_duration(raw).map_err(|error| error.to_string())?;
    if duration < Duration::from_secs(24 * 3600) {
        return Err("idempotency keys are kept at least 24h".to_owned());
    }
    Ok(duration)
}

/// `tenant:key` pairs from `--api-keys`.
#[derive(Clone, Debug)]
pub struct ApiKeys(pub Vec<(String, String)>);

/// Keys shorter than this are refused: a key is a secret, not a password to remember.
const API_KEY_CHARS_MIN: usize = 16;

fn parse_api_keys(raw: &str) -> Result<ApiKeys, String> {
    let mut pairs = Vec::new();
    for item in raw
        .split(',')
        .map(str::trim)
        .filter(|item| !item.is_empty())
    {
        let (tenant, key) = item
            .split_once(':')
            .ok_or_else(|| format!("expected tenant:key, got {item:?}"))?;
        asiento_domain::TenantId::parse(tenant).map_err(|error| error.to_string())?;
        if key.len() < API_KEY_CHARS_MIN || !key.bytes().all(|byte| byte.is_ascii_graphic()) {
            return Err(format!(
                "the key for tenant {tenant:?} must be at least {API_KEY_CHARS_MIN} printable ASCII characters"
            ));
        }
        pairs.push((tenant.to_owned(), key.to_owned()));
    }
    if pairs.is_empty() {
        return Err("no tenant:key pair given".to_owned());
    }
    Ok(ApiKeys(pairs))
}

/// Registers the configured keys; on a database with no key at all, creates the `demo` tenant with
/// a random key and returns it so that it can be printed once.
async fn bootstrap_api_keys(
    database: &Database,
    configured: Option<&ApiKeys>,
) -> anyhow::Result<Option<String>> {
    let now_ms = chrono::Utc::now().timestamp_millis();
    if let Some(ApiKeys(pairs)) = configured {
        for (tenant, key) in pairs {
            asiento_app::api_keys::register(database, tenant, key, now_ms)
                .await
                .with_context(|| format!("registering the API key of tenant {tenant}"))?;
        }
        return Ok(None);
    }
    if asiento_app::api_keys::any_registered(database)
        .await
        .context("reading API keys")?
    {
        return Ok(None);
    }
    let key = format!("sk_demo_{}", uuid::Uuid::new_v4().simple());
    asiento_app::api_keys::register(database, "demo", &key, now_ms)
        .await
        .context("creating the demo tenant")?;
    Ok(Some(key))
}

/// Connects to the database, applies the embedded migrations and registers the projections, so
/// that every subcommand that touches the database finds the schema it was built for.
pub async fn connect(url: &str) -> anyhow::Result<Database> {
    let database = Database::connect(url)
        .await
        .with_context(|| format!("connecting to {}", redact(url)))?;
    database
        .migrate()
        .await
        .context("applying database migrations")?;
    for projection in crate::projections::all() {
        asiento_projector::install(&database, projection.as_ref())
            .await
            .with_context(|| format!("installing projection {}", projection.name()))?;
    }
    Ok(database)
}

/// Who holds a lease: unique per process, readable by an operator.
pub fn lease_owner(role: &str) -> String {
    let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "localhost".to_owned());
    format!(
        "{host}:{role}:{}:{}",
        std::process::id(),
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    )
}

/// Drops the password from a database URL before it is printed.
fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme_end), Some(at)) if at > scheme_end => {
            let credentials = &url[scheme_end + 3..at];
            match credentials.split_once(':') {
                Some((user, _password)) => {
                    format!("{}{}:***{}", &url[..scheme_end + 3], user, &url[at..])
                }
                None => url.to_owned(),
            }
        }
        _ => url.to_owned(),
    }
}

pub async fn run(args: ServeArgs) -> anyhow::Result<()> {
    // Installed before anything records a metric.
    asiento_api::metrics_handle();
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("binding {}", args.listen))?;
    let address = listener.local_addr().context("reading the bound address")?;
    let (stop, stopped) = watch::channel(false);
    let mut tasks = tokio::task::JoinSet::new();

    let providers = if args.role.serves_api() || args.role.runs_workers() {
        Some(Providers::build(&args, address, &stopped)?)
    } else {
        None
    };
    let (mut app, backend, demo_key) = match args.cells.selected()? {
        None => {
            let database = connect(&args.database.database_url).await?;
            let backend = database.backend();
            // Keys are the API's: a projector or worker process never creates the demo tenant,
            // whose key only an API process prints.
            let demo_key = if args.role.serves_api() {
                bootstrap_api_keys(&database, args.api_keys.as_ref()).await?
            } else {
                None
            };
            let one = CellParts {
                database,
                read_urls: args.standbys.urls.clone(),
                name: None,
                place: None,
            };
            let app = one.start(&args, providers.as_ref(), &stopped, &mut tasks)?;
            (app, backend, demo_key)
        }
        Some(selected) => {
            anyhow::ensure!(
                args.standbys.urls.is_empty(),
                "with --cells, each cell's standbys are in the directory (read_database_urls)"
            );
            let mut served = Vec::new();
            for cell in selected.cells.clone() {
                let database = connect(&cell.database_url)
                    .await
                    .with_context(|| format!("cell {}", cell.name))?;
                if args.role.serves_api() {
                    register_cell_keys(
                        &selected.directory,
                        &cell,
                        &database,
                        args.api_keys.as_ref(),
                    )
                    .await?;
                }
                let parts = CellParts {
                    database: database.clone(),
                    read_urls: cell.read_database_urls.clone(),
                    name: Some(Arc::from(cell.name.as_str())),
                    place: Some(selected.place(&cell)),
                };
                let router = parts.start(&args, providers.as_ref(), &stopped, &mut tasks)?;
                println!("cell {} (number {}) served", cell.name, cell.number);
                served.push(crate::cells::front::ServedCell {
                    name: Arc::from(cell.name.as_str()),
                    router,
                    database,
                });
            }
            let backend = served[0].database.backend();
            let formats = providers
                .as_ref()
                .map(|providers| providers.secrets.clone())
                .unwrap_or_default();
            let front = crate::cells::front::Front::new(selected.directory, served, formats);
            (front.router(), backend, None)
        }
    };
    if let Some(providers) = &providers {
        if args.role.serves_api() {
            if let Some(simulator) = &providers.simulator {
                app = app.merge(simulator.mounted_router());
            }
            providers.print_hints(address, demo_key);
        }
    }
    if args.role.runs_workers() {
        println!(
            "webhook worker, reconciler, sealer, invariant checker, hold expiry, key purger, \
             gauges and merchant webhooks running"
        );
    }

    println!(
        "asiento listening on http://{address} ({backend:?}, role {:?})",
        args.role
    );
    tracing::info!(%address, role = ?args.role, ?backend, "serving");
    // With each connection's peer address, which the rate limits of requests without a known key
    // and of console sign-ins are kept by.
    let served = axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .with_graceful_shutdown(shutdown_signal())
    .await
    .context("serving HTTP");
    stop.send_replace(true);
    while tasks.join_next().await.is_some() {}
    served
}

/// Registers the `--api-keys` of the tenants the directory places in `cell`; a key of a tenant
/// in no cell is refused at start.
async fn register_cell_keys(
    directory: &crate::cells::Directory,
    cell: &crate::cells::Cell,
    database: &Database,
    keys: Option<&ApiKeys>,
) -> anyhow::Result<()> {
    let Some(ApiKeys(pairs)) = keys else {
        return Ok(());
    };
    let mut here = Vec::new();
    for (tenant, key) in pairs {
        let placed = asiento_domain::TenantId::parse(tenant)
            .ok()
            .and_then(|tenant| directory.cell_of_tenant(&tenant))
            .with_context(|| {
                format!("--api-keys: tenant {tenant} is in no cell of the directory")
            })?;
        if placed.name == cell.name {
            here.push((tenant.clone(), key.clone()));
        }
    }
    if !here.is_empty() {
        bootstrap_api_keys(database, Some(&ApiKeys(here))).await?;
    }
    Ok(())
}

/// What one database runs: its store, its one `Writer` and the flows that share
/// it, its reads, and whatever the role asks (API router, projectors, workers). A process of one
/// database has one; a process of several cells one per cell.
struct CellParts {
    database: Database,
    read_urls: Vec<String>,
    /// The cell's name, the `cell` label of what it records (`asiento_api::metrics_cell`).
    name: Option<Arc<str>>,
    /// The cell stamped into payment ids; `None` outside a deployment of cells.
    place: Option<asiento_app::payments::CellPlace>,
}

impl CellParts {
    /// Starts the projectors and workers the role asks for on `tasks`; answers the cell's router.
    fn start(
        self,
        args: &ServeArgs,
        providers: Option<&Providers>,
        stopped: &watch::Receiver<bool>,
        tasks: &mut tokio::task::JoinSet<()>,
    ) -> anyhow::Result<axum::Router> {
        let tasks = &mut CellTasks {
            tasks,
            cell: self.name,
        };
        let database = self.database;
        // One store per database: its readers (projections, sealer, reconciler) share its cache
        // of the newest events, its appenders its NOTIFY coalescing and own connections.
        let store = database.event_store();
        let core = match providers {
            Some(providers) => Some(Core::build(args, &database, &store, providers, self.place)?),
            None => None,
        };
        let app = match &core {
            Some(core) if args.role.serves_api() => {
                let standbys = StandbyArgs {
                    urls: self.read_urls,
                    wait: args.standbys.wait,
                };
                let reads = standbys.reads(&database, &store)?;
                tasks.spawn(
                    Arc::clone(&reads).watch_lag(STANDBY_LAG_INTERVAL, wait_for(stopped.clone())),
                );
                core.router(args, &database, reads, providers)?
            }
            _ => asiento_api::ops_router(database.clone()),
        };
        if args.role.runs_projectors() {
            let owner = lease_owner("projector");
            for projection in crate::projections::all() {
                let runner = asiento_projector::Runner::new(
                    database.clone(),
                    Arc::clone(&store),
                    projection,
                    asiento_projector::RunnerConfig::new(owner.clone()),
                );
                tasks.spawn(runner.run(wait_for(stopped.clone())));
            }
            println!("projectors running as {owner}");
        }
        if let (Some(core), true) = (&core, args.role.runs_workers()) {
            core.start_workers(args, &database, &store, stopped, tasks)?;
        }
        Ok(app)
    }
}

/// Where one database's long-running parts are spawned: the process's tasks, each inside its
/// cell's metrics label when the process serves cells.
struct CellTasks<'a> {
    tasks: &'a mut tokio::task::JoinSet<()>,
    cell: Option<Arc<str>>,
}

impl CellTasks<'_> {
    fn spawn(&mut self, task: impl std::future::Future<Output = ()> + Send + 'static) {
        match &self.cell {
            Some(cell) => {
                let labelled = asiento_api::metrics_cell::in_cell(Arc::clone(cell), task);
                self.tasks.spawn(labelled);
            }
            None => {
                self.tasks.spawn(task);
            }
        }
    }
}

/// The reconciler's settings from serve's flags.
fn reconciler_config(args: &ServeArgs) -> ReconcilerConfig {
    args.operations.apply(ReconcilerConfig {
        pending_timeout_ms: duration_ms(args.pending_timeout),
        interval_ms: u64::try_from(args.reconcile_interval.as_millis()).unwrap_or(u64::MAX),
        payment_lease_ms: duration_ms(args.payment_lease),
        report_settle_ms: args.report_settle.ms(),
        // A sweep killed mid-run holds the lease until it runs out: scale it with the
        // interval (a chaos run saw a 10-minute default stall convergence). Overlapping
        // sweeps after a slow one are safe: payments are leased and versioned.
        sweep_lease_ms: duration_ms(args.reconcile_interval)
            .saturating_mul(3)
            .max(SWEEP_LEASE_MS_MIN),
        ..ReconcilerConfig::default()
    })
}

fn duration_ms(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

/// The providers as configured once per process: their URLs, the in-process simulator (when no
/// provider URL was given) and the webhook secrets. Every cell's flows charge through them.
struct Providers {
    urls: ProviderSpecs,
    simulator: Option<Simulator>,
    secrets: WebhookSecrets,
    client: ClientConfig,
}

impl Providers {
    fn build(
        args: &ServeArgs,
        address: SocketAddr,
        stopped: &watch::Receiver<bool>,
    ) -> anyhow::Result<Providers> {
        let client = ClientConfig {
            request_timeout_ms: u64::try_from(args.psp_timeout.as_millis()).unwrap_or(u64::MAX),
            ..ClientConfig::default()
        };
        let mut secrets = args.webhook_secrets.clone().unwrap_or_default();
        let sim_name = default_provider()?;
        if let Some(secret) = &args.webhook_secret {
            secrets.set(&sim_name, secret).context("--webhook-secret")?;
        }
        let (urls, simulator) = match (&args.providers, &args.psp_url) {
            (Some(urls), _) => (urls.clone(), None),
            (None, Some(url)) => (ProviderSpecs::sim(sim_name, url.clone()), None),
            (None, None) if args.role.serves_api() => {
                // The in-process simulator signs with `sim`'s secret (random unless given) and
                // delivers to this very process.
                let secret = match secrets.get(sim_name.as_str()) {
                    Some(secret) => secret.to_owned(),
                    None => {
                        let secret = asiento_psp_sim::random_webhook_secret();
                        secrets.set(&sim_name, &secret).context("webhook secret")?;
                        println!("webhook secret of provider sim (generated, dev only): {secret}");
                        secret
                    }
                };
                let simulator = Simulator::new(SimConfig {
                    seed: asiento_psp_sim::random_seed(),
                    webhook_url: Some(format!("http://{address}/webhooks/sim")),
                    webhook_secret: secret,
                    ..SimConfig::default()
                });
                simulator
                    .spawn_webhook_dispatcher(wait_for(stopped.clone()))
                    .context("starting the simulator's webhook dispatcher")?;
                let url = format!("http://{address}/sim");
                (ProviderSpecs::sim(sim_name, url), Some(simulator))
            }
            (None, None) => anyhow::bail!(
                "--role {:?} needs --psp-url or --providers: the in-process simulator lives in the \
                 api process",
                args.role
            ),
        };
        let env = |variable: &str| std::env::var(variable).ok();
        for spec in &urls.0 {
            secrets.set_format(&spec.name, spec.kind.event_format());
            match webhook_auth(spec, &env)? {
                Some(WebhookAuth::Secret(secret)) => {
                    secrets.set(&spec.name, &secret).context("webhook secret")?
                }
                Some(WebhookAuth::Batch {
                    hmac_key,
                    credentials,
                }) => secrets
                    .set_batch(&spec.name, &hmac_key, credentials)
                    .context("webhook HMAC key")?,
                None => {}
            }
            if secrets.get(spec.name.as_str()).is_none()
                && secrets.batch_keys(spec.name.as_str()).is_none()
            {
                tracing::warn!(provider = %spec.name, "no webhook secret: its webhooks will be refused");
            }
        }
        Ok(Providers {
            urls,
            simulator,
            secrets,
            client,
        })
    }

    /// The providers and the hints for a first request, printed once the API is up.
    fn print_hints(&self, address: SocketAddr, demo_key: Option<String>) {
        for spec in &self.urls.0 {
            println!("provider {} ({:?}): {}", spec.name, spec.kind, spec.url);
        }
        let key = match demo_key {
            Some(key) => {
                println!("created tenant `demo`; its API key (shown once): {key}");
                key
            }
            None => "$API_KEY".to_owned(),
        };
        println!("console: http://{address}/console (sign in with the API key)");
        println!(
            "try: curl -s -X POST http://{address}/v1/payments -H 'Authorization: Bearer {key}' \\\n  \
             -H 'Idempotency-Key: order-1001' -H 'Content-Type: application/json' \\\n  \
             -d '{{\"amount_minor\": 10000, \"currency\": \"USD\", \"customer\": \"42\", \"payment_method\": \"pm_card_ok\"}}'"
        );
    }
}

/// What the API and the workers of one database share: the use cases on its one `Writer`.
struct Core {
    payments: PaymentFlow,
    ledger: LedgerFlow,
}

impl Core {
    fn build(
        args: &ServeArgs,
        database: &Database,
        store: &Arc<dyn EventStore>,
        providers: &Providers,
        cell: Option<asiento_app::payments::CellPlace>,
    ) -> anyhow::Result<Core> {
        let env = |variable: &str| std::env::var(variable).ok();
        let adapters =
            crate::providers::build(&providers.urls, &args.fees, &providers.client, &env)?;
        let clock = Arc::new(SystemClock);
        let render = Arc::new(asiento_api::render::JsonRender);
        let lease_ms = duration_ms(args.idempotency_lease);
        // The database's one writer: one batching of every flow's steps, one memory of what they
        // left.
        let writer = asiento_app::commit::Writer::new(Arc::clone(store));
        let mut payments = PaymentFlow::new(
            database.clone(),
            Arc::clone(&writer),
            adapters,
            clock.clone(),
            render.clone(),
        )
        .with_leases(lease_ms, duration_ms(args.payment_lease));
        if let Some(cell) = cell {
            payments = payments.in_cell(cell);
        }
        Ok(Core {
            payments,
            ledger: LedgerFlow::new(database.clone(), writer, clock, render)
                .with_idempotency_lease(lease_ms),
        })
    }

    /// The API process's router: the use cases, the webhook endpoint and the console.
    fn router(
        &self,
        args: &ServeArgs,
        database: &Database,
        reads: Arc<Reads>,
        providers: Option<&Providers>,
    ) -> anyhow::Result<axum::Router> {
        let secrets = providers
            .map(|providers| providers.secrets.clone())
            .unwrap_or_default();
        let state = asiento_api::AppState {
            payments: self.payments.clone(),
            ledger: self.ledger.clone(),
            webhooks: WebhookReceiver {
                database: database.clone(),
                writer: self.payments.writer().clone(),
                secrets,
                clock: self.payments.clock().clone(),
                tolerance_s: asiento_app::webhooks::TOLERANCE_S_DEFAULT,
            },
            database: database.clone(),
            reads,
            key_cache: Default::default(),
            amount_limit: asiento_domain::AmountLimit::new(args.amount_max)?,
            webhook_urls: Arc::new(args.outbound.policy()?),
            rate_limits: Arc::new(asiento_api::rate_limit::RateLimits::new(
                args.rate_limit.clone().unwrap_or_default(),
            )),
        };
        let console = asiento_console::ConsoleState::new(
            state.clone(),
            args.operator_key.as_deref(),
            crate::projections::all(),
        );
        Ok(asiento_api::router(state).merge(asiento_console::router(console)))
    }

    /// The background workers of one database, on `tasks`.
    fn start_workers(
        &self,
        args: &ServeArgs,
        database: &Database,
        store: &Arc<dyn EventStore>,
        stopped: &watch::Receiver<bool>,
        tasks: &mut CellTasks<'_>,
    ) -> anyhow::Result<()> {
        let worker = Worker::new(
            self.payments.clone(),
            WorkerConfig {
                payment_lease_ms: duration_ms(args.payment_lease),
                ..WorkerConfig::default()
            },
        );
        let shutdown = wait_for(stopped.clone());
        tasks.spawn(async move { worker.run(shutdown).await });
        let reconciler = Reconciler::new(self.payments.clone(), reconciler_config(args));
        let shutdown = wait_for(stopped.clone());
        tasks.spawn(async move { reconciler.run(shutdown).await });
        let sealer = Sealer::new(database.clone(), self.payments.clock().clone())
            .with_store(Arc::clone(store));
        let shutdown = wait_for(stopped.clone());
        tasks.spawn(async move { sealer.run(shutdown).await });
        let checker = crate::verify::checker(database);
        let (interval, shutdown) = (args.verify_interval, wait_for(stopped.clone()));
        tasks.spawn(async move { checker.run(interval, shutdown).await });
        let purger = IdempotencyPurger {
            database: database.clone(),
            clock: self.payments.clock().clone(),
            keep_ms: duration_ms(args.idempotency_retention),
        };
        tasks.spawn(purger.run(wait_for(stopped.clone())));
        tasks.spawn(asiento_app::hold_expiry::run(
            self.ledger.clone(),
            self.payments.paused().to_vec(),
            asiento_app::hold_expiry::EXPIRY_INTERVAL_DEFAULT,
            wait_for(stopped.clone()),
        ));
        let deliverer = asiento_outbound::Deliverer::new(database.clone(), args.outbound.config()?)
            .context("building the webhook sender")?;
        tasks.spawn(asiento_outbound::run(
            database.clone(),
            deliverer,
            wait_for(stopped.clone()),
        ));
        tasks.spawn(asiento_app::gauges::run(
            database.clone(),
            self.payments.clock().clone(),
            args.gauges_interval,
            wait_for(stopped.clone()),
        ));
        if let Some(relay) = args
            .events_relay
            .relay(database, self.payments.clock().clone())?
        {
            println!("events relay {} running", relay.name());
            tasks.spawn(relay.run(wait_for(stopped.clone())));
        }
        Ok(())
    }
}

/// Deletes completed idempotency records older than the retention, once a minute. In-flight ones
/// are never purged: their retry resumes them.
struct IdempotencyPurger {
    database: Database,
    clock: Arc<dyn asiento_app::clock::Clock>,
    keep_ms: i64,
}

/// How often old idempotency records are purged.
const IDEMPOTENCY_PURGE_INTERVAL_MS: u64 = 60_000;

impl IdempotencyPurger {
    async fn run(self, shutdown: impl std::future::Future<Output = ()>) {
        tokio::pin!(shutdown);
        let mut tick = tokio::time::interval(Duration::from_millis(IDEMPOTENCY_PURGE_INTERVAL_MS));
        loop {
            tokio::select! {
                () = &mut shutdown => return,
                _ = tick.tick() => {}
            }
            let before_ms = self.clock.now_ms() - self.keep_ms;
            let purged = async {
                let mut tx = self.database.begin().await?;
                let purged = asiento_app::idempotency::purge_completed(&mut tx, before_ms).await?;
                tx.commit().await?;
                Ok::<u64, anyhow::Error>(purged)
            }
            .await;
            match purged {
                Ok(0) => {}
                Ok(count) => tracing::info!(count, "purged old idempotency records"),
                Err(error) => tracing::warn!(%error, "idempotency purge failed; retrying later"),
            }
        }
    }
}

fn default_provider() -> anyhow::Result<ProviderName> {
    ProviderName::parse(DEFAULT_PROVIDER).context("the default provider name")
}

/// Resolves when `stopped` flips to true (or its sender is gone).
async fn wait_for(mut stopped: watch::Receiver<bool>) {
    let _ = stopped.wait_for(|stopped| *stopped).await;
}

/// Resolves on Ctrl-C or SIGTERM, so that `serve` drains in-flight requests before exiting.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        if let Err(error) = tokio::signal::ctrl_c().await {
            tracing::error!(%error, "cannot listen for Ctrl-C");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(error) => {
                tracing::error!(%error, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = terminate => {},
    }
    tracing::info!("shutting down");
}

#[cfg(test)]
mod tests {
    use super::redact;
    use clap::Parser as _;

    #[derive(clap::Parser)]
    struct Serve {
        #[command(flatten)]
        args: super::ServeArgs,
    }

    /// `--report-settle` reaches the reconciler; left alone, the reconciler's default holds.
    #[test]
    fn report_settle_reaches_the_reconciler() {
        let set = Serve::try_parse_from(["serve", "--report-settle", "5m"]).expect("flags");
        assert_eq!(
            super::reconciler_config(&set.args).report_settle_ms,
            300_000
        );
        let default = Serve::try_parse_from(["serve"]).expect("no flags");
        assert_eq!(
            super::reconciler_config(&default.args).report_settle_ms,
            asiento_app::reconcile::REPORT_SETTLE_MS_DEFAULT
        );
    }

    #[test]
    fn api_keys_flag_is_validated() {
        let ok =
            super::parse_api_keys("acme:sk_live_0123456789abcdef, beta:sk_live_fedcba9876543210")
                .expect("valid");
        assert_eq!(ok.0.len(), 2);
        for bad in [
            "",
            "acme",
            "Acme:sk_live_0123456789abcdef",
            "acme:short",
            "acme:sk live 0123456789abc",
        ] {
            assert!(super::parse_api_keys(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn redact_hides_only_the_password() {
        let table = [
            (
                "postgres://u:secret@h:5432/db",
                "postgres://u:***@h:5432/db",
            ),
            ("postgres://u@h/db", "postgres://u@h/db"),
            ("sqlite://data/asiento.db", "sqlite://data/asiento.db"),
        ];
        for (url, want) in table {
            assert_eq!(redact(url), want, "{url}");
        }
    }
}

/// Webhooks to merchants: which URLs endpoints may have, and how deliveries are sent.
#[derive(clap::Args, Debug, Clone)]
pub struct OutboundArgs {
    /// Hosts, addresses or CIDR ranges webhook endpoints may use although they are private,
    /// loopback or plain http (comma-separated: `127.0.0.1,10.0.0.0/8,hooks.internal`).
    #[arg(long, env = "ASIENTO_WEBHOOK_ALLOW_HOSTS", default_value = "")]
    pub webhook_allow_hosts: String,
    /// The whole of one delivery attempt: connect, send, the answer's head and first bytes.
    #[arg(long, env = "ASIENTO_WEBHOOK_TIMEOUT", value_parser = humantime::parse_duration, default_value = "15s")]
    pub webhook_timeout: Duration,
    /// The first retry's backoff ceiling; it doubles per failure (full jitter).
    #[arg(long, env = "ASIENTO_WEBHOOK_RETRY_BASE", value_parser = humantime::parse_duration, default_value = "5s")]
    pub webhook_retry_base: Duration,
    /// The largest backoff ceiling.
    #[arg(long, env = "ASIENTO_WEBHOOK_RETRY_MAX", value_parser = humantime::parse_duration, default_value = "1h")]
    pub webhook_retry_max: Duration,
    /// How long a delivery is retried, and how long an endpoint may fail every delivery before
    /// it is disabled.
    #[arg(long, env = "ASIENTO_WEBHOOK_RETRY_WINDOW", value_parser = humantime::parse_duration, default_value = "3days")]
    pub webhook_retry_window: Duration,
    /// Attempts in flight to one endpoint at most (per worker process).
    #[arg(long, env = "ASIENTO_WEBHOOK_PER_ENDPOINT", default_value_t = 4)]
    pub webhook_per_endpoint: usize,
}

impl OutboundArgs {
    pub fn policy(&self) -> anyhow::Result<asiento_outbound::url_policy::UrlPolicy> {
        let allow = asiento_outbound::url_policy::AllowList::parse(&self.webhook_allow_hosts)
            .map_err(|error| anyhow::anyhow!("--webhook-allow-hosts: {error}"))?;
        Ok(asiento_outbound::url_policy::UrlPolicy { allow })
    }

    pub fn config(&self) -> anyhow::Result<asiento_outbound::DeliveryConfig> {
        anyhow::ensure!(
            self.webhook_per_endpoint >= 1,
            "--webhook-per-endpoint must be at least 1"
        );
        Ok(asiento_outbound::DeliveryConfig {
            timeout: self.webhook_timeout,
            per_endpoint: self.webhook_per_endpoint,
            backoff: asiento_outbound::backoff::Backoff {
                base: self.webhook_retry_base,
                max: self.webhook_retry_max,
            },
            retry_window: self.webhook_retry_window,
            policy: Arc::new(self.policy()?),
            ..asiento_outbound::DeliveryConfig::default()
        })
    }
}

/// Standbys that serve the query routes (`asiento_api::reads`).
#[derive(clap::Args, Debug, Clone)]
pub struct StandbyArgs {
    /// PostgreSQL standbys of `--database-url` (streaming replication), comma-separated: the query
    /// routes read from them in turn; writes, projectors and workers stay on the primary.
    #[arg(
        long = "read-database-url",
        env = "ASIENTO_READ_DATABASE_URL",
        value_delimiter = ',',
        hide_env_values = true
    )]
    pub urls: Vec<String>,

    /// How long a read with `min_position` waits for a standby to reach it before it reads from
    /// the primary (which waits up to 5 s more).
    #[arg(long = "read-standby-wait", env = "ASIENTO_READ_STANDBY_WAIT", value_parser = humantime::parse_duration, default_value = "1s")]
    pub wait: Duration,
}

/// How often an API process with standbys measures their lag for `/metrics`.
const STANDBY_LAG_INTERVAL: Duration = Duration::from_secs(1);

impl StandbyArgs {
    /// The database's one `Reads`: the primary and a pool per standby.
    fn reads(
        &self,
        database: &Database,
        store: &Arc<dyn EventStore>,
    ) -> anyhow::Result<Arc<Reads>> {
        if !self.urls.is_empty() && database.backend() != asiento_eventstore::Backend::Postgres {
            anyhow::bail!("--read-database-url needs a PostgreSQL --database-url");
        }
        let mut standbys = Vec::new();
        for url in &self.urls {
            let standby =
                Database::connect_standby(url, asiento_eventstore::PG_POOL_CONNECTIONS_MAX)
                    .with_context(|| format!("--read-database-url {}", redact(url)))?;
            standbys.push(ReadSide::standby(standby));
        }
        Ok(Arc::new(Reads::new(
            ReadSide::primary(database.clone(), Arc::clone(store)),
            standbys,
            self.wait,
        )))
    }
}

/// The events relay: the merchant events feed published to NATS JetStream (crates/relay), by the
/// processes that run workers; one of them relays at a time (a job lease per relay name).
#[derive(clap::Args, Debug, Clone)]
pub struct EventsRelayArgs {
    /// The NATS server to relay merchant events to (`nats://host:4222`, several comma-separated);
    /// unset, no relay runs.
    #[arg(long, env = "ASIENTO_EVENTS_RELAY", hide_env_values = true)]
    pub events_relay: Option<String>,
    /// The JetStream stream, created with subjects `asiento.>` if it does not exist.
    #[arg(long, env = "ASIENTO_EVENTS_RELAY_STREAM", default_value = asiento_relay::STREAM_DEFAULT)]
    pub events_relay_stream: String,
    /// Only these tenants' events (comma-separated); empty for every tenant.
    #[arg(long, env = "ASIENTO_EVENTS_RELAY_TENANTS", default_value = "")]
    pub events_relay_tenants: String,
    /// The duplicate window of a stream the relay creates.
    #[arg(long, env = "ASIENTO_EVENTS_RELAY_DUPLICATE_WINDOW", value_parser = humantime::parse_duration, default_value = "2m")]
    pub events_relay_duplicate_window: Duration,
    /// How long the relay's lease holds: a stopped relay's successor takes over within it.
    #[arg(long, env = "ASIENTO_EVENTS_RELAY_LEASE", value_parser = humantime::parse_duration, default_value = "10s")]
    pub events_relay_lease: Duration,
    /// How long a publish waits for JetStream's acknowledgement (below the lease).
    #[arg(long, env = "ASIENTO_EVENTS_RELAY_ACK_TIMEOUT", value_parser = humantime::parse_duration, default_value = "5s")]
    pub events_relay_ack_timeout: Duration,
}

impl EventsRelayArgs {
    /// The relay these flags ask for, checked; None without `--events-relay`.
    pub fn relay(
        &self,
        database: &Database,
        clock: Arc<dyn asiento_app::clock::Clock>,
    ) -> anyhow::Result<Option<asiento_relay::Relay>> {
        let Some(url) = &self.events_relay else {
            return Ok(None);
        };
        let config = asiento_relay::RelayConfig {
            stream: self.events_relay_stream.clone(),
            duplicate_window: self.events_relay_duplicate_window,
            lease: self.events_relay_lease,
            ack_timeout: self.events_relay_ack_timeout,
            ..asiento_relay::RelayConfig::new(url.clone())
        }
        .with_tenants(&self.events_relay_tenants)
        .context("--events-relay-tenants")?;
        let relay =
            asiento_relay::Relay::new(database.clone(), clock, config).context("--events-relay")?;
        Ok(Some(relay))
    }
}
